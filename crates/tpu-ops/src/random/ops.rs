//! `uniform`, `normal`, `bernoulli` and `dropout`, all drawn from an
//! explicit `u32[2]` key with the counter-based generator of
//! [`super::bits`]. The device computes the same integer bits as the
//! reference; only the float transforms (log, cos) may differ by rounding.

use ndarray::Zip;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};
use tpu_core::{DType, Shape};

use super::bits::*;
use crate::support::*;

/// The `shape` attribute (every dim >= 0, at most `u32::MAX` elements: the
/// generator's counter is 32 bits).
fn shape_of(attrs: &Attrs) -> OpResult<Shape> {
    let dims = attrs.ints("shape")?;
    if let Some(d) = dims.iter().find(|&&d| d < 0) {
        return Err(invalid!("shape {dims:?} has a negative dimension {d}"));
    }
    let shape = Shape::new(dims.iter().map(|&d| d as usize).collect::<Vec<_>>());
    check_count(&shape)?;
    Ok(shape)
}

fn check_count(shape: &Shape) -> OpResult<()> {
    if shape.numel() as u64 > u64::from(u32::MAX) {
        return Err(invalid!(
            "shape {shape} has more elements than the generator's 32-bit counter allows"
        ));
    }
    Ok(())
}

/// The key (input `i`), checked.
fn key_at(inputs: &[TensorType], i: usize) -> OpResult<&TensorType> {
    let key = inputs.get(i).ok_or("missing key input")?;
    check_key(key)?;
    Ok(key)
}

/// The float dtype draws are made in before rounding to `dtype`: f64 for
/// f64, f32 otherwise.
fn compute_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The float output dtype (`dtype` attribute, f32 when absent).
fn float_dtype(attrs: &Attrs) -> OpResult<DType> {
    let dtype = attrs.dtype_opt("dtype")?.unwrap_or(DType::F32);
    require_dtype(dtype, FLOATS, "dtype")?;
    Ok(dtype)
}

fn probability(attrs: &Attrs) -> OpResult<f64> {
    let p = attrs.float("p")?;
    if !(0.0..=1.0).contains(&p) {
        return Err(invalid!("probability p must be in [0, 1], got {p}"));
    }
    Ok(p)
}

/// `u < p` exactly, on the 24-bit mantissa `m` (`u = m * 2^-24`):
/// `m < ceil(p * 2^24)`.
fn threshold(p: f64) -> u32 {
    (p * 16_777_216.0).ceil().clamp(0.0, 16_777_216.0) as u32
}

#[cfg(feature = "conformance")]
fn random_key(g: &mut Gen) -> HostTensor {
    let words = vec![g.u64() as u32 as i64, g.u64() as u32 as i64];
    HostTensor::from_i64(DType::U32, [2], words)
        .unwrap_or_else(|| unreachable!("two words fill [2]"))
}

// ---- uniform ----

struct UniformArgs {
    shape: Shape,
    dtype: DType,
    low: f64,
    high: f64,
}

fn uniform_args(attrs: &Attrs) -> OpResult<UniformArgs> {
    let (low, high) = (attrs.float_or("low", 0.0)?, attrs.float_or("high", 1.0)?);
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(invalid!(
            "uniform needs finite low <= high, got low = {low}, high = {high}"
        ));
    }
    Ok(UniformArgs {
        shape: shape_of(attrs)?,
        dtype: float_dtype(attrs)?,
        low,
        high,
    })
}

fn lower_uniform(b: &mut Builder, key: &Value, a: &UniformArgs) -> Value {
    let dims = a.shape.dims();
    let compute = compute_dtype(a.dtype);
    let bits = lower_bits(b, key, dims, &[0]).remove(0);
    let u = lower_unit(b, &bits, compute);
    let span = b.constant(compute, dims.to_vec(), a.high - a.low);
    let low = b.constant(compute, dims.to_vec(), a.low);
    let scaled = b.binary("stablehlo.multiply", &u, &span);
    let v = b.binary("stablehlo.add", &scaled, &low);
    b.convert(&v, a.dtype)
}

