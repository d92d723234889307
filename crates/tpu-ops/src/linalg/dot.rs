//! `dot_general` (explicit batch and contracting dims) and `matmul`
//! (`torch.matmul`: 1-D operands, broadcast batch dims). Floats accumulate
//! in f64 in the reference and in f32 (f16, bf16) or their own dtype on the
//! device; integers accumulate exactly (wrapping) in i64.

use ndarray::{ArrayD, IxDyn};
use tpu_core::host::{HostData, HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, TensorType, Value, dim_list as hlo_dims};
use tpu_core::{DType, Shape};

use super::{accumulator, permute};
use crate::support::*;

/// What `matmul` and `dot_general` accept.
pub(crate) const DOT_DTYPES: &[DType] = NUMERIC_OR_COMPLEX;

/// Checked dimension numbers of one `dot_general`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DotDims {
    pub lb: Vec<usize>,
    pub rb: Vec<usize>,
    pub lc: Vec<usize>,
    pub rc: Vec<usize>,
}

impl DotDims {
    /// The free dims of a side: those neither batch nor contracted, in order.
    fn free(rank: usize, batch: &[usize], contract: &[usize]) -> Vec<usize> {
        (0..rank)
            .filter(|d| !batch.contains(d) && !contract.contains(d))
            .collect()
    }

    /// Batch dims, then lhs free dims, then rhs free dims.
    fn out_shape(&self, a: &Shape, b: &Shape) -> Shape {
        let mut out: Vec<usize> = self.lb.iter().map(|&d| a.dims()[d]).collect();
        out.extend(
            Self::free(a.rank(), &self.lb, &self.lc)
                .iter()
                .map(|&d| a.dims()[d]),
        );
        out.extend(
            Self::free(b.rank(), &self.rb, &self.rc)
                .iter()
                .map(|&d| b.dims()[d]),
        );
        Shape::new(out)
    }
}

fn dim_list(attrs: &Attrs, key: &str, rank: usize) -> OpResult<Vec<usize>> {
    attrs
        .ints_opt(key)?
        .unwrap_or_default()
        .iter()
        .map(|&d| normalize_dim(d, rank))
        .collect()
}

/// Checks dimension numbers against the operand shapes.
pub(crate) fn check_dot_dims(a: &Shape, b: &Shape, d: &DotDims) -> OpResult<()> {
    if d.lb.len() != d.rb.len() || d.lc.len() != d.rc.len() {
        return Err(invalid!(
            "dot_general needs as many lhs as rhs batch dims ({} vs {}) and contracting dims ({} vs {})",
            d.lb.len(),
            d.rb.len(),
            d.lc.len(),
            d.rc.len()
        ));
    }
    for (side, batch, contract) in [("lhs", &d.lb, &d.lc), ("rhs", &d.rb, &d.rc)] {
        let mut all: Vec<usize> = batch.iter().chain(contract.iter()).copied().collect();
        all.sort_unstable();
        if all.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid!(
                "dot_general {side} batch dims {batch:?} and contracting dims {contract:?} repeat a dimension"
            ));
        }
    }
    for (kind, l, r) in [("batch", &d.lb, &d.rb), ("contracting", &d.lc, &d.rc)] {
        for (&i, &j) in l.iter().zip(r.iter()) {
            if a.dims()[i] != b.dims()[j] {
                return Err(invalid!(
                    "dot_general {kind} dims differ in size: lhs dim {i} of {a} is {}, rhs dim {j} of {b} is {}",
                    a.dims()[i],
                    b.dims()[j]
                ));
            }
        }
    }
    Ok(())
}

fn dot_dims(a: &Shape, b: &Shape, attrs: &Attrs) -> OpResult<DotDims> {
    let d = DotDims {
        lb: dim_list(attrs, "lhs_batch", a.rank())?,
        rb: dim_list(attrs, "rhs_batch", b.rank())?,
        lc: dim_list(attrs, "lhs_contract", a.rank())?,
        rc: dim_list(attrs, "rhs_contract", b.rank())?,
    };
    check_dot_dims(a, b, &d)?;
    Ok(d)
}

fn same_dtype(a: &TensorType, b: &TensorType, op: &str) -> OpResult<DType> {
    require_dtype(a.dtype, DOT_DTYPES, "lhs")?;
    if a.dtype != b.dtype {
        return Err(invalid!(
            "{op} needs operands of one dtype, got {} and {}",
            a.dtype,
            b.dtype
        ));
    }
    Ok(a.dtype)
}

