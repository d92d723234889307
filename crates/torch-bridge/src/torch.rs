//! The torch side of a tensor: its dtype, its storage's [`Storage`] handle
//! and its strided layout, read from the Python object; and new torch
//! tensors made around tpu-rs values.

use std::sync::Arc;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyBytes, PyList};
use tpu_core::{DType, HostBuffer, Runtime, Tensor};

use crate::error::{BridgeError, Result};
use crate::layout::Layout;
use crate::storage::{Handle, Padded, Storage};

/// Attribute of a torch storage that holds its [`Storage`].
const HANDLE: &str = "_tpu";

/// torch dtypes and their tpu-rs counterparts.
const DTYPES: [(&str, DType); 13] = [
    ("bool", DType::Bool),
    ("int8", DType::I8),
    ("int16", DType::I16),
    ("int32", DType::I32),
    ("int64", DType::I64),
    ("uint8", DType::U8),
    ("uint32", DType::U32),
    ("float16", DType::F16),
    ("bfloat16", DType::BF16),
    ("float32", DType::F32),
    ("float64", DType::F64),
    ("complex64", DType::C64),
    ("complex128", DType::C128),
];

/// Python objects the bridge uses on every op, looked up once.
struct Api {
    create_empty: Py<PyAny>,
    /// `torch_tpu_rs._devices.empty_tensor`: `create_empty` for `tpu:n`.
    create_empty_on: Py<PyAny>,
    construct_storage: Py<PyAny>,
    /// `torch._C._from_dlpack`: a tensor over a DLPack description.
    from_dlpack: Py<PyAny>,
    /// `aten::set_.source_Storage_storage_offset`'s redispatch, and the CPU
    /// key set it runs under: the CPU kernel binds a storage to a tensor
    /// without resizing it.
    set_storage: Py<PyAny>,
    cpu_keys: Py<PyAny>,
    devices: Vec<Py<PyAny>>,
    dtypes: Vec<(Py<PyAny>, DType)>,
    frombuffer: Py<PyAny>,
    uint8: Py<PyAny>,
}

static API: PyOnceLock<Api> = PyOnceLock::new();

fn api(py: Python<'_>) -> PyResult<&'static Api> {
    API.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let dtypes = DTYPES
            .iter()
            .map(|(name, d)| Ok((torch.getattr(*name)?.unbind(), *d)))
            .collect::<PyResult<Vec<_>>>()?;
        let c = torch.getattr("_C")?;
        let cpu = c.getattr("DispatchKey")?.getattr("CPU")?;
        let device_count = Runtime::global().map_or(1, |r| r.client().device_count().max(1));
        let devices = (0..device_count)
            .map(|i| Ok(torch.getattr("device")?.call1(("tpu", i))?.unbind()))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Api {
            create_empty: c.getattr("_acc")?.getattr("create_empty_tensor")?.unbind(),
            create_empty_on: py
                .import("torch_tpu_rs._devices")?
                .getattr("empty_tensor")?
                .unbind(),
            construct_storage: c.getattr("_construct_storage_from_data_pointer")?.unbind(),
            from_dlpack: c.getattr("_from_dlpack")?.unbind(),
            set_storage: torch
                .getattr("ops")?
                .getattr("aten")?
                .getattr("set_")?
                .getattr("source_Storage_storage_offset")?
                .getattr("_handle")?
                .getattr("redispatch_boxed")?
                .unbind(),
            cpu_keys: c.getattr("DispatchKeySet")?.call1((cpu,))?.unbind(),
            devices,
            dtypes,
            frombuffer: torch.getattr("frombuffer")?.unbind(),
            uint8: torch.getattr("uint8")?.unbind(),
        })
    })
}

/// The tpu-rs dtype of a `torch.dtype`.
pub fn dtype_of(dtype: &Bound<'_, PyAny>) -> Result<DType> {
    let api = api(dtype.py())?;
    api.dtypes
        .iter()
        .find(|(d, _)| d.bind(dtype.py()).is(dtype))
        .map(|(_, d)| *d)
        .ok_or_else(|| BridgeError::Unsupported(format!("the tpu device has no dtype {dtype}")))
}

