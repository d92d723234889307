//! `max_pool2d` and `avg_pool2d` (NCHW or CHW, PyTorch's floor-mode
//! output size) with `stablehlo.reduce_window`, and `max_pool2d_backward`,
//! the gradient of max pooling: each window's gradient goes to the first
//! position (row-major within the window) holding its maximum.

use ndarray::{ArrayD, IxDyn};
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value, i64_array, int_range};
use tpu_core::{DType, Shape};

use super::accumulator;
use super::conv::{ConvParams, conv_lhs_grad, spatial_ints};
use crate::reduce::kit::with_nan;
use crate::support::*;

/// Dtypes max pooling takes (any ordered type).
const MAX_DTYPES: &[DType] = NUMERIC;

/// A checked 2-D pooling call.
#[derive(Clone, Debug)]
struct Pool {
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    /// The input is `[C, H, W]`.
    unbatched: bool,
    /// The input as `[N, C, H, W]`.
    input: [usize; 4],
    /// The output as `[N, C, OH, OW]`.
    output: [usize; 4],
}

impl Pool {
    /// The output shape as the caller sees it.
    fn out_shape(&self) -> Shape {
        let d = if self.unbatched {
            self.output[1..].to_vec()
        } else {
            self.output.to_vec()
        };
        Shape::new(d)
    }

    /// `(low = high)` padding of the four dims.
    fn pads(&self) -> String {
        format!(
            "dense<[[0, 0], [0, 0], [{0}, {0}], [{1}, {1}]]> : tensor<4x2xi64>",
            self.padding[0], self.padding[1]
        )
    }

    fn window_attrs(&self) -> String {
        let four = |v: [usize; 2]| i64_array([1, 1, v[0] as i64, v[1] as i64]);
        format!(
            "window_dimensions = {}, window_strides = {}, base_dilations = {}, window_dilations = {}, padding = {}",
            four(self.kernel),
            four(self.stride),
            i64_array([1i64, 1, 1, 1]),
            four(self.dilation),
            self.pads()
        )
    }
}

fn pair(attrs: &Attrs, key: &str, default: Option<i64>, min: i64) -> OpResult<[usize; 2]> {
    let v = match (attrs.ints_opt(key)?, default) {
        (Some(v), _) if !v.is_empty() => spatial_ints(attrs, key, 2, 0, min)?,
        (_, Some(d)) => vec![d as usize; 2],
        _ => return Err(invalid!("missing attribute `{key}`")),
    };
    Ok([v[0], v[1]])
}

fn pool_args(x: &TensorType, attrs: &Attrs, max: bool, op: &str) -> OpResult<Pool> {
    let unbatched = match x.shape.rank() {
        3 => true,
        4 => false,
        r => {
            return Err(invalid!(
                "{op} expects a 3-D [C, H, W] or 4-D [N, C, H, W] input, got rank {r}"
            ));
        }
    };
    let d = x.shape.dims();
    let input = if unbatched {
        [1, d[0], d[1], d[2]]
    } else {
        [d[0], d[1], d[2], d[3]]
    };
    if input[1..].contains(&0) {
        return Err(invalid!(
            "{op} expects nonzero channel and spatial sizes (only the batch may be empty), got {}",
            x.shape
        ));
    }
    let kernel = pair(attrs, "kernel_size", None, 1)?;
    let stride = match attrs.ints_opt("stride")? {
        Some(v) if !v.is_empty() => pair(attrs, "stride", None, 1)?,
        _ => kernel,
    };
    let padding = pair(attrs, "padding", Some(0), 0)?;
    let dilation = if max {
        pair(attrs, "dilation", Some(1), 1)?
    } else {
        if attrs.get("dilation").is_some() {
            return Err(invalid!("{op} has no dilation"));
        }
        [1, 1]
    };
    let mut output = [input[0], input[1], 0, 0];
    for i in 0..2 {
        if padding[i] > kernel[i] / 2 {
            return Err(invalid!(
                "{op}: padding {padding:?} must be at most half of kernel_size {kernel:?}"
            ));
        }
        let span = (input[2 + i] as i64 + 2 * padding[i] as i64)
            .saturating_sub((dilation[i] as i64).saturating_mul(kernel[i] as i64 - 1))
            - 1;
        if span < 0 {
            return Err(invalid!(
                "{op}: input {} is too small for kernel_size {kernel:?}, dilation {dilation:?} and padding {padding:?}",
                x.shape
            ));
        }
        output[2 + i] = (span / stride[i] as i64 + 1) as usize;
    }
    Ok(Pool {
        kernel,
        stride,
        padding,
        dilation,
        unbatched,
        input,
        output,
    })
}

