//! Trains a small GPT-2 style decoder on `tpu` (the XLA CPU plugin when no
//! TPU is attached) with a byte-level tokenizer, then generates text.
//!
//! ```text
//! cargo run --release -p tpu-rs --example gpt -- [--steps N] [--corpus FILE] [--eager MODE]
//! ```
//!
//! Without `--corpus` it trains on this repository's own docs and sources.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, CosineSchedule, Optimizer, clip_grad_norm};
use tpu_rs::prelude::*;
use tpu_rs::{Result, no_grad};

const CONFIG: GptConfig = GptConfig {
    vocab_size: 256,
    block_size: 64,
    n_layer: 2,
    n_head: 4,
    n_embd: 64,
};
const BATCH: usize = 8;

struct Args {
    steps: usize,
    corpus: Option<PathBuf>,
    eager: EagerMode,
}

fn args() -> Result<Args> {
    let mut out = Args {
        steps: 300,
        corpus: None,
        eager: EagerMode::from_env()?,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--steps" => out.steps = it.next().and_then(|v| v.parse().ok()).unwrap_or(out.steps),
            "--corpus" => out.corpus = it.next().map(PathBuf::from),
            "--eager" => {
                if let Some(m) = it.next() {
                    out.eager = m.parse()?;
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The repository's markdown and Rust sources, up to 300 KB.
fn default_corpus() -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() && !name.starts_with('.') && name != "target" {
                stack.push(p);
            } else if name.ends_with(".md") || name.ends_with(".rs") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut text = Vec::new();
    for f in files {
        if let Ok(bytes) = std::fs::read(&f) {
            text.extend_from_slice(&bytes);
        }
        if text.len() > 300_000 {
            break;
        }
    }
    text.truncate(300_000);
    text
}

/// A small deterministic generator for batches and sampling.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn batch(data: &[u8], rng: &mut Rng, device: Device) -> Result<(Tensor, Tensor)> {
    let t = CONFIG.block_size;
    let mut x = Vec::with_capacity(BATCH * t);
    let mut y = Vec::with_capacity(BATCH * t);
    for _ in 0..BATCH {
        let start = rng.below(data.len() - t - 1);
        x.extend(data[start..start + t].iter().map(|&b| i64::from(b)));
        y.extend(data[start + 1..start + t + 1].iter().map(|&b| i64::from(b)));
    }
    Ok((
        Tensor::from_vec(x, [BATCH, t], device)?,
        Tensor::from_vec(y, [BATCH, t], device)?,
    ))
}

fn generate(
    model: &Gpt,
    prompt: &[u8],
    n: usize,
    rng: &mut Rng,
    device: Device,
) -> Result<Vec<u8>> {
    let mut out = prompt.to_vec();
    no_grad(|| {
        for _ in 0..n {
            let start = out.len().saturating_sub(CONFIG.block_size);
            let context: Vec<i64> = out[start..].iter().map(|&b| i64::from(b)).collect();
            let len = context.len();
            let logits = model.forward(&Tensor::from_vec(context, [1, len], device)?)?;
            let last = logits
                .slice(1, len as i64 - 1, len as i64, 1)?
                .reshape(&[-1])?;
            let probs = last.scale(1.0 / 0.8)?.softmax(-1)?.to_f64_vec()?;
            let mut r = rng.unit();
            let mut next = probs.len() - 1;
            for (i, p) in probs.iter().enumerate() {
                if r < *p {
                    next = i;
                    break;
                }
                r -= p;
            }
            out.push(next as u8);
        }
        Ok(out)
    })
}

fn main() -> Result<()> {
    let args = args()?;
    let device = Device::default();
    let data = match &args.corpus {
        Some(p) => std::fs::read(p).map_err(|e| tpu_rs::Error::Io {
            path: p.display().to_string(),
            message: e.to_string(),
        })?,
        None => default_corpus(),
    };
    if data.len() <= CONFIG.block_size + 1 {
        return Err(tpu_rs::Error::Io {
            path: "corpus".into(),
            message: "needs more text than one block".into(),
        });
    }
    let store = ParamStore::new(device, DType::F32, 1337);
    let model = Gpt::new(&store, CONFIG)?;
    match device {
        Device::Tpu(i) => println!("{}", tpu_rs::Runtime::global()?.describe(i)?),
        Device::Cpu => println!("device: cpu (host reference)"),
    }
    println!(
        "eager mode: {} | {} parameters | corpus {} bytes | {} steps of {}x{} tokens",
        args.eager,
        store.num_elements(),
        data.len(),
        args.steps,
        BATCH,
        CONFIG.block_size
    );
    let schedule = CosineSchedule {
        base_lr: 3e-3,
        min_lr: 3e-4,
        warmup_steps: 20,
        total_steps: args.steps,
    };
    let mut opt = AdamW::new(store.parameters(), schedule.base_lr, 0.01);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let started = Instant::now();
    let mut first = None;
    let mut last = 0.0;
    with_eager_mode(args.eager, || -> Result<()> {
        for step in 0..args.steps {
            let (x, y) = batch(&data, &mut rng, device)?;
            let loss = model.loss(&x, &y)?;
            loss.backward()?;
            clip_grad_norm(&store.parameters(), 1.0)?;
            opt.set_lr(schedule.lr(step));
            opt.step()?;
            opt.zero_grad();
            if step % 10 == 0 || step + 1 == args.steps {
                last = loss.item()?;
                first.get_or_insert(last);
                let done = step + 1;
                let bar = "#".repeat(30 * done / args.steps);
                let tokens =
                    (done * BATCH * CONFIG.block_size) as f64 / started.elapsed().as_secs_f64();
                print!(
                    "\r[{bar:<30}] step {done:>4}/{} loss {last:.3} {tokens:>8.0} tokens/s",
                    args.steps
                );
                let _ = std::io::stdout().flush();
            }
        }
        Ok(())
    })??;
    let secs = started.elapsed().as_secs_f64();
    println!();
    println!(
        "trained in {secs:.1} s: {:.0} tokens/s, loss {:.3} -> {last:.3}",
        (args.steps * BATCH * CONFIG.block_size) as f64 / secs,
        first.unwrap_or_default()
    );
    store.set_training(false);
    let sample = generate(&model, b"fn main() {", 200, &mut rng, device)?;
    println!("--- sample ---\n{}", String::from_utf8_lossy(&sample));
    Ok(())
}
