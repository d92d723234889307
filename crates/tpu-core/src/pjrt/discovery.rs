//! Finding PJRT plugins on disk: the plugins we know, where pip and our own
//! installer put them, and which one `TPU_RS_PLUGIN` (or the hardware) picks.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A wheel pinned by file name and sha256, fetched by `tpu-rs plugin install`.
#[derive(Clone, Copy, Debug)]
pub struct WheelPin {
    /// The wheel's file name (it fixes the Python and platform tags).
    pub file: &'static str,
    /// Its sha256, lowercase hex.
    pub sha256: &'static str,
}

/// A PJRT plugin distributed as a Python wheel.
#[derive(Clone, Copy, Debug)]
pub struct KnownPlugin {
    /// Our name for it, as `TPU_RS_PLUGIN` accepts it.
    pub name: &'static str,
    /// The platform it drives: `cpu`, `tpu` or `cuda`.
    pub platform: &'static str,
    /// The PyPI distribution.
    pub package: &'static str,
    /// The pinned version.
    pub version: &'static str,
    /// The shared library's path inside the wheel (and inside site-packages).
    pub library: &'static str,
    /// The pinned wheel, when `tpu-rs plugin install` can fetch it.
    pub wheel: Option<WheelPin>,
    /// Whether serializing an executable leaves every program correct, so
    /// the compile cache may keep executables on disk.
    pub serializes_safely: bool,
    /// Whether its client takes the `asynchronous` create option (runs
    /// programs on the launching thread when it is false).
    pub asynchronous_option: bool,
}

impl KnownPlugin {
    /// The folder `tpu-rs plugin install` unpacks this plugin into.
    pub fn install_dir(&self) -> PathBuf {
        plugin_cache_dir().join(format!("{}-{}", self.name, self.version))
    }
}

/// The plugins we know how to find, in order of preference per platform.
/// `jax-cpu` leads the CPU plugins: its newer XLA runs the bridge's GPT-2
/// step 1.25x faster in Strict and an MLP training step 1.6-2.4x faster
/// than `xla-cpu` (measured on 2 cores), though each launch costs 1.4 µs
/// more.
pub const KNOWN_PLUGINS: &[KnownPlugin] = &[
    KnownPlugin {
        name: "jax-cpu",
        platform: "cpu",
        package: "lammps-jax-pjrt-cpu",
        version: "0.11.2",
        library: "lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so",
        wheel: Some(WheelPin {
            file: "lammps_jax_pjrt_cpu-0.11.2-py3-none-manylinux_2_27_x86_64.whl",
            sha256: "1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1",
        }),
        serializes_safely: true,
        asynchronous_option: true,
    },
    KnownPlugin {
        name: "xla-cpu",
        platform: "cpu",
        package: "xla-cpu-pjrt",
        version: "0.0.1",
        library: "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so",
        wheel: Some(WheelPin {
            file: "xla_cpu_pjrt-0.0.1-py3-none-manylinux_2_27_x86_64.whl",
            sha256: "55837b6b7b47daa717f2d9a5a03563ea0ceaa338d06a81a1e2d3f060d960decc",
        }),
        // Serializing corrupts results of programs run afterwards (seen as
        // training losses off by up to 1% at random steps).
        serializes_safely: false,
        asynchronous_option: false,
    },
    KnownPlugin {
        name: "tpu",
        platform: "tpu",
        package: "libtpu",
        version: "0.0.52",
        library: "libtpu/libtpu.so",
        wheel: Some(WheelPin {
            file: "libtpu-0.0.52-cp311-cp311-manylinux_2_31_x86_64.whl",
            sha256: "f5e2e596eaea9357fbb5a6755a7a9007c6ab75bfde4a55191b03eff402971140",
        }),
        serializes_safely: true,
        asynchronous_option: false,
    },
    KnownPlugin {
        name: "cuda",
        platform: "cuda",
        package: "jax-cuda12-pjrt",
        version: "any",
        library: "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        wheel: None,
        serializes_safely: true,
        asynchronous_option: false,
    },
];

/// The known plugin whose library is the file at `path`, if any.
pub fn known_plugin_at(path: &Path) -> Option<&'static KnownPlugin> {
    KNOWN_PLUGINS.iter().find(|p| path.ends_with(p.library))
}

/// Looks up a known plugin by its name.
pub fn known_plugin(name: &str) -> Option<&'static KnownPlugin> {
    KNOWN_PLUGINS.iter().find(|p| p.name == name)
}

/// Where `tpu-rs plugin install` puts plugins: `$TPU_RS_PLUGIN_DIR`, else
/// `$XDG_CACHE_HOME/tpu-rs/plugins`, else `~/.cache/tpu-rs/plugins`.
pub fn plugin_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TPU_RS_PLUGIN_DIR") {
        return PathBuf::from(dir);
    }
    user_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("tpu-rs")
        .join("plugins")
}

/// The user's cache folder: `$XDG_CACHE_HOME`, else `~/.cache` (empty
/// variables count as unset, as the XDG spec says).
pub(crate) fn user_cache_dir() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    non_empty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|home| PathBuf::from(home).join(".cache")))
}