fn lowest(dtype: DType) -> f64 {
    if dtype.is_float() {
        f64::NEG_INFINITY
    } else {
        int_range(dtype).0 as f64
    }
}

/// `stablehlo.reduce_window` of a `[N, C, H, W]` value.
fn reduce_window(b: &mut Builder, x: &Value, p: &Pool, init: f64, op: &str) -> Value {
    let init = b.constant(x.dtype(), [], init);
    let region = b.scalar_region(op, x.dtype());
    let out = TensorType::new(x.dtype(), p.output.to_vec());
    b.op(
        "stablehlo.reduce_window",
        &[x, &init],
        &[region],
        &p.window_attrs(),
        vec![out],
    )
    .remove(0)
}

fn lower_max_pool(b: &mut Builder, x: &Value, p: &Pool) -> Value {
    let x4 = b.reshape(x, &p.input);
    let y = if x.shape().numel() == 0 {
        b.constant(x.dtype(), p.output.to_vec(), 0.0)
    } else {
        let y = reduce_window(b, &x4, p, lowest(x.dtype()), "stablehlo.maximum");
        with_nan(b, &x4, y, |b, nan| {
            reduce_window(b, nan, p, 0.0, "stablehlo.or")
        })
    };
    b.reshape(&y, p.out_shape().dims())
}

/// Visits every in-window position of output `(oh, ow)`: `(h, w)` in the
/// unpadded input, `None` where the window lies on padding. Row-major.
fn window(p: &Pool, oh: usize, ow: usize, mut f: impl FnMut(Option<(usize, usize)>)) {
    for i in 0..p.kernel[0] {
        let h = (oh * p.stride[0] + i * p.dilation[0]) as i64 - p.padding[0] as i64;
        for j in 0..p.kernel[1] {
            let w = (ow * p.stride[1] + j * p.dilation[1]) as i64 - p.padding[1] as i64;
            let inside = (0..p.input[2] as i64).contains(&h) && (0..p.input[3] as i64).contains(&w);
            f(inside.then_some((h as usize, w as usize)));
        }
    }
}

/// NaN-propagating maximum, as `stablehlo.maximum`.
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The reference max pool in f64 (padding counts as the lowest value).
fn max_pool_f64(x: &ArrayD<f64>, p: &Pool, low: f64) -> OpResult<ArrayD<f64>> {
    let x4 = x
        .view()
        .into_shape_with_order(IxDyn(&p.input))
        .map_err(|e| format!("max_pool2d: {e}"))?;
    Ok(ArrayD::from_shape_fn(IxDyn(&p.output), |ix| {
        let mut m = low;
        window(p, ix[2], ix[3], |pos| {
            let v = pos.map_or(low, |(h, w)| x4[[ix[0], ix[1], h, w]]);
            m = nan_max(m, v);
        });
        m
    }))
}

fn max_pool_ref(x: &HostTensor, p: &Pool) -> OpResult<HostTensor> {
    let low = lowest(x.dtype());
    let y = if x.dtype().is_float() {
        HostTensor::float(x.dtype(), max_pool_f64(&x.to_f64(), p, low)?)
    } else {
        // Integer values up to 2^53 are exact in f64; wider i64 values
        // compare exactly below.
        let xi = x.to_i64();
        let x4 = xi
            .view()
            .into_shape_with_order(IxDyn(&p.input))
            .map_err(|e| format!("max_pool2d: {e}"))?;
        let lo = int_range(x.dtype()).0;
        let y = ArrayD::from_shape_fn(IxDyn(&p.output), |ix| {
            let mut m = lo;
            window(p, ix[2], ix[3], |pos| {
                if let Some((h, w)) = pos {
                    m = m.max(x4[[ix[0], ix[1], h, w]]);
                }
            });
            m
        });
        HostTensor::int(x.dtype(), y)
    };
    reshape_to(&y, &p.out_shape())
}

