//! `triu` and `tril`: keep the upper or lower triangle of the last two dims.

use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::common::*;
use crate::support::*;

fn check(t: &TensorType, attrs: &Attrs) -> OpResult<i64> {
    if t.shape.rank() < 2 {
        return Err(invalid!(
            "needs at least 2 dimensions, got shape {}",
            t.shape
        ));
    }
    attrs.int_or("diagonal", 0)
}

/// Keeps element `(i, j)` when `j - i >= diagonal` (upper) or `<=` (lower).
fn keep(upper: bool, i: usize, j: usize, diagonal: i64) -> bool {
    let d = j as i64 - i as i64;
    if upper { d >= diagonal } else { d <= diagonal }
}

fn lower(b: &mut Builder, x: &Value, attrs: &Attrs, upper: bool) -> OpResult<Value> {
    let diagonal = check(x.ty(), attrs)?;
    Ok(triangle(b, x, upper, diagonal))
}

/// `x`'s upper (`j - i >= diagonal`) or lower (`<=`) triangle over its last
/// two dims, zeros elsewhere.
pub(crate) fn triangle(b: &mut Builder, x: &Value, upper: bool, diagonal: i64) -> Value {
    if x.shape().numel() == 0 {
        return x.clone();
    }
    let r = x.rank();
    let mn = [x.dims()[r - 2], x.dims()[r - 1]];
    let rows = b.iota(DType::I64, &mn, 0);
    let cols = b.iota(DType::I64, &mn, 1);
    let diff = b.binary("stablehlo.subtract", &cols, &rows);
    let k = b.constant(DType::I64, mn, diagonal as f64);
    let dir = if upper { Compare::Ge } else { Compare::Le };
    let mask = b.compare(dir, &diff, &k);
    let mask = b.broadcast_in_dim(&mask, x.dims(), &[r - 2, r - 1]);
    let zero = b.constant(x.dtype(), x.shape().clone(), 0.0);
    b.select(&mask, x, &zero)
}

fn reference(x: &HostTensor, attrs: &Attrs, upper: bool) -> OpResult<HostTensor> {
    let diagonal = check(&x.ty(), attrs)?;
    let shape = x.shape();
    let r = shape.rank();
    Ok(remap_tensor(x, shape.dims(), 0.0, &|ix, src| {
        src.copy_from_slice(ix);
        keep(upper, ix[r - 2], ix[r - 1], diagonal)
    }))
}

#[cfg(feature = "conformance")]
fn sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(2, 4);
    let mut attrs = Attrs::new();
    if g.below(4) != 0 {
        attrs.set("diagonal", g.below(9) as i64 - 4);
    }
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

macro_rules! triangle_op {
    ($name:literal, $upper:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                dtypes: ANY,
                infer: |x, attrs| {
                    let t = x.first().ok_or("missing input")?;
                    check(t, attrs)?;
                    Ok(vec![t.clone()])
                },
                lower: |b, x, attrs| Ok(vec![lower(b, &x[0], attrs, $upper)?]),
                reference: |x, attrs| Ok(vec![reference(one(x)?, attrs, $upper)?]),
                vjp: Some(|t, a| Ok(vec![Some(t.call1($name, &[a.grads[0]], a.attrs.clone())?)])),
                samples: || (0..10).map(|i| sample(&mut Gen::new(i))).collect(),
                arbitrary: sample,
                torch: Torch::Expr($torch),
            }
        }
    };
}

triangle_op!("triu", true, torch: r#"torch.triu(x[0], a.get("diagonal", 0))"#);
triangle_op!("tril", false, torch: r#"torch.tril(x[0], a.get("diagonal", 0))"#);
