//! Complex numbers: building them from parts (`complex`, `polar`), taking
//! them apart (`real`, `imag`, `angle`), `conj`, and the two real ops whose
//! complex forms differ (`abs` gives the magnitude, `neg` negates both
//! parts). Gradients follow PyTorch's convention: for a real loss `L`, the
//! gradient of `z` is `dL/dRe(z) + i dL/dIm(z)`.

use tpu_core::host::{HostData, HostTensor};
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{Complex, DType, invalid, op_def};

use super::unary::chain;
use crate::support::*;

/// The part dtypes complex numbers are made of.
const PARTS: &[DType] = &[DType::F32, DType::F64];
/// What `complex` and `polar` take and make.
const PARTS_AND_COMPLEX: &[DType] = &[DType::F32, DType::F64, DType::C64, DType::C128];

fn input(inputs: &[TensorType]) -> OpResult<&TensorType> {
    inputs.first().ok_or_else(|| "missing input".into())
}

/// The type of `x`'s parts, for a complex `x`.
fn part_type(inputs: &[TensorType]) -> OpResult<Vec<TensorType>> {
    let x = input(inputs)?;
    require_dtype(x.dtype, COMPLEX, "input")?;
    Ok(vec![TensorType::new(x.dtype.real_part(), x.shape.clone())])
}

/// The complex type two real inputs of one float dtype make.
fn complex_type(inputs: &[TensorType], first: &str, second: &str) -> OpResult<Vec<TensorType>> {
    let [a, b] = inputs else {
        return Err("takes two inputs".into());
    };
    require_dtype(a.dtype, PARTS, first)?;
    if a.dtype != b.dtype {
        return Err(invalid!(
            "{first} and {second} must have one dtype, got {} and {}",
            a.dtype,
            b.dtype
        ));
    }
    let shape = broadcast_shapes(&a.shape, &b.shape)?;
    let dtype = a.dtype.complex_of().ok_or("no complex form")?;
    Ok(vec![TensorType::new(dtype, shape)])
}

/// Complex values from a function of two broadcast real inputs.
fn from_parts(x: &[HostTensor], f: impl Fn(f64, f64) -> Complex<f64>) -> OpResult<Vec<HostTensor>> {
    let shape = broadcast_shapes(&x[0].shape(), &x[1].shape())?;
    let a = broadcast_array(&x[0].to_f64(), shape.dims())?;
    let b = broadcast_array(&x[1].to_f64(), shape.dims())?;
    let values = ndarray::Zip::from(&a).and(&b).map_collect(|&p, &q| f(p, q));
    let dtype = x[0].dtype().complex_of().ok_or("no complex form")?;
    Ok(vec![HostTensor::complex(dtype, values)])
}

/// A real function of each complex value.
fn of_complex(x: &HostTensor, f: impl Fn(Complex<f64>) -> f64) -> HostTensor {
    HostTensor::float(x.dtype().real_part(), x.to_complex().mapv(f))
}

/// The real part of `v` (a no-op for real `v`).
fn re(t: &mut dyn Tape, v: Var) -> OpResult<Var> {
    t.call1("real", &[v], Attrs::new())
}

/// The imaginary part of complex `v`.
fn im(t: &mut dyn Tape, v: Var) -> OpResult<Var> {
    t.call1("imag", &[v], Attrs::new())
}

/// `re + i im` on the tape.
fn join(t: &mut dyn Tape, re: Var, im: Var) -> OpResult<Var> {
    t.call1("complex", &[re, im], Attrs::new())
}

fn operands(b: &mut Builder, x: &[Value], out: &TensorType) -> (Value, Value) {
    (
        b.broadcast_to(&x[0], out.shape.dims()),
        b.broadcast_to(&x[1], out.shape.dims()),
    )
}

/// Complex samples of both widths, values in `[lo, hi)` for both parts.
#[cfg(feature = "conformance")]
fn complex_samples() -> Vec<Sample> {
    unary_samples(COMPLEX, -3.0, 3.0)
}

