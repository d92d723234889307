//! Convolutions: the general `convolution` (StableHLO's, with dimension
//! numbers, padding, lhs/rhs dilation and feature / batch groups), which
//! every convolution gradient is written in, and PyTorch's `conv1d` /
//! `conv2d` (NCL / NCHW inputs, OIL / OIHW weights, optional bias).
//!
//! The gradients follow JAX's transpose rules: the input gradient is a
//! convolution of the output gradient with the flipped kernel (input and
//! output features swapped, strides turned into lhs dilation), the kernel
//! gradient a convolution of the input with the output gradient (batch and
//! feature roles swapped, feature groups turned into batch groups).

use ndarray::{ArrayD, IxDyn};
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value, i64_array};
use tpu_core::{DType, Shape};

use super::{accumulator, flip, permute};
use crate::support::*;

/// Everything about one convolution except its operands.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ConvParams {
    /// Window strides, one per spatial dim.
    pub strides: Vec<usize>,
    /// `(low, high)` padding of the (lhs-dilated) input per spatial dim;
    /// may be negative (cropping).
    pub padding: Vec<(i64, i64)>,
    /// Input (lhs) dilation per spatial dim.
    pub lhs_dilation: Vec<usize>,
    /// Kernel (rhs) dilation per spatial dim.
    pub rhs_dilation: Vec<usize>,
    /// Feature groups.
    pub fgc: usize,
    /// Batch groups.
    pub bgc: usize,
    /// Input dims: `[batch, feature, spatial...]`.
    pub lhs_spec: Vec<usize>,
    /// Kernel dims: `[output feature, input feature, spatial...]`.
    pub rhs_spec: Vec<usize>,
    /// Output dims: `[batch, feature, spatial...]`.
    pub out_spec: Vec<usize>,
}

impl ConvParams {
    /// Plain NC... / OI... layout with `n` spatial dims.
    pub(crate) fn plain(n: usize) -> ConvParams {
        let spec: Vec<usize> = (0..n + 2).collect();
        ConvParams {
            strides: vec![1; n],
            padding: vec![(0, 0); n],
            lhs_dilation: vec![1; n],
            rhs_dilation: vec![1; n],
            fgc: 1,
            bgc: 1,
            lhs_spec: spec.clone(),
            rhs_spec: spec.clone(),
            out_spec: spec,
        }
    }

    fn spatial(&self) -> usize {
        self.strides.len()
    }

    /// The attributes of a `convolution` call with these parameters.
    pub(crate) fn attrs(&self) -> Attrs {
        let ints = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
        let pads: Vec<i64> = self.padding.iter().flat_map(|&(l, h)| [l, h]).collect();
        Attrs::new()
            .with("window_strides", ints(&self.strides))
            .with("padding", pads)
            .with("lhs_dilation", ints(&self.lhs_dilation))
            .with("rhs_dilation", ints(&self.rhs_dilation))
            .with("feature_group_count", self.fgc)
            .with("batch_group_count", self.bgc)
            .with("lhs_spec", ints(&self.lhs_spec))
            .with("rhs_spec", ints(&self.rhs_spec))
            .with("out_spec", ints(&self.out_spec))
    }
}

/// `1 + d (s - 1)`, 0 for an empty dim.
fn dilate(s: usize, d: usize) -> i64 {
    if s == 0 {
        0
    } else {
        (d as i64).saturating_mul(s as i64 - 1).saturating_add(1)
    }
}

/// A permutation of `0..rank` (or the identity when absent).
fn spec_attr(attrs: &Attrs, key: &str, rank: usize) -> OpResult<Vec<usize>> {
    let Some(v) = attrs.ints_opt(key)? else {
        return Ok((0..rank).collect());
    };
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(rank);
    for &d in &v {
        let d = normalize_dim(d, rank)?;
        if seen[d] {
            return Err(invalid!("{key} {v:?} repeats dimension {d}"));
        }
        seen[d] = true;
        out.push(d);
    }
    if out.len() != rank {
        return Err(invalid!("{key} {v:?} must list all {rank} dimensions"));
    }
    Ok(out)
}

/// `key` as `n` integers >= `min` (one value is repeated), `default` when
/// absent.
pub(crate) fn spatial_ints(
    attrs: &Attrs,
    key: &str,
    n: usize,
    default: i64,
    min: i64,
) -> OpResult<Vec<usize>> {
    let v = match attrs.ints_opt(key)? {
        None => vec![default; n],
        Some(v) if v.len() == 1 => vec![v[0]; n],
        Some(v) if v.len() == n => v,
        Some(v) => return Err(invalid!("{key} {v:?} must have 1 or {n} values")),
    };
    if let Some(bad) = v.iter().find(|&&x| x < min) {
        return Err(invalid!("{key} {v:?} has a value {bad} below {min}"));
    }
    Ok(v.iter().map(|&x| x as usize).collect())
}

