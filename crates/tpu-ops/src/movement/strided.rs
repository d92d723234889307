//! `as_strided` and `as_strided_scatter`: views of a tensor's flat row-major
//! elements (what PyTorch calls its storage) by explicit size, stride and
//! offset.

use std::cmp::Reverse;
use tpu_core::invalid;
use tpu_core::op_def;

use tpu_core::host::HostTensor;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{DType, Shape};

use super::common::*;
use crate::support::*;

/// A strided view of `numel` flat elements, checked to stay in bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct View {
    size: Vec<usize>,
    stride: Vec<usize>,
    offset: usize,
}

impl View {
    /// The view the `size`, `stride` and `offset` (default 0) attributes
    /// describe over `numel` elements.
    fn parse(numel: usize, attrs: &Attrs) -> OpResult<View> {
        let size = attrs.ints("size")?;
        let stride = attrs.ints("stride")?;
        let offset = attrs.int_or("offset", 0)?;
        if size.len() != stride.len() {
            return Err(invalid!(
                "size {size:?} and stride {stride:?} must have the same length"
            ));
        }
        if let Some(s) = size.iter().find(|&&s| s < 0) {
            return Err(invalid!("size {size:?} has a negative entry {s}"));
        }
        if let Some(s) = stride.iter().find(|&&s| s < 0) {
            return Err(invalid!("stride {stride:?} has a negative entry {s}"));
        }
        if offset < 0 {
            return Err(invalid!("offset must be >= 0, got {offset}"));
        }
        let view = View {
            size: size.iter().map(|&s| s as usize).collect(),
            stride: stride.iter().map(|&s| s as usize).collect(),
            offset: offset as usize,
        };
        // An empty view reaches nothing, whatever its strides and offset.
        if view.size.contains(&0) {
            return Ok(view);
        }
        let overflow =
            || format!("a view of size {size:?}, stride {stride:?} and offset {offset} overflows");
        view.size
            .iter()
            .try_fold(1usize, |n, &s| n.checked_mul(s))
            .ok_or_else(overflow)?;
        let last = view
            .size
            .iter()
            .zip(&view.stride)
            .try_fold(view.offset, |p, (&s, &t)| {
                (s - 1).checked_mul(t).and_then(|v| p.checked_add(v))
            })
            .ok_or_else(overflow)?;
        if last >= numel {
            return Err(invalid!(
                "a view of size {size:?}, stride {stride:?} and offset {offset} reaches element {last}, but the input has only {numel} elements"
            ));
        }
        Ok(view)
    }

    /// The attributes describing this view.
    fn attrs(&self) -> Attrs {
        Attrs::new()
            .with("size", self.size.clone())
            .with("stride", self.stride.clone())
            .with("offset", self.offset)
    }

    fn shape(&self) -> Shape {
        Shape::new(self.size.clone())
    }

    fn numel(&self) -> usize {
        self.size.iter().product()
    }

    /// How many flat elements the view needs: one past its last position.
    #[cfg(feature = "conformance")]
    fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        let last: Vec<usize> = self.size.iter().map(|s| s - 1).collect();
        self.position(&last) + 1
    }

    /// The flat position of view element `ix`.
    fn position(&self, ix: &[usize]) -> usize {
        self.offset
            + ix.iter()
                .zip(&self.stride)
                .map(|(i, t)| i * t)
                .sum::<usize>()
    }

    /// The dims that move through memory: size above 1, stride above 0.
    fn live(&self) -> Vec<usize> {
        (0..self.size.len())
            .filter(|&d| self.size[d] > 1 && self.stride[d] > 0)
            .collect()
    }

    /// The first dim that repeats one element (stride 0, size above 1).
    fn broadcast_dim(&self) -> Option<usize> {
        (0..self.size.len()).find(|&d| self.size[d] > 1 && self.stride[d] == 0)
    }

    /// True when the view is `size` laid out row-major (size-1 dims may
    /// have any stride, as in PyTorch).
    fn is_contiguous(&self) -> bool {
        let mut expected = 1usize;
        for d in (0..self.size.len()).rev() {
            if self.size[d] == 1 {
                continue;
            }
            if self.stride[d] != expected {
                return false;
            }
            expected = expected.saturating_mul(self.size[d]);
        }
        true
    }

    /// True when no two elements share a position. Sufficient test: sorted
    /// by stride, each stride exceeds the span of the smaller ones.
    fn is_non_overlapping(&self) -> bool {
        let mut dims: Vec<(usize, usize)> = (0..self.size.len())
            .filter(|&d| self.size[d] > 1)
            .map(|d| (self.stride[d], self.size[d]))
            .collect();
        dims.sort_unstable();
        let mut span = 0usize;
        for (t, s) in dims {
            if t <= span {
                return false;
            }
            span = span.saturating_add(t.saturating_mul(s - 1));
        }
        true
    }
}

