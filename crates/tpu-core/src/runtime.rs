//! The process-wide runtime behind `tpu:N`: one client on the chosen plugin
//! and its compile cache.

use std::sync::{Arc, OnceLock};

use crate::cache::CompileCache;
use crate::error::{Error, Result};
use crate::pjrt::{
    Client, ClientOptions, CompileOptions, Event, Executable, KeyValueStoreHandle, Plugin,
};

static GLOBAL: OnceLock<Result<Runtime>> = OnceLock::new();
static KV_STORE: OnceLock<KeyValueStoreHandle> = OnceLock::new();

/// A client and its compile cache.
pub struct Runtime {
    client: Client,
    cache: CompileCache,
}

impl Runtime {
    /// A runtime on `plugin`.
    pub fn new(plugin: &'static Plugin, options: &ClientOptions) -> Result<Runtime> {
        Ok(Runtime {
            client: Client::new(plugin, options)?,
            cache: CompileCache::from_env()?,
        })
    }

    /// The shared runtime, created on first use from `TPU_RS_PLUGIN` (or
    /// discovery), `TPU_RS_CPU_DEVICES` (device count of CPU plugins) and
    /// the store given to [`Runtime::set_key_value_store`].
    pub fn global() -> Result<&'static Runtime> {
        GLOBAL
            .get_or_init(|| {
                crate::profile::start_from_env()?;
                let options = ClientOptions {
                    cpu_device_count: cpu_devices_from_env()?,
                    cpu_asynchronous: crate::settings::switch(
                        &crate::settings::env,
                        "TPU_RS_CPU_ASYNC",
                    )?,
                    kv_store: KV_STORE.get().cloned(),
                };
                Runtime::new(Plugin::from_env()?, &options)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Hands the job's key-value store to the shared runtime's client, for
    /// plugins that run multi-host collectives themselves. Only a runtime
    /// not created yet can take it: returns whether this one will.
    pub fn set_key_value_store(store: KeyValueStoreHandle) -> bool {
        GLOBAL.get().is_none() && KV_STORE.set(store).is_ok()
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The compile cache.
    pub fn cache(&self) -> &CompileCache {
        &self.cache
    }

    /// Compiles `program` through the cache.
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<Arc<Executable>> {
        self.cache.get_or_compile(&self.client, program, options)
    }

    /// An event that fires once all work launched on `device` so far has
    /// finished: a device runs its programs in launch order, so a tiny
    /// program launched now completes after every one before it.
    pub fn mark(&self, device: usize) -> Result<Event> {
        const MARK: &str = "func.func @main() -> tensor<i32> {
  %0 = stablehlo.constant dense<0> : tensor<i32>
  return %0 : tensor<i32>
}";
        let exe = self.compile(MARK, &CompileOptions::on_device(device))?;
        let outputs = exe.run(&[])?;
        outputs
            .first()
            .ok_or_else(|| Error::Signature("the marking program returned no output".into()))?
            .ready_event()
    }

    /// A description of device `index` that names the real platform, so a
    /// CPU run is never mistaken for a TPU run.
    pub fn describe(&self, index: usize) -> Result<String> {
        let device = self
            .client
            .devices()
            .into_iter()
            .nth(index)
            .ok_or_else(|| Error::DeviceOutOfRange {
                index,
                count: self.client.device_count(),
                platform: self.client.platform_name().to_string(),
            })?;
        let plugin = self.client.plugin();
        let (major, minor) = plugin.api_version();
        let file = plugin
            .path()
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(format!(
            "tpu:{index} = {} ({}) via PJRT plugin {file} (API {major}.{minor}), device {} of {}",
            self.client.platform_name(),
            device.kind,
            index,
            self.client.device_count()
        ))
    }
}

fn cpu_devices_from_env() -> Result<Option<usize>> {
    crate::settings::count(&crate::settings::env, "TPU_RS_CPU_DEVICES")
}
