//! Building blocks for CPU references: elementwise maps and broadcasting
//! zips in f64 / i64.

use ndarray::{ArrayD, IxDyn, Zip};
use tpu_core::host::{HostData, HostTensor};
use tpu_core::invalid;
use tpu_core::op::{OpError, OpResult};
use tpu_core::{Complex, DType, Shape};

/// Broadcasts an array to `shape` (NumPy rules), as an owned array.
pub fn broadcast_array<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> OpResult<ArrayD<T>> {
    a.broadcast(IxDyn(shape))
        .map(|v| v.to_owned())
        .ok_or_else(|| invalid!("cannot broadcast {:?} to {shape:?}", a.shape()))
}

/// Applies `f` to each value of `x` computed as float, giving dtype `out`.
pub fn map_float(x: &HostTensor, out: DType, f: impl Fn(f64) -> f64) -> HostTensor {
    HostTensor::float(out, x.to_f64().mapv(f))
}

/// Applies `fi` to integer data or `ff` to float data, keeping the dtype.
pub fn map_same(x: &HostTensor, ff: impl Fn(f64) -> f64, fi: impl Fn(i64) -> i64) -> HostTensor {
    match x.data() {
        HostData::Float(a) => HostTensor::float(x.dtype(), a.mapv(ff)),
        HostData::Int(a) => HostTensor::int(x.dtype(), a.mapv(fi)),
        // Ops that take complex numbers list them and do not come here.
        HostData::Complex(_) => HostTensor::float(x.dtype(), x.to_f64().mapv(ff)),
    }
}

/// Applies a predicate to each value, giving bool.
pub fn map_predicate(
    x: &HostTensor,
    ff: impl Fn(f64) -> bool,
    fi: impl Fn(i64) -> bool,
) -> HostTensor {
    let values = match x.data() {
        HostData::Float(a) => a.mapv(|v| i64::from(ff(v))),
        HostData::Int(a) => a.mapv(|v| i64::from(fi(v))),
        HostData::Complex(_) => x.to_f64().mapv(|v| i64::from(ff(v))),
    };
    HostTensor::int(DType::Bool, values)
}

/// The output shape of broadcasting `a` with `b`.
fn out_shape(a: &HostTensor, b: &HostTensor) -> OpResult<Shape> {
    super::broadcast_shapes(&a.shape(), &b.shape())
}

/// Zips two float arrays after broadcasting.
pub fn zip_f64(
    a: &ArrayD<f64>,
    b: &ArrayD<f64>,
    shape: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> OpResult<ArrayD<f64>> {
    let (a, b) = (broadcast_array(a, shape)?, broadcast_array(b, shape)?);
    Ok(Zip::from(&a).and(&b).map_collect(|&x, &y| f(x, y)))
}

/// Zips two complex arrays after broadcasting.
pub fn zip_complex(
    a: &ArrayD<Complex<f64>>,
    b: &ArrayD<Complex<f64>>,
    shape: &[usize],
    f: impl Fn(Complex<f64>, Complex<f64>) -> Complex<f64>,
) -> OpResult<ArrayD<Complex<f64>>> {
    let (a, b) = (broadcast_array(a, shape)?, broadcast_array(b, shape)?);
    Ok(Zip::from(&a).and(&b).map_collect(|&x, &y| f(x, y)))
}

/// Zips two integer arrays after broadcasting.
pub fn zip_i64(
    a: &ArrayD<i64>,
    b: &ArrayD<i64>,
    shape: &[usize],
    f: impl Fn(i64, i64) -> i64,
) -> OpResult<ArrayD<i64>> {
    let (a, b) = (broadcast_array(a, shape)?, broadcast_array(b, shape)?);
    Ok(Zip::from(&a).and(&b).map_collect(|&x, &y| f(x, y)))
}

/// A broadcasting binary op computed in dtype `compute` (inputs cast to it
/// first), giving dtype `out`: floats through `ff`, integers through `fi`.
pub fn binary(
    a: &HostTensor,
    b: &HostTensor,
    compute: DType,
    out: DType,
    ff: impl Fn(f64, f64) -> f64,
    fi: impl Fn(i64, i64) -> i64,
) -> OpResult<HostTensor> {
    let shape = out_shape(a, b)?;
    let (a, b) = (a.cast(compute), b.cast(compute));
    if compute.is_complex() {
        Err(complex_unsupported())
    } else if compute.is_float() {
        Ok(HostTensor::float(
            out,
            zip_f64(&a.to_f64(), &b.to_f64(), shape.dims(), ff)?,
        ))
    } else {
        Ok(HostTensor::int(
            out,
            zip_i64(&a.to_i64(), &b.to_i64(), shape.dims(), fi)?,
        ))
    }
}

/// A broadcasting comparison computed in dtype `compute`, giving bool.
pub fn compare(
    a: &HostTensor,
    b: &HostTensor,
    compute: DType,
    ff: impl Fn(f64, f64) -> bool,
    fi: impl Fn(i64, i64) -> bool,
) -> OpResult<HostTensor> {
    binary(
        a,
        b,
        compute,
        DType::Bool,
        |x, y| f64::from(u8::from(ff(x, y))),
        |x, y| i64::from(fi(x, y)),
    )
}

/// A tensor of `shape` from row-major values.
pub fn tensor_f64(dtype: DType, shape: &[usize], values: Vec<f64>) -> OpResult<HostTensor> {
    let n = values.len();
    HostTensor::from_f64(dtype, shape.to_vec(), values)
        .ok_or_else(|| invalid!("{n} values do not fill {shape:?}"))
}

/// The only input of a unary reference.
pub fn one(inputs: &[HostTensor]) -> OpResult<&HostTensor> {
    inputs.first().ok_or_else(|| "missing input".into())
}

/// `x` with its elements regrouped into `shape` (same count).
pub fn reshape_to(x: &HostTensor, shape: &Shape) -> OpResult<HostTensor> {
    let dims = IxDyn(shape.dims());
    let bad = |e: ndarray::ShapeError| format!("cannot reshape {} to {shape}: {e}", x.shape());
    Ok(match x.data() {
        HostData::Float(a) => {
            let v: Vec<f64> = a.iter().copied().collect();
            HostTensor::float(x.dtype(), ArrayD::from_shape_vec(dims, v).map_err(bad)?)
        }
        HostData::Int(a) => {
            let v: Vec<i64> = a.iter().copied().collect();
            HostTensor::int(x.dtype(), ArrayD::from_shape_vec(dims, v).map_err(bad)?)
        }
        HostData::Complex(a) => {
            let v: Vec<_> = a.iter().copied().collect();
            HostTensor::complex(x.dtype(), ArrayD::from_shape_vec(dims, v).map_err(bad)?)
        }
    })
}

/// The error of a reference that computes on real numbers only, should a
/// complex tensor reach it (dispatch refuses complex inputs to ops that do
/// not list complex dtypes, so this names a broken record).
pub fn complex_unsupported() -> OpError {
    OpError::unsupported("the reference takes no complex tensors")
}