/// Pairs of real tensors of one float dtype (broadcasting), as `complex`
/// and `polar` take; `first` and `second` bound each.
#[cfg(feature = "conformance")]
fn pair_sample(g: &mut Gen, first: (f64, f64), second: (f64, f64)) -> Sample {
    let dtype = g.pick(PARTS);
    let shape = g.shape(0, 3);
    let other = g.broadcastable(&shape);
    let a = g.tensor_in(dtype, &shape, first.0, first.1);
    let b = g.tensor_in(dtype, &other, second.0, second.1);
    Sample::new(vec![a, b], Attrs::new())
}

inventory::submit! {
    op_def! {
        name: "complex",
        arity: Arity::Exactly(2),
        flags: Flags::ELEMENTWISE,
        dtypes: PARTS_AND_COMPLEX,
        infer: |x, _| complex_type(x, "real part", "imaginary part"),
        lower: |b, x, _| {
            let out = &complex_type(&[x[0].ty().clone(), x[1].ty().clone()], "", "")?[0];
            let (re, im) = operands(b, x, out);
            Ok(vec![b.complex(&re, &im)])
        },
        reference: |x, _| from_parts(x, Complex::new),
        vjp: Some(|t, a| {
            let re_g = re(t, a.grads[0])?;
            let im_g = im(t, a.grads[0])?;
            let gre = t.sum_to(re_g, &t.ty(a.inputs[0])?.shape)?;
            let gim = t.sum_to(im_g, &t.ty(a.inputs[1])?.shape)?;
            Ok(vec![Some(gre), Some(gim)])
        }),
        samples: || (0..6).map(|i| pair_sample(&mut Gen::new(i), (-3.0, 3.0), (-3.0, 3.0))).collect(),
        arbitrary: |g: &mut Gen| pair_sample(g, (-3.0, 3.0), (-3.0, 3.0)),
        torch: Torch::Expr("torch.complex(x[0], x[1])"),
    }
}

inventory::submit! {
    op_def! {
        name: "polar",
        arity: Arity::Exactly(2),
        flags: Flags::ELEMENTWISE,
        dtypes: PARTS_AND_COMPLEX,
        infer: |x, _| complex_type(x, "magnitude", "angle"),
        lower: |b, x, _| {
            let out = &complex_type(&[x[0].ty().clone(), x[1].ty().clone()], "", "")?[0];
            let (r, theta) = operands(b, x, out);
            let cos = b.unary("stablehlo.cosine", &theta);
            let sin = b.unary("stablehlo.sine", &theta);
            let re = b.binary("stablehlo.multiply", &r, &cos);
            let im = b.binary("stablehlo.multiply", &r, &sin);
            Ok(vec![b.complex(&re, &im)])
        },
        reference: |x, _| from_parts(x, Complex::from_polar),
        // z = r e^{iθ}: dz = e^{iθ} dr + i z dθ, so with g's parts (gr, gi)
        // and z's (zr, zi): grad r = gr cos θ + gi sin θ, grad θ = gi zr - gr zi.
        vjp: Some(|t, a| {
            let (r, theta, z, g) = (a.inputs[0], a.inputs[1], a.outputs[0], a.grads[0]);
            let (gr, gi) = (re(t, g)?, im(t, g)?);
            let (zr, zi) = (re(t, z)?, im(t, z)?);
            let cos = t.unary("cos", theta)?;
            let sin = t.unary("sin", theta)?;
            let a1 = t.mul(gr, cos)?;
            let a2 = t.mul(gi, sin)?;
            let grad_r = t.add(a1, a2)?;
            let b1 = t.mul(gi, zr)?;
            let b2 = t.mul(gr, zi)?;
            let grad_theta = t.sub(b1, b2)?;
            let grad_r = t.sum_to(grad_r, &t.ty(r)?.shape)?;
            let grad_theta = t.sum_to(grad_theta, &t.ty(theta)?.shape)?;
            Ok(vec![Some(grad_r), Some(grad_theta)])
        }),
        tolerance: super::unary::transcendental,
        samples: || (0..6).map(|i| pair_sample(&mut Gen::new(i), (0.1, 3.0), (-3.0, 3.0))).collect(),
        arbitrary: |g: &mut Gen| pair_sample(g, (0.1, 3.0), (-3.0, 3.0)),
        torch: Torch::Expr("torch.polar(x[0], x[1])"),
    }
}