fn two<T>(x: &[T]) -> OpResult<(&T, &T)> {
    match x {
        [a, b] => Ok((a, b)),
        _ => Err("takes two inputs".into()),
    }
}

/// `stablehlo.dot_general` accumulating in [`accumulator`] of the dtype.
pub(crate) fn lower_dot(b: &mut Builder, x: &Value, y: &Value, d: &DotDims) -> Value {
    let dtype = x.dtype();
    let acc = accumulator(dtype);
    let (xc, yc) = (b.convert(x, acc), b.convert(y, acc));
    let out = d.out_shape(x.shape(), y.shape());
    if out.numel() == 0 {
        return b.constant(dtype, out, 0.0);
    }
    // HIGHEST precision: f32 products stay f32 on every device (TPUs
    // otherwise multiply in bf16 passes).
    let attrs = format!(
        "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]",
        hlo_dims(&d.lb),
        hlo_dims(&d.rb),
        hlo_dims(&d.lc),
        hlo_dims(&d.rc)
    );
    let r = b.op1(
        "stablehlo.dot_general",
        &[&xc, &yc],
        &attrs,
        TensorType::new(acc, out),
    );
    b.convert(&r, dtype)
}

/// The values of `a` with its dims in order `perm`, row-major.
fn permuted<T: Copy>(a: &ArrayD<T>, perm: &[usize]) -> Vec<T> {
    a.view()
        .permuted_axes(IxDyn(perm))
        .iter()
        .copied()
        .collect()
}

/// `dot_general` on arrays: both sides are regrouped to
/// `[batch, free, contract]` / `[batch, contract, free]` and multiplied.
fn dot_arrays<T: Copy + Default>(
    a: &ArrayD<T>,
    b: &ArrayD<T>,
    d: &DotDims,
    mul_add: impl Fn(T, T, T) -> T,
) -> OpResult<ArrayD<T>> {
    let (sa, sb) = (Shape::new(a.shape()), Shape::new(b.shape()));
    let lf = DotDims::free(sa.rank(), &d.lb, &d.lc);
    let rf = DotDims::free(sb.rank(), &d.rb, &d.rc);
    let size = |s: &Shape, dims: &[usize]| dims.iter().map(|&i| s.dims()[i]).product::<usize>();
    let (nb, nk) = (size(&sa, &d.lb), size(&sa, &d.lc));
    let (nf, ng) = (size(&sa, &lf), size(&sb, &rf));
    let pa: Vec<usize> = d.lb.iter().chain(&lf).chain(&d.lc).copied().collect();
    let pb: Vec<usize> = d.rb.iter().chain(&d.rc).chain(&rf).copied().collect();
    let (va, vb) = (permuted(a, &pa), permuted(b, &pb));
    let mut out = vec![T::default(); nb * nf * ng];
    for bi in 0..nb {
        for f in 0..nf {
            for g in 0..ng {
                let mut acc = T::default();
                for k in 0..nk {
                    acc = mul_add(acc, va[(bi * nf + f) * nk + k], vb[(bi * nk + k) * ng + g]);
                }
                out[(bi * nf + f) * ng + g] = acc;
            }
        }
    }
    let shape = d.out_shape(&sa, &sb);
    ArrayD::from_shape_vec(IxDyn(shape.dims()), out).map_err(|e| invalid!("dot_general: {e}"))
}

/// The reference `dot_general` of two tensors of one dtype.
pub(crate) fn dot_ref(a: &HostTensor, b: &HostTensor, d: &DotDims) -> OpResult<HostTensor> {
    let dtype = a.dtype();
    Ok(match (a.data(), b.data()) {
        (HostData::Float(x), HostData::Float(y)) => {
            HostTensor::float(dtype, dot_arrays(x, y, d, |s, p, q| s + p * q)?)
        }
        (HostData::Complex(x), HostData::Complex(y)) => {
            HostTensor::complex(dtype, dot_arrays(x, y, d, |s, p, q| s + p * q)?)
        }
        _ => HostTensor::int(
            dtype,
            dot_arrays(&a.to_i64(), &b.to_i64(), d, |s: i64, p: i64, q: i64| {
                s.wrapping_add(p.wrapping_mul(q))
            })?,
        ),
    })
}