fn conv_params(attrs: &Attrs, rank: usize) -> OpResult<ConvParams> {
    if rank < 3 {
        return Err(invalid!(
            "convolution needs operands of rank >= 3 (batch, feature and spatial dims), got rank {rank}"
        ));
    }
    let n = rank - 2;
    let padding = match attrs.ints_opt("padding")? {
        None => vec![(0, 0); n],
        Some(v) if v.len() == 2 * n => v.chunks(2).map(|c| (c[0], c[1])).collect(),
        Some(v) => {
            return Err(invalid!(
                "padding {v:?} must have 2 values (low, high) per spatial dim, {}",
                2 * n
            ));
        }
    };
    let group = |key: &str| -> OpResult<usize> {
        let g = attrs.int_or(key, 1)?;
        if g < 1 {
            return Err(invalid!("{key} must be >= 1, got {g}"));
        }
        Ok(g as usize)
    };
    Ok(ConvParams {
        strides: spatial_ints(attrs, "window_strides", n, 1, 1)?,
        padding,
        lhs_dilation: spatial_ints(attrs, "lhs_dilation", n, 1, 1)?,
        rhs_dilation: spatial_ints(attrs, "rhs_dilation", n, 1, 1)?,
        fgc: group("feature_group_count")?,
        bgc: group("batch_group_count")?,
        lhs_spec: spec_attr(attrs, "lhs_spec", rank)?,
        rhs_spec: spec_attr(attrs, "rhs_spec", rank)?,
        out_spec: spec_attr(attrs, "out_spec", rank)?,
    })
}

/// Checks a convolution and gives its output shape.
pub(crate) fn conv_shape(lhs: &Shape, rhs: &Shape, p: &ConvParams) -> OpResult<Shape> {
    let rank = p.lhs_spec.len();
    if lhs.rank() != rank || rhs.rank() != rank {
        return Err(invalid!(
            "convolution operands {lhs} and {rhs} must both have rank {rank}"
        ));
    }
    let n = p.spatial();
    let l = |i: usize| lhs.dims()[p.lhs_spec[i]];
    let r = |i: usize| rhs.dims()[p.rhs_spec[i]];
    let (batch, feat, out_feat, in_feat) = (l(0), l(1), r(0), r(1));
    if p.fgc > 1 && p.bgc > 1 {
        return Err("feature_group_count and batch_group_count cannot both exceed 1".into());
    }
    if feat != in_feat * p.fgc {
        return Err(invalid!(
            "input has {feat} features but the kernel takes {in_feat} per group x {} groups",
            p.fgc
        ));
    }
    if out_feat % p.fgc != 0 || out_feat % p.bgc != 0 {
        return Err(invalid!(
            "kernel output features {out_feat} must divide into {} feature groups and {} batch groups",
            p.fgc,
            p.bgc
        ));
    }
    if batch % p.bgc != 0 {
        return Err(invalid!(
            "batch {batch} must divide into {} batch groups",
            p.bgc
        ));
    }
    let mut out = vec![0; rank];
    out[p.out_spec[0]] = batch / p.bgc;
    out[p.out_spec[1]] = out_feat;
    for i in 0..n {
        let k = r(2 + i);
        if k == 0 {
            return Err(invalid!("kernel spatial dim {i} is empty"));
        }
        let (lo, hi) = p.padding[i];
        let padded = dilate(l(2 + i), p.lhs_dilation[i])
            .saturating_add(lo)
            .saturating_add(hi);
        if padded < 0 {
            return Err(invalid!(
                "padding ({lo}, {hi}) crops more than spatial dim {i} of {lhs} holds"
            ));
        }
        let window = dilate(k, p.rhs_dilation[i]);
        out[p.out_spec[2 + i]] = if padded < window {
            0
        } else {
            ((padded - window) / p.strides[i] as i64 + 1) as usize
        };
    }
    Ok(Shape::new(out))
}

/// The `#stablehlo.conv` layout of one operand: each tensor dim's role.
fn layout(spec: &[usize], batch: &str, feature: &str) -> String {
    let mut roles = vec![String::new(); spec.len()];
    for (role, &dim) in spec.iter().enumerate() {
        roles[dim] = match role {
            0 => batch.to_string(),
            1 => feature.to_string(),
            s => (s - 2).to_string(),
        };
    }
    format!("[{}]", roles.join(", "))
}

