//! `cumsum` along one dim: integers and bool accumulate to i64 as `sum`
//! does; f16 and bf16 accumulate in f32. Lowered as a log-step prefix scan
//! (shift-and-add), O(n log n).

use tpu_core::DType;
use tpu_core::host::{HostData, HostTensor, Tolerance};
#[cfg(feature = "conformance")]
use tpu_core::op::Gen;
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::kit::*;
use super::scan::prefix_scan;
use crate::support::*;

fn cumsum_dtype(d: DType) -> DType {
    if d.is_inexact() { d } else { DType::I64 }
}

fn cumsum_dim(rank: usize, attrs: &Attrs) -> OpResult<usize> {
    normalize_dim_scalar_ok(attrs.int("dim")?, rank)
}

/// Inclusive prefix sum of `x` along `dim`, in `x`'s dtype.
pub(crate) fn prefix_sum(b: &mut Builder, x: &Value, dim: usize) -> Value {
    prefix_scan(b, x, dim, 0.0, |b, y, s| bin(b, "add", y, s))
}

fn lower_cumsum(b: &mut Builder, x: &Value, attrs: &Attrs) -> OpResult<Value> {
    let dim = cumsum_dim(x.rank(), attrs)?;
    let out = cumsum_dtype(x.dtype());
    let xc = b.convert(x, accumulator(out));
    let y = prefix_sum(b, &xc, dim);
    Ok(b.convert(&y, out))
}

fn cumsum_ref(x: &HostTensor, attrs: &Attrs) -> OpResult<HostTensor> {
    let dim = cumsum_dim(x.shape().rank(), attrs)?;
    let out = cumsum_dtype(x.dtype());
    Ok(match x.data() {
        HostData::Float(a) => HostTensor::float(
            out,
            along(a, dim, |v| {
                let mut s = 0.0;
                v.iter()
                    .map(|x| {
                        s += x;
                        s
                    })
                    .collect()
            }),
        ),
        HostData::Complex(a) => HostTensor::complex(
            out,
            along(a, dim, |v| {
                let mut s = tpu_core::Complex::new(0.0, 0.0);
                v.iter()
                    .map(|x| {
                        s += x;
                        s
                    })
                    .collect()
            }),
        ),
        HostData::Int(a) => HostTensor::int(
            out,
            along(a, dim, |v| {
                let mut s = 0i64;
                v.iter()
                    .map(|&x| {
                        s = s.wrapping_add(x);
                        s
                    })
                    .collect()
            }),
        ),
    })
}

/// The gradient is the suffix sum: `sum(g) - cumsum(g) + g`.
fn cumsum_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let x = t.ty(a.inputs[0])?;
    if !x.dtype.is_inexact() {
        return Ok(vec![None]);
    }
    let dim = cumsum_dim(x.shape.rank(), a.attrs)?;
    let g = a.grads[0];
    let dims: Vec<usize> = if x.shape.rank() == 0 {
        vec![]
    } else {
        vec![dim]
    };
    let total = reduce_call(t, "sum", g, &dims, true)?;
    let c = t.call1("cumsum", &[g], Attrs::new().with("dim", dim))?;
    let r = t.sub(total, c)?;
    let r = t.add(r, g)?;
    Ok(vec![Some(t.cast(r, x.dtype)?)])
}

inventory::submit! {
    op_def! {
        name: "cumsum",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        infer: |x, attrs| {
            let t = first(x)?;
            cumsum_dim(t.shape.rank(), attrs)?;
            Ok(vec![TensorType::new(cumsum_dtype(t.dtype), t.shape.clone())])
        },
        lower: |b, x, attrs| Ok(vec![lower_cumsum(b, &x[0], attrs)?]),
        reference: |x, attrs| Ok(vec![cumsum_ref(one(x)?, attrs)?]),
        vjp: Some(cumsum_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: || (0..12).map(|i| dim_sample(&mut Gen::new(900 + i), REAL, -3.0, 3.0)).chain((0..4).map(|i| dim_sample(&mut Gen::new(920 + i), COMPLEX, -3.0, 3.0))).collect(),
        arbitrary: |g: &mut Gen| dim_sample(g, ANY, -3.0, 3.0),
        torch: Torch::Expr(r#"torch.cumsum(x[0], a["dim"])"#),
    }
}
