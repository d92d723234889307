//! `max` and `min` over dims (keeping the dtype; an empty reduced dimension
//! is an error, as in PyTorch), and `argmax` / `argmin` (i64 indices of the
//! first extreme value, NaN counting as the extreme, over the flattened
//! input when `dim` is absent).

use tpu_core::DType;
use tpu_core::Shape;
use tpu_core::host::{HostData, HostTensor};
use tpu_core::op::{Arity, Attrs, Flags, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::out_of_range;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value, i64_array};

use super::kit::*;
use crate::support::*;

fn infer_extreme(inputs: &[TensorType], attrs: &Attrs, what: &str) -> OpResult<Vec<TensorType>> {
    let t = first(inputs)?;
    let (dims, keepdim) = reduce_args(&t.shape, attrs)?;
    require_nonempty(&t.shape, &dims, what)?;
    Ok(vec![TensorType::new(
        t.dtype,
        reduced_shape(&t.shape, &dims, keepdim),
    )])
}

fn lower_extreme(b: &mut Builder, x: &Value, attrs: &Attrs, largest: bool) -> OpResult<Value> {
    let (dims, keepdim) = reduce_args(x.shape(), attrs)?;
    let r = if largest {
        max_in(b, x, &dims)
    } else {
        min_in(b, x, &dims)
    };
    Ok(b.reshape(&r, reduced_shape(x.shape(), &dims, keepdim).dims()))
}

fn extreme_ref(x: &HostTensor, attrs: &Attrs, largest: bool) -> OpResult<HostTensor> {
    let (dims, keepdim) = reduce_args(&x.shape(), attrs)?;
    let out = reduced_shape(&x.shape(), &dims, keepdim);
    match x.data() {
        HostData::Float(a) => {
            let (kept, gs) = groups(a, &dims);
            let f = if largest { nan_max } else { nan_min };
            let init = if largest {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            };
            let values = gs.iter().map(|g| g.iter().copied().fold(init, f)).collect();
            float_result(x.dtype(), &kept, values, &out)
        }
        HostData::Complex(_) => Err(complex_unsupported()),
        HostData::Int(a) => {
            let (kept, gs) = groups(a, &dims);
            let values = gs
                .iter()
                .map(|g| {
                    let it = g.iter().copied();
                    if largest { it.max() } else { it.min() }.unwrap_or_default()
                })
                .collect();
            int_result(x.dtype(), &kept, values, &out)
        }
    }
}

/// The gradient goes to the extreme values, split evenly between ties.
fn extreme_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let Some(Unreduced { x, ty, dims, y, g }) = unreduced(t, a)? else {
        return Ok(vec![None]);
    };
    let hit = call2(t, "eq", x, y)?;
    let hit = t.cast(hit, ty.dtype)?;
    let ties = reduce_call(t, "sum", hit, &dims, true)?;
    let gh = t.mul(g, hit)?;
    Ok(vec![Some(t.div(gh, ties)?)])
}

macro_rules! extreme_op {
    ($name:literal, $largest:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::REDUCTION,
                infer: |x, attrs| infer_extreme(x, attrs, $name),
                lower: |b, x, attrs| Ok(vec![lower_extreme(b, &x[0], attrs, $largest)?]),
                reference: |x, attrs| Ok(vec![extreme_ref(one(x)?, attrs, $largest)?]),
                vjp: Some(extreme_vjp),
                samples: || (0..10).map(|i| reduce_sample_nonempty(&mut Gen::new(300 + i), REAL)).collect(),
                arbitrary: |g: &mut Gen| reduce_sample_nonempty(g, REAL),
                torch: Torch::Expr($torch),
            }
        }
    };
}