/// Distinct values (a shuffled grid with spacing 1/16), exact in every
/// float dtype for up to 256 elements and in f16 / f32 / f64 beyond, so
/// max pooling has no ties and finite differences no kinks.
#[cfg(feature = "conformance")]
fn distinct(g: &mut Gen, dtype: DType, shape: &Shape) -> HostTensor {
    let n = shape.numel();
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, g.below(i + 1));
    }
    if dtype.is_float() {
        let values = v
            .iter()
            .map(|&i| (i as f64 - n as f64 / 2.0) / 16.0)
            .collect();
        HostTensor::from_f64(dtype, shape.clone(), values)
    } else {
        let values = v.iter().map(|&i| i as i64 % 41 - 20).collect();
        HostTensor::from_i64(dtype, shape.clone(), values)
    }
    .unwrap_or_else(|| unreachable!("value count matches the shape"))
}

/// A random valid pooling call: `(input, attrs)`.
#[cfg(feature = "conformance")]
fn pool_sample(g: &mut Gen, dtype: DType, max: bool) -> (HostTensor, Attrs) {
    let kernel = [1 + g.below(3), 1 + g.below(3)];
    let stride = [1 + g.below(3), 1 + g.below(3)];
    let padding = [g.below(kernel[0] / 2 + 1), g.below(kernel[1] / 2 + 1)];
    let dilation = if max {
        [1 + g.below(2), 1 + g.below(2)]
    } else {
        [1, 1]
    };
    let mut dims = vec![g.below(3), 1 + g.below(3)];
    for i in 0..2 {
        let window = dilation[i] * (kernel[i] - 1) + 1;
        let least = window.saturating_sub(2 * padding[i]).max(1);
        dims.push(least + g.below(7));
    }
    if g.below(4) == 0 {
        dims.remove(0);
    }
    // Low-precision dtypes hold distinct values only for small tensors
    // (at most 2 x 11 x 11 elements here).
    if dtype == DType::BF16 {
        let r = dims.len();
        dims[r - 3] = dims[r - 3].min(2);
        if r == 4 {
            dims[0] = dims[0].min(1);
        }
    }
    let shape = Shape::new(dims);
    let x = if max {
        distinct(g, dtype, &shape)
    } else {
        g.tensor_in(dtype, &shape, -1.0, 1.0)
    };
    let two = |g: &mut Gen, v: [usize; 2]| -> Vec<i64> {
        if v[0] == v[1] && g.bool() {
            vec![v[0] as i64]
        } else {
            vec![v[0] as i64, v[1] as i64]
        }
    };
    let mut attrs = Attrs::new().with("kernel_size", two(g, kernel));
    if stride != kernel || g.bool() {
        attrs.set("stride", two(g, stride));
    }
    if padding != [0, 0] || g.bool() {
        attrs.set("padding", two(g, padding));
    }
    if max && (dilation != [1, 1] || g.bool()) {
        attrs.set("dilation", two(g, dilation));
    }
    (x, attrs)
}

fn max_pool_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let x = a.inputs[0];
    if !t.ty(x)?.dtype.is_float() {
        return Ok(vec![None]);
    }
    let g = t.call1("max_pool2d_backward", &[x, a.grads[0]], a.attrs.clone())?;
    Ok(vec![Some(g)])
}

