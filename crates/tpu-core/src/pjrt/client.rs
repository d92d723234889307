//! A PJRT client: the devices of one plugin, host transfers and compilation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pjrt_sys as sys;

use super::buffer::{Buffer, pjrt_type};
use super::event::Event;
use super::executable::Executable;
use super::ffi::{Api, Padded, pjrt_call, str_from_raw};
use super::kv::{self, KeyValueStoreHandle, UserArg};
use super::options::CompileOptions;
use super::plugin::Plugin;
use crate::dtype::Element;
use crate::error::{Error, ErrorCode, Result};
use crate::stablehlo::Signature;
use crate::{DType, Shape};

/// Options for creating a client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// Number of devices the XLA CPU plugin exposes (it defaults to 1).
    /// Ignored by other platforms.
    pub cpu_device_count: Option<usize>,
    /// Whether the XLA CPU plugins run a program on their worker threads
    /// (`Some(true)`, their default for all but the tiniest programs) or on
    /// the thread that launches it (`Some(false)`). Synchronous launches
    /// cost less (a [64, 64] add: 3 µs against 9-10 µs on 2 cores) but the
    /// caller no longer runs ahead of the device, which costs programs that
    /// take longer than the host's work between them. Only the `jax-cpu`
    /// plugin takes it; with another, setting it is an error.
    pub cpu_asynchronous: Option<bool>,
    /// The job's key-value store, for plugins that run multi-host
    /// collectives themselves.
    pub kv_store: Option<KeyValueStoreHandle>,
}

/// What a device says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceDescription {
    /// Our index: position in the client's addressable devices.
    pub index: usize,
    /// PJRT's global device id.
    pub id: i64,
    /// The process that owns the device.
    pub process_index: i64,
    /// The device kind, e.g. `cpu` or `TPU v5 lite`.
    pub kind: String,
    /// The plugin's debug description.
    pub debug_string: String,
}

/// Device memory use, where the plugin reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes allocated now.
    pub bytes_in_use: u64,
    /// High-water mark, if reported.
    pub peak_bytes_in_use: Option<u64>,
    /// Total bytes the device may allocate, if reported.
    pub bytes_limit: Option<u64>,
}

pub(crate) struct ClientInner {
    pub(crate) api: Api,
    pub(crate) raw: *mut sys::PJRT_Client,
    pub(crate) plugin: &'static Plugin,
    pub(crate) devices: Vec<(*mut sys::PJRT_Device, DeviceDescription)>,
    pub(crate) platform_name: String,
    pub(crate) platform_version: String,
    pub(crate) id: u64,
    /// The store the plugin's key-value callbacks reach; it must outlive
    /// the client.
    pub(crate) _kv_store: Option<UserArg>,
}

// SAFETY: PJRT clients, devices and their descriptions are thread-safe.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl ClientInner {
    pub(crate) fn device(&self, index: usize) -> Result<*mut sys::PJRT_Device> {
        self.devices
            .get(index)
            .map(|(raw, _)| *raw)
            .ok_or_else(|| Error::DeviceOutOfRange {
                index,
                count: self.devices.len(),
                platform: self.platform_name.clone(),
            })
    }

    pub(crate) fn device_index(&self, raw: *mut sys::PJRT_Device) -> Option<usize> {
        self.devices.iter().position(|(d, _)| *d == raw)
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = Padded::<sys::PJRT_Client_Destroy_Args>::new();
        args.client = self.raw;
        if let Err(e) = pjrt_call!(self.api, PJRT_Client_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT client failed: {e}");
        }
    }
}

/// A connection to one plugin's devices. Cheap to clone; buffers and
/// executables keep it alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(0);

/// One create option named `name`, its value set by `set`. NamedValue
/// arrays are indexed by the plugin's own struct size, so these carry their
/// true size, not padding.
fn create_option(
    name: &'static str,
    set: impl FnOnce(&mut sys::PJRT_NamedValue),
) -> sys::PJRT_NamedValue {
    // SAFETY: an all-zero NamedValue is valid (null name, zero value).
    let mut v: sys::PJRT_NamedValue = unsafe { std::mem::zeroed() };
    v.struct_size = std::mem::size_of::<sys::PJRT_NamedValue>();
    v.name = name.as_ptr().cast();
    v.name_size = name.len();
    v.value_size = 1;
    set(&mut v);
    v
}

