//! `zeros`, `ones`, `arange`, `eye` and `iota`: tensors from attributes
//! alone.

use ndarray::{ArrayD, IxDyn};
use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::invalid;
use tpu_core::op::{Arity, Attr, Attrs, OpResult, Torch};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value};

use super::fill::{filled_ref, filled_type, shape_attr};
use crate::support::*;

/// The longest `arange` accepted: its index must fit an `i32` iota on every
/// device.
const MAX_ARANGE: f64 = 2_147_483_647.0;

/// `dtype` attribute, f32 when absent.
fn dtype_or_f32(attrs: &Attrs) -> OpResult<DType> {
    Ok(attrs.dtype_opt("dtype")?.unwrap_or(DType::F32))
}

// ---- zeros / ones ----

#[cfg(feature = "conformance")]
fn filled_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(REAL);
    let shape = g.shape(0, 4);
    let mut attrs = Attrs::new().with("shape", shape.dims());
    if g.below(4) != 0 {
        attrs.set("dtype", dtype);
    }
    Sample::new(vec![], attrs)
}

#[cfg(feature = "conformance")]
fn filled_samples() -> Vec<Sample> {
    let mut out: Vec<Sample> = (0..6).map(|i| filled_sample(&mut Gen::new(i))).collect();
    for dims in FIXED_SHAPES {
        out.push(Sample::new(
            vec![],
            Attrs::new().with("shape", *dims).with("dtype", DType::Bool),
        ));
    }
    out
}

/// `zeros` and `ones`: [`full`](super::fill) with a fixed value.
macro_rules! constant_fill {
    ($name:literal, $value:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(0),
                infer: |_, attrs| Ok(vec![filled_type(attrs)?]),
                lower: |b, _, attrs| {
                    let t = filled_type(attrs)?;
                    Ok(vec![b.constant(t.dtype, t.shape, $value)])
                },
                reference: |_, attrs| filled_ref(attrs, $value),
                samples: filled_samples,
                arbitrary: filled_sample,
                torch: Torch::Expr($torch),
            }
        }
    };
}

