//! `slice`, `narrow`, `select` and `pad`.

use tpu_core::Shape;
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::out_of_range;
use tpu_core::stablehlo::{Builder, TensorType, Value};

use super::common::*;
use crate::support::*;

/// A strided range along one dim: `start, start + step, ..` (`len` items).
#[derive(Clone, Copy, Debug)]
struct Range {
    dim: usize,
    start: usize,
    step: usize,
    len: usize,
}

impl Range {
    fn out_shape(&self, shape: &Shape) -> Shape {
        let mut dims = shape.dims().to_vec();
        dims[self.dim] = self.len;
        Shape::new(dims)
    }

    fn lower(&self, b: &mut Builder, x: &Value) -> Value {
        let r = x.rank();
        let mut start = vec![0; r];
        let mut limit = x.dims().to_vec();
        let mut strides = vec![1; r];
        start[self.dim] = self.start;
        limit[self.dim] =
            self.start + self.len.saturating_sub(1) * self.step + usize::from(self.len > 0);
        strides[self.dim] = self.step;
        b.slice(x, &start, &limit, &strides)
    }

    fn reference(&self, x: &HostTensor) -> HostTensor {
        let out = self.out_shape(&x.shape());
        remap_tensor(x, out.dims(), 0.0, &|ix, src| {
            src.copy_from_slice(ix);
            src[self.dim] = self.start + ix[self.dim] * self.step;
            true
        })
    }

    /// The gradient of the input: `g` spread back with zeros in between and
    /// around (pad only).
    fn vjp(&self, t: &mut dyn Tape, g: Var, input: Var) -> OpResult<Var> {
        let shape = t.ty(input)?.shape;
        let size = shape.dims()[self.dim] as i64;
        let mut g = g;
        if self.step > 1 {
            // [.., n, ..] -> [.., n, 1, ..] -> pad to [.., n, step, ..] -> [.., n*step, ..].
            let gs = t.ty(g)?.shape;
            let mut dims = gs.dims().to_vec();
            dims.insert(self.dim + 1, 1);
            g = t.reshape(g, &Shape::new(dims.clone()))?;
            g = pad_dim(t, g, self.dim + 1, 0, self.step as i64 - 1)?;
            dims.remove(self.dim + 1);
            dims[self.dim] = self.len * self.step;
            g = t.reshape(g, &Shape::new(dims))?;
        }
        let covered = (self.len * self.step) as i64;
        let start = self.start as i64;
        pad_dim(t, g, self.dim, start, size - start - covered)
    }
}

/// `slice(dim, start=0, end=max, step=1)` with PyTorch's clamping.
fn slice_range(shape: &Shape, attrs: &Attrs) -> OpResult<Range> {
    if shape.rank() == 0 {
        return Err("slice cannot be applied to a 0-dim tensor".into());
    }
    let dim = normalize_dim(attrs.int_or("dim", 0)?, shape.rank())?;
    let size = shape.dims()[dim] as i64;
    let step = attrs.int_or("step", 1)?;
    if step <= 0 {
        return Err(invalid!("slice step must be positive, got {step}"));
    }
    let clamp = |v: i64| {
        let v = if v < 0 { v.saturating_add(size) } else { v };
        v.clamp(0, size)
    };
    let start = clamp(attrs.int_or("start", 0)?);
    let end = clamp(attrs.int_or("end", i64::MAX)?).max(start);
    let len = if end == start {
        0
    } else {
        (end - start - 1) / step + 1
    };
    Ok(Range {
        dim,
        start: start as usize,
        step: step as usize,
        len: len as usize,
    })
}

#[cfg(feature = "conformance")]
fn slice_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(1, 4);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank).unwrap_or(0);
    let size = shape.dims()[d] as i64;
    let mut attrs = Attrs::new().with("dim", dim);
    let pick = |g: &mut Gen| g.below((2 * size + 5) as usize) as i64 - size - 2;
    if g.below(4) != 0 {
        attrs.set("start", pick(g));
    }
    if g.below(4) != 0 {
        attrs.set("end", pick(g));
    }
    if g.below(3) != 0 {
        attrs.set("step", 1 + g.below(4) as i64);
    }
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

#[cfg(feature = "conformance")]
fn slice_samples() -> Vec<Sample> {
    let mut g = Gen::new(0x511c);
    let x = |g: &mut Gen, dims: &[usize]| g.tensor(tpu_core::DType::F32, &Shape::from(dims));
    let mut out: Vec<Sample> = (0..8).map(|i| slice_sample(&mut Gen::new(i))).collect();
    let fixed: &[(&[usize], i64, i64, i64, i64)] = &[
        (&[7], 0, 1, 6, 2),
        (&[7], 0, -3, 1000, 1),
        (&[3, 127], 1, 5, -5, 3),
        (&[4, 5], -2, -100, 2, 1),
        (&[4, 5], 0, 3, 1, 1),
        (&[0, 3], 0, 0, 5, 2),
        (&[2, 7], 1, 1, 7, 7),
    ];
    for &(dims, dim, start, end, step) in fixed {
        let attrs = Attrs::new()
            .with("dim", dim)
            .with("start", start)
            .with("end", end)
            .with("step", step);
        out.push(Sample::new(vec![x(&mut g, dims)], attrs));
    }
    out
}

