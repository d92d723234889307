//! Installing a pinned plugin wheel: `pip download` the exact wheel, check
//! its sha256, and unpack it with pip into the plugin cache that discovery
//! searches.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use tpu_rs::discovery::{KnownPlugin, WheelPin};

/// Installs `plugin` unless it is already there; returns its library path.
pub fn install(plugin: &KnownPlugin, force: bool) -> Result<PathBuf, String> {
    let wheel = plugin.wheel.ok_or_else(|| {
        format!(
            "{} has no pinned wheel; install it with `pip install {}`",
            plugin.name, plugin.package
        )
    })?;
    let target = plugin.install_dir();
    let library = target.join(plugin.library);
    if library.is_file() && !force {
        return Ok(library);
    }
    let staging = target.with_extension("partial");
    remove_dir(&staging)?;
    std::fs::create_dir_all(&staging)
        .map_err(|e| format!("creating {}: {e}", staging.display()))?;
    let downloaded = download(plugin, &wheel, &staging)?;
    verify_sha256(&downloaded, wheel.sha256)?;
    let unpacked = staging.join("unpacked");
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-compile",
        ])
        .arg("--target")
        .arg(&unpacked)
        .arg(&downloaded))?;
    remove_dir(&target)?;
    std::fs::rename(&unpacked, &target)
        .map_err(|e| format!("moving into {}: {e}", target.display()))?;
    remove_dir(&staging)?;
    if !library.is_file() {
        return Err(format!("{} holds no {}", wheel.file, plugin.library));
    }
    Ok(library)
}

fn python() -> String {
    std::env::var("TPU_RS_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Downloads exactly the pinned file: the wheel's own tags are passed to pip,
/// so the local Python version does not change which wheel comes back.
fn download(plugin: &KnownPlugin, wheel: &WheelPin, dir: &Path) -> Result<PathBuf, String> {
    let stem = wheel.file.strip_suffix(".whl").unwrap_or(wheel.file);
    let tags: Vec<&str> = stem.rsplitn(4, '-').collect();
    let [platform, abi, python_tag, _] = tags[..] else {
        return Err(format!("cannot read the tags of {}", wheel.file));
    };
    let mut cmd = Command::new(python());
    cmd.args([
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
    ])
    .args(["--platform", platform])
    .arg("--dest")
    .arg(dir);
    if let Some(version) = python_tag.strip_prefix("cp") {
        let (major, minor) = version.split_at(1);
        cmd.args(["--implementation", "cp", "--abi", abi])
            .args(["--python-version", &format!("{major}.{minor}")]);
    }
    cmd.arg(format!("{}=={}", plugin.package, plugin.version));
    run(&mut cmd)?;
    let path = dir.join(wheel.file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("pip did not fetch {}", wheel.file))
    }
}

fn verify_sha256(path: &Path, expected: &str) -> Result<(), String> {
    let mut file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(|e| format!("{}: {e}", path.display()))?;
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual == expected {
        Ok(())
    } else {
        Err(format!(
            "sha256 mismatch for {}: expected {expected}, got {actual}",
            path.display()
        ))
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

fn remove_dir(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("removing {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_mismatch_is_reported() {
        let path = std::env::temp_dir().join(format!("tpu-rs-sha-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert!(verify_sha256(&path, abc).is_ok());
        let err = verify_sha256(&path, &"0".repeat(64)).unwrap_err();
        assert!(err.contains("sha256 mismatch"), "{err}");
        std::fs::remove_file(path).ok();
    }
}