// ---- Lowering. ----

/// `x[start..limit:step]` of a rank-1 `x`, or `x` itself when that is all
/// of it.
fn slice1(b: &mut Builder, x: &Value, start: usize, limit: usize, step: usize) -> Value {
    if start == 0 && limit == x.dims()[0] && step == 1 {
        x.clone()
    } else {
        b.slice(x, &[start], &[limit], &[step])
    }
}

/// The live dims of `v` by stride, largest first, when they read as a
/// strided slice of one contiguous block: each stride divides the one
/// before it, with room for its dim in between (so no two elements meet).
fn block_order(v: &View, live: &[usize]) -> Option<Vec<usize>> {
    let mut order = live.to_vec();
    order.sort_by_key(|&d| Reverse(v.stride[d]));
    let fits = order.windows(2).all(|w| {
        let (outer, inner) = (v.stride[w[0]], v.stride[w[1]]);
        outer % inner == 0 && outer / inner >= v.size[w[1]]
    });
    fits.then_some(order)
}

/// The live dims of `v` in `order` (from [`block_order`]) read out of
/// `flat` without a gather. With sizes `s` and strides `t` in that order,
/// the block `flat[offset .. offset + s0*t0]` (zero-padded past the end)
/// is reshaped to `[s0, t0/t1, .., t(k-2)/t(k-1), t(k-2)]` and sliced to
/// `[s0, s1, .., s(k-1)]`, the last dim with step `t(k-1)`.
fn lower_block(b: &mut Builder, flat: &Value, v: &View, order: &[usize]) -> Value {
    let s: Vec<usize> = order.iter().map(|&d| v.size[d]).collect();
    let t: Vec<usize> = order.iter().map(|&d| v.stride[d]).collect();
    let k = order.len();
    match k {
        0 => {
            let one = slice1(b, flat, v.offset, v.offset + 1, 1);
            b.reshape(&one, &[])
        }
        1 => slice1(b, flat, v.offset, v.offset + (s[0] - 1) * t[0] + 1, t[0]),
        _ => {
            let n = flat.dims()[0];
            let end = v.offset + s[0] * t[0];
            let region = if end > n {
                // A negative low pad crops the front.
                let zero = b.constant(flat.dtype(), Shape::scalar(), 0.0);
                b.pad(
                    flat,
                    &zero,
                    &[-(v.offset as i64)],
                    &[(end - n) as i64],
                    &[0],
                )
            } else {
                slice1(b, flat, v.offset, end, 1)
            };
            let mut block = vec![s[0]];
            block.extend((1..k - 1).map(|j| t[j - 1] / t[j]));
            block.push(t[k - 2]);
            let cube = b.reshape(&region, &block);
            if block == s {
                return cube;
            }
            let mut limit = s[..k - 1].to_vec();
            limit.push((s[k - 1] - 1) * t[k - 1] + 1);
            let mut step = vec![1; k - 1];
            step.push(t[k - 1]);
            b.slice(&cube, &vec![0; k], &limit, &step)
        }
    }
}

/// The flat positions `offset + Σ i_d * strides_d` over `dims`, computed
/// in the program, as a rank-1 i64 tensor.
fn positions(b: &mut Builder, dims: &[usize], strides: &[usize], offset: usize) -> Value {
    let mut pos = (offset > 0).then(|| b.constant(DType::I64, dims.to_vec(), offset as f64));
    for d in 0..dims.len() {
        if dims[d] > 1 && strides[d] > 0 {
            let i = b.iota(DType::I64, dims, d);
            let t = b.constant(DType::I64, dims.to_vec(), strides[d] as f64);
            let term = b.binary("stablehlo.multiply", &i, &t);
            pos = Some(match pos {
                Some(p) => b.binary("stablehlo.add", &p, &term),
                None => term,
            });
        }
    }
    let pos = pos.unwrap_or_else(|| b.constant(DType::I64, dims.to_vec(), 0.0));
    b.reshape(&pos, &[dims.iter().product()])
}