inventory::submit! {
    op_def! {
        name: "slice",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let r = slice_range(&t.shape, attrs)?;
            Ok(vec![TensorType::new(t.dtype, r.out_shape(&t.shape))])
        },
        lower: |b, x, attrs| Ok(vec![slice_range(x[0].shape(), attrs)?.lower(b, &x[0])]),
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![slice_range(&x.shape(), attrs)?.reference(x)])
        },
        vjp: Some(|t, a| {
            let r = slice_range(&t.ty(a.inputs[0])?.shape, a.attrs)?;
            Ok(vec![Some(r.vjp(t, a.grads[0], a.inputs[0])?)])
        }),
        samples: slice_samples,
        arbitrary: slice_sample,
        torch: Torch::Expr(r#"torch.ops.aten.slice(x[0], a.get("dim", 0), a.get("start"), a.get("end"), a.get("step", 1))"#),
    }
}

/// `narrow(dim, start, length)`: `start` in `[-size, size]`, and the range
/// must fit.
fn narrow_range(shape: &Shape, attrs: &Attrs) -> OpResult<Range> {
    if shape.rank() == 0 {
        return Err("narrow cannot be applied to a 0-dim tensor".into());
    }
    let dim = normalize_dim(attrs.int("dim")?, shape.rank())?;
    let size = shape.dims()[dim] as i64;
    let start = attrs.int("start")?;
    let length = attrs.int("length")?;
    if start < -size || start > size {
        return Err(out_of_range!(
            "start {start} is out of range for dimension {dim} of size {size}"
        ));
    }
    let start = if start < 0 { start + size } else { start };
    if length < 0 || start + length > size {
        return Err(invalid!(
            "start {start} + length {length} exceeds dimension {dim} of size {size}"
        ));
    }
    Ok(Range {
        dim,
        start: start as usize,
        step: 1,
        len: length as usize,
    })
}

#[cfg(feature = "conformance")]
fn narrow_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(1, 4);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank).unwrap_or(0);
    let size = shape.dims()[d];
    let start = g.below(size + 1);
    let length = g.below(size - start + 1);
    let start = if g.bool() && start > 0 {
        start as i64 - size as i64
    } else {
        start as i64
    };
    let attrs = Attrs::new()
        .with("dim", dim)
        .with("start", start)
        .with("length", length as i64);
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "narrow",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let r = narrow_range(&t.shape, attrs)?;
            Ok(vec![TensorType::new(t.dtype, r.out_shape(&t.shape))])
        },
        lower: |b, x, attrs| Ok(vec![narrow_range(x[0].shape(), attrs)?.lower(b, &x[0])]),
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![narrow_range(&x.shape(), attrs)?.reference(x)])
        },
        vjp: Some(|t, a| {
            let r = narrow_range(&t.ty(a.inputs[0])?.shape, a.attrs)?;
            Ok(vec![Some(r.vjp(t, a.grads[0], a.inputs[0])?)])
        }),
        samples: || (0..10).map(|i| narrow_sample(&mut Gen::new(i))).collect(),
        arbitrary: narrow_sample,
        torch: Torch::Expr(r#"torch.narrow(x[0], a["dim"], a["start"], a["length"])"#),
    }
}

/// `select(dim, index)`: a length-1 range; the dim is then dropped.
fn select_range(shape: &Shape, attrs: &Attrs) -> OpResult<(Range, Shape)> {
    if shape.rank() == 0 {
        return Err("select cannot be applied to a 0-dim tensor".into());
    }
    let dim = normalize_dim(attrs.int("dim")?, shape.rank())?;
    let size = shape.dims()[dim] as i64;
    let index = attrs.int("index")?;
    if index < -size || index >= size {
        return Err(out_of_range!(
            "index {index} is out of range for dimension {dim} of size {size}"
        ));
    }
    let index = if index < 0 { index + size } else { index };
    let mut dims = shape.dims().to_vec();
    dims.remove(dim);
    let range = Range {
        dim,
        start: index as usize,
        step: 1,
        len: 1,
    };
    Ok((range, Shape::new(dims)))
}