/// `low + (high - low) * u` with the rounding of the device's compute dtype.
fn uniform_value(m: u32, a: &UniformArgs) -> f64 {
    if compute_dtype(a.dtype) == DType::F64 {
        a.low + (a.high - a.low) * (f64::from(m) * UNIT)
    } else {
        let u = m as f32 * UNIT as f32;
        f64::from(u * (a.high - a.low) as f32 + a.low as f32)
    }
}

fn uniform_ref(key: &HostTensor, a: &UniformArgs) -> OpResult<HostTensor> {
    let bits = host_bits(key, a.shape.numel(), 0)?;
    let values = bits
        .into_iter()
        .map(|x| uniform_value(mantissa(x), a))
        .collect();
    tensor_f64(a.dtype, a.shape.dims(), values)
}

#[cfg(feature = "conformance")]
fn uniform_sample(g: &mut Gen) -> Sample {
    let shape = g.shape(0, 4);
    let mut attrs = Attrs::new().with("shape", shape.dims());
    if g.below(4) != 0 {
        attrs.set("dtype", g.pick(FLOATS));
    }
    if g.bool() {
        let low = g.uniform(-3.0, 3.0);
        attrs.set("low", low);
        attrs.set("high", low + g.uniform(0.0, 5.0));
    }
    Sample::new(vec![random_key(g)], attrs)
}

inventory::submit! {
    op_def! {
        name: "uniform",
        arity: Arity::Exactly(1),
        flags: Flags::RANDOM,
        dtypes: FLOATS,
        infer: |x, attrs| {
            key_at(x, 0)?;
            let a = uniform_args(attrs)?;
            Ok(vec![TensorType::new(a.dtype, a.shape)])
        },
        lower: |b, x, attrs| Ok(vec![lower_uniform(b, &x[0], &uniform_args(attrs)?)]),
        reference: |x, attrs| Ok(vec![uniform_ref(one(x)?, &uniform_args(attrs)?)?]),
        tolerance: |d| Tolerance::for_dtype(d).scaled(2.0),
        samples: || (0..8).map(|i| uniform_sample(&mut Gen::new(i))).collect(),
        arbitrary: uniform_sample,
        torch: Torch::Unmatched("draws from an explicit key; PyTorch's generator gives other numbers"),
    }
}

// ---- normal ----

struct NormalArgs {
    shape: Shape,
    dtype: DType,
    mean: f64,
    std: f64,
}

fn normal_args(attrs: &Attrs) -> OpResult<NormalArgs> {
    let (mean, std) = (attrs.float_or("mean", 0.0)?, attrs.float_or("std", 1.0)?);
    if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
        return Err(invalid!(
            "normal needs a finite mean and a finite std >= 0, got mean = {mean}, std = {std}"
        ));
    }
    Ok(NormalArgs {
        shape: shape_of(attrs)?,
        dtype: float_dtype(attrs)?,
        mean,
        std,
    })
}

/// Box–Muller: `sqrt(-2 ln(1 - u0)) * cos(2 pi u1)` (`1 - u0` is in (0, 1]).
fn lower_normal(b: &mut Builder, key: &Value, a: &NormalArgs) -> Value {
    let dims = a.shape.dims().to_vec();
    let compute = compute_dtype(a.dtype);
    let streams = lower_bits(b, key, &dims, &[0, 1]);
    let u0 = lower_unit(b, &streams[0], compute);
    let u1 = lower_unit(b, &streams[1], compute);
    let one = b.constant(compute, dims.clone(), 1.0);
    let v = b.binary("stablehlo.subtract", &one, &u0);
    let log = b.unary("stablehlo.log", &v);
    let minus_two = b.constant(compute, dims.clone(), -2.0);
    let r2 = b.binary("stablehlo.multiply", &log, &minus_two);
    let r = b.unary("stablehlo.sqrt", &r2);
    let two_pi = b.constant(compute, dims.clone(), std::f64::consts::TAU);
    let theta = b.binary("stablehlo.multiply", &u1, &two_pi);
    let c = b.unary("stablehlo.cosine", &theta);
    let z = b.binary("stablehlo.multiply", &r, &c);
    let std = b.constant(compute, dims.clone(), a.std);
    let mean = b.constant(compute, dims, a.mean);
    let scaled = b.binary("stablehlo.multiply", &z, &std);
    let v = b.binary("stablehlo.add", &scaled, &mean);
    b.convert(&v, a.dtype)
}