inventory::submit! {
    op_def! {
        name: "real",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: COMPLEX,
        infer: |x, _| part_type(x),
        lower: |b, x, _| Ok(vec![b.part("stablehlo.real", &x[0])]),
        reference: |x, _| Ok(vec![of_complex(one(x)?, |z| z.re)]),
        vjp: Some(|t, a| {
            let zero = t.full_like(a.grads[0], 0.0)?;
            Ok(vec![Some(join(t, a.grads[0], zero)?)])
        }),
        samples: complex_samples,
        arbitrary: |g: &mut Gen| unary_arbitrary(g, COMPLEX, -3.0, 3.0),
        torch: Torch::Expr("torch.real(x[0])"),
    }
}

inventory::submit! {
    op_def! {
        name: "imag",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: COMPLEX,
        infer: |x, _| part_type(x),
        lower: |b, x, _| Ok(vec![b.part("stablehlo.imag", &x[0])]),
        reference: |x, _| Ok(vec![of_complex(one(x)?, |z| z.im)]),
        vjp: Some(|t, a| {
            let zero = t.full_like(a.grads[0], 0.0)?;
            Ok(vec![Some(join(t, zero, a.grads[0])?)])
        }),
        samples: complex_samples,
        arbitrary: |g: &mut Gen| unary_arbitrary(g, COMPLEX, -3.0, 3.0),
        torch: Torch::Expr("torch.imag(x[0])"),
    }
}

fn lower_conj(b: &mut Builder, x: &Value) -> Value {
    let re = b.part("stablehlo.real", x);
    let im = b.part("stablehlo.imag", x);
    let minus_im = b.unary("stablehlo.negate", &im);
    b.complex(&re, &minus_im)
}

inventory::submit! {
    op_def! {
        name: "conj",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: COMPLEX,
        infer: |x, _| {
            let t = input(x)?;
            require_dtype(t.dtype, COMPLEX, "input")?;
            Ok(vec![t.clone()])
        },
        lower: |b, x, _| Ok(vec![lower_conj(b, &x[0])]),
        reference: |x, _| {
            let x = one(x)?;
            Ok(vec![HostTensor::complex(x.dtype(), x.to_complex().mapv(|z| z.conj()))])
        },
        vjp: Some(|t, a| Ok(vec![Some(t.conj(a.grads[0])?)])),
        samples: complex_samples,
        arbitrary: |g: &mut Gen| unary_arbitrary(g, COMPLEX, -3.0, 3.0),
        torch: Torch::Expr("torch.conj(x[0]).resolve_conj()"),
    }
}

/// `angle(z) = atan2(im, re)`; for z = x + iy its gradient is
/// `g (-y + ix) / |z|^2 = g i z / |z|^2`.
fn angle_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let z = a.inputs[0];
    let (x, y) = (re(t, z)?, im(t, z)?);
    let xx = t.mul(x, x)?;
    let yy = t.mul(y, y)?;
    let norm2 = t.add(xx, yy)?;
    let scaled = t.div(a.grads[0], norm2)?;
    let minus_y = t.neg(y)?;
    let gre = t.mul(scaled, minus_y)?;
    let gim = t.mul(scaled, x)?;
    Ok(vec![Some(join(t, gre, gim)?)])
}

inventory::submit! {
    op_def! {
        name: "angle",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: COMPLEX,
        infer: |x, _| part_type(x),
        lower: |b, x, _| {
            let re = b.part("stablehlo.real", &x[0]);
            let im = b.part("stablehlo.imag", &x[0]);
            Ok(vec![b.binary("stablehlo.atan2", &im, &re)])
        },
        reference: |x, _| Ok(vec![of_complex(one(x)?, |z| z.im.atan2(z.re))]),
        vjp: Some(angle_vjp),
        tolerance: super::unary::transcendental,
        samples: complex_samples,
        arbitrary: |g: &mut Gen| unary_arbitrary(g, COMPLEX, -3.0, 3.0),
        torch: Torch::Expr("torch.angle(x[0])"),
    }
}