/// `stablehlo.convolution` in the accumulator dtype (f32 for f16 / bf16).
/// Negative padding is applied with an explicit `stablehlo.pad`.
pub(crate) fn lower_conv_acc(
    b: &mut Builder,
    lhs: &Value,
    rhs: &Value,
    p: &ConvParams,
) -> OpResult<Value> {
    let out = conv_shape(lhs.shape(), rhs.shape(), p)?;
    let acc = accumulator(lhs.dtype());
    if lhs.shape().numel() == 0 || rhs.shape().numel() == 0 || out.numel() == 0 {
        return Ok(b.constant(acc, out, 0.0));
    }
    let mut x = b.convert(lhs, acc);
    let w = b.convert(rhs, acc);
    let mut p = p.clone();
    if p.padding.iter().any(|&(l, h)| l < 0 || h < 0) {
        let rank = x.rank();
        let (mut lo, mut hi, mut interior) = (vec![0; rank], vec![0; rank], vec![0; rank]);
        for i in 0..p.spatial() {
            let d = p.lhs_spec[2 + i];
            (lo[d], hi[d]) = p.padding[i];
            interior[d] = p.lhs_dilation[i] as i64 - 1;
        }
        let zero = b.constant(acc, [], 0.0);
        x = b.pad(&x, &zero, &lo, &hi, &interior);
        p.padding = vec![(0, 0); p.spatial()];
        p.lhs_dilation = vec![1; p.spatial()];
    }
    let n = p.spatial();
    let pads: Vec<String> = p
        .padding
        .iter()
        .map(|(l, h)| format!("[{l}, {h}]"))
        .collect();
    let attrs = format!(
        "batch_group_count = {} : i64, dimension_numbers = #stablehlo.conv<{}x{}->{}>, feature_group_count = {} : i64, lhs_dilation = {}, padding = dense<[{}]> : tensor<{n}x2xi64>, rhs_dilation = {}, window_strides = {}, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]",
        p.bgc,
        layout(&p.lhs_spec, "b", "f"),
        layout(&p.rhs_spec, "o", "i"),
        layout(&p.out_spec, "b", "f"),
        p.fgc,
        i64_array(p.lhs_dilation.iter().map(|&v| v as i64)),
        pads.join(", "),
        i64_array(p.rhs_dilation.iter().map(|&v| v as i64)),
        i64_array(p.strides.iter().map(|&v| v as i64)),
    );
    Ok(b.op1(
        "stablehlo.convolution",
        &[&x, &w],
        &attrs,
        TensorType::new(acc, out),
    ))
}

/// The reference convolution in f64, in canonical `[N, C, spatial...]`
/// order first, then laid out as `out_spec` says.
pub(crate) fn conv_ref_f64(
    lhs: &HostTensor,
    rhs: &HostTensor,
    p: &ConvParams,
) -> OpResult<ArrayD<f64>> {
    let out = conv_shape(&lhs.shape(), &rhs.shape(), p)?;
    let n = p.spatial();
    let (x, w) = (lhs.to_f64(), rhs.to_f64());
    let xc = x.view().permuted_axes(IxDyn(&p.lhs_spec));
    let wc = w.view().permuted_axes(IxDyn(&p.rhs_spec));
    let (in_feat, out_feat) = (wc.shape()[1], wc.shape()[0]);
    let in_sizes: Vec<usize> = xc.shape()[2..].to_vec();
    let k_sizes: Vec<usize> = wc.shape()[2..].to_vec();
    let mut canon: Vec<usize> = p.out_spec.iter().map(|&d| out.dims()[d]).collect();
    let n_out = canon[0];
    canon[1] = out_feat;
    let per_fgroup = (out_feat / p.fgc).max(1);
    let per_bgroup = (out_feat / p.bgc).max(1);
    let mut result = ArrayD::<f64>::zeros(IxDyn(&canon));
    let mut xi = vec![0usize; n + 2];
    let mut wi = vec![0usize; n + 2];
    for (oi, slot) in result.indexed_iter_mut() {
        let (n2, o) = (oi[0], oi[1]);
        let batch = (o / per_bgroup) * n_out + n2;
        let base_c = (o / per_fgroup) * in_feat;
        let mut acc = 0.0;
        for kpos in ndarray::indices(IxDyn(&k_sizes)) {
            let mut inside = true;
            for d in 0..n {
                let pos = (oi[2 + d] * p.strides[d] + kpos[d] * p.rhs_dilation[d]) as i64
                    - p.padding[d].0;
                let ld = p.lhs_dilation[d] as i64;
                if pos < 0 || pos % ld != 0 || (pos / ld) as usize >= in_sizes[d] {
                    inside = false;
                    break;
                }
                xi[2 + d] = (pos / ld) as usize;
                wi[2 + d] = kpos[d];
            }
            if !inside {
                continue;
            }
            xi[0] = batch;
            wi[0] = o;
            for i in 0..in_feat {
                xi[1] = base_c + i;
                wi[1] = i;
                acc += xc[IxDyn(&xi)] * wc[IxDyn(&wi)];
            }
        }
        *slot = acc;
    }
    let mut inv = vec![0; n + 2];
    for (j, &d) in p.out_spec.iter().enumerate() {
        inv[d] = j;
    }
    Ok(result
        .permuted_axes(IxDyn(&inv))
        .as_standard_layout()
        .into_owned())
}