/// `as_strided`: the live dims are read as a block slice when they fit one
/// (contiguous views, permutes, stepped slices, selects), else gathered;
/// size-1 and stride-0 dims are then added by reshape or broadcast.
fn lower_view(b: &mut Builder, x: &Value, v: &View) -> Value {
    if v.numel() == 0 {
        return zeros(b, &TensorType::new(x.dtype(), v.shape()));
    }
    let flat = b.reshape(x, &[x.shape().numel()]);
    let live = v.live();
    let live_sizes: Vec<usize> = live.iter().map(|&d| v.size[d]).collect();
    let picked = match block_order(v, &live) {
        Some(order) => {
            let sorted = lower_block(b, &flat, v, &order);
            // `live` is ascending, so sorting positions by dim undoes `order`.
            let mut perm: Vec<usize> = (0..order.len()).collect();
            perm.sort_by_key(|&j| order[j]);
            b.transpose(&sorted, &perm)
        }
        None => {
            let strides: Vec<usize> = live.iter().map(|&d| v.stride[d]).collect();
            let idx = positions(b, &live_sizes, &strides, v.offset);
            let got = gather_elements(b, &flat, &idx, 0);
            b.reshape(&got, &live_sizes)
        }
    };
    if v.broadcast_dim().is_some() {
        b.broadcast_in_dim(&picked, &v.size, &live)
    } else {
        b.reshape(&picked, &v.size)
    }
}

/// `as_strided_scatter`: a contiguous view is one `dynamic_update_slice`
/// (or just `src` when it covers everything); others scatter element-wise.
fn lower_scatter(b: &mut Builder, base: &Value, src: &Value, v: &View) -> Value {
    let (n, m) = (base.shape().numel(), v.numel());
    if m == 0 {
        return base.clone();
    }
    let contiguous = v.is_contiguous();
    if contiguous && v.offset == 0 && m == n {
        return b.reshape(src, base.dims());
    }
    let flat = b.reshape(base, &[n]);
    let upd = b.reshape(src, &[m]);
    let out = if contiguous {
        let start = b.constant(DType::I64, Shape::scalar(), v.offset as f64);
        b.op1(
            "stablehlo.dynamic_update_slice",
            &[&flat, &upd, &start],
            "",
            flat.ty().clone(),
        )
    } else {
        let idx = positions(b, &v.size, &v.stride, v.offset);
        scatter_elements(b, &flat, &idx, &upd, 0, Combine::Replace)
    };
    b.reshape(&out, base.dims())
}

// ---- Inference and references. ----

fn two<T>(x: &[T]) -> OpResult<(&T, &T)> {
    match x {
        [a, b] => Ok((a, b)),
        _ => Err("takes (input, src)".into()),
    }
}

/// The view `as_strided_scatter` writes `src` through.
fn scatter_view(base: &TensorType, src: &TensorType, attrs: &Attrs) -> OpResult<View> {
    let v = View::parse(base.shape.numel(), attrs)?;
    if let Some(d) = v.broadcast_dim() {
        return Err(invalid!(
            "dimension {d} has stride 0 and size {}: writing through a broadcast view is ill-defined",
            v.size[d]
        ));
    }
    if src.shape != v.shape() {
        return Err(invalid!(
            "src shape {} must equal the view size {:?}",
            src.shape,
            v.size
        ));
    }
    if src.dtype != base.dtype {
        return Err(invalid!(
            "src dtype {} must equal the input dtype {}",
            src.dtype,
            base.dtype
        ));
    }
    Ok(v)
}

fn view_ref(x: &HostTensor, v: &View) -> OpResult<HostTensor> {
    let flat = with_shape(x, &[x.shape().numel()])?;
    Ok(remap_tensor(&flat, &v.size, 0.0, &|ix, src| {
        src[0] = v.position(ix);
        true
    }))
}

/// Writes `src` in row-major order, so overlapping positions (unspecified
/// in PyTorch) keep the last write.
fn scatter_ref(base: &HostTensor, src: &HostTensor, v: &View) -> OpResult<HostTensor> {
    let flat = with_shape(base, &[base.shape().numel()])?;
    let out = scatter_tensor(&flat, src, Combine::Replace, &|p, dest| {
        dest[0] = v.position(p);
        true
    })?;
    with_shape(&out, base.dims())
}

// ---- Backward rules. ----