/// Calls `dot_general` on the tape.
pub(crate) fn tape_dot(t: &mut dyn Tape, a: Var, b: Var, d: &DotDims) -> OpResult<Var> {
    let l = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    let attrs = Attrs::new()
        .with("lhs_batch", l(&d.lb))
        .with("rhs_batch", l(&d.rb))
        .with("lhs_contract", l(&d.lc))
        .with("rhs_contract", l(&d.rc));
    t.call1("dot_general", &[a, b], attrs)
}

/// Where `v` sits in `sorted` (sorted ascending).
fn rank_in(v: usize, dims: &[usize]) -> usize {
    dims.iter().filter(|&&x| x < v).count()
}

/// Gradients of `dot_general`: each side is a `dot_general` of the output
/// gradient with the other side, permuted back to the side's layout.
fn dot_general_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let (x, y, g) = (a.inputs[0], a.inputs[1], a.grads[0]);
    let (tx, ty) = (t.ty(x)?, t.ty(y)?);
    if !tx.dtype.is_inexact() {
        return Ok(vec![None, None]);
    }
    // Each side's gradient multiplies by the other side's conjugate.
    let (x, y) = (t.conj(x)?, t.conj(y)?);
    let d = dot_dims(&tx.shape, &ty.shape, a.attrs)?;
    let nb = d.lb.len();
    let lf = DotDims::free(tx.shape.rank(), &d.lb, &d.lc);
    let rf = DotDims::free(ty.shape.rank(), &d.rb, &d.rc);
    let batch: Vec<usize> = (0..nb).collect();
    let g_lf: Vec<usize> = (nb..nb + lf.len()).collect();
    let g_rf: Vec<usize> = (nb + lf.len()..nb + lf.len() + rf.len()).collect();

    // d lhs: g [batch, lf, rf] . rhs over rf -> [batch, lf, rc (sorted)].
    let mut sorted_rc = d.rc.clone();
    sorted_rc.sort_unstable();
    let gx = tape_dot(
        t,
        g,
        y,
        &DotDims {
            lb: batch.clone(),
            rb: d.rb.clone(),
            lc: g_rf.clone(),
            rc: rf.clone(),
        },
    )?;
    let mut perm_x = vec![0; tx.shape.rank()];
    for (i, &dim) in d.lb.iter().enumerate() {
        perm_x[dim] = i;
    }
    for (j, &dim) in lf.iter().enumerate() {
        perm_x[dim] = nb + j;
    }
    for (i, &dim) in d.lc.iter().enumerate() {
        perm_x[dim] = nb + lf.len() + rank_in(d.rc[i], &sorted_rc);
    }
    let gx = permute(t, gx, &perm_x)?;

    // d rhs: g [batch, lf, rf] . lhs over lf -> [batch, rf, lc (sorted)].
    let mut sorted_lc = d.lc.clone();
    sorted_lc.sort_unstable();
    let gy = tape_dot(
        t,
        g,
        x,
        &DotDims {
            lb: batch,
            rb: d.lb.clone(),
            lc: g_lf,
            rc: lf,
        },
    )?;
    let mut perm_y = vec![0; ty.shape.rank()];
    for (i, &dim) in d.rb.iter().enumerate() {
        perm_y[dim] = i;
    }
    for (j, &dim) in rf.iter().enumerate() {
        perm_y[dim] = nb + j;
    }
    for (i, &dim) in d.rc.iter().enumerate() {
        perm_y[dim] = nb + rf.len() + rank_in(d.lc[i], &sorted_lc);
    }
    let gy = permute(t, gy, &perm_y)?;
    Ok(vec![Some(gx), Some(gy)])
}

/// Values in [-1, 1) (small integers for integer dtypes), to keep
/// accumulated rounding small.
#[cfg(feature = "conformance")]
fn operand(g: &mut Gen, dtype: DType, shape: &Shape) -> HostTensor {
    if dtype.is_float() {
        g.tensor_in(dtype, shape, -1.0, 1.0)
    } else {
        g.tensor(dtype, shape)
    }
}

