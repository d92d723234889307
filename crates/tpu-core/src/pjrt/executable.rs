//! Compiled programs and their execution on one or many devices.

use std::sync::Arc;

use pjrt_sys as sys;

use super::buffer::Buffer;
use super::client::ClientInner;
use super::ffi::{Padded, pjrt_call};
use super::options::CompileOptions;
use crate::error::{Error, Result};
use crate::stablehlo::Signature;

/// An argument to an execution.
pub enum Arg<'a> {
    /// The buffer stays valid: it is never donated, even to a donor parameter.
    Borrow(&'a Buffer),
    /// The buffer is given away: a donor parameter may reuse its memory for
    /// an output; otherwise it is freed once the execution is done with it.
    Donate(Buffer),
}

impl Arg<'_> {
    fn buffer(&self) -> &Buffer {
        match self {
            Arg::Borrow(b) => b,
            Arg::Donate(b) => b,
        }
    }
}

impl<'a> From<&'a Buffer> for Arg<'a> {
    fn from(buffer: &'a Buffer) -> Arg<'a> {
        Arg::Borrow(buffer)
    }
}

impl From<Buffer> for Arg<'_> {
    fn from(buffer: Buffer) -> Self {
        Arg::Donate(buffer)
    }
}

/// A program compiled and loaded onto its devices.
pub struct Executable {
    raw: *mut sys::PJRT_LoadedExecutable,
    client: Arc<ClientInner>,
    signature: Signature,
    options: CompileOptions,
    /// Device index of each replica/partition, in execution order.
    devices: Vec<usize>,
}

// SAFETY: PJRT loaded executables may be executed from any thread.
unsafe impl Send for Executable {}
// SAFETY: as above.
unsafe impl Sync for Executable {}

impl Executable {
    pub(crate) fn from_raw(
        client: Arc<ClientInner>,
        raw: *mut sys::PJRT_LoadedExecutable,
        signature: Signature,
        options: CompileOptions,
    ) -> Result<Executable> {
        let mut exe = Executable {
            raw,
            client,
            signature,
            options,
            devices: Vec::new(),
        };
        exe.devices = exe.addressable_devices()?;
        let outputs = exe.num_outputs()?;
        if outputs != exe.signature.results.len() {
            return Err(Error::Signature(format!(
                "@main declares {} result(s) but the compiled program has {outputs}",
                exe.signature.results.len()
            )));
        }
        Ok(exe)
    }

    fn addressable_devices(&self) -> Result<Vec<usize>> {
        let mut args = Padded::<sys::PJRT_LoadedExecutable_AddressableDevices_Args>::new();
        args.executable = self.raw;
        pjrt_call!(
            self.client.api,
            PJRT_LoadedExecutable_AddressableDevices,
            &mut args
        )?;
        // SAFETY: the list is owned by the executable, alive here.
        let raw = unsafe {
            super::ffi::slice_from_raw(args.addressable_devices, args.num_addressable_devices)
        };
        raw.into_iter()
            .map(|d| {
                self.client.device_index(d).ok_or_else(|| {
                    Error::Signature(
                        "the executable runs on a device the client does not list".into(),
                    )
                })
            })
            .collect()
    }

    /// Runs `f` on the unloaded executable behind this one, then frees it.
    fn with_executable<T>(
        &self,
        f: impl FnOnce(*mut sys::PJRT_Executable) -> Result<T>,
    ) -> Result<T> {
        let api = self.client.api;
        let mut get = Padded::<sys::PJRT_LoadedExecutable_GetExecutable_Args>::new();
        get.loaded_executable = self.raw;
        pjrt_call!(api, PJRT_LoadedExecutable_GetExecutable, &mut get)?;
        let result = f(get.executable);
        let mut destroy = Padded::<sys::PJRT_Executable_Destroy_Args>::new();
        destroy.executable = get.executable;
        pjrt_call!(api, PJRT_Executable_Destroy, &mut destroy)?;
        result
    }

    fn num_outputs(&self) -> Result<usize> {
        let api = self.client.api;
        self.with_executable(|exe| {
            let mut num = Padded::<sys::PJRT_Executable_NumOutputs_Args>::new();
            num.executable = exe;
            pjrt_call!(api, PJRT_Executable_NumOutputs, &mut num)?;
            Ok(num.num_outputs)
        })
    }