// PyTorch reduces every dim when `dims` is empty, where this op reduces
// none: that case reduces a new trailing dim of size 1 instead.
extreme_op!("max", true,
    torch: r#"(lambda d, k: torch.amax(x[0], d, keepdim=k) if d else torch.amax(x[0].unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#);
extreme_op!("min", false,
    torch: r#"(lambda d, k: torch.amin(x[0], d, keepdim=k) if d else torch.amin(x[0].unsqueeze(-1), -1))(a.get("dims", list(range(x[0].dim()))), a.get("keepdim", False))"#);

/// The reduced dimension (`None`: the flattened input) and `keepdim`.
fn arg_args(shape: &Shape, attrs: &Attrs) -> OpResult<(Option<usize>, bool)> {
    let keepdim = attrs.bool_or("keepdim", false)?;
    let dim = match attrs.int_opt("dim")? {
        None => None,
        Some(d) => Some(normalize_dim_scalar_ok(d, shape.rank())?),
    };
    Ok((dim, keepdim))
}

fn arg_shape(shape: &Shape, dim: Option<usize>, keepdim: bool) -> Shape {
    match dim {
        None if keepdim => Shape::new(vec![1; shape.rank()]),
        None => Shape::scalar(),
        Some(_) if shape.rank() == 0 => Shape::scalar(),
        Some(d) => reduced_shape(shape, &[d], keepdim),
    }
}

fn infer_arg(inputs: &[TensorType], attrs: &Attrs, what: &str) -> OpResult<Vec<TensorType>> {
    let t = first(inputs)?;
    require_dtype(t.dtype, NUMERIC, "input")?;
    let (dim, keepdim) = arg_args(&t.shape, attrs)?;
    match dim {
        None if t.shape.numel() == 0 => {
            return Err(out_of_range!(
                "{what} of an empty tensor ({}) without a `dim`",
                t.shape
            ));
        }
        Some(d) if t.shape.rank() > 0 => require_nonempty(&t.shape, &[d], what)?,
        _ => {}
    }
    Ok(vec![TensorType::new(
        DType::I64,
        arg_shape(&t.shape, dim, keepdim),
    )])
}

fn lower_arg(b: &mut Builder, x: &Value, attrs: &Attrs, largest: bool) -> OpResult<Value> {
    let (dim, keepdim) = arg_args(x.shape(), attrs)?;
    let out = arg_shape(x.shape(), dim, keepdim);
    // Work on a tensor of rank >= 1 with one reduced dimension.
    let (x2, d) = match dim {
        Some(d) if x.rank() > 0 => (x.clone(), d),
        _ => (b.reshape(x, &[x.shape().numel()]), 0),
    };
    let dt = x2.dtype();
    let idx = b.iota(DType::I64, x2.dims(), d);
    let init_v = b.constant(dt, [], if largest { lowest(dt) } else { highest(dt) });
    let init_i = b.constant(DType::I64, [], 0.0);
    let sv = TensorType::new(dt, []);
    let si = TensorType::new(DType::I64, []);
    let region = b.region(&[sv.clone(), si.clone(), sv.clone(), si.clone()], |b, a| {
        let (av, ai, bv, bi) = (&a[0], &a[1], &a[2], &a[3]);
        let dir = if largest { Compare::Gt } else { Compare::Lt };
        let mut pick = b.compare(dir, av, bv);
        let mut tie = b.compare(Compare::Eq, av, bv);
        if dt.is_float() {
            let an = b.compare(Compare::Ne, av, av);
            let bn = b.compare(Compare::Ne, bv, bv);
            let not_bn = b.unary("stablehlo.not", &bn);
            let a_only = bin(b, "and", &an, &not_bn);
            pick = bin(b, "or", &pick, &a_only);
            let both = bin(b, "and", &an, &bn);
            tie = bin(b, "or", &tie, &both);
        }
        let earlier = b.compare(Compare::Lt, ai, bi);
        let tie_pick = bin(b, "and", &tie, &earlier);
        let pick_i = bin(b, "or", &pick, &tie_pick);
        let v = b.select(&pick, av, bv);
        let i = b.select(&pick_i, ai, bi);
        Ok::<_, String>(vec![v, i])
    })?;
    let rshape: Vec<usize> = (0..x2.rank())
        .filter(|&i| i != d)
        .map(|i| x2.dims()[i])
        .collect();
    let outs = b.op(
        "stablehlo.reduce",
        &[&x2, &idx, &init_v, &init_i],
        &[region],
        &format!("dimensions = {}", i64_array([d as i64])),
        vec![
            TensorType::new(dt, rshape.clone()),
            TensorType::new(DType::I64, rshape),
        ],
    );
    let i = outs.get(1).ok_or("reduce gave no index")?;
    Ok(b.reshape(i, out.dims()))
}

/// Index of the first extreme value of a lane (NaN beats everything).
fn arg_of<T: Copy + PartialOrd>(v: &[T], largest: bool, is_nan: impl Fn(T) -> bool) -> i64 {
    let mut best = 0;
    for i in 1..v.len() {
        let (x, y) = (v[i], v[best]);
        let better = if is_nan(y) {
            false
        } else if is_nan(x) {
            true
        } else if largest {
            x > y
        } else {
            x < y
        };
        if better {
            best = i;
        }
    }
    best as i64
}

fn arg_ref(x: &HostTensor, attrs: &Attrs, largest: bool) -> OpResult<HostTensor> {
    let (dim, keepdim) = arg_args(&x.shape(), attrs)?;
    let out = arg_shape(&x.shape(), dim, keepdim);
    let flat = |t: &HostTensor| reshape_to(t, &Shape::new([t.shape().numel()]));
    let (x2, d) = match dim {
        Some(d) if x.shape().rank() > 0 => (x.clone(), d),
        _ => (flat(x)?, 0),
    };
    let (kept, values) = match x2.data() {
        HostData::Float(a) => {
            let (kept, gs) = groups(a, &[d]);
            (
                kept,
                gs.iter().map(|g| arg_of(g, largest, f64::is_nan)).collect(),
            )
        }
        HostData::Complex(_) => return Err(complex_unsupported()),
        HostData::Int(a) => {
            let (kept, gs) = groups(a, &[d]);
            (
                kept,
                gs.iter().map(|g| arg_of(g, largest, |_| false)).collect(),
            )
        }
    };
    int_result(DType::I64, &kept, values, &out)
}

#[cfg(feature = "conformance")]
fn arg_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(NUMERIC);
    let shape = g.shape_nonempty(0, 4);
    let x = g.tensor(dtype, &shape);
    let mut attrs = Attrs::new().with("keepdim", g.bool());
    if g.below(4) != 0 {
        let rank = shape.rank().max(1);
        let d = g.below(rank) as i64;
        attrs.set("dim", if g.bool() { d - rank as i64 } else { d });
    }
    Sample::new(vec![x], attrs)
}

macro_rules! arg_op {
    ($name:literal, $largest:expr, torch: $torch:literal) => {
        inventory::submit! {
            tpu_core::op_def! {
                name: $name,
                arity: Arity::Exactly(1),
                flags: Flags::REDUCTION,
                dtypes: NUMERIC,
                infer: |x, attrs| infer_arg(x, attrs, $name),
                lower: |b, x, attrs| Ok(vec![lower_arg(b, &x[0], attrs, $largest)?]),
                reference: |x, attrs| Ok(vec![arg_ref(one(x)?, attrs, $largest)?]),
                samples: || {
                    let mut s: Vec<Sample> = (0..10).map(|i| arg_sample(&mut Gen::new(400 + i))).collect();
                    // Ties resolve to the first index; zero-size kept dims are fine.
                    let ties = HostTensor::from_i64(DType::I32, [2, 3], vec![1, 5, 5, 2, 2, 0]);
                    let empty = HostTensor::from_f64(DType::F32, [0, 3], vec![]);
                    if let (Some(ties), Some(empty)) = (ties, empty) {
                        s.push(Sample::new(vec![ties.clone()], Attrs::new().with("dim", 1i64)));
                        s.push(Sample::new(vec![ties], Attrs::new().with("keepdim", true)));
                        s.push(Sample::new(vec![empty], Attrs::new().with("dim", 1i64)));
                    }
                    s
                },
                arbitrary: arg_sample,
                torch: Torch::Expr($torch),
            }
        }
    };
}

arg_op!("argmax", true,
    torch: r#"torch.argmax(x[0], a.get("dim"), a.get("keepdim", False))"#);
arg_op!("argmin", false,
    torch: r#"torch.argmin(x[0], a.get("dim"), a.get("keepdim", False))"#);
