//! Loading a PJRT plugin and reading its attributes. Plugins are loaded once
//! per path and never unloaded: unloading and reloading one corrupts its
//! global state.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pjrt_sys as sys;

use super::discovery;
use super::ffi::{Api, Padded, pjrt_call, str_from_raw};
use crate::error::{Error, Result};

/// A plugin attribute value, as PJRT_NamedValue carries it.
#[derive(Clone, Debug, PartialEq)]
pub enum AttributeValue {
    /// A string.
    String(String),
    /// A 64-bit integer.
    Int(i64),
    /// A list of 64-bit integers.
    Ints(Vec<i64>),
    /// A float.
    Float(f32),
    /// A bool.
    Bool(bool),
}

/// A loaded PJRT plugin: its function table and what it says about itself.
pub struct Plugin {
    pub(crate) api: Api,
    path: PathBuf,
    attributes: Vec<(String, AttributeValue)>,
}

static LOADED: Mutex<Vec<&'static Plugin>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads the plugin at `path` (once per process; later calls return the
    /// same plugin).
    pub fn load(path: impl AsRef<Path>) -> Result<&'static Plugin> {
        let path = path.as_ref();
        let canonical = path.canonicalize().map_err(|e| Error::PluginNotFound {
            name: path.display().to_string(),
            searched: path.display().to_string(),
            hint: e.to_string(),
        })?;
        let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plugin) = loaded.iter().find(|p| p.path == canonical) {
            return Ok(plugin);
        }
        let plugin: &'static Plugin = Box::leak(Box::new(Plugin::open(canonical)?));
        loaded.push(plugin);
        Ok(plugin)
    }

    /// Loads the plugin chosen by `TPU_RS_PLUGIN` or by discovery (see
    /// [`discovery::default_plugin`]).
    pub fn from_env() -> Result<&'static Plugin> {
        Plugin::load(discovery::default_plugin()?)
    }

    /// Loads a plugin by spec: a path, a known name, or a platform.
    pub fn named(spec: &str) -> Result<&'static Plugin> {
        Plugin::load(discovery::resolve_plugin(spec)?)
    }

    fn open(path: PathBuf) -> Result<Plugin> {
        let load_error = |reason: String| Error::PluginLoad {
            path: path.clone(),
            reason,
        };
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if file_name.contains("libtpu") {
            prepare_libtpu_env();
        }
        if super::discovery::known_plugin_at(&path).is_some_and(|p| p.platform == "cpu") {
            quiet_cpu_plugin_logs();
        }
        if let Some(warning) = writable_by_others(&path) {
            // Shown whether or not a tracing subscriber is installed: the
            // plugin runs as this process.
            eprintln!("tpu-rs: warning: {warning}");
            tracing::warn!("{warning}");
        }
        // SAFETY: loading a shared library runs its initialisers; PJRT plugins
        // are built to be dlopen'ed. The library is leaked with the plugin, so
        // nothing it hands out ever dangles.
        let library = unsafe { libloading::Library::new(&path) }
            .map_err(|e| load_error(format!("not a loadable shared library: {e}")))?;
        type GetPjrtApi = unsafe extern "C" fn() -> *const sys::PJRT_Api;
        // SAFETY: `GetPjrtApi` has this signature in every PJRT plugin.
        let get_api = unsafe { library.get::<GetPjrtApi>(b"GetPjrtApi\0") }
            .map_err(|_| load_error("not a PJRT plugin: it exports no GetPjrtApi".into()))?;
        // SAFETY: calling the plugin's entry point; it returns a static table.
        let raw = unsafe { get_api() };
        if raw.is_null() {
            return Err(load_error("GetPjrtApi returned null".into()));
        }
        std::mem::forget(library);
        let label: &'static str = Box::leak(file_name.into_boxed_str());
        // SAFETY: `raw` is the plugin's static table; the library is never
        // unloaded.
        let api = unsafe { Api::new(raw, label) };
        let (major, minor) = api.version();
        if major != sys::PJRT_API_MAJOR as i32 {
            return Err(load_error(format!(
                "PJRT API {major}.{minor} is not compatible with major version {}",
                sys::PJRT_API_MAJOR
            )));
        }
        let min_table = std::mem::offset_of!(sys::PJRT_Api, PJRT_Client_Create);
        if api.table_size() <= min_table {
            return Err(load_error(format!(
                "function table of {} bytes is too small",
                api.table_size()
            )));
        }
        if api
            .function(
                std::mem::offset_of!(sys::PJRT_Api, PJRT_Plugin_Initialize),
                "PJRT_Plugin_Initialize",
                |t| t.PJRT_Plugin_Initialize,
            )
            .is_ok()
        {
            let mut args = Padded::<sys::PJRT_Plugin_Initialize_Args>::new();
            pjrt_call!(api, PJRT_Plugin_Initialize, &mut args)?;
        }
        let attributes = read_attributes(api)?;
        tracing::debug!(path = %path.display(), major, minor, "loaded PJRT plugin");
        Ok(Plugin {
            api,
            path,
            attributes,
        })
    }

    /// The plugin file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the compile cache may keep this plugin's executables on disk:
    /// true unless it is a known plugin whose serialization corrupts
    /// programs ([`super::discovery::KnownPlugin::serializes_safely`]).
    pub fn serializes_safely(&self) -> bool {
        super::discovery::known_plugin_at(&self.path).is_none_or(|p| p.serializes_safely)
    }

    /// The plugin's PJRT C API version as (major, minor).
    pub fn api_version(&self) -> (i32, i32) {
        self.api.version()
    }

    /// Everything the plugin reports about itself (`xla_version`,
    /// `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> &[(String, AttributeValue)] {
        &self.attributes
    }

    /// One attribute by name.
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// The newest StableHLO version the plugin accepts, as (major, minor, patch).
    pub fn stablehlo_version(&self) -> Option<(i64, i64, i64)> {
        match self.attribute("stablehlo_current_version")? {
            AttributeValue::Ints(v) if v.len() == 3 => Some((v[0], v[1], v[2])),
            _ => None,
        }
    }

    /// True for libtpu.
    pub fn is_libtpu(&self) -> bool {
        self.api.plugin.contains("libtpu")
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &self.api_version())
            .finish()
    }
}