impl Client {
    /// Creates a client on `plugin`.
    pub fn new(plugin: &'static Plugin, options: &ClientOptions) -> Result<Client> {
        let api = plugin.api;
        if options.cpu_device_count == Some(0) {
            return Err(Error::InvalidOption {
                option: "cpu_device_count",
                reason: "must be at least 1".into(),
            });
        }
        let mut named: Vec<sys::PJRT_NamedValue> = Vec::new();
        if let Some(count) = options.cpu_device_count {
            named.push(create_option("cpu_device_count", |v| {
                v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kInt64;
                v.__bindgen_anon_1.int64_value = count as i64;
            }));
        }
        if let Some(asynchronous) = options.cpu_asynchronous {
            let takes_it = super::discovery::known_plugin_at(plugin.path())
                .is_some_and(|known| known.asynchronous_option);
            if !takes_it {
                return Err(Error::InvalidOption {
                    option: "cpu_asynchronous (TPU_RS_CPU_ASYNC)",
                    reason: format!(
                        "the plugin {} has no choice of synchronous launches (the `jax-cpu` plugin has)",
                        plugin.path().display()
                    ),
                });
            }
            named.push(create_option("asynchronous", |v| {
                v.type_ = sys::PJRT_NamedValue_Type_PJRT_NamedValue_kBool;
                v.__bindgen_anon_1.bool_value = asynchronous;
            }));
        }
        let mut args = Padded::<sys::PJRT_Client_Create_Args>::new();
        args.create_options = named.as_ptr();
        args.num_options = named.len();
        let kv_store: Option<UserArg> = options.kv_store.as_ref().map(|h| Box::new(h.0.clone()));
        if let Some(store) = &kv_store {
            let user_arg = (&**store as *const std::sync::Arc<dyn kv::KeyValueStore>)
                .cast_mut()
                .cast();
            args.kv_get_callback = Some(kv::get);
            args.kv_get_user_arg = user_arg;
            args.kv_put_callback = Some(kv::put);
            args.kv_put_user_arg = user_arg;
        }
        let created = pjrt_call!(api, PJRT_Client_Create, &mut args);
        if let Err(Error::Pjrt { message, .. }) = &created
            && plugin.is_libtpu()
        {
            return Err(Error::NoTpuFound {
                detail: message.clone(),
            });
        }
        created?;
        let raw = args.client;
        let mut inner = ClientInner {
            api,
            raw,
            plugin,
            devices: Vec::new(),
            platform_name: String::new(),
            platform_version: String::new(),
            id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
            _kv_store: kv_store,
        };
        inner.platform_name = platform_string(&inner, false)?;
        inner.platform_version = platform_string(&inner, true)?;
        inner.devices = addressable_devices(&inner)?;
        tracing::debug!(
            platform = %inner.platform_name,
            devices = inner.devices.len(),
            "created PJRT client"
        );
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The plugin behind this client.
    pub fn plugin(&self) -> &'static Plugin {
        self.inner.plugin
    }

    /// The platform name: `cpu`, `tpu`, `cuda`.
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    /// The platform's version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// A string that identifies plugin and API version, for cache keys.
    pub fn identity(&self) -> String {
        let (major, minor) = self.inner.plugin.api_version();
        format!(
            "{}|{major}.{minor}|{}|{}",
            self.inner.plugin.path().display(),
            self.inner.platform_name,
            self.inner.platform_version
        )
    }

    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// The addressable devices, in index order.
    pub fn devices(&self) -> Vec<DeviceDescription> {
        self.inner.devices.iter().map(|(_, d)| d.clone()).collect()
    }

    /// Number of addressable devices.
    pub fn device_count(&self) -> usize {
        self.inner.devices.len()
    }

