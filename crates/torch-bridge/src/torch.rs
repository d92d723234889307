//! The torch side of a tensor: its dtype, its storage's [`Storage`] handle
//! and its strided layout, read from the Python object; and new torch
//! tensors made around tpu-rs values.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyBytes, PyList};
use tpu_core::{DType, HostBuffer, Runtime, Tensor};

use crate::error::{BridgeError, Result};
use crate::storage::{Layout, Storage, read};

/// Attribute of a torch storage that holds its [`Storage`].
const HANDLE: &str = "_tpu";

/// torch dtypes and their tpu-rs counterparts.
const DTYPES: [(&str, DType); 11] = [
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
];

/// Python objects the bridge uses on every op, looked up once.
struct Api {
    create_empty: Py<PyAny>,
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
        Ok(Api {
            create_empty: torch
                .getattr("_C")?
                .getattr("_acc")?
                .getattr("create_empty_tensor")?
                .unbind(),
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
    pub storage: Py<Storage>,
    /// Where it sits in the storage.
    pub layout: Layout,
}

impl View {
    /// The view of torch tensor `t`, or `None` when it is not on `tpu`.
    pub fn of(t: &Bound<'_, PyAny>) -> Result<Option<View>> {
        let py = t.py();
        let storage = t.call_method0(intern!(py, "untyped_storage"))?;
        let Ok(handle) = storage.getattr(intern!(py, HANDLE)) else {
            return Ok(None);
        };
        let storage: Py<Storage> = handle.extract().map_err(PyErr::from)?;
        let size: Vec<usize> = t.getattr(intern!(py, "shape"))?.extract()?;
        let stride: Vec<usize> = t.call_method0(intern!(py, "stride"))?.extract()?;
        let offset: usize = t.call_method0(intern!(py, "storage_offset"))?.extract()?;
        let dtype = dtype_of(&t.getattr(intern!(py, "dtype"))?)?;
        let held = storage.get().dtype();
        if dtype != held {
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
        }))
    }

    /// Its value, shaped as the view.
    pub fn read(&self) -> Result<Tensor> {
        read(self.storage.get(), &self.layout)
    }
}

/// A new torch tensor on `tpu` holding `value` (contiguous).
pub fn wrap<'py>(py: Python<'py>, value: Tensor) -> Result<Bound<'py, PyAny>> {
    let api = api(py)?;
    let size = PyList::new(py, value.shape().dims())?;
    let dtype = torch_dtype(py, value.dtype())?;
    let t = api.create_empty.bind(py).call1((size, dtype))?;
    attach(&t, Storage::holding(value)?)?;
    Ok(t)
}

/// Makes `storage` the tpu-rs side of torch tensor `t`'s storage.
pub fn attach(t: &Bound<'_, PyAny>, storage: Storage) -> Result<()> {
    let py = t.py();
    t.call_method0(intern!(py, "untyped_storage"))?
        .setattr(intern!(py, HANDLE), Bound::new(py, storage)?)?;
    Ok(())
}

/// A new, unwritten torch tensor on `tpu` of `size` (contiguous).
pub fn empty<'py>(py: Python<'py>, size: &[usize], dtype: DType) -> Result<Bound<'py, PyAny>> {
    let api = api(py)?;
    let t = api
        .create_empty
        .bind(py)
        .call1((PyList::new(py, size)?, torch_dtype(py, dtype)?))?;
    attach(&t, Storage::empty(dtype, size.iter().product(), 0))?;
    Ok(t)
}

/// The elements of a contiguous CPU torch tensor, as a tpu-rs value on
/// device `device`.
pub fn upload(t: &Bound<'_, PyAny>, device: usize) -> Result<Tensor> {
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
    let runtime = Runtime::global()?;
    let buffer = HostBuffer::from_bytes(bytes, dtype, size)?.upload(runtime.client(), device)?;
    Ok(Tensor::from_buffer(buffer))
}

/// A CPU torch tensor with `value`'s elements.
pub fn download<'py>(py: Python<'py>, value: &Tensor) -> Result<Bound<'py, PyAny>> {
    let host = HostBuffer::download(&*value.buffer()?)?;
    let api = api(py)?;
    let size = PyList::new(py, value.shape().dims())?;
    let dtype = torch_dtype(py, value.dtype())?;
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