#[cfg(feature = "conformance")]
fn dot_general_sample(g: &mut Gen) -> Sample {
    let dtype = if g.below(3) == 0 {
        g.pick(DOT_DTYPES)
    } else {
        g.pick(FLOATS)
    };
    // Sizes of the batch, contracting and free dims, then a random layout
    // of each side.
    let (nb, nc, nlf, nrf) = (g.below(3), g.below(3), g.below(3), g.below(3));
    let small = |g: &mut Gen| {
        if g.below(5) == 0 {
            g.dim()
        } else {
            g.dim().min(5)
        }
    };
    let batch: Vec<usize> = (0..nb).map(|_| small(g)).collect();
    let contract: Vec<usize> = (0..nc).map(|_| small(g)).collect();
    let lfree: Vec<usize> = (0..nlf).map(|_| small(g)).collect();
    let rfree: Vec<usize> = (0..nrf).map(|_| small(g)).collect();
    let layout = |g: &mut Gen, free: &[usize]| {
        // Roles: (kind, index): 0 batch, 1 contract, 2 free.
        let mut roles: Vec<(u8, usize)> = (0..nb)
            .map(|i| (0, i))
            .chain((0..nc).map(|i| (1, i)))
            .chain((0..free.len()).map(|i| (2, i)))
            .collect();
        for i in (1..roles.len()).rev() {
            roles.swap(i, g.below(i + 1));
        }
        let dims: Vec<usize> = roles
            .iter()
            .map(|&(k, i)| match k {
                0 => batch[i],
                1 => contract[i],
                _ => free[i],
            })
            .collect();
        let find = |kind: u8, n: usize| -> Vec<i64> {
            (0..n)
                .map(|i| roles.iter().position(|&r| r == (kind, i)).unwrap_or(0) as i64)
                .collect()
        };
        (Shape::new(dims), find(0, nb), find(1, nc))
    };
    let (sa, lb, lc) = layout(g, &lfree);
    let (sb, rb, rc) = layout(g, &rfree);
    // Keep the work small: cap every dim at 4 if needed (equal sizes stay
    // equal).
    let (sa, sb) = if sa.numel() * sb.numel() > 20_000 {
        let shrink = |s: &Shape| Shape::new(s.dims().iter().map(|&d| d.min(4)).collect::<Vec<_>>());
        (shrink(&sa), shrink(&sb))
    } else {
        (sa, sb)
    };
    let neg = |v: Vec<i64>, r: usize, g: &mut Gen| -> Vec<i64> {
        v.into_iter()
            .map(|d| if g.bool() { d - r as i64 } else { d })
            .collect()
    };
    let attrs = Attrs::new()
        .with("lhs_batch", neg(lb, sa.rank(), g))
        .with("rhs_batch", neg(rb, sb.rank(), g))
        .with("lhs_contract", neg(lc, sa.rank(), g))
        .with("rhs_contract", neg(rc, sb.rank(), g));
    Sample::new(vec![operand(g, dtype, &sa), operand(g, dtype, &sb)], attrs)
}

#[cfg(feature = "conformance")]
fn dot_general_samples() -> Vec<Sample> {
    let mut g = Gen::new(0xd07);
    let mut out: Vec<Sample> = (0..10)
        .map(|i| dot_general_sample(&mut Gen::new(i)))
        .collect();
    // (lhs shape, rhs shape, lhs_batch, rhs_batch, lhs_contract, rhs_contract, dtype)
    type Case<'a> = (
        &'a [usize],
        &'a [usize],
        &'a [i64],
        &'a [i64],
        &'a [i64],
        &'a [i64],
        DType,
    );
    let fixed: &[Case] = &[
        // A plain matrix product.
        (&[3, 4], &[4, 5], &[], &[], &[1], &[0], DType::F32),
        // Batched, contracting the first dims.
        (&[7, 2, 3], &[7, 2, 5], &[0], &[0], &[1], &[1], DType::F64),
        // Outer product, no contraction.
        (&[3], &[1, 4], &[], &[], &[], &[], DType::BF16),
        // Long contraction, integers.
        (&[2, 127], &[127], &[], &[], &[1], &[0], DType::I32),
        (&[2, 127], &[127, 3], &[], &[], &[-1], &[0], DType::F16),
        // Empty contraction gives zeros; empty free dim gives nothing.
        (&[3, 0], &[0, 2], &[], &[], &[1], &[0], DType::F32),
        (&[0, 3], &[3, 2], &[], &[], &[1], &[0], DType::I64),
        // Two contracting dims in swapped order.
        (
            &[2, 3, 4],
            &[4, 5, 3],
            &[],
            &[],
            &[1, 2],
            &[2, 0],
            DType::F32,
        ),
        (&[2, 3], &[3, 2], &[], &[], &[1], &[0], DType::U8),
    ];
    for &(a, b, lb, rb, lc, rc, dtype) in fixed {
        out.push(Sample::new(
            vec![
                operand(&mut g, dtype, &Shape::from(a)),
                operand(&mut g, dtype, &Shape::from(b)),
            ],
            Attrs::new()
                .with("lhs_batch", lb)
                .with("rhs_batch", rb)
                .with("lhs_contract", lc)
                .with("rhs_contract", rc),
        ));
    }
    out
}