// ---- Gradients, on the tape. ----

/// Splits dim `src` of `x` into `(size, rest)`.
fn axis_out_of(t: &mut dyn Tape, src: usize, size: usize, x: Var) -> OpResult<Var> {
    let mut dims = t.ty(x)?.shape.dims().to_vec();
    let rest = dims[src] / size.max(1);
    dims.splice(src..=src, [size, rest]);
    t.reshape(x, &Shape::new(dims))
}

/// Merges dim `src` of `x` into dim `dst` (numbered with `src` removed),
/// `src` becoming the major part.
fn axis_into(t: &mut dyn Tape, src: usize, dst: usize, x: Var) -> OpResult<Var> {
    let dims = t.ty(x)?.shape.dims().to_vec();
    let mut perm: Vec<usize> = (0..dims.len()).filter(|&i| i != src).collect();
    perm.insert(dst, src);
    let moved = permute(t, x, &perm)?;
    let mut shape: Vec<usize> = dims
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != src)
        .map(|(_, &d)| d)
        .collect();
    shape[dst] *= dims[src];
    t.reshape(moved, &Shape::new(shape))
}

fn swap_first_two(spec: &[usize]) -> Vec<usize> {
    let mut s = spec.to_vec();
    s.swap(0, 1);
    s
}

fn zeros(t: &mut dyn Tape, dtype: DType, shape: &Shape) -> OpResult<Var> {
    t.full(dtype, shape, 0.0)
}

/// The gradient of a convolution with respect to its input (`lhs`, of
/// shape `lhs_shape`), given the output gradient `g` and the kernel.
pub(crate) fn conv_lhs_grad(
    t: &mut dyn Tape,
    g: Var,
    rhs: Var,
    lhs_shape: &Shape,
    p: &ConvParams,
) -> OpResult<Var> {
    let (gt, rt) = (t.ty(g)?, t.ty(rhs)?);
    if gt.shape.numel() == 0 || rt.shape.numel() == 0 || lhs_shape.numel() == 0 {
        return zeros(t, gt.dtype, lhs_shape);
    }
    let mut w = rhs;
    let mut fgc = p.fgc;
    let groups = p.fgc.max(p.bgc);
    if groups > 1 {
        w = axis_out_of(t, p.rhs_spec[0], groups, w)?;
        w = axis_into(t, p.rhs_spec[0], p.rhs_spec[1], w)?;
        fgc = groups;
    }
    let ws = t.ty(w)?.shape;
    let n = p.spatial();
    let mut padding = Vec::with_capacity(n);
    for i in 0..n {
        let input = dilate(lhs_shape.dims()[p.lhs_spec[2 + i]], p.lhs_dilation[i]);
        let kernel = dilate(ws.dims()[p.rhs_spec[2 + i]], p.rhs_dilation[i]);
        let out = dilate(gt.shape.dims()[p.out_spec[2 + i]], p.strides[i]);
        let before = kernel - p.padding[i].0 - 1;
        padding.push((before, input + kernel - 1 - out - before));
    }
    let spatial: Vec<usize> = p.rhs_spec[2..].to_vec();
    let w = flip(t, w, &spatial)?;
    let q = ConvParams {
        strides: p.lhs_dilation.clone(),
        padding,
        lhs_dilation: p.strides.clone(),
        rhs_dilation: p.rhs_dilation.clone(),
        fgc,
        bgc: 1,
        lhs_spec: p.out_spec.clone(),
        rhs_spec: swap_first_two(&p.rhs_spec),
        out_spec: p.lhs_spec.clone(),
    };
    let mut out = t.call1("convolution", &[g, w], q.attrs())?;
    if p.bgc > 1 {
        out = axis_out_of(t, p.lhs_spec[1], p.bgc, out)?;
        out = axis_into(t, p.lhs_spec[1], p.lhs_spec[0], out)?;
    }
    Ok(out)
}

