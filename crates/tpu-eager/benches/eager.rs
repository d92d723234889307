//! Strict vs DeferAndFuse, measured in one run:
//!
//! - a chain of 50 elementwise ops on a 2048x2048 f32 tensor;
//! - a 3-layer MLP training step (forward, backward, SGD update);
//! - a transformer block forward + backward;
//! - Strict's per-op overhead over the raw PJRT execute floor.
//!
//! `cargo bench -p tpu-eager --bench eager` (plugin from `TPU_RS_PLUGIN`).
//! Prints time per iteration, the speed-up, and peak device bytes.

use std::time::{Duration, Instant};

use tpu_core::autograd::GradTape;
use tpu_core::metrics::{metrics, reset_peak_device_bytes};
use tpu_core::op::{Attrs, Var};
use tpu_core::pjrt::CompileOptions;
use tpu_core::policy::{EagerMode, call, sync, with_eager_mode};
use tpu_core::{DType, Device, HostTensor, Result, Runtime, Tensor};

const DEVICE: Device = Device::Tpu(0);

fn tensor(shape: &[usize], seed: u64, scale: f64) -> Result<Tensor> {
    let mut g = tpu_core::op::Gen::new(seed);
    let t = g.tensor_in(DType::F32, &tpu_core::Shape::from(shape), -scale, scale);
    Tensor::from_host(t, DEVICE)
}

fn scalar(v: f64) -> Result<Tensor> {
    Tensor::from_host(HostTensor::scalar(DType::F32, v), DEVICE)
}

fn op(name: &str, inputs: &[&Tensor]) -> Result<Tensor> {
    let inputs: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    Ok(call(name, &inputs, &Attrs::new(), None)?.remove(0))
}