/// The gradient of `as_strided`'s input: `g` added back at the positions it
/// was read from. Without overlap that is a plain write into zeros; with it
/// (stride 0, overlapping windows) repeated reads must accumulate.
fn view_grad(t: &mut dyn Tape, g: Var, x: Var, v: &View) -> OpResult<Var> {
    let xt = t.ty(x)?;
    let g = t.cast(g, xt.dtype)?;
    let zeros = zeros_like(t, x)?;
    if v.numel() == 0 {
        return Ok(zeros);
    }
    if v.is_non_overlapping() {
        return t.call1("as_strided_scatter", &[zeros, g], v.attrs());
    }
    let (n, m) = (xt.shape.numel(), Shape::new(vec![v.numel()]));
    let all = Attrs::new()
        .with("shape", vec![n])
        .with("dim", 0i64)
        .with("dtype", DType::I64);
    let all = t.call1("iota", &[], all)?;
    let idx = t.call1("as_strided", &[all], v.attrs())?;
    let idx = t.reshape(idx, &m)?;
    let g = t.reshape(g, &m)?;
    let acc = t.full(xt.dtype, &Shape::new(vec![n]), 0.0)?;
    let acc = t.call1(
        "scatter_add",
        &[acc, idx, g],
        Attrs::new().with("dim", 0i64),
    )?;
    t.reshape(acc, &xt.shape)
}

// ---- Samples. ----

/// Row-major strides of `size` (empty dims count as 1, as in PyTorch).
#[cfg(feature = "conformance")]
fn contiguous_strides(size: &[usize]) -> Vec<usize> {
    let mut out = vec![1; size.len()];
    for d in (0..size.len().saturating_sub(1)).rev() {
        out[d] = out[d + 1] * size[d + 1].max(1);
    }
    out
}

/// Shuffles the dims of a view (size and stride together).
#[cfg(feature = "conformance")]
fn shuffle(g: &mut Gen, size: &mut [usize], stride: &mut [usize]) {
    for i in (1..size.len()).rev() {
        let j = g.below(i + 1);
        size.swap(i, j);
        stride.swap(i, j);
    }
}

/// A random view. `writable` keeps distinct elements at distinct positions
/// (for `as_strided_scatter`); otherwise strides may repeat or overlap.
#[cfg(feature = "conformance")]
fn random_view(g: &mut Gen, writable: bool) -> View {
    let kinds = if writable { 3 } else { 4 };
    let (mut size, mut stride, mut offset) = (Vec::new(), Vec::new(), g.below(3));
    match g.below(kinds) {
        // Contiguous, sometimes permuted.
        0 => {
            size = g.shape(0, 3).dims().to_vec();
            stride = contiguous_strides(&size);
        }
        // A stepped slice of a contiguous parent; some dims selected away.
        1 => {
            let parent = g.shape_nonempty(1, 3).dims().to_vec();
            let strides = contiguous_strides(&parent);
            for d in 0..parent.len() {
                let start = g.below(parent[d]);
                offset += start * strides[d];
                if parent.len() > 1 && g.below(4) == 0 {
                    continue;
                }
                let step = 1 + g.below(3);
                size.push((parent[d] - start).div_ceil(step));
                stride.push(strides[d] * step);
            }
        }
        // Irregular strides, each past the span of the ones before.
        2 => {
            let mut span = 0;
            for _ in 0..1 + g.below(3) {
                let s = 1 + g.below(4);
                let t = span + 1 + g.below(3);
                span += t * (s - 1);
                size.push(s);
                stride.push(t);
            }
        }
        // Anything small: repeats (stride 0) and overlapping windows.
        _ => {
            for _ in 0..g.below(4) {
                size.push(g.below(5));
                stride.push(g.below(5));
            }
        }
    }
    if g.bool() {
        shuffle(g, &mut size, &mut stride);
    }
    View {
        size,
        stride,
        offset,
    }
}

/// A shape with `n` elements: flat, a scalar, or two factors.
#[cfg(feature = "conformance")]
fn storage_shape(g: &mut Gen, n: usize) -> Shape {
    if n == 1 && g.bool() {
        return Shape::scalar();
    }
    let divisors: Vec<usize> = (2..=7).filter(|d| n % d == 0).collect();
    if divisors.is_empty() || g.below(3) == 0 {
        return Shape::new(vec![n]);
    }
    let d = g.pick(&divisors);
    Shape::new(vec![d, n / d])
}

/// The attributes of `v`, leaving a zero offset to its default at times.
#[cfg(feature = "conformance")]
fn sample_attrs(g: &mut Gen, v: &View) -> Attrs {
    let mut attrs = Attrs::new()
        .with("size", v.size.clone())
        .with("stride", v.stride.clone());
    if v.offset > 0 || g.bool() {
        attrs.set("offset", v.offset);
    }
    attrs
}