    /// Memory use of device `index`; `None` if the plugin does not report it.
    pub fn memory_stats(&self, index: usize) -> Result<Option<MemoryStats>> {
        let device = self.inner.device(index)?;
        let mut args = Padded::<sys::PJRT_Device_MemoryStats_Args>::new();
        args.device = device;
        match pjrt_call!(self.inner.api, PJRT_Device_MemoryStats, &mut args) {
            Ok(()) => Ok(Some(MemoryStats {
                bytes_in_use: args.bytes_in_use.max(0) as u64,
                peak_bytes_in_use: args
                    .peak_bytes_in_use_is_set
                    .then_some(args.peak_bytes_in_use.max(0) as u64),
                bytes_limit: args
                    .bytes_limit_is_set
                    .then_some(args.bytes_limit.max(0) as u64),
            })),
            Err(Error::Pjrt {
                code: ErrorCode::Unimplemented,
                ..
            })
            | Err(Error::MissingFunction { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Copies host bytes into a new buffer on device `device`.
    pub fn buffer_from_bytes(
        &self,
        bytes: &[u8],
        dtype: DType,
        shape: impl Into<Shape>,
        device: usize,
    ) -> Result<Buffer> {
        let shape = shape.into();
        crate::host::check_len(bytes.len(), dtype, &shape)?;
        let raw_device = self.inner.device(device)?;
        let mut span = crate::profile::span("transfer", "host_to_device");
        span.arg("bytes", bytes.len());
        crate::metrics::record_to_device(bytes.len() as u64);
        let dims = shape.dims_i64();
        let mut args = Padded::<sys::PJRT_Client_BufferFromHostBuffer_Args>::new();
        args.client = self.inner.raw;
        args.data = bytes.as_ptr().cast();
        args.type_ = pjrt_type(dtype);
        args.dims = dims.as_ptr();
        args.num_dims = dims.len();
        args.host_buffer_semantics =
            sys::PJRT_HostBufferSemantics_PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
        args.device = raw_device;
        pjrt_call!(self.inner.api, PJRT_Client_BufferFromHostBuffer, &mut args)?;
        let buffer = Buffer::from_raw(self.inner.clone(), args.buffer, dtype, shape, device);
        if let Some(done) = Event::from_raw(self.inner.api, args.done_with_host_buffer) {
            done.wait()?;
        }
        Ok(buffer)
    }

    /// Copies a typed slice into a new buffer on device `device`.
    pub fn buffer_from_slice<T: Element>(
        &self,
        data: &[T],
        shape: impl Into<Shape>,
        device: usize,
    ) -> Result<Buffer> {
        self.buffer_from_bytes(T::as_bytes(data), T::DTYPE, shape, device)
    }

    /// Compiles StableHLO text. Prefer [`crate::CompileCache`] for programs
    /// that repeat.
    pub fn compile(&self, program: &str, options: &CompileOptions) -> Result<Executable> {
        options.validate(self.device_count())?;
        let signature = Signature::parse(program)?;
        let device_ids: Vec<i64> = self.inner.devices.iter().map(|(_, d)| d.id).collect();
        let proto = options.to_proto(&device_ids);
        let format = "mlir";
        let mut code = program.as_bytes().to_vec();
        let mut pjrt_program = Padded::<sys::PJRT_Program>::new();
        pjrt_program.code = code.as_mut_ptr().cast();
        pjrt_program.code_size = code.len();
        pjrt_program.format = format.as_ptr().cast();
        pjrt_program.format_size = format.len();
        let mut args = Padded::<sys::PJRT_Client_Compile_Args>::new();
        args.client = self.inner.raw;
        args.program = pjrt_program.as_mut_ptr();
        args.compile_options = proto.as_ptr().cast();
        args.compile_options_size = proto.len();
        pjrt_call!(self.inner.api, PJRT_Client_Compile, &mut args)?;
        Executable::from_raw(
            self.inner.clone(),
            args.executable,
            signature,
            options.clone(),
        )
    }
}

impl Client {
    /// Loads an executable serialized by [`Executable::serialize`] with this
    /// plugin; `program` is the StableHLO it was compiled from (for its
    /// signature) and `options` what it was compiled with.
    pub fn deserialize(
        &self,
        bytes: &[u8],
        program: &str,
        options: &CompileOptions,
    ) -> Result<Executable> {
        options.validate(self.device_count())?;
        let signature = Signature::parse(program)?;
        let mut args = Padded::<sys::PJRT_Executable_DeserializeAndLoad_Args>::new();
        args.client = self.inner.raw;
        args.serialized_executable = bytes.as_ptr().cast();
        args.serialized_executable_size = bytes.len();
        pjrt_call!(
            self.inner.api,
            PJRT_Executable_DeserializeAndLoad,
            &mut args
        )?;
        Executable::from_raw(
            self.inner.clone(),
            args.loaded_executable,
            signature,
            options.clone(),
        )
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform_name)
            .field("version", &self.inner.platform_version)
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

fn platform_string(inner: &ClientInner, version: bool) -> Result<String> {
    if version {
        let mut args = Padded::<sys::PJRT_Client_PlatformVersion_Args>::new();
        args.client = inner.raw;
        pjrt_call!(inner.api, PJRT_Client_PlatformVersion, &mut args)?;
        // SAFETY: the string is owned by the client, which is alive.
        Ok(unsafe { str_from_raw(args.platform_version, args.platform_version_size) })
    } else {
        let mut args = Padded::<sys::PJRT_Client_PlatformName_Args>::new();
        args.client = inner.raw;
        pjrt_call!(inner.api, PJRT_Client_PlatformName, &mut args)?;
        // SAFETY: as above.
        Ok(unsafe { str_from_raw(args.platform_name, args.platform_name_size) })
    }
}

fn addressable_devices(
    inner: &ClientInner,
) -> Result<Vec<(*mut sys::PJRT_Device, DeviceDescription)>> {
    let mut args = Padded::<sys::PJRT_Client_AddressableDevices_Args>::new();
    args.client = inner.raw;
    pjrt_call!(inner.api, PJRT_Client_AddressableDevices, &mut args)?;
    // SAFETY: the device list is owned by the client and lives as long as it.
    let raw = unsafe {
        super::ffi::slice_from_raw(args.addressable_devices, args.num_addressable_devices)
    };
    raw.into_iter()
        .enumerate()
        .map(|(index, device)| Ok((device, describe(inner.api, device, index)?)))
        .collect()
}

fn describe(api: Api, device: *mut sys::PJRT_Device, index: usize) -> Result<DeviceDescription> {
    let mut get = Padded::<sys::PJRT_Device_GetDescription_Args>::new();
    get.device = device;
    pjrt_call!(api, PJRT_Device_GetDescription, &mut get)?;
    let desc = get.device_description;
    let mut id = Padded::<sys::PJRT_DeviceDescription_Id_Args>::new();
    id.device_description = desc;
    pjrt_call!(api, PJRT_DeviceDescription_Id, &mut id)?;
    let mut process = Padded::<sys::PJRT_DeviceDescription_ProcessIndex_Args>::new();
    process.device_description = desc;
    pjrt_call!(api, PJRT_DeviceDescription_ProcessIndex, &mut process)?;
    let mut kind = Padded::<sys::PJRT_DeviceDescription_Kind_Args>::new();
    kind.device_description = desc;
    pjrt_call!(api, PJRT_DeviceDescription_Kind, &mut kind)?;
    let mut debug = Padded::<sys::PJRT_DeviceDescription_DebugString_Args>::new();
    debug.device_description = desc;
    pjrt_call!(api, PJRT_DeviceDescription_DebugString, &mut debug)?;
    // SAFETY: description strings are owned by the device, alive with the client.
    let (kind, debug_string) = unsafe {
        (
            str_from_raw(kind.device_kind, kind.device_kind_size),
            str_from_raw(debug.debug_string, debug.debug_string_size),
        )
    };
    Ok(DeviceDescription {
        index,
        id: i64::from(id.id),
        process_index: i64::from(process.process_index),
        kind,
        debug_string,
    })
}