inventory::submit! {
    op_def! {
        name: "max_pool2d",
        arity: Arity::Exactly(1),
        dtypes: MAX_DTYPES,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            require_dtype(t.dtype, MAX_DTYPES, "input")?;
            let p = pool_args(t, attrs, true, "max_pool2d")?;
            Ok(vec![TensorType::new(t.dtype, p.out_shape())])
        },
        lower: |b, x, attrs| {
            let p = pool_args(x[0].ty(), attrs, true, "max_pool2d")?;
            Ok(vec![lower_max_pool(b, &x[0], &p)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let p = pool_args(&x.ty(), attrs, true, "max_pool2d")?;
            Ok(vec![max_pool_ref(x, &p)?])
        },
        vjp: Some(max_pool_vjp),
        samples: || {
            (0..12)
                .map(|i| {
                    let mut g = Gen::new(i);
                    let dtype = if i % 3 == 2 { g.pick(MAX_DTYPES) } else { g.pick(FLOATS) };
                    let (x, attrs) = pool_sample(&mut g, dtype, true);
                    Sample::new(vec![x], attrs)
                })
                .collect()
        },
        arbitrary: |g: &mut Gen| {
            let dtype = g.pick(MAX_DTYPES);
            let (x, attrs) = pool_sample(g, dtype, true);
            Sample::new(vec![x], attrs)
        },
        // Floats are padded with -inf by F.pad: PyTorch's own padding sends the
        // gradient of a window lying wholly in the padding (possible with
        // dilation) outside the input.
        torch: Torch::Expr(r#"(lambda k, s, p, d: F.max_pool2d(F.pad(x[0], [p[-1], p[-1], p[0], p[0]], value=-torch.inf), k, s, 0, d) if x[0].is_floating_point() else F.max_pool2d(x[0], k, s, p, d))(a["kernel_size"], a.get("stride"), a.get("padding", [0]), a.get("dilation", 1))"#),
    }
}

// ---- max_pool2d_backward ----

fn infer_max_backward(x: &[TensorType], attrs: &Attrs) -> OpResult<(Pool, TensorType)> {
    let [xt, gt] = x else {
        return Err("max_pool2d_backward takes (input, output gradient)".into());
    };
    require_dtype(xt.dtype, FLOATS, "input")?;
    let p = pool_args(xt, attrs, true, "max_pool2d_backward")?;
    if gt.dtype != xt.dtype || gt.shape != p.out_shape() {
        return Err(invalid!(
            "the output gradient must be {}{}, got {gt}",
            xt.dtype,
            p.out_shape()
        ));
    }
    Ok((p, xt.clone()))
}

/// For each kernel offset in row-major order: the strided view of the
/// padded input at that offset, compared with the window maxima; the first
/// offset that matches takes the window's gradient, which is put back in
/// place with an interior-padded `stablehlo.pad` and summed.
fn lower_max_backward(b: &mut Builder, x: &Value, g: &Value, p: &Pool) -> Value {
    let dtype = x.dtype();
    let acc = accumulator(dtype);
    if x.shape().numel() == 0 {
        return b.constant(dtype, x.shape().clone(), 0.0);
    }
    let x4 = b.reshape(x, &p.input);
    let g4 = b.reshape(g, &p.output);
    let g4 = b.convert(&g4, acc);
    let pooled = reduce_window(b, &x4, p, f64::NEG_INFINITY, "stablehlo.maximum");
    let (ph, pw) = (p.padding[0] as i64, p.padding[1] as i64);
    let low = b.constant(dtype, [], f64::NEG_INFINITY);
    let xp = b.pad(&x4, &low, &[0, 0, ph, pw], &[0, 0, ph, pw], &[0, 0, 0, 0]);
    let padded = xp.dims().to_vec();
    let out = p.output;
    let mut total = b.constant(acc, padded.clone(), 0.0);
    let mut taken = b.constant(DType::Bool, out.to_vec(), 0.0);
    let zero = b.constant(acc, out.to_vec(), 0.0);
    let zero_scalar = b.constant(acc, [], 0.0);
    for i in 0..p.kernel[0] {
        for j in 0..p.kernel[1] {
            let (oh, ow) = (i * p.dilation[0], j * p.dilation[1]);
            let limit = [
                out[0],
                out[1],
                oh + (out[2] - 1) * p.stride[0] + 1,
                ow + (out[3] - 1) * p.stride[1] + 1,
            ];
            let view = b.slice(
                &xp,
                &[0, 0, oh, ow],
                &limit,
                &[1, 1, p.stride[0], p.stride[1]],
            );
            let is_max = b.compare(Compare::Eq, &view, &pooled);
            let free = b.unary("stablehlo.not", &taken);
            let hit = b.binary("stablehlo.and", &is_max, &free);
            taken = b.binary("stablehlo.or", &taken, &hit);
            let part = b.select(&hit, &g4, &zero);
            let high = [
                0,
                0,
                (padded[2] - limit[2]) as i64,
                (padded[3] - limit[3]) as i64,
            ];
            let placed = b.pad(
                &part,
                &zero_scalar,
                &[0, 0, oh as i64, ow as i64],
                &high,
                &[0, 0, p.stride[0] as i64 - 1, p.stride[1] as i64 - 1],
            );
            total = b.binary("stablehlo.add", &total, &placed);
        }
    }
    let (h, w) = (p.input[2], p.input[3]);
    let inner = b.slice(
        &total,
        &[0, 0, p.padding[0], p.padding[1]],
        &[p.input[0], p.input[1], p.padding[0] + h, p.padding[1] + w],
        &[1, 1, 1, 1],
    );
    let inner = b.convert(&inner, dtype);
    b.reshape(&inner, x.dims())
}

fn max_backward_ref(x: &HostTensor, g: &HostTensor, p: &Pool) -> OpResult<HostTensor> {
    let xf = x.to_f64();
    let pooled = max_pool_f64(&xf, p, f64::NEG_INFINITY)?;
    let x4 = xf
        .view()
        .into_shape_with_order(IxDyn(&p.input))
        .map_err(|e| format!("max_pool2d_backward: {e}"))?;
    let gf = g.to_f64();
    let g4 = gf
        .view()
        .into_shape_with_order(IxDyn(&p.output))
        .map_err(|e| format!("max_pool2d_backward: {e}"))?;
    let mut grad = ArrayD::<f64>::zeros(IxDyn(&p.input));
    for (ix, &m) in pooled.indexed_iter() {
        let mut chosen: Option<Option<(usize, usize)>> = None;
        window(p, ix[2], ix[3], |pos| {
            let v = pos.map_or(f64::NEG_INFINITY, |(h, w)| x4[[ix[0], ix[1], h, w]]);
            if chosen.is_none() && v == m {
                chosen = Some(pos);
            }
        });
        if let Some(Some((h, w))) = chosen {
            grad[[ix[0], ix[1], h, w]] += g4[[ix[0], ix[1], ix[2], ix[3]]];
        }
    }
    reshape_to(&HostTensor::float(x.dtype(), grad), &x.shape())
}

#[cfg(feature = "conformance")]
fn max_backward_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let (x, attrs) = pool_sample(g, dtype, true);
    let p = pool_args(&x.ty(), &attrs, true, "max_pool2d_backward")
        .unwrap_or_else(|e| unreachable!("pool_sample gives valid calls: {e}"));
    let grad = g.tensor_in(dtype, &p.out_shape(), -1.0, 1.0);
    Sample::new(vec![x, grad], attrs)
}

inventory::submit! {
    op_def! {
        name: "max_pool2d_backward",
        arity: Arity::Exactly(2),
        // Piecewise linear in the gradient, piecewise constant in the input;
        // no second-order rule.
        flags: Flags::NOT_DIFFERENTIABLE,
        dtypes: FLOATS,
        infer: |x, attrs| Ok(vec![infer_max_backward(x, attrs)?.1]),
        lower: |b, x, attrs| {
            let types = [x[0].ty().clone(), x[1].ty().clone()];
            let (p, _) = infer_max_backward(&types, attrs)?;
            Ok(vec![lower_max_backward(b, &x[0], &x[1], &p)])
        },
        reference: |x, attrs| {
            let [xt, gt] = x else { return Err("max_pool2d_backward takes two inputs".into()) };
            let (p, _) = infer_max_backward(&[xt.ty(), gt.ty()], attrs)?;
            Ok(vec![max_backward_ref(xt, gt, &p)?])
        },
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..12).map(|i| max_backward_sample(&mut Gen::new(i))).collect(),
        arbitrary: max_backward_sample,
        // The backward of the max_pool2d expression (padded by F.pad, as there).
        torch: Torch::Expr(r#"(lambda k, s, p, d: torch.func.vjp(lambda v: F.max_pool2d(F.pad(v, [p[-1], p[-1], p[0], p[0]], value=-torch.inf), k, s, 0, d), x[0])[1](x[1])[0])(a["kernel_size"], a.get("stride"), a.get("padding", [0]), a.get("dilation", 1))"#),
    }
}

// ---- avg_pool2d ----

/// How many input (not padding) elements each output window covers,
/// `[OH, OW]`.
fn window_counts(p: &Pool) -> Vec<f64> {
    let mut out = Vec::with_capacity(p.output[2] * p.output[3]);
    for oh in 0..p.output[2] {
        for ow in 0..p.output[3] {
            let mut n = 0usize;
            window(p, oh, ow, |pos| n += usize::from(pos.is_some()));
            out.push(n as f64);
        }
    }
    out
}

fn include_pad(attrs: &Attrs) -> OpResult<bool> {
    attrs.bool_or("count_include_pad", true)
}

fn lower_avg_pool(b: &mut Builder, x: &Value, p: &Pool, include: bool) -> Value {
    let dtype = x.dtype();
    let acc = accumulator(dtype);
    let out = p.output.to_vec();
    let y = if x.shape().numel() == 0 {
        b.constant(dtype, out, 0.0)
    } else {
        let x4 = b.reshape(x, &p.input);
        let x4 = b.convert(&x4, acc);
        let s = reduce_window(b, &x4, p, 0.0, "stablehlo.add");
        let divisor = if include {
            b.constant(acc, out.clone(), (p.kernel[0] * p.kernel[1]) as f64)
        } else {
            let counts = b.constant_values(acc, [p.output[2], p.output[3]], &window_counts(p));
            b.broadcast_in_dim(&counts, &out, &[2, 3])
        };
        let y = b.binary("stablehlo.divide", &s, &divisor);
        b.convert(&y, dtype)
    };
    b.reshape(&y, p.out_shape().dims())
}

fn avg_pool_ref(x: &HostTensor, p: &Pool, include: bool) -> OpResult<HostTensor> {
    let xf = x.to_f64();
    let x4 = xf
        .view()
        .into_shape_with_order(IxDyn(&p.input))
        .map_err(|e| format!("avg_pool2d: {e}"))?;
    let full = (p.kernel[0] * p.kernel[1]) as f64;
    let y = ArrayD::from_shape_fn(IxDyn(&p.output), |ix| {
        let (mut s, mut n) = (0.0, 0usize);
        window(p, ix[2], ix[3], |pos| {
            if let Some((h, w)) = pos {
                s += x4[[ix[0], ix[1], h, w]];
                n += 1;
            }
        });
        s / if include { full } else { n as f64 }
    });
    reshape_to(&HostTensor::float(x.dtype(), y), &p.out_shape())
}

/// The average pool's gradient: the output gradient divided by each
/// window's divisor, spread back over the window with a transposed
/// convolution by a kernel of ones (channels folded into the batch).
fn avg_pool_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let x = a.inputs[0];
    let xt = t.ty(x)?;
    let p = pool_args(&xt, a.attrs, false, "avg_pool2d")?;
    let include = include_pad(a.attrs)?;
    let dtype = xt.dtype;
    let [n, c, h, w] = p.input;
    let [_, _, oh, ow] = p.output;
    let conv = ConvParams {
        strides: p.stride.to_vec(),
        padding: p.padding.iter().map(|&v| (v as i64, v as i64)).collect(),
        ..ConvParams::plain(2)
    };
    let kernel = t.full(dtype, &Shape::new([1, 1, p.kernel[0], p.kernel[1]]), 1.0)?;
    let g = t.reshape(a.grads[0], &Shape::new([n * c, 1, oh, ow]))?;
    let g = if include {
        t.scale(g, 1.0 / (p.kernel[0] * p.kernel[1]) as f64)?
    } else {
        let ones = t.full(dtype, &Shape::new([1, 1, h, w]), 1.0)?;
        let counts = t.call1("convolution", &[ones, kernel], conv.attrs())?;
        t.div(g, counts)?
    };
    let gx = conv_lhs_grad(t, g, kernel, &Shape::new([n * c, 1, h, w]), &conv)?;
    Ok(vec![Some(t.reshape(gx, &xt.shape)?)])
}