constant_fill!("zeros", 0.0,
    torch: r#"torch.zeros(a["shape"], dtype=a.get("dtype", torch.float32))"#);
constant_fill!("ones", 1.0,
    torch: r#"torch.ones(a["shape"], dtype=a.get("dtype", torch.float32))"#);

// ---- arange ----

/// A checked `arange` call: `len` values `start + i * step` of `dtype`.
struct Arange {
    start: f64,
    step: f64,
    /// Start and step as integers, for integer dtypes: exact where f64 is
    /// not (beyond 2^53).
    exact: Option<(i64, i64)>,
    len: usize,
    dtype: DType,
}

/// True when `key` is absent or given as an integer.
fn int_attr(attrs: &Attrs, key: &str) -> bool {
    matches!(attrs.get(key), None | Some(Attr::Int(_)))
}

fn arange_args(attrs: &Attrs) -> OpResult<Arange> {
    let start = attrs.float_or("start", 0.0)?;
    let end = attrs.float("end")?;
    let step = attrs.float_or("step", 1.0)?;
    // PyTorch: integer arguments give i64, any float argument the default
    // float dtype.
    let all_ints = ["start", "end", "step"].iter().all(|k| int_attr(attrs, k));
    let default = if all_ints { DType::I64 } else { DType::F32 };
    let dtype = attrs.dtype_opt("dtype")?.unwrap_or(default);
    require_dtype(dtype, NUMERIC, "arange dtype")?;
    if !(start.is_finite() && end.is_finite() && step.is_finite()) {
        return Err(invalid!(
            "arange needs finite start, end and step, got {start}, {end}, {step}"
        ));
    }
    if step == 0.0 {
        return Err("arange step must be nonzero".into());
    }
    // Integer arguments are read as integers: past 2^53 f64 loses them.
    let ints = if all_ints {
        Some((
            attrs.int_opt("start")?.unwrap_or(0),
            attrs.int("end")?,
            attrs.int_opt("step")?.unwrap_or(1),
        ))
    } else {
        None
    };
    let len = match ints {
        Some((s, e, st)) => {
            let (span, st) = (i128::from(e) - i128::from(s), i128::from(st));
            // Ceiling division, for either sign of the step.
            (span / st + i128::from(span % st != 0 && (span < 0) == (st < 0))) as f64
        }
        None => ((end - start) / step).ceil(),
    };
    // `len` alone misses a short wrong-way span: ceil(-0.5) is -0.
    if len < 0.0 || (end - start) * step < 0.0 {
        return Err(invalid!(
            "arange from {start} to {end} with step {step} has negative length (the step's sign does not lead from start to end)"
        ));
    }
    if !len.is_finite() || len > MAX_ARANGE {
        return Err(invalid!(
            "arange from {start} to {end} with step {step} is too long ({len} elements)"
        ));
    }
    if !dtype.is_float() && (start.fract() != 0.0 || step.fract() != 0.0) {
        return Err(invalid!(
            "arange of integer dtype {dtype} needs integral start and step, got {start} and {step}"
        ));
    }
    let exact =
        (!dtype.is_float()).then(|| ints.map_or((start as i64, step as i64), |(s, _, st)| (s, st)));
    Ok(Arange {
        start,
        step,
        exact,
        len: len as usize,
        dtype,
    })
}

fn lower_arange(b: &mut Builder, a: &Arange) -> Value {
    let i = b.iota(DType::I64, &[a.len], 0);
    let (i, start, step) = match a.exact {
        Some((start, step)) => (
            i,
            b.int_constant(DType::I64, [a.len], start),
            b.int_constant(DType::I64, [a.len], step),
        ),
        None => {
            let compute = if a.dtype == DType::F64 {
                DType::F64
            } else {
                DType::F32
            };
            (
                b.convert(&i, compute),
                b.constant(compute, [a.len], a.start),
                b.constant(compute, [a.len], a.step),
            )
        }
    };
    let scaled = b.binary("stablehlo.multiply", &i, &step);
    let v = b.binary("stablehlo.add", &scaled, &start);
    b.convert(&v, a.dtype)
}

fn arange_ref(a: &Arange) -> OpResult<HostTensor> {
    match a.exact {
        None => {
            let values = (0..a.len).map(|i| a.start + i as f64 * a.step).collect();
            tensor_f64(a.dtype, &[a.len], values)
        }
        Some((start, step)) => {
            let values = (0..a.len as i64)
                .map(|i| start.wrapping_add(i.wrapping_mul(step)))
                .collect();
            HostTensor::from_i64(a.dtype, [a.len], values)
                .ok_or_else(|| "arange value count mismatch".into())
        }
    }
}

#[cfg(feature = "conformance")]
fn arange_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(NUMERIC);
    let mut attrs = Attrs::new();
    if dtype.is_float() {
        let start = g.uniform(-5.0, 5.0);
        let step = g.pick(&[0.25, 0.5, 1.0, -0.5, 0.1, 3.0, -0.7]);
        let n = g.dim() as f64;
        attrs.set("start", start);
        // n elements: end half a step past the last; n = 0 is start itself.
        let end = if n == 0.0 {
            start
        } else {
            start + step * (n - 0.5)
        };
        attrs.set("end", end);
        attrs.set("step", step);
    } else {
        let start = g.below(20) as i64 - 10;
        let step = g.pick(&[1i64, 2, 3, -1, -2, 5]);
        let n = g.dim() as i64;
        attrs.set("start", start);
        attrs.set("end", start + step * n);
        attrs.set("step", step);
    }
    if g.below(4) != 0 {
        attrs.set("dtype", dtype);
    }
    Sample::new(vec![], attrs)
}

#[cfg(feature = "conformance")]
fn arange_samples() -> Vec<Sample> {
    let mut out: Vec<Sample> = (0..8).map(|i| arange_sample(&mut Gen::new(i))).collect();
    let fixed: &[(f64, f64, f64, DType)] = &[
        (0.0, 10.0, 1.0, DType::I64),
        (0.0, 0.0, 1.0, DType::F32),
        (1.0, 2.5, 0.5, DType::F32),
        (10.0, 0.0, -3.0, DType::I32),
        (0.0, 1.0, 0.1, DType::F64),
        (-3.0, 3.0, 0.1, DType::BF16),
        (0.0, 127.0, 1.0, DType::F16),
        (0.0, 300.0, 1.0, DType::U8),
    ];
    for &(start, end, step, dtype) in fixed {
        out.push(Sample::new(
            vec![],
            Attrs::new()
                .with("start", start)
                .with("end", end)
                .with("step", step)
                .with("dtype", dtype),
        ));
    }
    out.push(Sample::new(vec![], Attrs::new().with("end", 7i64)));
    // Past 2^53, where f64 arithmetic would lose the values.
    let big = 1i64 << 62;
    out.push(Sample::new(
        vec![],
        Attrs::new()
            .with("start", big)
            .with("end", big + 3)
            .with("step", 1i64),
    ));
    out.push(Sample::new(
        vec![],
        Attrs::new()
            .with("start", big + 10)
            .with("end", big)
            .with("step", -4i64),
    ));
    out
}

inventory::submit! {
    op_def! {
        name: "arange",
        arity: Arity::Exactly(0),
        dtypes: NUMERIC,
        infer: |_, attrs| {
            let a = arange_args(attrs)?;
            Ok(vec![TensorType::new(a.dtype, [a.len])])
        },
        lower: |b, _, attrs| Ok(vec![lower_arange(b, &arange_args(attrs)?)]),
        reference: |_, attrs| Ok(vec![arange_ref(&arange_args(attrs)?)?]),
        samples: arange_samples,
        arbitrary: arange_sample,
        torch: Torch::Expr(r#"torch.arange(a.get("start", 0), a["end"], a.get("step", 1), dtype=a.get("dtype"))"#),
    }
}

// ---- eye ----

fn eye_type(attrs: &Attrs) -> OpResult<TensorType> {
    let n = attrs.int("n")?;
    let m = attrs.int_opt("m")?.unwrap_or(n);
    if n < 0 || m < 0 {
        return Err(invalid!("eye needs n and m >= 0, got n = {n}, m = {m}"));
    }
    Ok(TensorType::new(
        dtype_or_f32(attrs)?,
        [n as usize, m as usize],
    ))
}

/// `[n, m]` booleans, true on the diagonal.
pub(crate) fn lower_diagonal(b: &mut Builder, n: usize, m: usize) -> Value {
    let rows = b.iota(DType::I64, &[n, m], 0);
    let cols = b.iota(DType::I64, &[n, m], 1);
    b.compare(Compare::Eq, &rows, &cols)
}

#[cfg(feature = "conformance")]
fn eye_sample(g: &mut Gen) -> Sample {
    let mut attrs = Attrs::new().with("n", g.dim());
    if g.bool() {
        attrs.set("m", g.dim());
    }
    if g.below(4) != 0 {
        attrs.set("dtype", g.pick(REAL));
    }
    Sample::new(vec![], attrs)
}

inventory::submit! {
    op_def! {
        name: "eye",
        arity: Arity::Exactly(0),
        infer: |_, attrs| Ok(vec![eye_type(attrs)?]),
        lower: |b, _, attrs| {
            let t = eye_type(attrs)?;
            let (n, m) = (t.shape.dims()[0], t.shape.dims()[1]);
            let d = lower_diagonal(b, n, m);
            Ok(vec![b.convert(&d, t.dtype)])
        },
        reference: |_, attrs| {
            let t = eye_type(attrs)?;
            let values = ArrayD::from_shape_fn(IxDyn(t.shape.dims()), |ix| i64::from(ix[0] == ix[1]));
            Ok(vec![HostTensor::int(t.dtype, values)])
        },
        samples: || {
            let mut out: Vec<Sample> = (0..6).map(|i| eye_sample(&mut Gen::new(i))).collect();
            out.push(Sample::new(vec![], Attrs::new().with("n", 3i64)));
            out.push(Sample::new(vec![], Attrs::new().with("n", 0i64).with("m", 4i64)));
            out.push(Sample::new(vec![], Attrs::new().with("n", 127i64).with("m", 1i64).with("dtype", DType::Bool)));
            out
        },
        arbitrary: eye_sample,
        torch: Torch::Expr(r#"torch.eye(a["n"], a.get("m", a["n"]), dtype=a.get("dtype", torch.float32))"#),
    }
}

// ---- iota ----

fn iota_args(attrs: &Attrs) -> OpResult<(TensorType, usize)> {
    let shape = shape_attr(attrs)?;
    let dim = normalize_dim(attrs.int("dim")?, shape.rank())?;
    let dtype = attrs.dtype_opt("dtype")?.unwrap_or(DType::I64);
    require_dtype(dtype, NUMERIC, "iota dtype")?;
    Ok((TensorType::new(dtype, shape), dim))
}

#[cfg(feature = "conformance")]
fn iota_sample(g: &mut Gen) -> Sample {
    let shape = g.shape(1, 4);
    let rank = shape.rank() as i64;
    let dim = g.below(shape.rank()) as i64 - if g.bool() { rank } else { 0 };
    let mut attrs = Attrs::new().with("shape", shape.dims()).with("dim", dim);
    if g.below(4) != 0 {
        attrs.set("dtype", g.pick(NUMERIC));
    }
    Sample::new(vec![], attrs)
}

inventory::submit! {
    op_def! {
        name: "iota",
        arity: Arity::Exactly(0),
        dtypes: NUMERIC,
        infer: |_, attrs| Ok(vec![iota_args(attrs)?.0]),
        lower: |b, _, attrs| {
            let (t, dim) = iota_args(attrs)?;
            let i = b.iota(DType::I64, t.shape.dims(), dim);
            Ok(vec![b.convert(&i, t.dtype)])
        },
        reference: |_, attrs| {
            let (t, dim) = iota_args(attrs)?;
            let values = ArrayD::from_shape_fn(IxDyn(t.shape.dims()), |ix| ix[dim] as i64);
            Ok(vec![HostTensor::int(t.dtype, values)])
        },
        samples: || {
            let mut out: Vec<Sample> = (0..6).map(|i| iota_sample(&mut Gen::new(i))).collect();
            out.push(Sample::new(vec![], Attrs::new().with("shape", vec![3i64, 300]).with("dim", -1i64).with("dtype", DType::U8)));
            out.push(Sample::new(vec![], Attrs::new().with("shape", vec![1i64, 0, 2]).with("dim", 2i64)));
            out.push(Sample::new(vec![], Attrs::new().with("shape", vec![700i64]).with("dim", 0i64).with("dtype", DType::BF16)));
            out
        },
        arbitrary: iota_sample,
        torch: Torch::Expr(r#"(lambda s, d: torch.arange(s[d]).reshape([s[d] if i == d % len(s) else 1 for i in range(len(s))]).expand(s).to(a.get("dtype", torch.int64)))(a["shape"], a["dim"])"#),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arange_lengths_and_errors() {
        let a = |s: f64, e: f64, st: f64| {
            arange_args(
                &Attrs::new()
                    .with("start", s)
                    .with("end", e)
                    .with("step", st),
            )
        };
        assert_eq!(a(0.0, 10.0, 3.0).map(|a| a.len), Ok(4));
        assert_eq!(a(1.0, 2.5, 0.5).map(|a| a.len), Ok(3));
        assert_eq!(a(5.0, 5.0, 1.0).map(|a| a.len), Ok(0));
        assert_eq!(a(10.0, 0.0, -3.0).map(|a| a.len), Ok(4));
        assert!(
            a(0.0, 1.0, 0.0)
                .err()
                .map(|e| e.message)
                .unwrap_or_default()
                .contains("nonzero")
        );
        assert!(
            a(0.0, 1.0, -1.0)
                .err()
                .map(|e| e.message)
                .unwrap_or_default()
                .contains("negative")
        );
        let ints = arange_args(&Attrs::new().with("end", 4i64)).map(|a| a.dtype);
        assert_eq!(ints, Ok(DType::I64));
    }
}