inventory::submit! {
    op_def! {
        name: "dot_general",
        arity: Arity::Exactly(2),
        dtypes: DOT_DTYPES,
        infer: |x, attrs| {
            let (a, b) = two(x)?;
            let dtype = same_dtype(a, b, "dot_general")?;
            let d = dot_dims(&a.shape, &b.shape, attrs)?;
            Ok(vec![TensorType::new(dtype, d.out_shape(&a.shape, &b.shape))])
        },
        lower: |b, x, attrs| {
            let d = dot_dims(x[0].shape(), x[1].shape(), attrs)?;
            Ok(vec![lower_dot(b, &x[0], &x[1], &d)])
        },
        reference: |x, attrs| {
            let (a, b) = two(x)?;
            let d = dot_dims(&a.shape(), &b.shape(), attrs)?;
            Ok(vec![dot_ref(a, b, &d)?])
        },
        vjp: Some(dot_general_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(20.0),
        samples: dot_general_samples,
        arbitrary: dot_general_sample,
        torch: Torch::Expr(r#"(lambda ra, rb: (lambda lb, rbt, lc, rc: torch.einsum(x[0], list(range(ra)), x[1], [lb[rbt.index(j)] if j in rbt else lc[rc.index(j)] if j in rc else ra + j for j in range(rb)], lb + [i for i in range(ra) if i not in lb + lc] + [ra + j for j in range(rb) if j not in rbt + rc]))(*[[d % r for d in a.get(k, [])] for k, r in (("lhs_batch", ra), ("rhs_batch", rb), ("lhs_contract", ra), ("rhs_contract", rb))]))(x[0].dim(), x[1].dim())"#),
    }
}

// ---- matmul ----

/// How a `matmul` call maps onto `dot_general`.
struct MatmulPlan {
    /// Shapes both sides are broadcast to first (1-D sides stay as they are).
    a_shape: Shape,
    b_shape: Shape,
    dims: DotDims,
    out: Shape,
}

fn matmul_plan(a: &Shape, b: &Shape) -> OpResult<MatmulPlan> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra == 0 || rb == 0 {
        return Err(invalid!(
            "both arguments to matmul need to be at least 1-D, got {a} and {b}"
        ));
    }
    let k_a = a.dims()[ra - 1];
    let k_b = if rb == 1 {
        b.dims()[0]
    } else {
        b.dims()[rb - 2]
    };
    if k_a != k_b {
        return Err(invalid!(
            "matmul shapes {a} and {b} cannot be multiplied ({k_a} vs {k_b})"
        ));
    }
    let plan = |a_shape: Shape, b_shape: Shape, dims: DotDims| {
        let out = dims.out_shape(&a_shape, &b_shape);
        MatmulPlan {
            a_shape,
            b_shape,
            dims,
            out,
        }
    };
    let none = Vec::new;
    Ok(match (ra, rb) {
        (1, _) => plan(
            a.clone(),
            b.clone(),
            DotDims {
                lb: none(),
                rb: none(),
                lc: vec![0],
                rc: vec![rb.saturating_sub(2)],
            },
        ),
        (_, 1) => plan(
            a.clone(),
            b.clone(),
            DotDims {
                lb: none(),
                rb: none(),
                lc: vec![ra - 1],
                rc: vec![0],
            },
        ),
        _ => {
            let batch = broadcast_shapes(
                &Shape::from(&a.dims()[..ra - 2]),
                &Shape::from(&b.dims()[..rb - 2]),
            )?;
            let nb = batch.rank();
            let mut sa = batch.dims().to_vec();
            sa.extend_from_slice(&a.dims()[ra - 2..]);
            let mut sb = batch.dims().to_vec();
            sb.extend_from_slice(&b.dims()[rb - 2..]);
            let all: Vec<usize> = (0..nb).collect();
            plan(
                Shape::new(sa),
                Shape::new(sb),
                DotDims {
                    lb: all.clone(),
                    rb: all,
                    lc: vec![nb + 1],
                    rc: vec![nb],
                },
            )
        }
    })
}

fn lower_matmul(b: &mut Builder, x: &Value, y: &Value) -> OpResult<Value> {
    let p = matmul_plan(x.shape(), y.shape())?;
    let xb = b.broadcast_to(x, p.a_shape.dims());
    let yb = b.broadcast_to(y, p.b_shape.dims());
    Ok(lower_dot(b, &xb, &yb, &p.dims))
}

fn broadcast_host(x: &HostTensor, shape: &Shape) -> OpResult<HostTensor> {
    Ok(match x.data() {
        HostData::Float(a) => HostTensor::float(x.dtype(), broadcast_array(a, shape.dims())?),
        HostData::Int(a) => HostTensor::int(x.dtype(), broadcast_array(a, shape.dims())?),
        HostData::Complex(a) => HostTensor::complex(x.dtype(), broadcast_array(a, shape.dims())?),
    })
}

fn matmul_ref(x: &HostTensor, y: &HostTensor) -> OpResult<HostTensor> {
    let p = matmul_plan(&x.shape(), &y.shape())?;
    let (xb, yb) = (
        broadcast_host(x, &p.a_shape)?,
        broadcast_host(y, &p.b_shape)?,
    );
    dot_ref(&xb, &yb, &p.dims)
}

/// `d a = g . b^T`, `d b = a^T . g`, on both sides lifted to at least 2-D
/// and broadcast to the common batch, then summed back to each shape.
fn matmul_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let (x, y, g) = (a.inputs[0], a.inputs[1], a.grads[0]);
    let (tx, ty) = (t.ty(x)?, t.ty(y)?);
    if !tx.dtype.is_inexact() {
        return Ok(vec![None, None]);
    }
    // Each side's gradient multiplies by the other side's conjugate.
    let (x, y) = (t.conj(x)?, t.conj(y)?);
    let sx = if tx.shape.rank() == 1 {
        Shape::new([1, tx.shape.dims()[0]])
    } else {
        tx.shape.clone()
    };
    let sy = if ty.shape.rank() == 1 {
        Shape::new([ty.shape.dims()[0], 1])
    } else {
        ty.shape.clone()
    };
    let p = matmul_plan(&sx, &sy)?;
    let nb = p.dims.lb.len();
    let x2 = t.reshape(x, &sx)?;
    let y2 = t.reshape(y, &sy)?;
    let g2 = t.reshape(g, &p.out)?;
    let xb = t.broadcast_to(x2, &p.a_shape)?;
    let yb = t.broadcast_to(y2, &p.b_shape)?;
    let batch: Vec<usize> = (0..nb).collect();
    // [B, M, N] . [B, K, N] over N -> [B, M, K].
    let gx = tape_dot(
        t,
        g2,
        yb,
        &DotDims {
            lb: batch.clone(),
            rb: batch.clone(),
            lc: vec![nb + 1],
            rc: vec![nb + 1],
        },
    )?;
    // [B, M, K] . [B, M, N] over M -> [B, K, N].
    let gy = tape_dot(
        t,
        xb,
        g2,
        &DotDims {
            lb: batch.clone(),
            rb: batch,
            lc: vec![nb],
            rc: vec![nb],
        },
    )?;
    let gx = t.sum_to(gx, &sx)?;
    let gy = t.sum_to(gy, &sy)?;
    Ok(vec![
        Some(t.reshape(gx, &tx.shape)?),
        Some(t.reshape(gy, &ty.shape)?),
    ])
}

