//! `scaled_dot_product_attention(q, k, v[, mask]; causal=false, scale?)`:
//! `softmax(q k^T * scale + mask) v` with q `(..., L, E)`, k `(..., S, E)`,
//! v `(..., S, Ev)`; batch dims broadcast (NumPy rules). The mask broadcasts
//! to `(..., L, S)`: a float mask (q's dtype) is added, a bool mask keeps
//! the positions where it is true. `causal` keeps `j <= i` (top-left
//! aligned, as PyTorch) and excludes an explicit mask. `scale` defaults to
//! `1 / sqrt(E)`. f16 and bf16 compute in f32; a row with every position
//! masked gives zeros (and zero gradients), as PyTorch's CPU kernel does.

use tpu_core::host::{HostData, HostTensor, Tolerance};
use tpu_core::invalid;
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::op_def;
use tpu_core::stablehlo::{Builder, Compare, TensorType, Value, dim_list};
use tpu_core::{DType, Shape};

use crate::linalg::{matmul, transpose_last};
use crate::reduce::kit::*;
use crate::support::*;

/// The checked shapes and attributes of one call.
struct Attn {
    batch: Shape,
    l: usize,
    s: usize,
    e: usize,
    ev: usize,
    scale: f64,
    causal: bool,
}

impl Attn {
    fn with(&self, tail: &[usize]) -> Vec<usize> {
        let mut d = self.batch.dims().to_vec();
        d.extend_from_slice(tail);
        d
    }
}

fn split_last2(t: &TensorType, what: &str) -> OpResult<(Shape, usize, usize)> {
    let r = t.shape.rank();
    if r < 2 {
        return Err(invalid!("{what} must have rank >= 2, got {}", t.shape));
    }
    let d = t.shape.dims();
    Ok((Shape::from(&d[..r - 2]), d[r - 2], d[r - 1]))
}

fn attn_args(inputs: &[TensorType], attrs: &Attrs) -> OpResult<Attn> {
    let (q, k, v, mask) = match inputs {
        [q, k, v] => (q, k, v, None),
        [q, k, v, m] => (q, k, v, Some(m)),
        _ => return Err("takes (q, k, v) or (q, k, v, mask)".into()),
    };
    require_dtype(q.dtype, FLOATS, "q")?;
    for (t, what) in [(k, "k"), (v, "v")] {
        if t.dtype != q.dtype {
            return Err(invalid!(
                "{what} dtype {} must match q dtype {}",
                t.dtype,
                q.dtype
            ));
        }
    }
    let (qb, l, e) = split_last2(q, "q")?;
    let (kb, s, ek) = split_last2(k, "k")?;
    let (vb, sv, ev) = split_last2(v, "v")?;
    if ek != e {
        return Err(invalid!(
            "q {} and k {} must share the last dim",
            q.shape,
            k.shape
        ));
    }
    if sv != s {
        return Err(invalid!(
            "k {} and v {} must share the sequence dim",
            k.shape,
            v.shape
        ));
    }
    let batch = broadcast_all([&qb, &kb, &vb])?;
    let causal = attrs.bool_or("causal", false)?;
    if let Some(m) = mask {
        if causal {
            return Err("an explicit mask cannot be combined with causal=true".into());
        }
        if m.dtype != DType::Bool && m.dtype != q.dtype {
            return Err(invalid!(
                "mask must be bool or {}, got {}",
                q.dtype,
                m.dtype
            ));
        }
        let mut full = batch.dims().to_vec();
        full.extend([l, s]);
        let full = Shape::new(full);
        if broadcast_shapes(&m.shape, &full).ok().as_ref() != Some(&full) {
            return Err(invalid!("mask {} does not broadcast to {full}", m.shape));
        }
    }
    let scale = attrs.float_opt("scale")?.unwrap_or(1.0 / (e as f64).sqrt());
    Ok(Attn {
        batch,
        l,
        s,
        e,
        ev,
        scale,
        causal,
    })
}

/// Batched `dot_general` over the leading `nb` dims, contracting `cx` of
/// `x` with `cy` of `y`, at full precision.
fn dot(b: &mut Builder, x: &Value, y: &Value, nb: usize, cx: usize, cy: usize) -> Value {
    let batch: Vec<usize> = (0..nb).collect();
    let free = |v: &Value, c: usize| -> Vec<usize> {
        (nb..v.rank())
            .filter(|&d| d != c)
            .map(|d| v.dims()[d])
            .collect()
    };
    let mut shape: Vec<usize> = batch.iter().map(|&d| x.dims()[d]).collect();
    shape.extend(free(x, cx));
    shape.extend(free(y, cy));
    let attrs = format!(
        "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {b0}, rhs_batching_dimensions = {b0}, lhs_contracting_dimensions = [{cx}], rhs_contracting_dimensions = [{cy}]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]",
        b0 = dim_list(&batch)
    );
    b.op1(
        "stablehlo.dot_general",
        &[x, y],
        &attrs,
        TensorType::new(x.dtype(), shape),
    )
}