/// Mean time per iteration of `f` after `warmup` runs, and the peak device
/// bytes above the starting level during the measured runs.
fn measure(
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<(Duration, u64)> {
    for _ in 0..warmup {
        f()?;
    }
    sync()?;
    let base = metrics().live_device_bytes;
    reset_peak_device_bytes();
    let started = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    sync()?;
    Ok((
        started.elapsed() / iters as u32,
        metrics().peak_device_bytes.saturating_sub(base),
    ))
}

fn compare(
    name: &str,
    warmup: usize,
    iters: usize,
    f: impl Fn() -> Result<()> + Copy,
) -> Result<()> {
    let (strict, strict_peak) = with_eager_mode(EagerMode::Strict, || measure(warmup, iters, f))??;
    let (fused, fused_peak) =
        with_eager_mode(EagerMode::DeferAndFuse, || measure(warmup, iters, f))??;
    println!(
        "{name:<34} strict {:>9.3} ms  defer {:>9.3} ms  speed-up {:>5.2}x   peak MiB strict {:>7.2} defer {:>7.2}",
        strict.as_secs_f64() * 1e3,
        fused.as_secs_f64() * 1e3,
        strict.as_secs_f64() / fused.as_secs_f64(),
        strict_peak as f64 / (1 << 20) as f64,
        fused_peak as f64 / (1 << 20) as f64,
    );
    Ok(())
}

fn chain_of_50(x: &Tensor, s: &Tensor) -> Result<()> {
    let mut y = x.clone();
    for i in 0..50 {
        // Mostly arithmetic, a transcendental every fifth op.
        y = match i % 5 {
            0 => op("mul", &[&y, s])?,
            1 => op("add", &[&y, x])?,
            2 => op("maximum", &[&y, s])?,
            3 => op("sub", &[&y, s])?,
            _ => op("tanh", &[&y])?,
        };
    }
    y.to_host()?;
    Ok(())
}

struct Mlp {
    weights: Vec<Tensor>,
    biases: Vec<Tensor>,
}

fn mlp_step(model: &std::cell::RefCell<Mlp>, x: &Tensor, y: &Tensor, lr: &Tensor) -> Result<()> {
    let mut m = model.borrow_mut();
    let mut tape = GradTape::new();
    let ws: Vec<Var> = m.weights.iter().map(|w| tape.input(w.clone())).collect();
    let bs: Vec<Var> = m.biases.iter().map(|b| tape.input(b.clone())).collect();
    let mut h = tape.input(x.clone());
    for (i, (w, b)) in ws.iter().zip(&bs).enumerate() {
        let z = tape.op1("matmul", &[h, *w], Attrs::new())?;
        let z = tape.op1("add", &[z, *b], Attrs::new())?;
        h = if i + 1 < ws.len() {
            tape.op1("relu", &[z], Attrs::new())?
        } else {
            z
        };
    }
    let target = tape.input(y.clone());
    let d = tape.op1("sub", &[h, target], Attrs::new())?;
    let sq = tape.op1("mul", &[d, d], Attrs::new())?;
    let loss = tape.op1("mean", &[sq], Attrs::new())?;
    let params: Vec<Var> = ws.iter().chain(&bs).copied().collect();
    let grads = tape.grad(loss, None, &params)?;
    let n = m.weights.len();
    for (i, g) in grads.into_iter().enumerate() {
        let Some(g) = g else { continue };
        let step = op("mul", &[&g, lr])?;
        let p = if i < n {
            &mut m.weights[i]
        } else {
            &mut m.biases[i - n]
        };
        *p = op("sub", &[p, &step])?;
    }
    sync()?; // the end of an optimizer step
    tape.value(loss).to_host()?;
    Ok(())
}

struct Block {
    params: Vec<Tensor>,
}

const B: usize = 4;
const T: usize = 64;
const C: usize = 128;
const H: usize = 4;

fn block_fwd_bwd(block: &Block, x: &Tensor) -> Result<()> {
    let mut tape = GradTape::new();
    let p: Vec<Var> = block.params.iter().map(|t| tape.input(t.clone())).collect();
    let (wq, wk, wv, wo, w1, w2) = (p[0], p[1], p[2], p[3], p[4], p[5]);
    let x = tape.input(x.clone());
    let ln = |t: &mut GradTape, v: Var| {
        t.op1(
            "layer_norm",
            &[v],
            Attrs::new().with("normalized_dims", 1i64),
        )
    };
    let heads = |t: &mut GradTape, v: Var| -> Result<Var> {
        let r = t.op1(
            "reshape",
            &[v],
            Attrs::new().with("shape", vec![B as i64, T as i64, H as i64, (C / H) as i64]),
        )?;
        t.op1(
            "permute",
            &[r],
            Attrs::new().with("dims", vec![0i64, 2, 1, 3]),
        )
    };
    let h = ln(&mut tape, x)?;
    let q = tape.op1("matmul", &[h, wq], Attrs::new())?;
    let k = tape.op1("matmul", &[h, wk], Attrs::new())?;
    let v = tape.op1("matmul", &[h, wv], Attrs::new())?;
    let (q, k, v) = (
        heads(&mut tape, q)?,
        heads(&mut tape, k)?,
        heads(&mut tape, v)?,
    );
    let a = tape.op1(
        "scaled_dot_product_attention",
        &[q, k, v],
        Attrs::new().with("causal", true),
    )?;
    let a = tape.op1(
        "permute",
        &[a],
        Attrs::new().with("dims", vec![0i64, 2, 1, 3]),
    )?;
    let a = tape.op1(
        "reshape",
        &[a],
        Attrs::new().with("shape", vec![B as i64, T as i64, C as i64]),
    )?;
    let a = tape.op1("matmul", &[a, wo], Attrs::new())?;
    let x = tape.op1("add", &[x, a], Attrs::new())?;
    let h = ln(&mut tape, x)?;
    let h = tape.op1("matmul", &[h, w1], Attrs::new())?;
    let h = tape.op1("gelu", &[h], Attrs::new())?;
    let h = tape.op1("matmul", &[h, w2], Attrs::new())?;
    let out = tape.op1("add", &[x, h], Attrs::new())?;
    let sq = tape.op1("mul", &[out, out], Attrs::new())?;
    let loss = tape.op1("mean", &[sq], Attrs::new())?;
    let grads = tape.grad(loss, None, &p)?;
    for g in grads.into_iter().flatten() {
        g.buffer()?;
    }
    tape.value(loss).to_host()?;
    Ok(())
}

/// Strict dispatch of a tiny op vs executing its compiled program directly.
fn per_op_overhead() -> Result<()> {
    let runtime = Runtime::global()?;
    let x = tensor(&[4], 1, 1.0)?;
    let y = tensor(&[4], 2, 1.0)?;
    let program = tpu_core::op::single_op_program(
        tpu_ops::registry()?.get("add")?,
        &[x.ty().clone(), y.ty().clone()],
        &Attrs::new(),
    )?;
    let exe = runtime.compile(&program, &CompileOptions::on_device(0))?;
    let (bx, by) = (x.buffer()?, y.buffer()?);
    let n = 20_000;
    let floor = {
        let started = Instant::now();
        for _ in 0..n {
            let out = exe.run(&[&bx, &by])?;
            std::hint::black_box(out);
        }
        started.elapsed() / n
    };
    let strict = with_eager_mode(EagerMode::Strict, || -> Result<Duration> {
        op("add", &[&x, &y])?;
        let started = Instant::now();
        for _ in 0..n {
            std::hint::black_box(op("add", &[&x, &y])?);
        }
        Ok(started.elapsed() / n)
    })??;
    println!(
        "{:<34} floor  {:>9.2} us  strict {:>9.2} us  overhead {:>5.2}x the floor",
        "per-op dispatch (add, 4 f32)",
        floor.as_secs_f64() * 1e6,
        strict.as_secs_f64() * 1e6,
        strict.as_secs_f64() / floor.as_secs_f64()
    );
    Ok(())
}

fn main() -> Result<()> {
    tpu_eager::link();
    println!("{}", Runtime::global()?.describe(0)?);
    per_op_overhead()?;

    let x = tensor(&[2048, 2048], 3, 1.0)?;
    let s = scalar(0.5)?;
    compare("chain of 50 ops, 2048x2048 f32", 1, 3, || {
        chain_of_50(&x, &s)
    })?;

    let sizes = [256usize, 512, 512, 10];
    let model = std::cell::RefCell::new(Mlp {
        weights: (0..3)
            .map(|i| tensor(&[sizes[i], sizes[i + 1]], 10 + i as u64, 0.05))
            .collect::<Result<_>>()?,
        biases: (0..3)
            .map(|i| tensor(&[sizes[i + 1]], 20 + i as u64, 0.0))
            .collect::<Result<_>>()?,
    });
    let (xb, yb) = (tensor(&[64, 256], 30, 1.0)?, tensor(&[64, 10], 31, 1.0)?);
    let lr = scalar(0.01)?;
    compare("MLP 256-512-512-10 train step", 2, 10, || {
        mlp_step(&model, &xb, &yb, &lr)
    })?;

    let block = Block {
        params: [[C, C], [C, C], [C, C], [C, C], [C, 4 * C], [4 * C, C]]
            .iter()
            .enumerate()
            .map(|(i, s)| tensor(s, 40 + i as u64, 0.05))
            .collect::<Result<_>>()?,
    };
    let xt = tensor(&[B, T, C], 50, 1.0)?;
    compare("transformer block fwd+bwd", 2, 5, || {
        block_fwd_bwd(&block, &xt)
    })
}