/// The `torch.dtype` of a tpu-rs dtype.
pub fn torch_dtype(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyAny>> {
    let api = api(py)?;
    let found = api.dtypes.iter().find(|(_, d)| *d == dtype);
    Ok(found
        .map_or_else(|| py.None(), |(t, _)| t.clone_ref(py))
        .into_bound(py))
}

/// A torch tensor on the `tpu` device, as the bridge sees it.
pub struct View {
    /// Its storage.
    pub storage: Arc<Storage>,
    /// Where it sits in the storage (in elements of `dtype`).
    pub layout: Layout,
    /// Its dtype: the storage's, or a complex type and its part type on
    /// the two sides ([`crate::storage::read_as`]).
    pub dtype: DType,
}

impl View {
    /// The view of torch tensor `t`, or `None` when it is not on `tpu`.
    pub fn of(t: &Bound<'_, PyAny>) -> Result<Option<View>> {
        let py = t.py();
        // Most non-tpu inputs are CPU tensors (PyTorch wraps Python numbers
        // so); asking first spares raising and catching an AttributeError.
        if t.getattr(intern!(py, "is_cpu"))?.is_truthy()? {
            return Ok(None);
        }
        let storage = t.call_method0(intern!(py, "untyped_storage"))?;
        let storage: Arc<Storage> = match storage.getattr(intern!(py, HANDLE)) {
            Ok(handle) => handle
                .cast::<Handle>()
                .map_err(PyErr::from)?
                .get()
                .0
                .clone(),
            // A storage torch's C++ core allocated (or none of ours).
            Err(_) => {
                let address = storage
                    .call_method0(intern!(py, "data_ptr"))
                    .and_then(|a| a.extract::<u64>());
                match address.ok().and_then(crate::storage::find) {
                    Some(storage) => storage,
                    None => return Ok(None),
                }
            }
        };
        let size: Vec<usize> = t.getattr(intern!(py, "shape"))?.extract()?;
        let stride: Vec<usize> = t.call_method0(intern!(py, "stride"))?.extract()?;
        let offset: usize = t.call_method0(intern!(py, "storage_offset"))?.extract()?;
        let dtype = dtype_of(&t.getattr(intern!(py, "dtype"))?)?;
        let held = storage.dtype();
        let paired = held.is_complex() && dtype == held.real_part()
            || dtype.is_complex() && dtype.real_part() == held;
        if dtype != held && !paired {
            return Err(BridgeError::Unsupported(format!(
                "a {dtype} view of a {held} tpu storage (Tensor.view(dtype)) is not supported"
            )));
        }
        Ok(Some(View {
            storage,
            layout: Layout {
                size,
                stride,
                offset,
            },
            dtype,
        }))
    }

    /// Its value, shaped as the view.
    pub fn read(&self) -> Result<Tensor> {
        crate::storage::read_as(&self.storage, &self.layout, self.dtype)
    }

    /// Writes `value` through it with copy semantics: cast to its dtype and
    /// broadcast to its shape.
    pub fn write(&self, value: Tensor) -> Result<()> {
        let value =
            crate::kernels::broadcast(crate::kernels::cast(value, self.dtype)?, &self.layout.size)?;
        crate::storage::write_as(&self.storage, &self.layout, self.dtype, value)
    }
}

/// A new torch tensor on `tpu` holding `value` (contiguous).
pub fn wrap<'py>(py: Python<'py>, value: Tensor) -> Result<Bound<'py, PyAny>> {
    let layout = Layout::contiguous(value.shape().dims());
    tensor_over(py, &layout, Storage::holding(value)?)
}

/// A new torch tensor on `tpu`: the view `layout` of a storage holding
/// `value` (whose elements the layout stays within).
pub fn wrap_as<'py>(py: Python<'py>, value: Tensor, layout: &Layout) -> Result<Bound<'py, PyAny>> {
    tensor_over(py, layout, Storage::holding(value)?)
}

/// A new torch tensor on `tpu` holding `padded`'s elements (contiguous).
pub fn wrap_padded(py: Python<'_>, padded: Padded) -> Result<Bound<'_, PyAny>> {
    let layout = Layout::contiguous(&padded.shape());
    tensor_over(py, &layout, Storage::holding_padded(padded)?)
}

/// A new, unwritten torch tensor on `tpu:device` of `size` (contiguous).
pub fn empty<'py>(
    py: Python<'py>,
    size: &[usize],
    dtype: DType,
    device: usize,
) -> Result<Bound<'py, PyAny>> {
    // Nothing is allocated yet, but without a device there is nothing to
    // make: say why now, as CUDA does.
    Runtime::global()?;
    let count = api(py)?.devices.len();
    if device >= count {
        return Err(tpu_core::Error::DeviceOutOfRange {
            index: device,
            count,
            platform: Runtime::global()?.client().platform_name().to_string(),
        }
        .into());
    }
    tensor_over(
        py,
        &Layout::contiguous(size),
        Storage::empty(dtype, size.iter().product(), device)?,
    )
}