#[cfg(feature = "conformance")]
fn matmul_sample(g: &mut Gen) -> Sample {
    let dtype = if g.below(3) == 0 {
        g.pick(DOT_DTYPES)
    } else {
        g.pick(FLOATS)
    };
    let small = |g: &mut Gen| {
        if g.below(6) == 0 {
            g.dim()
        } else {
            g.dim().min(5)
        }
    };
    let (m, k, n) = (small(g), small(g), small(g));
    let batch = g.shape(0, 2);
    let batch = Shape::new(batch.dims().iter().map(|&d| d.min(4)).collect::<Vec<_>>());
    let (ba, bb) = if g.bool() {
        (batch.clone(), g.broadcastable(&batch))
    } else {
        (g.broadcastable(&batch), batch.clone())
    };
    let with = |b: &Shape, tail: &[usize]| {
        let mut d = b.dims().to_vec();
        d.extend_from_slice(tail);
        Shape::new(d)
    };
    let sa = match g.below(4) {
        0 => Shape::new([k]),
        _ => with(&ba, &[m, k]),
    };
    let sb = match g.below(4) {
        0 => Shape::new([k]),
        _ => with(&bb, &[k, n]),
    };
    Sample::new(
        vec![operand(g, dtype, &sa), operand(g, dtype, &sb)],
        Attrs::new(),
    )
}