fn normal_ref(key: &HostTensor, a: &NormalArgs) -> OpResult<HostTensor> {
    let n = a.shape.numel();
    let (b0, b1) = (host_bits(key, n, 0)?, host_bits(key, n, 1)?);
    let values = b0
        .into_iter()
        .zip(b1)
        .map(|(x, y)| {
            let u0 = f64::from(mantissa(x)) * UNIT;
            let u1 = f64::from(mantissa(y)) * UNIT;
            let z = (-2.0 * (1.0 - u0).ln()).sqrt() * (std::f64::consts::TAU * u1).cos();
            a.mean + a.std * z
        })
        .collect();
    tensor_f64(a.dtype, a.shape.dims(), values)
}

#[cfg(feature = "conformance")]
fn normal_sample(g: &mut Gen) -> Sample {
    let shape = g.shape(0, 4);
    let mut attrs = Attrs::new().with("shape", shape.dims());
    if g.below(4) != 0 {
        attrs.set("dtype", g.pick(FLOATS));
    }
    if g.bool() {
        attrs.set("mean", g.uniform(-2.0, 2.0));
        attrs.set("std", g.uniform(0.0, 2.0));
    }
    Sample::new(vec![random_key(g)], attrs)
}

inventory::submit! {
    op_def! {
        name: "normal",
        arity: Arity::Exactly(1),
        flags: Flags::RANDOM,
        dtypes: FLOATS,
        infer: |x, attrs| {
            key_at(x, 0)?;
            let a = normal_args(attrs)?;
            Ok(vec![TensorType::new(a.dtype, a.shape)])
        },
        lower: |b, x, attrs| Ok(vec![lower_normal(b, &x[0], &normal_args(attrs)?)]),
        reference: |x, attrs| Ok(vec![normal_ref(one(x)?, &normal_args(attrs)?)?]),
        // log and cos are computed in f32 on the device.
        tolerance: |d| Tolerance::for_dtype(d).scaled(20.0),
        samples: || (0..8).map(|i| normal_sample(&mut Gen::new(i))).collect(),
        arbitrary: normal_sample,
        torch: Torch::Unmatched("draws from an explicit key; PyTorch's generator gives other numbers"),
    }
}

// ---- bernoulli ----

/// `u < p` for every element of `dims`, as booleans.
fn lower_mask(b: &mut Builder, key: &Value, dims: &[usize], p: f64) -> Value {
    let bits = lower_bits(b, key, dims, &[0]).remove(0);
    let m = lower_mantissa(b, &bits);
    let t = b.constant(DType::U32, dims.to_vec(), f64::from(threshold(p)));
    b.compare(Compare::Lt, &m, &t)
}

fn host_mask(key: &HostTensor, n: usize, p: f64) -> OpResult<Vec<bool>> {
    let t = threshold(p);
    Ok(host_bits(key, n, 0)?
        .into_iter()
        .map(|x| mantissa(x) < t)
        .collect())
}

#[cfg(feature = "conformance")]
fn bernoulli_sample(g: &mut Gen) -> Sample {
    let shape = g.shape(0, 4);
    let p = g.pick(&[0.0, 0.1, 0.5, 0.9, 1.0, 0.333]);
    Sample::new(
        vec![random_key(g)],
        Attrs::new().with("shape", shape.dims()).with("p", p),
    )
}

