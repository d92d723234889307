//! GPT training step throughput (tokens/s) under Strict and DeferAndFuse,
//! measured in one run. `cargo bench -p tpu-rs --bench gpt`.

use std::time::Instant;

use tpu_rs::Result;
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;

const CONFIG: GptConfig = GptConfig {
    vocab_size: 256,
    block_size: 64,
    n_layer: 2,
    n_head: 4,
    n_embd: 64,
};
const BATCH: usize = 8;

/// Tokens per second and peak device MiB of the measured steps.
fn tokens_per_second(mode: EagerMode, steps: usize) -> Result<(f64, f64)> {
    with_eager_mode(mode, || -> Result<(f64, f64)> {
        let device = Device::default();
        let store = ParamStore::new(device, DType::F32, 1);
        let model = Gpt::new(&store, CONFIG)?;
        let mut opt = AdamW::new(store.parameters(), 1e-3, 0.01);
        let n = BATCH * CONFIG.block_size;
        let x = Tensor::from_vec(
            (0..n as i64).map(|i| (i * 31 + 7) % 256).collect(),
            [BATCH, CONFIG.block_size],
            device,
        )?;
        let y = Tensor::from_vec(
            (0..n as i64).map(|i| (i * 31 + 38) % 256).collect(),
            [BATCH, CONFIG.block_size],
            device,
        )?;
        let mut step = || -> Result<()> {
            let loss = model.loss(&x, &y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            loss.item()?;
            Ok(())
        };
        for _ in 0..3 {
            step()?; // compile
        }
        let base = tpu_core::metrics::metrics().live_device_bytes;
        tpu_core::metrics::reset_peak_device_bytes();
        let started = Instant::now();
        for _ in 0..steps {
            step()?;
        }
        let rate = (steps * n) as f64 / started.elapsed().as_secs_f64();
        let peak = tpu_core::metrics::metrics()
            .peak_device_bytes
            .saturating_sub(base);
        Ok((rate, peak as f64 / (1 << 20) as f64))
    })?
}

fn main() -> Result<()> {
    let (strict, strict_peak) = tokens_per_second(EagerMode::Strict, 10)?;
    let (fused, fused_peak) = tokens_per_second(EagerMode::DeferAndFuse, 10)?;
    println!(
        "GPT {}x{}x{} (L={}, C={}) train step: strict {strict:.0} tokens/s, defer_and_fuse {fused:.0} tokens/s, speed-up {:.2}x; peak MiB strict {strict_peak:.2}, defer {fused_peak:.2}",
        BATCH,
        CONFIG.block_size,
        CONFIG.vocab_size,
        CONFIG.n_layer,
        CONFIG.n_embd,
        fused / strict
    );
    Ok(())
}