/// The gradient of a convolution with respect to its kernel (of shape
/// `rhs_shape`), given the output gradient `g` and the input.
pub(crate) fn conv_rhs_grad(
    t: &mut dyn Tape,
    g: Var,
    lhs: Var,
    rhs_shape: &Shape,
    p: &ConvParams,
) -> OpResult<Var> {
    let (gt, lt) = (t.ty(g)?, t.ty(lhs)?);
    if gt.shape.numel() == 0 || lt.shape.numel() == 0 || rhs_shape.numel() == 0 {
        return zeros(t, gt.dtype, rhs_shape);
    }
    let (fgc, bgc) = if p.bgc > 1 { (p.bgc, 1) } else { (1, p.fgc) };
    let n = p.spatial();
    let mut padding = Vec::with_capacity(n);
    for i in 0..n {
        let input = dilate(lt.shape.dims()[p.lhs_spec[2 + i]], p.lhs_dilation[i]);
        let kernel = dilate(rhs_shape.dims()[p.rhs_spec[2 + i]], p.rhs_dilation[i]);
        let out = dilate(gt.shape.dims()[p.out_spec[2 + i]], p.strides[i]);
        let lo = p.padding[i].0;
        padding.push((lo, (out - input) + (kernel - lo - 1)));
    }
    let q = ConvParams {
        strides: p.rhs_dilation.clone(),
        padding,
        lhs_dilation: p.lhs_dilation.clone(),
        rhs_dilation: p.strides.clone(),
        fgc,
        bgc,
        lhs_spec: swap_first_two(&p.lhs_spec),
        rhs_spec: swap_first_two(&p.out_spec),
        out_spec: swap_first_two(&p.rhs_spec),
    };
    t.call1("convolution", &[lhs, g], q.attrs())
}

fn float_pair<'a>(x: &'a [TensorType], op: &str) -> OpResult<(&'a TensorType, &'a TensorType)> {
    let (a, b) = match x {
        [a, b, ..] => (a, b),
        _ => return Err(invalid!("{op} takes an input and a kernel")),
    };
    require_dtype(a.dtype, FLOATS, "input")?;
    if a.dtype != b.dtype {
        return Err(invalid!(
            "{op} needs input and kernel of one dtype, got {} and {}",
            a.dtype,
            b.dtype
        ));
    }
    Ok((a, b))
}

fn infer_convolution(x: &[TensorType], attrs: &Attrs) -> OpResult<TensorType> {
    let (a, b) = float_pair(x, "convolution")?;
    let p = conv_params(attrs, a.shape.rank())?;
    Ok(TensorType::new(
        a.dtype,
        conv_shape(&a.shape, &b.shape, &p)?,
    ))
}

fn convolution_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let (x, w, g) = (a.inputs[0], a.inputs[1], a.grads[0]);
    let (xs, ws) = (t.ty(x)?.shape, t.ty(w)?.shape);
    let p = conv_params(a.attrs, xs.rank())?;
    let gx = conv_lhs_grad(t, g, w, &xs, &p)?;
    let gw = conv_rhs_grad(t, g, x, &ws, &p)?;
    Ok(vec![Some(gx), Some(gw)])
}

/// A random permutation of `0..n`.
#[cfg(feature = "conformance")]
fn shuffled(g: &mut Gen, n: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, g.below(i + 1));
    }
    v
}

/// Lays out canonical `[a, b, spatial...]` sizes as `spec` says.
#[cfg(feature = "conformance")]
fn place(canon: &[usize], spec: &[usize]) -> Shape {
    let mut dims = vec![0; canon.len()];
    for (role, &d) in spec.iter().enumerate() {
        dims[d] = canon[role];
    }
    Shape::new(dims)
}