/// A random view and a tensor with at least the elements it reaches.
#[cfg(feature = "conformance")]
fn view_sample(g: &mut Gen, writable: bool) -> (View, HostTensor) {
    let dtype = g.pick(ANY);
    let v = random_view(g, writable);
    let n = v.extent() + g.below(3);
    let shape = storage_shape(g, n);
    (v, g.tensor(dtype, &shape))
}

#[cfg(feature = "conformance")]
fn as_strided_sample(g: &mut Gen) -> Sample {
    let (v, x) = view_sample(g, false);
    Sample::new(vec![x], sample_attrs(g, &v))
}

#[cfg(feature = "conformance")]
fn as_strided_scatter_sample(g: &mut Gen) -> Sample {
    let (v, base) = view_sample(g, true);
    let src = g.tensor(base.dtype(), &v.shape());
    Sample::new(vec![base, src], sample_attrs(g, &v))
}

/// A fixed case: input dims, size, stride, offset and dtype.
#[cfg(feature = "conformance")]
type Case = (
    &'static [usize],
    &'static [usize],
    &'static [usize],
    usize,
    DType,
);

/// Views both ops accept: contiguous, offset, transposed, stepped, select-
/// like, padded blocks, irregular strides, empty, rank 0, and narrow dtypes.
#[cfg(feature = "conformance")]
const WRITABLE_CASES: &[Case] = &[
    (&[2, 3], &[3, 2], &[2, 1], 0, DType::F32),
    (&[10], &[2, 3], &[3, 1], 3, DType::F32),
    (&[2, 3], &[3, 2], &[1, 3], 0, DType::BF16),
    (&[4, 6], &[2, 2], &[12, 3], 1, DType::I32),
    (&[3, 3], &[2, 2], &[3, 1], 4, DType::F32),
    (&[4, 5], &[4], &[5], 2, DType::F16),
    (&[6], &[1, 3, 1], &[9, 1, 4], 2, DType::Bool),
    (&[7], &[2, 2], &[3, 2], 0, DType::F32),
    (&[2, 3, 4], &[4, 2, 3], &[1, 12, 4], 0, DType::U8),
    (&[3, 127], &[127, 3], &[1, 127], 0, DType::F32),
    (&[3, 127], &[64], &[6], 1, DType::F64),
    (&[4], &[0, 3], &[1, 1], 0, DType::F32),
    (&[0], &[0], &[1], 0, DType::I64),
    (&[2, 3], &[], &[], 4, DType::F32),
    (&[], &[], &[], 0, DType::BF16),
];

/// Views only `as_strided` accepts: repeats (stride 0), overlapping
/// windows, and an empty view whose offset lies past the end.
#[cfg(feature = "conformance")]
const READ_ONLY_CASES: &[Case] = &[
    (&[3], &[2, 3], &[0, 1], 0, DType::F32),
    (&[3, 4], &[3, 1, 4], &[1, 7, 0], 1, DType::Bool),
    (&[5], &[3, 3], &[1, 1], 0, DType::F32),
    (&[2, 5], &[4, 3], &[2, 1], 1, DType::BF16),
    (&[0], &[2, 0], &[5, 1], 7, DType::F32),
];

#[cfg(feature = "conformance")]
fn fixed(g: &mut Gen, case: &Case) -> (View, HostTensor) {
    let &(dims, size, stride, offset, dtype) = case;
    let v = View {
        size: size.to_vec(),
        stride: stride.to_vec(),
        offset,
    };
    (v, g.tensor(dtype, &Shape::from(dims)))
}

#[cfg(feature = "conformance")]
fn as_strided_samples() -> Vec<Sample> {
    let mut g = Gen::new(0xa5);
    let mut out: Vec<Sample> = WRITABLE_CASES
        .iter()
        .chain(READ_ONLY_CASES)
        .map(|case| {
            let (v, x) = fixed(&mut g, case);
            Sample::new(vec![x], v.attrs())
        })
        .collect();
    out.extend((0..8).map(|i| as_strided_sample(&mut Gen::new(i))));
    out
}

