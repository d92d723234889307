//! Strict vs DeferAndFuse, measured in one run:
//!
//! - a chain of 50 elementwise ops on a 2048x2048 f32 tensor;
//! - a 3-layer MLP training step (forward, backward, SGD update);
//! - a transformer block forward + backward;
//! - Strict's per-op overhead over the raw PJRT execute floor.
//!
//! `cargo bench -p tpu-rs --bench eager` (plugin from `TPU_RS_PLUGIN`).
//! Prints time per iteration, the speed-up, and peak device bytes.

use std::time::{Duration, Instant};

use tpu_core::metrics::{metrics, reset_peak_device_bytes};
use tpu_core::op::Attrs;
use tpu_core::pjrt::CompileOptions;
use tpu_rs::nn::{CausalSelfAttention, LayerNorm, Linear, Mlp, Module, ParamStore, mse};
use tpu_rs::optim::{Optimizer, Sgd};
use tpu_rs::prelude::*;
use tpu_rs::{Result, Runtime, Shape, sync};

const DEVICE: Device = Device::Tpu(0);

fn tensor(shape: &[usize], seed: u64, scale: f64) -> Result<Tensor> {
    let mut g = tpu_core::op::Gen::new(seed);
    let t = g.tensor_in(DType::F32, &Shape::from(shape), -scale, scale);
    Tensor::from_host(t, DEVICE)
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
    mut f: impl FnMut() -> Result<()>,
) -> Result<()> {
    let (strict, strict_peak) =
        with_eager_mode(EagerMode::Strict, || measure(warmup, iters, &mut f))?;
    let (fused, fused_peak) =
        with_eager_mode(EagerMode::DeferAndFuse, || measure(warmup, iters, &mut f))?;
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
            0 => (&y * s)?,
            1 => (&y + x)?,
            2 => y.maximum(s)?,
            3 => (&y - s)?,
            _ => y.tanh()?,
        };
    }
    y.to_host()?;
    Ok(())
}

fn transformer_block(
    x: &Tensor,
    ln1: &LayerNorm,
    attn: &CausalSelfAttention,
    ln2: &LayerNorm,
    mlp: &Mlp,
) -> Result<()> {
    let h = (x + &attn.forward(&ln1.forward(x)?)?)?;
    let out = (&h + &mlp.forward(&ln2.forward(&h)?)?)?;
    let loss = (&out * &out)?.mean_all()?;
    loss.backward()?;
    loss.item()?;
    Ok(())
}

/// Strict dispatch of a tiny op vs executing its compiled program directly.
fn per_op_overhead(shape: &[usize]) -> Result<()> {
    let runtime = Runtime::global()?;
    let x = tensor(shape, 1, 1.0)?;
    let y = tensor(shape, 2, 1.0)?;
    let program = tpu_core::op::single_op_program(
        tpu_ops::registry()?.get("add")?,
        &[x.ty().clone(), y.ty().clone()],
        &Attrs::new(),
    )?;
    let exe = runtime.compile(&program, &CompileOptions::on_device(0))?;
    let (bx, by) = (x.value().buffer()?, y.value().buffer()?);
    let n = 20_000;
    let started = Instant::now();
    for _ in 0..n {
        std::hint::black_box(exe.run(&[&bx, &by])?);
    }
    let floor = started.elapsed() / n;
    let strict = with_eager_mode(EagerMode::Strict, || -> Result<Duration> {
        let (a, b) = (x.value().clone(), y.value().clone());
        let add = |a: &tpu_core::Tensor, b: &tpu_core::Tensor| {
            tpu_core::policy::call("add", &[a.clone(), b.clone()], &Attrs::new(), None)
        };
        add(&a, &b)?;
        let started = Instant::now();
        for _ in 0..n {
            std::hint::black_box(add(&a, &b)?);
        }
        Ok(started.elapsed() / n)
    })?;
    println!(
        "{:<34} floor  {:>9.2} us  strict {:>9.2} us  overhead {:>5.2}x the floor",
        format!("per-op dispatch (add, f32 {shape:?})"),
        floor.as_secs_f64() * 1e6,
        strict.as_secs_f64() * 1e6,
        strict.as_secs_f64() / floor.as_secs_f64()
    );
    Ok(())
}

fn main() -> Result<()> {
    tpu_rs::link();
    println!("{}", Runtime::global()?.describe(0)?);
    per_op_overhead(&[4])?;
    for n in [32, 64] {
        per_op_overhead(&[n, n])?;
    }

    let x = tensor(&[2048, 2048], 3, 1.0)?;
    let s = Tensor::scalar(0.5, DType::F32, DEVICE)?;
    compare("chain of 50 ops, 2048x2048 f32", 1, 3, || {
        chain_of_50(&x, &s)
    })?;

    let store = ParamStore::new(DEVICE, DType::F32, 1);
    let root = store.root();
    let layers = [
        Linear::new(&root.sub("0"), 256, 512, true)?,
        Linear::new(&root.sub("1"), 512, 512, true)?,
        Linear::new(&root.sub("2"), 512, 10, true)?,
    ];
    let mut opt = Sgd::new(store.parameters(), 0.01, 0.0, 0.0);
    let (xb, yb) = (tensor(&[64, 256], 30, 1.0)?, tensor(&[64, 10], 31, 1.0)?);
    compare("MLP 256-512-512-10 train step", 2, 10, || {
        let mut h = xb.clone();
        for (i, layer) in layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i < 2 {
                h = h.relu()?;
            }
        }
        let loss = mse(&h, &yb)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        loss.item()?;
        Ok(())
    })?;

    let (b, t, c) = (4, 64, 128);
    let blocks = ParamStore::new(DEVICE, DType::F32, 2);
    let r = blocks.root();
    let ln1 = LayerNorm::new(&r.sub("ln_1"), c, 1e-5)?;
    let attn = CausalSelfAttention::new(&r.sub("attn"), c, 4)?;
    let ln2 = LayerNorm::new(&r.sub("ln_2"), c, 1e-5)?;
    let mlp = Mlp::new(&r.sub("mlp"), c)?;
    let xt = tensor(&[b, t, c], 50, 1.0)?;
    compare("transformer block fwd+bwd", 2, 5, || {
        let r = transformer_block(&xt, &ln1, &attn, &ln2, &mlp);
        for p in blocks.parameters() {
            p.get().zero_grad();
        }
        r
    })
}