#[cfg(feature = "conformance")]
fn convolution_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let n = 1 + g.below(2);
    let rank = n + 2;
    let mut p = ConvParams::plain(n);
    if g.bool() {
        p.lhs_spec = shuffled(g, rank);
        p.rhs_spec = shuffled(g, rank);
        p.out_spec = shuffled(g, rank);
    }
    match g.below(3) {
        0 => p.fgc = 1 + g.below(3),
        1 => p.bgc = 1 + g.below(3),
        _ => {}
    }
    let per_in = 1 + g.below(3);
    let per_out = 1 + g.below(3);
    let batch = g.below(3) * p.bgc;
    let (feat, out_feat) = (per_in * p.fgc, per_out * p.fgc * p.bgc);
    let mut in_sizes = Vec::new();
    let mut k_sizes = Vec::new();
    for i in 0..n {
        p.strides[i] = 1 + g.below(3);
        p.lhs_dilation[i] = 1 + g.below(2);
        p.rhs_dilation[i] = 1 + g.below(2);
        let size = if n == 1 {
            1 + g.below(9)
        } else {
            1 + g.below(6)
        };
        let k = 1 + g.below(3);
        let lo = g.below(4) as i64 - 1;
        let hi = g.below(4) as i64 - 1;
        // Keep the padded input at least as large as the window.
        let window = dilate(k, p.rhs_dilation[i]);
        let padded = dilate(size, p.lhs_dilation[i]) + lo + hi;
        let hi = if padded < window {
            hi + window - padded
        } else {
            hi
        };
        p.padding[i] = (lo, hi);
        in_sizes.push(size);
        k_sizes.push(k);
    }
    let mut lhs_canon = vec![batch, feat];
    lhs_canon.extend(&in_sizes);
    let mut rhs_canon = vec![out_feat, per_in];
    rhs_canon.extend(&k_sizes);
    let x = g.tensor_in(dtype, &place(&lhs_canon, &p.lhs_spec), -1.0, 1.0);
    let w = g.tensor_in(dtype, &place(&rhs_canon, &p.rhs_spec), -1.0, 1.0);
    Sample::new(vec![x, w], p.attrs())
}