inventory::submit! {
    op_def! {
        name: "bernoulli",
        arity: Arity::Exactly(1),
        flags: Flags::RANDOM,
        dtypes: &[DType::Bool],
        infer: |x, attrs| {
            key_at(x, 0)?;
            probability(attrs)?;
            Ok(vec![TensorType::new(DType::Bool, shape_of(attrs)?)])
        },
        lower: |b, x, attrs| {
            let shape = shape_of(attrs)?;
            Ok(vec![lower_mask(b, &x[0], shape.dims(), probability(attrs)?)])
        },
        reference: |x, attrs| {
            let shape = shape_of(attrs)?;
            let mask = host_mask(one(x)?, shape.numel(), probability(attrs)?)?;
            HostTensor::from_i64(DType::Bool, shape, mask.into_iter().map(i64::from).collect())
                .map(|t| vec![t])
                .ok_or_else(|| "bernoulli value count mismatch".into())
        },
        samples: || (0..8).map(|i| bernoulli_sample(&mut Gen::new(i))).collect(),
        arbitrary: bernoulli_sample,
        torch: Torch::Unmatched("draws from an explicit key; PyTorch's generator gives other numbers"),
    }
}

// ---- dropout ----

fn infer_dropout(x: &[TensorType], attrs: &Attrs) -> OpResult<TensorType> {
    let t = x.first().ok_or("missing input")?;
    require_dtype(t.dtype, FLOATS, "input")?;
    key_at(x, 1)?;
    probability(attrs)?;
    check_count(&t.shape)?;
    Ok(t.clone())
}

/// `1 / (1 - p)` in `dtype`, as PyTorch scales the kept values.
fn keep_scale(p: f64) -> f64 {
    1.0 / (1.0 - p)
}

fn lower_dropout(b: &mut Builder, x: &Value, key: &Value, p: f64) -> Value {
    let dims = x.dims().to_vec();
    let keep = lower_mask(b, key, &dims, 1.0 - p);
    let scale = b.constant(x.dtype(), dims.clone(), keep_scale(p));
    let scaled = b.binary("stablehlo.multiply", x, &scale);
    let zero = b.constant(x.dtype(), dims, 0.0);
    b.select(&keep, &scaled, &zero)
}

fn dropout_ref(x: &HostTensor, key: &HostTensor, p: f64) -> OpResult<HostTensor> {
    let keep = host_mask(key, x.shape().numel(), 1.0 - p)?;
    let keep = ndarray::ArrayD::from_shape_vec(x.dims().to_vec(), keep)
        .map_err(|e| format!("dropout mask: {e}"))?;
    // The scale is rounded to the input's dtype first, like PyTorch's noise.
    let scale = HostTensor::scalar(x.dtype(), keep_scale(p)).to_f64();
    let scale = scale.iter().next().copied().unwrap_or(0.0);
    let values = Zip::from(&x.to_f64())
        .and(&keep)
        .map_collect(|&v, &k| if k { v * scale } else { 0.0 });
    Ok(HostTensor::float(x.dtype(), values))
}

#[cfg(feature = "conformance")]
fn dropout_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let shape = g.shape(0, 4);
    let p = g.pick(&[0.0, 0.1, 0.5, 0.9, 1.0, 0.25]);
    Sample::new(
        vec![g.tensor(dtype, &shape), random_key(g)],
        Attrs::new().with("p", p),
    )
}