#[cfg(feature = "conformance")]
fn matmul_samples() -> Vec<Sample> {
    let mut g = Gen::new(0x3a7);
    let mut out: Vec<Sample> = (0..10).map(|i| matmul_sample(&mut Gen::new(i))).collect();
    let fixed: &[(&[usize], &[usize], DType)] = &[
        (&[3], &[3], DType::F32),
        (&[127], &[127], DType::F64),
        (&[3], &[3, 4], DType::F32),
        (&[2, 3], &[3], DType::BF16),
        (&[5, 1, 2, 3], &[4, 3, 7], DType::F32),
        (&[3], &[2, 3, 4], DType::F16),
        (&[2, 4, 3], &[3], DType::I32),
        (&[1, 127], &[127, 1], DType::I64),
        (&[3, 0], &[0, 2], DType::F32),
        (&[0, 2, 3], &[3, 2], DType::F32),
        (&[0], &[0], DType::F64),
        (&[2, 3], &[3, 2], DType::U32),
        (&[7, 7], &[7, 7], DType::I8),
    ];
    for &(a, b, dtype) in fixed {
        out.push(Sample::new(
            vec![
                operand(&mut g, dtype, &Shape::from(a)),
                operand(&mut g, dtype, &Shape::from(b)),
            ],
            Attrs::new(),
        ));
    }
    // Integer products that overflow wrap like the dtype.
    let wide: &[(DType, i64, i64)] = &[
        (DType::I32, 1 << 20, 1 << 20),
        (DType::U32, 3_000_000_000, 3),
        (DType::I64, 1 << 40, 1 << 30),
        (DType::I8, 100, 3),
    ];
    for &(dtype, x, y) in wide {
        let t = |v: i64| {
            HostTensor::from_i64(dtype, [1, 2], vec![v, v])
                .unwrap_or_else(|| unreachable!("two values fill [1, 2]"))
        };
        let y2 = reshape_to(&t(y), &Shape::new([2, 1])).unwrap_or_else(|e| unreachable!("{e}"));
        out.push(Sample::new(vec![t(x), y2], Attrs::new()));
    }
    out
}

inventory::submit! {
    op_def! {
        name: "matmul",
        arity: Arity::Exactly(2),
        dtypes: DOT_DTYPES,
        infer: |x, _| {
            let (a, b) = two(x)?;
            let dtype = same_dtype(a, b, "matmul")?;
            Ok(vec![TensorType::new(dtype, matmul_plan(&a.shape, &b.shape)?.out)])
        },
        lower: |b, x, _| Ok(vec![lower_matmul(b, &x[0], &x[1])?]),
        reference: |x, _| {
            let (a, b) = two(x)?;
            Ok(vec![matmul_ref(a, b)?])
        },
        vjp: Some(matmul_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(20.0),
        samples: matmul_samples,
        arbitrary: matmul_sample,
        torch: Torch::Expr("torch.matmul(x[0], x[1])"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_shapes_follow_torch() {
        let out =
            |a: &[usize], b: &[usize]| matmul_plan(&Shape::from(a), &Shape::from(b)).map(|p| p.out);
        assert_eq!(out(&[3], &[3]), Ok(Shape::scalar()));
        assert_eq!(out(&[3], &[2, 3, 4]), Ok(Shape::from([2, 4])));
        assert_eq!(out(&[2, 4, 3], &[3]), Ok(Shape::from([2, 4])));
        assert_eq!(
            out(&[5, 1, 2, 3], &[4, 3, 7]),
            Ok(Shape::from([5, 4, 2, 7]))
        );
        assert!(out(&[2, 3], &[2, 3]).is_err());
        assert!(out(&[], &[3]).is_err());
    }
}