inventory::submit! {
    op_def! {
        name: "convolution",
        arity: Arity::Exactly(2),
        dtypes: FLOATS,
        infer: |x, attrs| Ok(vec![infer_convolution(x, attrs)?]),
        lower: |b, x, attrs| {
            let p = conv_params(attrs, x[0].rank())?;
            let out = lower_conv_acc(b, &x[0], &x[1], &p)?;
            Ok(vec![b.convert(&out, x[0].dtype())])
        },
        reference: |x, attrs| {
            let [lhs, rhs] = x else { return Err("convolution takes two inputs".into()) };
            let p = conv_params(attrs, lhs.dims().len())?;
            Ok(vec![HostTensor::float(lhs.dtype(), conv_ref_f64(lhs, rhs, &p)?)])
        },
        vjp: Some(convolution_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(20.0),
        samples: || (0..12).map(|i| convolution_sample(&mut Gen::new(i))).collect(),
        arbitrary: convolution_sample,
        torch: Torch::Expr(r#"(lambda n, spec, bg: (lambda v, w: getattr(F, f"conv{n}d")(F.pad(getattr(F, f"conv_transpose{n}d")(v, v.new_ones([v.shape[1], 1] + [1] * n), stride=a.get("lhs_dilation", 1), groups=v.shape[1]), [p for i in reversed(range(n)) for p in a.get("padding", [0] * 2 * n)[2 * i:2 * i + 2]]), w, stride=a.get("window_strides", 1), dilation=a.get("rhs_dilation", 1), groups=a.get("feature_group_count", 1) * bg).permute([spec("out_spec").index(d) for d in range(n + 2)]))((lambda u: u.reshape(bg, u.shape[0] // bg, *u.shape[1:]).transpose(0, 1).reshape(u.shape[0] // bg, bg * u.shape[1], *u.shape[2:]))(x[0].permute(spec("lhs_spec"))), x[1].permute(spec("rhs_spec"))))(x[0].dim() - 2, lambda k: [d % x[0].dim() for d in a.get(k, range(x[0].dim()))], a.get("batch_group_count", 1))"#),
    }
}

// ---- conv1d / conv2d ----

/// A checked `conv1d` / `conv2d` call.
struct ConvNd {
    params: ConvParams,
    /// The input has no batch dim (`[C, L]` / `[C, H, W]`).
    unbatched: bool,
    /// The shape the output has (without a batch dim when unbatched).
    out: Shape,
}

fn conv_nd(x: &[TensorType], attrs: &Attrs, n: usize, op: &str) -> OpResult<ConvNd> {
    let (xt, wt) = float_pair(x, op)?;
    let rank = n + 2;
    let unbatched = match xt.shape.rank() {
        r if r == rank => false,
        r if r == rank - 1 => true,
        r => {
            return Err(invalid!(
                "{op} expects a {}-D (unbatched) or {rank}-D (batched) input, got rank {r}",
                rank - 1
            ));
        }
    };
    if wt.shape.rank() != rank {
        return Err(invalid!("{op} expects a {rank}-D weight, got {}", wt.shape));
    }
    let groups = attrs.int_or("groups", 1)?;
    if groups < 1 {
        return Err(invalid!("groups must be >= 1, got {groups}"));
    }
    let groups = groups as usize;
    let padding = spatial_ints(attrs, "padding", n, 0, 0)?;
    let params = ConvParams {
        strides: spatial_ints(attrs, "stride", n, 1, 1)?,
        padding: padding.iter().map(|&p| (p as i64, p as i64)).collect(),
        rhs_dilation: spatial_ints(attrs, "dilation", n, 1, 1)?,
        fgc: groups,
        ..ConvParams::plain(n)
    };
    let xs = batched(&xt.shape, unbatched);
    let (c, o, i) = (xs.dims()[1], wt.shape.dims()[0], wt.shape.dims()[1]);
    if c != i * groups {
        return Err(invalid!(
            "{op}: weight {} with groups = {groups} expects {} input channels, got {c}",
            wt.shape,
            i * groups
        ));
    }
    if o % groups != 0 {
        return Err(invalid!(
            "{op}: {o} output channels do not divide into {groups} groups"
        ));
    }
    for (s, &pad) in padding.iter().enumerate() {
        let k = wt.shape.dims()[2 + s];
        let window = dilate(k, params.rhs_dilation[s]);
        let padded = (xs.dims()[2 + s] as i64).saturating_add((pad as i64).saturating_mul(2));
        if k == 0 || padded < window {
            return Err(invalid!(
                "{op}: kernel size {k} (dilated {window}) does not fit the padded input size {padded}"
            ));
        }
    }
    if let Some(bias) = x.get(2) {
        if bias.dtype != xt.dtype || bias.shape.dims() != [o] {
            return Err(invalid!("{op}: bias must be {}[{o}], got {bias}", xt.dtype));
        }
    }
    let full = conv_shape(&xs, &wt.shape, &params)?;
    let out = if unbatched {
        Shape::from(&full.dims()[1..])
    } else {
        full
    };
    Ok(ConvNd {
        params,
        unbatched,
        out,
    })
}

/// `shape` with a leading batch dim of 1 when `unbatched`.
fn batched(shape: &Shape, unbatched: bool) -> Shape {
    if unbatched {
        let mut d = vec![1];
        d.extend_from_slice(shape.dims());
        Shape::new(d)
    } else {
        shape.clone()
    }
}

fn lower_conv_nd(b: &mut Builder, x: &[Value], c: &ConvNd) -> OpResult<Value> {
    let xs = batched(x[0].shape(), c.unbatched);
    let xb = b.reshape(&x[0], xs.dims());
    let mut y = lower_conv_acc(b, &xb, &x[1], &c.params)?;
    if let Some(bias) = x.get(2) {
        let acc = y.dtype();
        let bias = b.convert(bias, acc);
        let bias = b.broadcast_in_dim(&bias, y.dims(), &[1]);
        y = b.binary("stablehlo.add", &y, &bias);
    }
    let y = b.convert(&y, x[0].dtype());
    Ok(b.reshape(&y, c.out.dims()))
}

fn conv_nd_ref(x: &[HostTensor], c: &ConvNd) -> OpResult<HostTensor> {
    let xs = batched(&x[0].shape(), c.unbatched);
    let xb = reshape_to(&x[0], &xs)?;
    let mut y = conv_ref_f64(&xb, &x[1], &c.params)?;
    if let Some(bias) = x.get(2) {
        let bias = bias.to_f64();
        for (ix, v) in y.indexed_iter_mut() {
            *v += bias[[ix[1]]];
        }
    }
    let y = HostTensor::float(x[0].dtype(), y);
    reshape_to(&y, &c.out)
}

fn conv_nd_vjp(
    t: &mut dyn Tape,
    a: &VjpArgs<'_>,
    n: usize,
    op: &str,
) -> OpResult<Vec<Option<Var>>> {
    let types = a
        .inputs
        .iter()
        .map(|&v| t.ty(v))
        .collect::<OpResult<Vec<TensorType>>>()?;
    let c = conv_nd(&types, a.attrs, n, op)?;
    let (x, w) = (a.inputs[0], a.inputs[1]);
    let xs = batched(&types[0].shape, c.unbatched);
    let full = conv_shape(&xs, &types[1].shape, &c.params)?;
    let g = t.reshape(a.grads[0], &full)?;
    let xb = t.reshape(x, &xs)?;
    let gx = conv_lhs_grad(t, g, w, &xs, &c.params)?;
    let gx = t.reshape(gx, &types[0].shape)?;
    let gw = conv_rhs_grad(t, g, xb, &types[1].shape, &c.params)?;
    let mut grads = vec![Some(gx), Some(gw)];
    if a.inputs.len() > 2 {
        let dims: Vec<usize> = (0..full.rank()).filter(|&d| d != 1).collect();
        grads.push(Some(t.sum(g, &dims, false)?));
    }
    Ok(grads)
}

#[cfg(feature = "conformance")]
fn conv_nd_sample(g: &mut Gen, n: usize) -> Sample {
    let dtype = g.pick(FLOATS);
    let groups = if g.bool() { 1 + g.below(3) } else { 1 };
    let per_in = 1 + g.below(3);
    let out = groups * (1 + g.below(3));
    let batch = g.below(4);
    // Which attributes are given (absent ones take their defaults).
    let (set_stride, set_pad, set_dil) = (g.below(4) != 0, g.below(4) != 0, g.below(3) != 0);
    let mut attrs = Attrs::new();
    let (mut stride, mut padding, mut dilation) = (Vec::new(), Vec::new(), Vec::new());
    let mut xd = vec![batch, per_in * groups];
    let mut wd = vec![out, per_in];
    for _ in 0..n {
        let k = 1 + g.below(3);
        let s = if set_stride { 1 + g.below(3) } else { 1 };
        let p = if set_pad { g.below(3) } else { 0 };
        let d = if set_dil { 1 + g.below(2) } else { 1 };
        let window = dilate(k, d) as usize;
        let extra = if n == 1 && g.below(4) == 0 {
            12
        } else {
            g.below(6)
        };
        xd.push(window.saturating_sub(2 * p).max(1) + extra);
        wd.push(k);
        stride.push(s as i64);
        padding.push(p as i64);
        dilation.push(d as i64);
    }
    let list = |g: &mut Gen, v: Vec<i64>| -> Vec<i64> {
        if v.iter().all(|&x| x == v[0]) && g.bool() {
            vec![v[0]]
        } else {
            v
        }
    };
    if set_stride {
        attrs.set("stride", list(g, stride));
    }
    if set_pad {
        attrs.set("padding", list(g, padding));
    }
    if set_dil {
        attrs.set("dilation", list(g, dilation));
    }
    if groups > 1 || g.bool() {
        attrs.set("groups", groups as i64);
    }
    let xs = if g.below(5) == 0 {
        Shape::from(&xd[1..])
    } else {
        Shape::new(xd)
    };
    let mut inputs = vec![
        g.tensor_in(dtype, &xs, -1.0, 1.0),
        g.tensor_in(dtype, &Shape::new(wd), -1.0, 1.0),
    ];
    if g.bool() {
        inputs.push(g.tensor_in(dtype, &Shape::new([out]), -1.0, 1.0));
    }
    Sample::new(inputs, attrs)
}

/// `conv1d` / `conv2d`: PyTorch's functional convolutions over `$n`
/// spatial dims, with optional bias.
macro_rules! conv_nd_op {
    ($name:literal, $n:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::AtLeast(2),
                dtypes: FLOATS,
                infer: |x, attrs| {
                    if x.len() > 3 {
                        return Err(concat!($name, " takes (input, weight[, bias])").into());
                    }
                    let c = conv_nd(x, attrs, $n, $name)?;
                    Ok(vec![TensorType::new(x[0].dtype, c.out)])
                },
                lower: |b, x, attrs| {
                    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
                    Ok(vec![lower_conv_nd(b, x, &conv_nd(&types, attrs, $n, $name)?)?])
                },
                reference: |x, attrs| {
                    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
                    Ok(vec![conv_nd_ref(x, &conv_nd(&types, attrs, $n, $name)?)?])
                },
                vjp: Some(|t, a| conv_nd_vjp(t, a, $n, $name)),
                tolerance: |d| Tolerance::for_dtype(d).scaled(20.0),
                samples: || (0..12).map(|i| conv_nd_sample(&mut Gen::new(i), $n)).collect(),
                arbitrary: |g: &mut Gen| conv_nd_sample(g, $n),
                torch: Torch::Expr(concat!("F.", $name, r#"(*x, stride=a.get("stride", 1), padding=a.get("padding", 0), dilation=a.get("dilation", 1), groups=a.get("groups", 1))"#)),
            }
        }
    };
}

conv_nd_op!("conv1d", 1);
conv_nd_op!("conv2d", 2);