#[cfg(feature = "conformance")]
fn as_strided_scatter_samples() -> Vec<Sample> {
    let mut g = Gen::new(0xa55c);
    let mut out: Vec<Sample> = WRITABLE_CASES
        .iter()
        .map(|case| {
            let (v, base) = fixed(&mut g, case);
            let src = g.tensor(base.dtype(), &v.shape());
            Sample::new(vec![base, src], v.attrs())
        })
        .collect();
    out.extend((0..8).map(|i| as_strided_scatter_sample(&mut Gen::new(i))));
    out
}

inventory::submit! {
    op_def! {
        name: "as_strided",
        arity: Arity::Exactly(1),
        dtypes: ANY,
        flags: Flags::VIEW,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            let v = View::parse(t.shape.numel(), attrs)?;
            Ok(vec![TensorType::new(t.dtype, v.shape())])
        },
        lower: |b, x, attrs| {
            let v = View::parse(x[0].shape().numel(), attrs)?;
            Ok(vec![lower_view(b, &x[0], &v)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            Ok(vec![view_ref(x, &View::parse(x.shape().numel(), attrs)?)?])
        },
        vjp: Some(|t, a| {
            let x = a.inputs[0];
            let xt = t.ty(x)?;
            if !xt.dtype.is_inexact() {
                return Ok(vec![None]);
            }
            let v = View::parse(xt.shape.numel(), a.attrs)?;
            Ok(vec![Some(view_grad(t, a.grads[0], x, &v)?)])
        }),
        samples: as_strided_samples,
        arbitrary: as_strided_sample,
        torch: Torch::Expr(r#"torch.as_strided(x[0], a["size"], a["stride"], a.get("offset", 0))"#),
    }
}

inventory::submit! {
    op_def! {
        name: "as_strided_scatter",
        arity: Arity::Exactly(2),
        dtypes: ANY,
        infer: |x, attrs| {
            let (base, src) = two(x)?;
            scatter_view(base, src, attrs)?;
            Ok(vec![base.clone()])
        },
        lower: |b, x, attrs| {
            let v = scatter_view(x[0].ty(), x[1].ty(), attrs)?;
            Ok(vec![lower_scatter(b, &x[0], &x[1], &v)])
        },
        reference: |x, attrs| {
            let (base, src) = two(x)?;
            let v = scatter_view(&base.ty(), &src.ty(), attrs)?;
            Ok(vec![scatter_ref(base, src, &v)?])
        },
        vjp: Some(|t, a| {
            let (base, src) = (a.inputs[0], a.inputs[1]);
            let (bt, st) = (t.ty(base)?, t.ty(src)?);
            let v = scatter_view(&bt, &st, a.attrs)?;
            if !bt.dtype.is_inexact() {
                return Ok(vec![None, None]);
            }
            let g = t.cast(a.grads[0], bt.dtype)?;
            // The overwritten positions take no gradient back to `base`.
            let zeros = zeros_like(t, src)?;
            let gb = t.call1("as_strided_scatter", &[g, zeros], v.attrs())?;
            let gs = t.call1("as_strided", &[g], v.attrs())?;
            Ok(vec![Some(gb), Some(gs)])
        }),
        samples: as_strided_scatter_samples,
        arbitrary: as_strided_scatter_sample,
        // As an index_put of the flat positions the view covers: autograd of
        // torch.as_strided_scatter swaps the gradients of covered and
        // uncovered positions (its gradcheck fails in PyTorch 2.15).
        torch: Torch::Expr(
            r#"x[0].flatten().index_put((torch.as_strided(torch.arange(x[0].numel()), a["size"], a["stride"], a.get("offset", 0)).flatten(),), x[1].flatten()).reshape(x[0].shape)"#
        ),
    }
}

#[cfg(test)]
mod tests {
    use tpu_core::op::HostTape;

    use super::*;

    #[test]
    fn overlapping_reads_accumulate_their_gradient() {
        let mut tape = HostTape::new();
        let values = (0..5).map(f64::from).collect();
        let x = tape.push(HostTensor::from_f64(DType::F32, vec![5], values).expect("fills"));
        let g =
            tape.push(HostTensor::from_f64(DType::F32, vec![3, 3], vec![1.0; 9]).expect("fills"));
        let windows = Attrs::new()
            .with("size", &[3usize, 3][..])
            .with("stride", &[1usize, 1][..])
            .with("offset", 0usize);
        let v = View::parse(5, &windows).expect("in bounds");
        let gx = view_grad(&mut tape, g, x, &v).expect("backward");
        let got: Vec<f64> = tape.value(gx).unwrap().to_f64().iter().copied().collect();
        assert_eq!(got, [1., 2., 3., 2., 1.]);
    }
}
