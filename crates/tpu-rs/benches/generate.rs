//! Greedy generation speed with the KV cache: ms per generated token and
//! programs built per generated token under Strict and DeferAndFuse, next
//! to PyTorch CPU eager's (Hugging Face `generate`, same architecture) in
//! the same run. `cargo bench -p tpu-rs --bench generate`. PyTorch comes
//! from `TPU_RS_TORCH_PYTHON`, else the workspace's `.venv`.

use std::time::Instant;

use tpu_rs::Result;
use tpu_rs::models::{Gpt, GptConfig, Sampling};
use tpu_rs::nn::ParamStore;
use tpu_rs::prelude::*;

mod common;

const PROMPT: usize = 16;
const NEW: usize = 48;
const MODELS: [GptConfig; 2] = [
    GptConfig {
        vocab_size: 1024,
        block_size: 64,
        n_layer: 2,
        n_head: 4,
        n_embd: 128,
    },
    GptConfig {
        vocab_size: 1024,
        block_size: 64,
        n_layer: 4,
        n_head: 4,
        n_embd: 256,
    },
];

/// Median ms per generated token, and programs built per generated token
/// after a warm-up generation.
fn measure(config: GptConfig, mode: EagerMode) -> Result<(f64, f64)> {
    with_eager_mode(mode, || -> Result<(f64, f64)> {
        let device = Device::default();
        let store = ParamStore::new(device, DType::F32, 1);
        let model = Gpt::new(&store, config)?;
        let vocab = config.vocab_size as i64;
        let ids: Vec<i64> = (0..PROMPT as i64).map(|i| (i * 7 + 3) % vocab).collect();
        let prompt = Tensor::from_vec(ids, [1, PROMPT], device)?;
        let run = || -> Result<f64> {
            let started = Instant::now();
            model
                .generate(&prompt, NEW, Sampling::Greedy)?
                .to_vec::<i64>()?;
            Ok(started.elapsed().as_secs_f64())
        };
        model
            .generate(&prompt, 4, Sampling::Greedy)?
            .to_vec::<i64>()?;
        let built = |m: tpu_rs::Metrics| m.compiles + m.disk_hits;
        let before = built(tpu_rs::metrics());
        let mut times = vec![run()?];
        let programs = (built(tpu_rs::metrics()) - before) as f64 / NEW as f64;
        for _ in 0..2 {
            times.push(run()?);
        }
        times.sort_by(f64::total_cmp);
        Ok((times[1] * 1e3 / NEW as f64, programs))
    })
}

/// PyTorch CPU eager's ms/token, or why there is none.
fn torch_cpu_eager(c: GptConfig) -> std::result::Result<f64, String> {
    let args = [common::model_args(c).as_slice(), &[PROMPT, NEW]].concat();
    common::torch_figure("torch_generate.py", &args, "ms/token ")
}

fn main() -> Result<()> {
    println!("{}", tpu_core::Runtime::global()?.describe(0)?);
    println!("greedy generation, prompt {PROMPT} tokens, {NEW} new tokens, batch 1");
    for c in MODELS {
        let torch = torch_cpu_eager(c);
        for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
            let (ms, programs) = measure(c, mode)?;
            let peer = match &torch {
                Ok(t) => format!(
                    "torch cpu eager {t:.2} ms/token, tpu/torch time {:.2}x",
                    ms / t
                ),
                Err(why) => format!("torch cpu eager not measured ({why})"),
            };
            println!(
                "L={} C={:<4} {:<15} {ms:6.2} ms/token  {programs:.2} programs built/token  {peer}",
                c.n_layer,
                c.n_embd,
                format!("{mode:?}")
            );
        }
    }
    Ok(())
}