/// Why loading `path` is risky, if it or its folder can be written by
/// other users (anyone could replace the code this process will run).
pub(crate) fn writable_by_others(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    if mode(path) & 0o002 != 0 {
        return Some(format!(
            "the PJRT plugin {} is writable by every user",
            path.display()
        ));
    }
    // A sticky folder (like /tmp) lets others add files but not replace ours.
    let folder = path.parent().filter(|d| !d.as_os_str().is_empty())?;
    let folder_mode = mode(folder);
    (folder_mode & 0o002 != 0 && folder_mode & 0o1000 == 0).then(|| {
        format!(
            "the PJRT plugin {} is in {}, which every user can write to",
            path.display(),
            folder.display()
        )
    })
}

/// libtpu queries a cloud metadata server for minutes when it finds no TPU
/// unless told not to.
fn prepare_libtpu_env() {
    if std::env::var_os("TPU_SKIP_MDS_QUERY").is_none() {
        // SAFETY: done under the plugin-loading lock, before libtpu starts
        // threads of its own; our own code reads the environment only
        // through std, which serialises access.
        unsafe { std::env::set_var("TPU_SKIP_MDS_QUERY", "1") };
    }
}

/// The XLA CPU plugin logs each create option it reads at INFO level to
/// stderr; keep its warnings and errors only, unless the user chose a level.
fn quiet_cpu_plugin_logs() {
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        // SAFETY: as in `prepare_libtpu_env`: under the plugin-loading lock,
        // before the plugin starts threads of its own.
        unsafe { std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1") };
    }
}

fn read_attributes(api: Api) -> Result<Vec<(String, AttributeValue)>> {
    let offset = std::mem::offset_of!(sys::PJRT_Api, PJRT_Plugin_Attributes);
    if api
        .function(offset, "PJRT_Plugin_Attributes", |t| {
            t.PJRT_Plugin_Attributes
        })
        .is_err()
    {
        return Ok(Vec::new());
    }
    let mut args = Padded::<sys::PJRT_Plugin_Attributes_Args>::new();
    pjrt_call!(api, PJRT_Plugin_Attributes, &mut args)?;
    if args.attributes.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the plugin returned `num_attributes` values that live as long
    // as the plugin.
    let values = unsafe { std::slice::from_raw_parts(args.attributes, args.num_attributes) };
    Ok(values.iter().map(named_value).collect())
}

fn named_value(v: &sys::PJRT_NamedValue) -> (String, AttributeValue) {
    // SAFETY: the union member read is the one `type_` names; pointers and
    // sizes come from the plugin and stay valid while it is loaded.
    unsafe {
        let name = str_from_raw(v.name, v.name_size);
        let value = match v.type_ {
            sys::PJRT_NamedValue_Type_PJRT_NamedValue_kString => {
                AttributeValue::String(str_from_raw(v.__bindgen_anon_1.string_value, v.value_size))
            }
            sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64 => {
                AttributeValue::Int(v.__bindgen_anon_1.int64_value)
            }
            sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64List => AttributeValue::Ints(
                super::ffi::slice_from_raw(v.__bindgen_anon_1.int64_array_value, v.value_size),
            ),
            sys::PJRT_NamedValue_Type_PJRT_NamedValue_kFloat => {
                AttributeValue::Float(v.__bindgen_anon_1.float_value)
            }
            _ => AttributeValue::Bool(v.__bindgen_anon_1.bool_value),
        };
        (name, value)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn plugins_others_can_replace_are_flagged() {
        let dir = std::env::temp_dir().join(format!("tpu-rs-plugin-perm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plugin = dir.join("plugin.so");
        std::fs::write(&plugin, b"").unwrap();
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        set(&dir, 0o755);
        set(&plugin, 0o644);
        assert_eq!(writable_by_others(&plugin), None);
        set(&plugin, 0o666);
        assert!(
            writable_by_others(&plugin)
                .unwrap()
                .contains("writable by every user")
        );
        set(&plugin, 0o644);
        set(&dir, 0o777);
        assert!(
            writable_by_others(&plugin)
                .unwrap()
                .contains("every user can write to")
        );
        // Sticky, like /tmp: others cannot replace our file.
        set(&dir, 0o1777);
        assert_eq!(writable_by_others(&plugin), None);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