fn lower_attn(b: &mut Builder, x: &[Value], attrs: &Attrs) -> OpResult<Value> {
    let types: Vec<TensorType> = x.iter().map(|v| v.ty().clone()).collect();
    let a = attn_args(&types, attrs)?;
    let dt = x[0].dtype();
    let acc = accumulator(dt);
    let nb = a.batch.rank();
    let prep = |b: &mut Builder, v: &Value, tail: &[usize]| {
        let v = b.convert(v, acc);
        b.broadcast_to(&v, &a.with(tail))
    };
    let q = prep(b, &x[0], &[a.l, a.e]);
    let k = prep(b, &x[1], &[a.s, a.e]);
    let v = prep(b, &x[2], &[a.s, a.ev]);
    let ls = a.with(&[a.l, a.s]);
    let scores = dot(b, &q, &k, nb, nb + 1, nb + 1);
    let mut scores = scale_by(b, &scores, a.scale);
    let ninf = b.constant(acc, ls.as_slice(), f64::NEG_INFINITY);
    if let Some(m) = x.get(3) {
        if m.dtype() == DType::Bool {
            let m = b.broadcast_to(m, &ls);
            scores = b.select(&m, &scores, &ninf);
        } else {
            let m = prep(b, m, &[a.l, a.s]);
            scores = bin(b, "add", &scores, &m);
        }
    }
    if a.causal {
        let rows = b.iota(DType::I64, &[a.l, a.s], 0);
        let cols = b.iota(DType::I64, &[a.l, a.s], 1);
        let keep = b.compare(Compare::Ge, &rows, &cols);
        let keep = b.broadcast_to(&keep, &ls);
        scores = b.select(&keep, &scores, &ninf);
    }
    let p = softmax_in(b, &scores, &[nb + 1]);
    // Rows with every position masked: zeros, not softmax's 0/0.
    let m = max_in(b, &scores, &[nb + 1]);
    let m = expand(b, &m, &ls, &[nb + 1]);
    let dead = b.compare(Compare::Eq, &m, &ninf);
    let zero = b.constant(acc, ls.as_slice(), 0.0);
    let p = b.select(&dead, &zero, &p);
    let out = dot(b, &p, &v, nb, nb + 1, nb);
    Ok(b.convert(&out, dt))
}

fn flat_f64(x: &HostTensor, shape: &[usize]) -> OpResult<Vec<f64>> {
    Ok(broadcast_array(&x.to_f64(), shape)?
        .iter()
        .copied()
        .collect())
}

fn attn_ref(x: &[HostTensor], attrs: &Attrs) -> OpResult<HostTensor> {
    let types: Vec<TensorType> = x.iter().map(HostTensor::ty).collect();
    let a = attn_args(&types, attrs)?;
    let (l, s, e, ev) = (a.l, a.s, a.e, a.ev);
    let q = flat_f64(&x[0], &a.with(&[l, e]))?;
    let k = flat_f64(&x[1], &a.with(&[s, e]))?;
    let v = flat_f64(&x[2], &a.with(&[s, ev]))?;
    // Additive mask: 0 to keep, -inf to drop, or the float mask itself.
    let mask: Option<Vec<f64>> = match x.get(3) {
        None => None,
        Some(m) => {
            let full = broadcast_array(&m.to_f64(), &a.with(&[l, s]))?;
            Some(match m.data() {
                HostData::Int(_) => full
                    .iter()
                    .map(|&keep| if keep != 0.0 { 0.0 } else { f64::NEG_INFINITY })
                    .collect(),
                HostData::Float(_) => full.iter().copied().collect(),
                HostData::Complex(_) => return Err(complex_unsupported()),
            })
        }
    };
    let nbatch = a.batch.numel();
    let mut out = vec![0.0; nbatch * l * ev];
    let mut scores = vec![0.0; s];
    for bi in 0..nbatch {
        for i in 0..l {
            for (j, sc) in scores.iter_mut().enumerate() {
                let dotp: f64 = (0..e)
                    .map(|c| q[(bi * l + i) * e + c] * k[(bi * s + j) * e + c])
                    .sum();
                *sc = dotp * a.scale;
                if let Some(m) = &mask {
                    *sc += m[(bi * l + i) * s + j];
                }
                if a.causal && j > i {
                    *sc = f64::NEG_INFINITY;
                }
            }
            let p = if scores.iter().all(|&sc| sc == f64::NEG_INFINITY) {
                vec![0.0; s]
            } else {
                softmax_of(&scores)
            };
            for c in 0..ev {
                out[(bi * l + i) * ev + c] = (0..s).map(|j| p[j] * v[(bi * s + j) * ev + c]).sum();
            }
        }
    }
    tensor_f64(x[0].dtype(), &a.with(&[l, ev]), out)
}

