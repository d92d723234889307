//! GPT training steps/s fed by a `DataLoader` over a byte corpus, with
//! batches built on the training thread and with `prefetch(2)` (built and
//! moved to the device on a background thread while the device runs the
//! step), measured in one run under DeferAndFuse.
//! `cargo bench -p tpu-rs --bench prefetch`.

use std::sync::Arc;
use std::time::Instant;

use tpu_rs::Result;
use tpu_rs::data::{DataLoader, Dataset};
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;

const CONFIG: GptConfig = GptConfig::tiny();
const BATCH: usize = 16;
const STEPS: usize = 40;

/// Windows of a byte corpus: example `i` is the `block_size` bytes from
/// offset `i * stride` and the same window one byte later (the targets).
struct Windows {
    corpus: Vec<u8>,
    stride: usize,
}

impl Dataset for Windows {
    fn len(&self) -> usize {
        (self.corpus.len() - CONFIG.block_size - 1) / self.stride
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        let start = index * self.stride;
        let window = |from: usize| -> Vec<i64> {
            self.corpus[from..from + CONFIG.block_size]
                .iter()
                .map(|&b| b as i64)
                .collect()
        };
        Ok(vec![
            Tensor::from_vec(window(start), [CONFIG.block_size], Device::Cpu)?,
            Tensor::from_vec(window(start + 1), [CONFIG.block_size], Device::Cpu)?,
        ])
    }
}

/// A text-like corpus of a megabyte: words from a small vocabulary.
fn corpus() -> Vec<u8> {
    let words = [
        "tensor ", "device ", "program ", "compile ", "step ", "loss ", "the ", "a ",
    ];
    let mut state = 17u64;
    let mut out = Vec::with_capacity(1 << 20);
    while out.len() < 1 << 20 {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
        out.extend_from_slice(words[(state >> 60) as usize % words.len()].as_bytes());
    }
    out
}

/// Steps per second of `STEPS` steps fed by `loader` (after two warm-up
/// steps that compile).
fn steps_per_second(loader: &DataLoader) -> Result<f64> {
    with_eager_mode(EagerMode::DeferAndFuse, || -> Result<f64> {
        let store = ParamStore::new(Device::default(), DType::F32, 1);
        let model = Gpt::new(&store, CONFIG)?;
        let mut opt = AdamW::new(store.parameters(), 1e-3, 0.01);
        let mut batches = loader.epoch(0);
        let mut step = || -> Result<()> {
            let batch = batches.next().expect("enough batches")?;
            let loss = model.loss(&batch[0], &batch[1])?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
            loss.item()?;
            Ok(())
        };
        step()?;
        step()?;
        let started = Instant::now();
        for _ in 0..STEPS {
            step()?;
        }
        Ok(STEPS as f64 / started.elapsed().as_secs_f64())
    })
}

fn main() -> Result<()> {
    println!("{}", tpu_core::Runtime::global()?.describe(0)?);
    let data: Arc<dyn Dataset> = Arc::new(Windows {
        corpus: corpus(),
        stride: 7,
    });
    let loader = DataLoader::new(data, BATCH)
        .shuffle(3)
        .to_device(Device::default());
    let here = steps_per_second(&loader)?;
    let ahead = steps_per_second(&loader.clone().prefetch(2))?;
    println!(
        "GPT {BATCH}x{} (L={}, C={}) fed by a DataLoader: {here:.1} steps/s built on the training thread, {ahead:.1} steps/s with prefetch(2): {:.2}x",
        CONFIG.block_size,
        CONFIG.n_layer,
        CONFIG.n_embd,
        ahead / here
    );
    Ok(())
}
