//! GPT training-step throughput (tokens/s) under Strict and DeferAndFuse
//! (and DeferAndFuse under bf16 autocast), and PyTorch CPU eager's on the
//! same model, measured in one run.
//! `cargo bench -p tpu-rs --bench gpt`. PyTorch comes from
//! `TPU_RS_TORCH_PYTHON`, else the workspace's `.venv`; without it the
//! PyTorch column says so.

use std::time::Instant;

use tpu_rs::Result;
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;

mod common;

const CONFIG: GptConfig = GptConfig {
    vocab_size: 1024,
    block_size: 128,
    n_layer: 4,
    n_head: 4,
    n_embd: 256,
};
const BATCH: usize = 8;
const STEPS: usize = 10;

/// What one measured run gives.
struct Run {
    tokens_per_second: f64,
    /// Seconds until the first step's work is done (tracing and compiling
    /// included), and the first three steps'.
    first_step: f64,
    first_steps: f64,
    /// Peak device MiB over the measured steps.
    peak_mib: f64,
    /// Programs one step runs.
    programs: u64,
    /// Seconds to issue one step (trace), and then to finish it (execute).
    trace: f64,
    execute: f64,
}

fn measure(mode: EagerMode, half: Option<DType>) -> Result<Run> {
    with_eager_mode(mode, || -> Result<Run> {
        let device = Device::default();
        let store = ParamStore::new(device, DType::F32, 1);
        let model = Gpt::new(&store, CONFIG)?;
        let mut opt = AdamW::new(store.parameters(), 1e-3, 0.01);
        let n = BATCH * CONFIG.block_size;
        let vocab = CONFIG.vocab_size as i64;
        let ids = |offset: i64| -> Result<Tensor> {
            Tensor::from_vec(
                (0..n as i64).map(|i| (i * 31 + offset) % vocab).collect(),
                [BATCH, CONFIG.block_size],
                device,
            )
        };
        let (x, y) = (ids(7)?, ids(38)?);
        // Issues one step; reading the loss finishes it.
        let mut issue = || -> Result<Tensor> {
            let loss = match half {
                Some(d) => tpu_rs::amp::autocast(d, || model.loss(&x, &y))??,
                None => model.loss(&x, &y)?,
            };
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            Ok(loss)
        };
        let mut step = || -> Result<()> {
            issue()?.item()?;
            // What the loss did not need may still wait on its compiles.
            tpu_core::policy::sync()?;
            Ok(())
        };
        let started = Instant::now();
        step()?;
        let first_step = started.elapsed().as_secs_f64();
        for _ in 0..2 {
            step()?; // settle: every program compiled
        }
        let first_steps = started.elapsed().as_secs_f64();
        let base = tpu_core::metrics::metrics().live_device_bytes;
        tpu_core::metrics::reset_peak_device_bytes();
        let started = Instant::now();
        for _ in 0..STEPS {
            step()?;
        }
        let tokens_per_second = (STEPS * n) as f64 / started.elapsed().as_secs_f64();
        let peak = tpu_core::metrics::metrics()
            .peak_device_bytes
            .saturating_sub(base);
        let before = tpu_core::metrics::metrics().executions;
        let started = Instant::now();
        let loss = issue()?;
        let trace = started.elapsed().as_secs_f64();
        loss.item()?;
        let execute = started.elapsed().as_secs_f64() - trace;
        Ok(Run {
            tokens_per_second,
            first_step,
            first_steps,
            peak_mib: peak as f64 / (1 << 20) as f64,
            programs: tpu_core::metrics::metrics().executions - before,
            trace,
            execute,
        })
    })
}

/// PyTorch CPU eager's tokens/s on the same model, or why there is none.
fn torch_cpu_eager() -> std::result::Result<f64, String> {
    let args = [common::model_args(CONFIG).as_slice(), &[BATCH, STEPS]].concat();
    common::torch_figure("torch_gpt_step.py", &args, "tokens/s ")
}

fn main() -> Result<()> {
    println!("{}", tpu_core::Runtime::global()?.describe(0)?);
    let strict = measure(EagerMode::Strict, None)?;
    let fused = measure(EagerMode::DeferAndFuse, None)?;
    let fused_bf16 = measure(EagerMode::DeferAndFuse, Some(DType::BF16))?;
    let torch = torch_cpu_eager();
    let c = CONFIG;
    let peer = match &torch {
        Ok(rate) => format!(
            "torch cpu eager {rate:.0} tokens/s; vs torch: strict {:.2}x, defer_and_fuse {:.2}x",
            strict.tokens_per_second / rate,
            fused.tokens_per_second / rate
        ),
        Err(why) => format!("torch cpu eager not measured ({why})"),
    };
    println!(
        "GPT {BATCH}x{}x{} (L={}, C={}) train step: strict {:.0} tokens/s, defer_and_fuse {:.0} tokens/s, {peer}",
        c.block_size,
        c.vocab_size,
        c.n_layer,
        c.n_embd,
        strict.tokens_per_second,
        fused.tokens_per_second,
    );
    println!(
        "defer_and_fuse vs strict {:.2}x",
        fused.tokens_per_second / strict.tokens_per_second
    );
    println!(
        "defer_and_fuse under bf16 autocast {:.0} tokens/s, {:.2}x f32's",
        fused_bf16.tokens_per_second,
        fused_bf16.tokens_per_second / fused.tokens_per_second
    );
    for (name, run) in [
        ("strict", &strict),
        ("defer_and_fuse", &fused),
        ("dnf + bf16", &fused_bf16),
    ] {
        println!(
            "{name:<15} programs/step {:>5}  trace {:>7.1} ms  execute {:>7.1} ms  first step {:.2} s  first 3 steps {:.2} s  peak {:.1} MiB",
            run.programs,
            run.trace * 1e3,
            run.execute * 1e3,
            run.first_step,
            run.first_steps,
            run.peak_mib
        );
    }
    Ok(())
}