inventory::submit! {
    op_def! {
        name: "dropout",
        arity: Arity::Exactly(2),
        flags: Flags::RANDOM,
        dtypes: FLOATS,
        infer: |x, attrs| Ok(vec![infer_dropout(x, attrs)?]),
        lower: |b, x, attrs| Ok(vec![lower_dropout(b, &x[0], &x[1], probability(attrs)?)]),
        reference: |x, attrs| {
            let [x, key] = x else { return Err("dropout takes (x, key)".into()) };
            Ok(vec![dropout_ref(x, key, probability(attrs)?)?])
        },
        // Linear in x with the mask the key gives: the gradient is the
        // same dropout of the incoming gradient. The key gets none.
        vjp: Some(|t, a| {
            let g = t.call1("dropout", &[a.grads[0], a.inputs[1]], a.attrs.clone())?;
            Ok(vec![Some(g), None])
        }),
        samples: || (0..8).map(|i| dropout_sample(&mut Gen::new(i))).collect(),
        arbitrary: dropout_sample,
        torch: Torch::Unmatched("draws from an explicit key; PyTorch's generator gives other numbers"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpu_core::op::run_reference;

    fn key(a: u32, b: u32) -> HostTensor {
        HostTensor::from_i64(DType::U32, [2], vec![i64::from(a), i64::from(b)])
            .unwrap_or_else(|| unreachable!())
    }

    fn draw(op: &str, k: &HostTensor, attrs: &Attrs) -> Vec<f64> {
        let registry = crate::registry().unwrap_or_else(|e| panic!("{e}"));
        let def = registry.get(op).unwrap_or_else(|e| panic!("{e}"));
        let out =
            run_reference(def, std::slice::from_ref(k), attrs).unwrap_or_else(|e| panic!("{e}"));
        out[0].to_f64().iter().copied().collect()
    }

    #[test]
    fn same_key_same_numbers_different_keys_different_numbers() {
        let attrs = Attrs::new().with("shape", vec![64i64]);
        for op in ["uniform", "normal"] {
            let a = draw(op, &key(1, 2), &attrs);
            assert_eq!(a, draw(op, &key(1, 2), &attrs), "{op}");
            let b = draw(op, &key(1, 3), &attrs);
            let c = draw(op, &key(7, 2), &attrs);
            assert!(a.iter().zip(&b).all(|(x, y)| x != y), "{op}");
            assert!(a.iter().zip(&c).all(|(x, y)| x != y), "{op}");
        }
        let bern = Attrs::new().with("shape", vec![256i64]).with("p", 0.5);
        let a = draw("bernoulli", &key(1, 2), &bern);
        assert_eq!(a, draw("bernoulli", &key(1, 2), &bern));
        assert_ne!(a, draw("bernoulli", &key(2, 1), &bern));
    }

    fn moments(v: &[f64]) -> (f64, f64) {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        (mean, var)
    }

    #[test]
    fn moments_are_plausible() {
        let n = 200_000i64;
        let u = draw("uniform", &key(42, 0), &Attrs::new().with("shape", vec![n]));
        assert!(u.iter().all(|&x| (0.0..1.0).contains(&x)));
        let (mean, var) = moments(&u);
        assert!((mean - 0.5).abs() < 0.005, "uniform mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.002, "uniform variance {var}");

        let shifted = Attrs::new()
            .with("shape", vec![n])
            .with("low", -2.0)
            .with("high", 4.0);
        let (mean, var) = moments(&draw("uniform", &key(3, 9), &shifted));
        assert!((mean - 1.0).abs() < 0.03, "uniform[-2, 4) mean {mean}");
        assert!((var - 3.0).abs() < 0.06, "uniform[-2, 4) variance {var}");

        let z = draw("normal", &key(5, 6), &Attrs::new().with("shape", vec![n]));
        let (mean, var) = moments(&z);
        assert!(mean.abs() < 0.01, "normal mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "normal variance {var}");

        let b = draw(
            "bernoulli",
            &key(8, 8),
            &Attrs::new().with("shape", vec![n]).with("p", 0.3),
        );
        let (mean, _) = moments(&b);
        assert!((mean - 0.3).abs() < 0.01, "bernoulli mean {mean}");
    }

    #[test]
    fn thresholds_are_exact() {
        assert_eq!(threshold(0.0), 0);
        assert_eq!(threshold(1.0), 1 << 24);
        assert_eq!(threshold(0.5), 1 << 23);
    }
}