/// Folders that may hold pip-installed plugins: the active virtualenv and
/// the usual system and user site-packages.
fn site_packages() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(PathBuf::from(venv).join("lib"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local/lib"));
    }
    prefixes.push(PathBuf::from("/usr/local/lib"));
    prefixes.push(PathBuf::from("/usr/lib"));
    let mut dirs = Vec::new();
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(&prefix) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                dirs.push(entry.path().join("site-packages"));
                dirs.push(entry.path().join("dist-packages"));
            }
        }
    }
    dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    dirs.retain(|d| d.is_dir());
    dirs
}

/// The site-packages of the `python3` on PATH, asked only when the usual
/// places hold nothing (it costs a process start).
fn python_site_packages() -> Vec<PathBuf> {
    let script =
        "import site,sys;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))";
    std::process::Command::new("python3")
        .args(["-c", script])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from)
                .filter(|d| d.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

fn find_in(plugin: &KnownPlugin, roots: &[PathBuf]) -> Option<PathBuf> {
    std::iter::once(plugin.install_dir())
        .chain(roots.iter().cloned())
        .map(|root| root.join(plugin.library))
        .find(|path| path.is_file())
}

/// Where `plugin` is installed, if anywhere.
pub fn find_plugin(plugin: &KnownPlugin) -> Option<PathBuf> {
    find_in(plugin, &site_packages()).or_else(|| find_in(plugin, &python_site_packages()))
}

/// Every known plugin found on this machine, with its library path.
pub fn installed_plugins() -> Vec<(&'static KnownPlugin, PathBuf)> {
    let mut roots = site_packages();
    roots.extend(python_site_packages());
    KNOWN_PLUGINS
        .iter()
        .filter_map(|p| find_in(p, &roots).map(|path| (p, path)))
        .collect()
}

/// True when this machine has TPU chips (libtpu's device nodes).
pub fn tpu_present() -> bool {
    dev_entries().any(|name| name.starts_with("accel") || name == "vfio")
}

/// True when this machine has an NVIDIA GPU.
pub fn gpu_present() -> bool {
    Path::new("/dev/nvidia0").exists()
}

fn dev_entries() -> impl Iterator<Item = String> {
    std::fs::read_dir("/dev")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
}

/// Resolves a plugin spec: a path (contains `/` or ends in `.so`), a known
/// name (`xla-cpu`, `jax-cpu`, `tpu`, `cuda`), or a platform (`cpu`: the
/// first CPU plugin installed).
pub fn resolve_plugin(spec: &str) -> Result<PathBuf> {
    if spec.contains('/') || spec.ends_with(".so") {
        let path = PathBuf::from(spec);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::PluginNotFound {
                name: spec.to_string(),
                searched: spec.to_string(),
                hint: "the path is not a file".to_string(),
            })
        };
    }
    let candidates: Vec<&KnownPlugin> = KNOWN_PLUGINS
        .iter()
        .filter(|p| p.name == spec || p.platform == spec)
        .collect();
    if candidates.is_empty() {
        let names: Vec<&str> = KNOWN_PLUGINS.iter().map(|p| p.name).collect();
        return Err(Error::PluginNotFound {
            name: spec.to_string(),
            searched: "known plugin names".to_string(),
            hint: format!("use a path, `cpu`, or one of: {}", names.join(", ")),
        });
    }
    let mut roots = site_packages();
    let found = |roots: &[PathBuf]| candidates.iter().find_map(|p| find_in(p, roots));
    if let Some(path) = found(&roots) {
        return Ok(path);
    }
    roots.extend(python_site_packages());
    found(&roots).ok_or_else(|| {
        let mut searched = vec![plugin_cache_dir()];
        searched.extend(roots);
        Error::PluginNotFound {
            name: spec.to_string(),
            searched: searched
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            hint: match candidates[0].wheel {
                Some(_) => format!(
                    "install it with `tpu-rs plugin install {}`",
                    candidates[0].name
                ),
                None => format!("install it with `pip install {}`", candidates[0].package),
            },
        }
    })
}

/// The plugin to use: `$TPU_RS_PLUGIN` if set, else libtpu when a TPU is
/// present, else a CUDA plugin when a GPU is present and one is installed,
/// else the first CPU plugin installed (`jax-cpu`, then `xla-cpu`).
pub fn default_plugin() -> Result<PathBuf> {
    if let Some(spec) = crate::settings::env("TPU_RS_PLUGIN")? {
        return resolve_plugin(&spec);
    }
    if tpu_present()
        && let Ok(path) = resolve_plugin("tpu")
    {
        return Ok(path);
    }
    if gpu_present()
        && let Ok(path) = resolve_plugin("cuda")
    {
        return Ok(path);
    }
    resolve_plugin("cpu")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = resolve_plugin("nonsense").unwrap_err().to_string();
        assert!(err.contains("xla-cpu") && err.contains("tpu"), "{err}");
    }

    #[test]
    fn missing_paths_are_typed_errors() {
        let err = resolve_plugin("/no/such/plugin.so").unwrap_err();
        assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
    }

    #[test]
    fn every_pinned_wheel_names_its_package() {
        for p in KNOWN_PLUGINS {
            if let Some(w) = p.wheel {
                let stem = p.package.replace('-', "_");
                assert!(
                    w.file.starts_with(&format!("{stem}-{}-", p.version)),
                    "{}",
                    w.file
                );
                assert_eq!(w.sha256.len(), 64);
            }
        }
    }
}
