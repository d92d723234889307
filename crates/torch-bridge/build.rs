//! Builds the bridge's C++ layer (native/) against the PyTorch it will run
//! under: its headers, its libraries and its C++ ABI, read from a Python
//! interpreter that has torch installed, as `torch.utils.cpp_extension`
//! does. The interpreter is maturin's (`PYO3_PYTHON`), else
//! `TPU_RS_TORCH_PYTHON`, else the workspace's `.venv`.
//!
//! The wheel pins torch to one minor version (pyproject.toml); building
//! against another is an error naming both.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What the build needs to know about the torch it builds against.
struct Torch {
    version: String,
    includes: Vec<PathBuf>,
    lib: PathBuf,
    cxx11_abi: bool,
}

const PROBE: &str = "\
import torch, torch.utils.cpp_extension as e
print(torch.__version__.split('+')[0])
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(e.library_paths()[0])
for p in e.include_paths():
    print(p)
";

fn main() {
    for var in ["PYO3_PYTHON", "TPU_RS_TORCH_PYTHON"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=native");
    println!("cargo:rerun-if-changed=pyproject.toml");
    let python = python();
    let torch = probe(&python).unwrap_or_else(|why| {
        panic!(
            "torch-bridge builds against PyTorch's C++ headers, read from a Python \
             with torch installed ({why}). Run `cargo xtask test` once (it makes \
             .venv), or set TPU_RS_TORCH_PYTHON to such an interpreter."
        )
    });
    check_pin(&torch.version);

    let mut build = cxx_build::bridges(["src/ffi.rs", "src/native.rs"]);
    build
        .file("native/device.cc")
        .file("native/allocator.cc")
        .file("native/views.cc")
        .file("native/tensors.cc")
        .file("native/kernels.cc")
        .file("native/boxed.cc")
        .std("c++20")
        .define(
            "_GLIBCXX_USE_CXX11_ABI",
            if torch.cxx11_abi { "1" } else { "0" },
        );
    for dir in &torch.includes {
        build
            .flag("-isystem")
            .flag(dir.to_str().expect("utf-8 path"));
    }
    build.compile("torch_bridge_native");

    println!("cargo:rustc-link-search=native={}", torch.lib.display());
    // Last on the link line, so torch's libraries come after Gloo's in the
    // library's search order: libtorch_cpu exports its own build of Gloo,
    // whose symbols must not stand in for the Gloo tpu-dist links.
    println!("cargo:rustc-link-arg=-lc10");
    println!("cargo:rustc-link-arg=-ltorch_cpu");
    // The wheel sits beside torch in site-packages; the crate's unit
    // tests find the build's torch where it is.
    println!("cargo:rustc-link-arg-cdylib=-Wl,-rpath,$ORIGIN/../torch/lib");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", torch.lib.display());
}

fn python() -> PathBuf {
    for var in ["PYO3_PYTHON", "TPU_RS_TORCH_PYTHON"] {
        if let Some(p) = std::env::var_os(var) {
            return PathBuf::from(p);
        }
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let venv = manifest.join("../../.venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

fn probe(python: &Path) -> Result<Torch, String> {
    // Without autoloading: an installed torch_tpu_rs (perhaps a broken one)
    // must not stand in the way of building its replacement.
    let out = Command::new(python)
        .args(["-c", PROBE])
        .env("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        .output()
        .map_err(|e| format!("running {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} could not import torch: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let mut next = || lines.next().map(str::to_string).ok_or("short probe output");
    Ok(Torch {
        version: next()?,
        cxx11_abi: next()? == "1",
        lib: PathBuf::from(next()?),
        includes: lines.map(PathBuf::from).collect(),
    })
}

/// The torch version must match pyproject.toml's pin (`torch==X.Y.*`).
fn check_pin(version: &str) {
    let pyproject = std::fs::read_to_string("pyproject.toml").expect("pyproject.toml");
    let pin = pyproject
        .lines()
        .find_map(|l| l.split("\"torch==").nth(1))
        .and_then(|rest| rest.split(".*").next())
        .expect("pyproject.toml pins torch as \"torch==X.Y.*\"");
    let minor: Vec<&str> = version.split('.').take(2).collect();
    if minor.join(".") != pin {
        panic!(
            "the wheel is pinned to torch {pin}.* (pyproject.toml) but the build's \
             Python has torch {version}: update the pin with the C++ layer"
        );
    }
}