#[cfg(feature = "conformance")]
fn avg_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let (x, mut attrs) = pool_sample(g, dtype, false);
    if g.bool() {
        attrs.set("count_include_pad", g.bool());
    }
    Sample::new(vec![x], attrs)
}

inventory::submit! {
    op_def! {
        name: "avg_pool2d",
        arity: Arity::Exactly(1),
        dtypes: FLOATS,
        infer: |x, attrs| {
            let t = x.first().ok_or("missing input")?;
            require_dtype(t.dtype, FLOATS, "input")?;
            include_pad(attrs)?;
            let p = pool_args(t, attrs, false, "avg_pool2d")?;
            Ok(vec![TensorType::new(t.dtype, p.out_shape())])
        },
        lower: |b, x, attrs| {
            let p = pool_args(x[0].ty(), attrs, false, "avg_pool2d")?;
            Ok(vec![lower_avg_pool(b, &x[0], &p, include_pad(attrs)?)])
        },
        reference: |x, attrs| {
            let x = one(x)?;
            let p = pool_args(&x.ty(), attrs, false, "avg_pool2d")?;
            Ok(vec![avg_pool_ref(x, &p, include_pad(attrs)?)?])
        },
        vjp: Some(avg_pool_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(4.0),
        samples: || (0..12).map(|i| avg_sample(&mut Gen::new(i))).collect(),
        arbitrary: avg_sample,
        torch: Torch::Expr(r#"F.avg_pool2d(x[0], a["kernel_size"], a.get("stride"), a.get("padding", 0), count_include_pad=a.get("count_include_pad", True))"#),
    }
}