#[cfg(feature = "conformance")]
fn select_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape_nonempty(1, 4);
    let rank = shape.rank();
    let dim = random_dim(g, rank);
    let d = normalize_dim(dim, rank).unwrap_or(0);
    let size = shape.dims()[d] as i64;
    let index = g.below(size as usize) as i64 - if g.bool() { size } else { 0 };
    let attrs = Attrs::new().with("dim", dim).with("index", index);
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "select",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(t.dtype, select_range(&t.shape, attrs)?.1)])
        },
        lower: |b, x, attrs| {
            let (r, out) = select_range(x[0].shape(), attrs)?;
            let s = r.lower(b, &x[0]);
            Ok(vec![b.reshape(&s, out.dims())])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let (r, out) = select_range(&x.shape(), attrs)?;
            Ok(vec![reshape_to(&r.reference(x), &out)?])
        },
        vjp: Some(|t, a| {
            let shape = t.ty(a.inputs[0])?.shape;
            let (r, _) = select_range(&shape, a.attrs)?;
            let kept = r.out_shape(&shape);
            let g = t.reshape(a.grads[0], &kept)?;
            Ok(vec![Some(r.vjp(t, g, a.inputs[0])?)])
        }),
        samples: || (0..10).map(|i| select_sample(&mut Gen::new(i))).collect(),
        arbitrary: select_sample,
        torch: Torch::Expr(r#"torch.select(x[0], a["dim"], a["index"])"#),
    }
}

/// Low and high padding per dim (from `pad`, last dim first, as
/// `torch.nn.functional.pad`) and the padded shape.
fn pad_plan(shape: &Shape, attrs: &Attrs) -> OpResult<(Vec<i64>, Vec<i64>, Shape)> {
    let pad = attrs.ints("pad")?;
    attrs.float_or("value", 0.0)?;
    let rank = shape.rank();
    if pad.len() % 2 != 0 || pad.len() / 2 > rank {
        return Err(invalid!(
            "pad {pad:?} must hold a (low, high) pair for at most {rank} dims"
        ));
    }
    let mut lo = vec![0i64; rank];
    let mut hi = vec![0i64; rank];
    for (k, pair) in pad.chunks(2).enumerate() {
        let d = rank - 1 - k;
        lo[d] = pair[0];
        hi[d] = pair[1];
    }
    let mut dims = Vec::with_capacity(rank);
    for d in 0..rank {
        let n = (shape.dims()[d] as i64)
            .checked_add(lo[d])
            .and_then(|v| v.checked_add(hi[d]))
            .filter(|&n| n >= 0)
            .ok_or_else(|| {
                format!(
                    "padding ({}, {}) of dimension {d} of size {} gives a negative size",
                    lo[d],
                    hi[d],
                    shape.dims()[d]
                )
            })?;
        dims.push(n as usize);
    }
    Ok((lo, hi, Shape::new(dims)))
}

fn pad_ref(x: &HostTensor, attrs: &Attrs) -> OpResult<HostTensor> {
    let (lo, _, out) = pad_plan(&x.shape(), attrs)?;
    let value = attrs.float_or("value", 0.0)?;
    let sizes = x.shape();
    Ok(remap_tensor(x, out.dims(), value, &|ix, src| {
        for d in 0..ix.len() {
            let s = ix[d] as i64 - lo[d];
            if s < 0 || s >= sizes.dims()[d] as i64 {
                return false;
            }
            src[d] = s as usize;
        }
        true
    }))
}

#[cfg(feature = "conformance")]
fn pad_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(ANY);
    let shape = g.shape(0, 4);
    let rank = shape.rank();
    let n = g.below(rank + 1);
    let mut pad = Vec::new();
    for k in 0..n {
        let size = shape.dims()[rank - 1 - k] as i64;
        let lo = g.below(5) as i64 - 2;
        let lo = lo.max(-size);
        let hi = (g.below(5) as i64 - 2).max(-(size + lo));
        pad.push(lo);
        pad.push(hi);
    }
    let value = if dtype.is_float() {
        g.uniform(-2.0, 2.0)
    } else {
        g.below(5) as f64
    };
    let attrs = Attrs::new().with("pad", pad).with("value", value);
    Sample::new(vec![g.tensor(dtype, &shape)], attrs)
}

inventory::submit! {
    op_def! {
        name: "pad",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            Ok(vec![TensorType::new(t.dtype, pad_plan(&t.shape, attrs)?.2)])
        },
        lower: |b, x, attrs| {
            let (lo, hi, _) = pad_plan(x[0].shape(), attrs)?;
            let value = b.constant(x[0].dtype(), Shape::scalar(), attrs.float_or("value", 0.0)?);
            let interior = vec![0; lo.len()];
            Ok(vec![b.pad(&x[0], &value, &lo, &hi, &interior)])
        },
        reference: |x, attrs| Ok(vec![pad_ref(one(x)?, attrs)?]),
        vjp: Some(|t, a| {
            let neg: Vec<i64> = a.attrs.ints("pad")?.iter().map(|p| -p).collect();
            let attrs = Attrs::new().with("pad", neg).with("value", 0.0);
            Ok(vec![Some(t.call1("pad", &[a.grads[0]], attrs)?)])
        }),
        samples: || (0..10).map(|i| pad_sample(&mut Gen::new(i))).collect(),
        arbitrary: pad_sample,
        // Pads first, then crops: F.pad crops first, and rejects a crop larger
        // than the dim even where the other side's padding makes up for it.
        torch: Torch::Expr(r#"F.pad(F.pad(x[0], [max(p, 0) for p in a["pad"]], value=a.get("value", 0.0)), [min(p, 0) for p in a["pad"]])"#),
    }
}