/// `abs` of complex `z` is `|z|`, real; its gradient is `g z / |z|` (0 at 0).
fn abs_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let z = a.inputs[0];
    let dtype = t.ty(z)?.dtype;
    if !dtype.is_complex() {
        return chain(t, a, |t, x, _| t.unary("sign", x));
    }
    let r = a.outputs[0];
    let zero = t.full_like(r, 0.0)?;
    let one = t.full_like(r, 1.0)?;
    let at_zero = t.call1("eq", &[r, zero], Attrs::new())?;
    let safe = t.call1("where", &[at_zero, one, r], Attrs::new())?;
    let g = t.div(a.grads[0], safe)?;
    let g = t.cast(g, dtype)?;
    Ok(vec![Some(t.mul(g, z)?)])
}

inventory::submit! {
    op_def! {
        name: "abs",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: SIGNED_OR_COMPLEX,
        infer: |x, _| {
            let t = input(x)?;
            require_dtype(t.dtype, SIGNED_OR_COMPLEX, "input")?;
            Ok(vec![TensorType::new(t.dtype.real_part(), t.shape.clone())])
        },
        lower: |b, x, _| {
            let ty = TensorType::new(x[0].dtype().real_part(), x[0].shape().clone());
            Ok(vec![b.op1("stablehlo.abs", &[&x[0]], "", ty)])
        },
        reference: |x, _| {
            let x = one(x)?;
            Ok(vec![match x.data() {
                HostData::Complex(_) => of_complex(x, |v| v.norm()),
                _ => map_same(x, f64::abs, |v: i64| v.wrapping_abs()),
            }])
        },
        vjp: Some(abs_vjp),
        samples: || {
            let mut s = unary_samples(SIGNED, -3.0, 3.0);
            s.extend(complex_samples());
            s
        },
        arbitrary: |g: &mut Gen| unary_arbitrary(g, SIGNED_OR_COMPLEX, -3.0, 3.0),
        torch: Torch::Expr("torch.abs(x[0])"),
    }
}

fn neg_ref(x: &HostTensor) -> HostTensor {
    match x.data() {
        HostData::Complex(z) => HostTensor::complex(x.dtype(), z.mapv(|v| -v)),
        _ => map_same(x, |v| -v, i64::wrapping_neg),
    }
}

inventory::submit! {
    op_def! {
        name: "neg",
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: SIGNED_OR_COMPLEX,
        infer: |x, _| {
            let t = input(x)?;
            require_dtype(t.dtype, SIGNED_OR_COMPLEX, "input")?;
            Ok(vec![t.clone()])
        },
        lower: |b, x, _| Ok(vec![b.unary("stablehlo.negate", &x[0])]),
        reference: |x, _| Ok(vec![neg_ref(one(x)?)]),
        vjp: Some(|t, a| Ok(vec![Some(t.neg(a.grads[0])?)])),
        samples: || {
            let mut s = unary_samples(SIGNED, -3.0, 3.0);
            s.extend(complex_samples());
            s
        },
        arbitrary: |g: &mut Gen| unary_arbitrary(g, SIGNED_OR_COMPLEX, -3.0, 3.0),
        torch: Torch::Expr("torch.neg(x[0])"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    #[test]
    fn magnitude_and_phase_of_a_known_value() {
        let z = HostTensor::complex(
            DType::C128,
            ArrayD::from_shape_vec(ndarray::IxDyn(&[1]), vec![Complex::new(3.0, 4.0)]).unwrap(),
        );
        assert_eq!(of_complex(&z, |v| v.norm()).to_f64()[[0]], 5.0);
        assert_eq!(neg_ref(&z).to_complex()[[0]], Complex::new(-3.0, -4.0));
    }
}