/// A torch tensor laid out as `layout` over a new torch storage that
/// carries `storage`: as many bytes as it holds, at its own address. A
/// layout covering the storage densely is described to torch through
/// DLPack (one call); any other binds the storage to an empty tensor.
fn tensor_over<'py>(
    py: Python<'py>,
    layout: &Layout,
    storage: Arc<Storage>,
) -> Result<Bound<'py, PyAny>> {
    let api = api(py)?;
    let device = api.devices.get(storage.device()).ok_or_else(|| {
        BridgeError::internal(format!("no torch device for tpu:{}", storage.device()))
    })?;
    let described = crate::dlpack::capsule(
        py,
        storage.address(),
        storage.device(),
        storage.dtype(),
        storage.numel(),
        layout,
    )?;
    if let Some(capsule) = described {
        let t = api.from_dlpack.bind(py).call1((capsule,))?;
        t.call_method0(intern!(py, "untyped_storage"))?
            .setattr(intern!(py, HANDLE), Bound::new(py, Handle(storage))?)?;
        return Ok(t);
    }
    let raw = api.construct_storage.bind(py).call1((
        storage.address(),
        device.bind(py),
        storage.nbytes(),
    ))?;
    let dtype = torch_dtype(py, storage.dtype())?;
    let t = match storage.device() {
        0 => api.create_empty.bind(py).call1((EMPTY, dtype))?,
        n => api.create_empty_on.bind(py).call1((n, dtype))?,
    };
    api.set_storage.bind(py).call1((
        api.cpu_keys.bind(py),
        &t,
        &raw,
        layout.offset,
        PyList::new(py, &layout.size)?,
        PyList::new(py, &layout.stride)?,
    ))?;
    raw.setattr(intern!(py, HANDLE), Bound::new(py, Handle(storage))?)?;
    Ok(t)
}

/// The size `create_empty_tensor` starts a tensor with, before its storage
/// is bound.
const EMPTY: [usize; 1] = [0];

/// The elements of a CPU torch tensor (any layout), in host memory.
pub fn host_buffer(t: &Bound<'_, PyAny>) -> Result<HostBuffer> {
    let py = t.py();
    let dtype = dtype_of(&t.getattr(intern!(py, "dtype"))?)?;
    let size: Vec<usize> = t.getattr(intern!(py, "shape"))?.extract()?;
    // Bytes through numpy's buffer: one copy, any dtype (bf16 included).
    let flat = t
        .call_method0(intern!(py, "contiguous"))?
        .call_method1(intern!(py, "reshape"), (-1,))?
        .call_method1(intern!(py, "view"), (api(py)?.uint8.bind(py),))?
        .call_method0(intern!(py, "numpy"))?;
    let bytes: Vec<u8> = flat
        .call_method0(intern!(py, "tobytes"))?
        .cast_into::<PyBytes>()
        .map_err(PyErr::from)?
        .as_bytes()
        .to_vec();
    Ok(HostBuffer::from_bytes(bytes, dtype, size)?)
}

/// The elements of a CPU torch tensor, as a tpu-rs value on device
/// `device`.
pub fn upload(t: &Bound<'_, PyAny>, device: usize) -> Result<Tensor> {
    upload_host(&host_buffer(t)?, device)
}

/// `host`'s elements as a new value on `tpu:device`.
pub fn upload_host(host: &HostBuffer, device: usize) -> Result<Tensor> {
    let runtime = Runtime::global()?;
    Ok(Tensor::from_buffer(host.upload(runtime.client(), device)?))
}

/// `value`'s elements in host memory, shaped as the value.
pub fn host_copy(value: &Tensor) -> Result<HostBuffer> {
    crate::recording::note_unreplayable("a value is read back to the host");
    // The buffer may be shared with a reshape of it: the value's shape rules.
    Ok(HostBuffer::download(&*value.elements()?)?.reshaped(value.shape().clone())?)
}

/// A CPU torch tensor holding a copy of `host`.
pub fn cpu_tensor<'py>(py: Python<'py>, host: &HostBuffer) -> Result<Bound<'py, PyAny>> {
    let api = api(py)?;
    let size = PyList::new(py, host.shape().dims())?;
    let dtype = torch_dtype(py, host.dtype())?;
    if host.bytes().is_empty() {
        let torch = py.import("torch")?;
        let kwargs = [("dtype", dtype)].into_py_dict(py)?;
        return Ok(torch.call_method("empty", (size,), Some(&kwargs))?);
    }
    let bytes = pyo3::types::PyByteArray::new(py, host.bytes());
    let flat = api.frombuffer.bind(py).call(
        (bytes,),
        Some(&[("dtype", api.uint8.bind(py))].into_py_dict(py)?),
    )?;
    Ok(flat
        .call_method1(intern!(py, "view"), (dtype,))?
        .call_method1(intern!(py, "reshape"), (size,))?)
}