    /// The compiled program in the plugin's serialized form, loadable with
    /// [`crate::Client::deserialize`] by the same plugin version.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let api = self.client.api;
        self.with_executable(|exe| {
            let mut args = Padded::<sys::PJRT_Executable_Serialize_Args>::new();
            args.executable = exe;
            pjrt_call!(api, PJRT_Executable_Serialize, &mut args)?;
            // SAFETY: the bytes stay valid until the deleter runs below.
            let bytes = unsafe {
                super::ffi::slice_from_raw(
                    args.serialized_bytes.cast::<u8>(),
                    args.serialized_bytes_size,
                )
            };
            if let Some(deleter) = args.serialized_executable_deleter {
                // SAFETY: the plugin handed us this object and its deleter; it
                // is freed exactly once.
                unsafe { deleter(args.serialized_executable) };
            }
            Ok(bytes)
        })
    }

    /// The program's entry signature.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The options it was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// Device index of each replica (and partition), in the order argument
    /// lists are given to [`Executable::execute_on_devices`].
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    /// Runs a single-device program on borrowed arguments.
    pub fn run(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        self.execute(args.iter().map(|&b| Arg::Borrow(b)).collect())
    }

    /// Runs a single-device program.
    pub fn execute(&self, args: Vec<Arg<'_>>) -> Result<Vec<Buffer>> {
        let mut outputs = self.execute_on_devices(vec![args])?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Runs on every device of the executable: one argument list per device,
    /// in [`Executable::devices`] order; returns one output list per device.
    /// Execution is asynchronous: outputs are handles whose contents are
    /// ready when their [`Buffer::ready_event`] fires.
    ///
    /// A program over several devices (a collective) is launched alone in
    /// the process, so every device meets collectives in the same order.
    /// On the CPU plugins, whose collectives block worker threads until
    /// every replica arrives, nothing else is launched until it completes:
    /// work launched from other threads meanwhile could take the threads
    /// its last replica needs, and the plugin aborts the process after 40 s
    /// (seen with data-parallel tests running side by side).
    pub fn execute_on_devices(&self, args: Vec<Vec<Arg<'_>>>) -> Result<Vec<Vec<Buffer>>> {
        static LAUNCH: std::sync::RwLock<()> = std::sync::RwLock::new(());
        if self.devices.len() == 1 {
            let _shared = LAUNCH.read().unwrap_or_else(|e| e.into_inner());
            return self.launch(args);
        }
        let _alone = LAUNCH.write().unwrap_or_else(|e| e.into_inner());
        let outputs = self.launch(args)?;
        if self.client.platform_name == "cpu" {
            for buffer in outputs.iter().flatten() {
                buffer.block_until_ready()?;
            }
        }
        Ok(outputs)
    }

    fn launch(&self, args: Vec<Vec<Arg<'_>>>) -> Result<Vec<Vec<Buffer>>> {
        self.check_args(&args)?;
        let mut span = crate::profile::span("execute", "launch");
        if span.recording() {
            span.arg("program", self.signature.name.clone());
            span.arg("devices", self.devices.len());
        }
        let num_args = self.signature.parameters.len();
        let num_outputs = self.signature.results.len();
        let non_donatable: Vec<i64> = (0..num_args)
            .filter(|&i| args.iter().any(|list| matches!(list[i], Arg::Borrow(_))))
            .map(|i| i as i64)
            .collect();
        let arg_lists: Vec<Vec<*mut sys::PJRT_Buffer>> = args
            .iter()
            .map(|list| list.iter().map(|a| a.buffer().raw()).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut sys::PJRT_Buffer> =
            arg_lists.iter().map(|l| l.as_ptr()).collect();
        let mut out_lists: Vec<Vec<*mut sys::PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); num_outputs]; args.len()];
        let out_ptrs: Vec<*mut *mut sys::PJRT_Buffer> =
            out_lists.iter_mut().map(|l| l.as_mut_ptr()).collect();

        let mut options = Padded::<sys::PJRT_ExecuteOptions>::new();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let mut exec = Padded::<sys::PJRT_LoadedExecutable_Execute_Args>::new();
        exec.executable = self.raw;
        exec.options = options.as_mut_ptr();
        exec.argument_lists = arg_ptrs.as_ptr();
        exec.num_devices = args.len();
        exec.num_args = num_args;
        exec.output_lists = out_ptrs.as_ptr();
        pjrt_call!(self.client.api, PJRT_LoadedExecutable_Execute, &mut exec)?;
        crate::metrics::record_execution();
        // Donated buffers are released now; PJRT keeps what it still uses.
        drop(args);

        Ok(out_lists
            .into_iter()
            .zip(&self.devices)
            .map(|(list, &device)| {
                list.into_iter()
                    .zip(&self.signature.results)
                    .map(|(raw, ty)| {
                        Buffer::from_raw(
                            self.client.clone(),
                            raw,
                            ty.dtype,
                            ty.shape.clone(),
                            device,
                        )
                    })
                    .collect()
            })
            .collect())
    }

    fn check_args(&self, args: &[Vec<Arg<'_>>]) -> Result<()> {
        let program = &self.signature.name;
        if args.len() != self.devices.len() {
            return Err(Error::DeviceCount {
                program: program.clone(),
                expected: self.devices.len(),
                actual: args.len(),
            });
        }
        for (list, &device) in args.iter().zip(&self.devices) {
            if list.len() != self.signature.parameters.len() {
                return Err(Error::ArgumentCount {
                    program: program.clone(),
                    expected: self.signature.parameters.len(),
                    actual: list.len(),
                });
            }
            for (index, (arg, param)) in list.iter().zip(&self.signature.parameters).enumerate() {
                let buffer = arg.buffer();
                let mismatch = |expected: String, actual: String| Error::ArgumentMismatch {
                    program: program.clone(),
                    index,
                    expected,
                    actual,
                };
                if !Arc::ptr_eq(&buffer.client, &self.client) {
                    return Err(mismatch(
                        "a buffer of this executable's client".into(),
                        "a buffer of another client".into(),
                    ));
                }
                if buffer.dtype() != param.ty.dtype || buffer.shape() != &param.ty.shape {
                    return Err(mismatch(
                        param.ty.to_string(),
                        format!("{}{}", buffer.dtype(), buffer.shape()),
                    ));
                }
                if buffer.device() != device {
                    return Err(mismatch(
                        format!("a buffer on device {device}"),
                        format!("a buffer on device {}", buffer.device()),
                    ));
                }
                if buffer.is_deleted()? {
                    return Err(mismatch(
                        "a live buffer".into(),
                        "a donated or deleted buffer".into(),
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut args = Padded::<sys::PJRT_LoadedExecutable_Destroy_Args>::new();
        args.executable = self.raw;
        if let Err(e) = pjrt_call!(self.client.api, PJRT_LoadedExecutable_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT executable failed: {e}");
        }
    }
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("program", &self.signature.name)
            .field("devices", &self.devices)
            .finish()
    }
}