/// With `s = q k^T * scale + mask` and `p = softmax(s)`:
/// `dv = p^T g`, `ds = p * (g v^T - sum(p * g v^T))`, `dq = ds k * scale`,
/// `dk = ds^T q * scale`, `dmask = ds`, each summed to its input's shape.
fn attn_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let types = a
        .inputs
        .iter()
        .map(|&v| t.ty(v))
        .collect::<OpResult<Vec<TensorType>>>()?;
    let args = attn_args(&types, a.attrs)?;
    let (q, k, v) = (a.inputs[0], a.inputs[1], a.inputs[2]);
    let g = a.grads[0];
    let kt = transpose_last(t, k)?;
    let s = matmul(t, q, kt)?;
    let mut s = t.scale(s, args.scale)?;
    let ninf = t.full_like(s, f64::NEG_INFINITY)?;
    if let Some(&m) = a.inputs.get(3) {
        if t.ty(m)?.dtype == DType::Bool {
            s = select(t, m, s, ninf)?;
        } else {
            s = t.add(s, m)?;
        }
    }
    if args.causal {
        let iota = |t: &mut dyn Tape, dim: i64| {
            let attrs = Attrs::new()
                .with("shape", vec![args.l, args.s])
                .with("dim", dim)
                .with("dtype", DType::I64);
            t.call1("iota", &[], attrs)
        };
        let rows = iota(t, 0)?;
        let cols = iota(t, 1)?;
        let keep = call2(t, "ge", rows, cols)?;
        s = select(t, keep, s, ninf)?;
    }
    let last = t.ty(s)?.shape.rank() - 1;
    let p = t.call1("softmax", &[s], Attrs::new().with("dim", last))?;
    // Fully masked rows are 0/0 in softmax and zero in the forward.
    let dead = t.call1("isnan", &[p], Attrs::new())?;
    let zeros = t.full_like(p, 0.0)?;
    let p = select(t, dead, zeros, p)?;
    let vt = transpose_last(t, v)?;
    let dp = matmul(t, g, vt)?;
    let pdp = t.mul(p, dp)?;
    let row = reduce_call(t, "sum", pdp, &[last], true)?;
    let prow = t.mul(p, row)?;
    let ds = t.sub(pdp, prow)?;
    let dq = matmul(t, ds, k)?;
    let dq = t.scale(dq, args.scale)?;
    let dst = transpose_last(t, ds)?;
    let dk = matmul(t, dst, q)?;
    let dk = t.scale(dk, args.scale)?;
    let pt = transpose_last(t, p)?;
    let dv = matmul(t, pt, g)?;
    let mut grads = vec![
        Some(t.sum_to(dq, &types[0].shape)?),
        Some(t.sum_to(dk, &types[1].shape)?),
        Some(t.sum_to(dv, &types[2].shape)?),
    ];
    if let Some(m) = types.get(3) {
        grads.push(if m.dtype == DType::Bool {
            None
        } else {
            Some(t.sum_to(ds, &m.shape)?)
        });
    }
    Ok(grads)
}

#[cfg(feature = "conformance")]
fn attn_sample(g: &mut Gen) -> Sample {
    let dtype = g.pick(FLOATS);
    let small = |g: &mut Gen| [1, 2, 3, 4, 5, 7, 8][g.below(7)];
    let nb = g.below(3);
    let batch: Vec<usize> = (0..nb).map(|_| small(g)).collect();
    let (l, s, e, ev) = (small(g), small(g), small(g), small(g));
    // Batch dims of k and v sometimes broadcast (size 1 or dropped).
    let part = |g: &mut Gen, tail: [usize; 2]| {
        let mut d: Vec<usize> = batch
            .iter()
            .map(|&b| if g.below(4) == 0 { 1 } else { b })
            .collect();
        if !d.is_empty() && g.below(4) == 0 {
            d.remove(0);
        }
        d.extend(tail);
        Shape::new(d)
    };
    let mut qd = batch.clone();
    qd.extend([l, e]);
    let q = g.tensor(dtype, &Shape::new(qd));
    let ks = part(g, [s, e]);
    let k = g.tensor(dtype, &ks);
    let vs = part(g, [s, ev]);
    let v = g.tensor(dtype, &vs);
    let mut inputs = vec![q, k, v];
    let mut attrs = Attrs::new();
    match g.below(4) {
        0 => attrs.set("causal", true),
        1 => {
            let full = part(g, [l, s]);
            let shape = g.broadcastable(&full);
            inputs.push(g.tensor_in(dtype, &shape, -2.0, 2.0));
        }
        2 => {
            // A bool mask that keeps column 0 in every row.
            let shape = part(g, [l, s]);
            let m = g.tensor(DType::Bool, &shape);
            let dims = shape.dims().to_vec();
            let last = dims[dims.len() - 1];
            let vals: Vec<i64> = m
                .to_i64()
                .iter()
                .enumerate()
                .map(|(i, &v)| if i % last == 0 { 1 } else { v })
                .collect();
            if let Some(m) = HostTensor::from_i64(DType::Bool, shape, vals) {
                inputs.push(m);
            }
        }
        _ => {}
    }
    if g.below(3) == 0 {
        attrs.set("scale", 0.3);
    }
    Sample::new(inputs, attrs)
}

#[cfg(feature = "conformance")]
fn attn_samples() -> Vec<Sample> {
    let mut s: Vec<Sample> = (0..14)
        .map(|i| attn_sample(&mut Gen::new(1300 + i)))
        .collect();
    let mut g = Gen::new(1399);
    let f = DType::F32;
    let t = |g: &mut Gen, d: &[usize]| g.tensor(f, &Shape::from(d));
    // Longer sequences, causal with L > S and L < S, and empty sequences.
    let (q, k, v) = (
        t(&mut g, &[2, 127, 8]),
        t(&mut g, &[2, 127, 8]),
        t(&mut g, &[2, 127, 4]),
    );
    s.push(Sample::new(
        vec![q, k, v],
        Attrs::new().with("causal", true),
    ));
    let (q, k, v) = (t(&mut g, &[7, 3]), t(&mut g, &[4, 3]), t(&mut g, &[4, 5]));
    s.push(Sample::new(
        vec![q.clone(), k.clone(), v.clone()],
        Attrs::new().with("causal", true),
    ));
    s.push(Sample::new(
        vec![k.clone(), q.clone(), t(&mut g, &[7, 2])],
        Attrs::new().with("causal", true),
    ));
    s.push(Sample::new(vec![t(&mut g, &[0, 3]), k, v], Attrs::new()));
    s.push(Sample::new(
        vec![q, t(&mut g, &[0, 3]), t(&mut g, &[0, 5])],
        Attrs::new(),
    ));
    // A row with every position masked, by a bool and by a float mask.
    let keep: Vec<i64> = (0..15).map(|i| i64::from(!(5..10).contains(&i))).collect();
    let keep = HostTensor::from_i64(DType::Bool, [3, 5], keep).expect("3x5");
    let add = HostTensor::float(
        f,
        keep.to_f64()
            .mapv(|k| if k == 0.0 { f64::NEG_INFINITY } else { 0.0 }),
    );
    for mask in [keep, add] {
        let (q, k, v) = (t(&mut g, &[3, 4]), t(&mut g, &[5, 4]), t(&mut g, &[5, 2]));
        s.push(Sample::new(vec![q, k, v, mask], Attrs::new()));
    }
    s
}

inventory::submit! {
    op_def! {
        name: "scaled_dot_product_attention",
        arity: Arity::AtLeast(3),
        dtypes: FLOATS,
        infer: |x, attrs| {
            let a = attn_args(x, attrs)?;
            Ok(vec![TensorType::new(x[0].dtype, a.with(&[a.l, a.ev]))])
        },
        lower: |b, x, attrs| Ok(vec![lower_attn(b, x, attrs)?]),
        reference: |x, attrs| Ok(vec![attn_ref(x, attrs)?]),
        vjp: Some(attn_vjp),
        tolerance: |d| Tolerance::for_dtype(d).scaled(10.0),
        samples: attn_samples,
        arbitrary: attn_sample,
        torch: Torch::Expr(r#"F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=x[3] if len(x) > 3 else None, is_causal=a.get("causal", False), scale=a.get("scale"))"#),
    }
}
