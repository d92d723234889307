//! Soak: the GPT example's model trained for many steps under Strict and
//! DeferAndFuse, watching for leaks. Every `--every` steps it prints the
//! device bytes tpu-rs buffers hold, the programs built (compiled, or loaded
//! from the disk cache) and the process's resident memory; then a verdict:
//! `flat` when, from the warm-up step on, device bytes and programs do not
//! change and RSS stays within 2% of its value then. It exits with status 1
//! when either mode is not flat.
//!
//! ```text
//! cargo bench -p tpu-rs --bench soak -- [--steps 10000] [--every 500] [--warmup 1000]
//! ```
//! (`cargo xtask soak` runs this and the PyTorch bridge's soak.)

use tpu_rs::Result;
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;

/// The GPT example's model and batch.
const CONFIG: GptConfig = GptConfig::tiny();
const BATCH: usize = 8;

/// RSS may move this much (relative) after warm-up and still count as flat.
const RSS_TOLERANCE: f64 = 0.02;

/// One row of the table.
struct Sample {
    step: usize,
    live_bytes: u64,
    programs: u64,
    rss: u64,
    loss: f64,
}

fn sample(step: usize, loss: f64) -> Sample {
    let m = tpu_core::metrics::metrics();
    Sample {
        step,
        live_bytes: m.live_device_bytes,
        programs: m.compiles + m.disk_hits,
        rss: rss_bytes(),
        loss,
    }
}

/// Resident memory, from `/proc/self/statm` (pages of 4 KiB).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Trains under `mode`, prints the table, and returns the verdict.
fn soak(mode: EagerMode, steps: usize, every: usize, warmup: usize) -> Result<String> {
    println!("\n{steps} steps under {mode}");
    println!(
        "{:>7} {:>12} {:>9} {:>9} {:>8}",
        "step", "live bytes", "programs", "rss MiB", "loss"
    );
    let rows = with_eager_mode(mode, || -> Result<Vec<Sample>> {
        let device = Device::default();
        let store = ParamStore::new(device, DType::F32, 1);
        let model = Gpt::new(&store, CONFIG)?;
        let mut opt = AdamW::new(store.parameters(), 1e-3, 0.01);
        let n = BATCH * CONFIG.block_size;
        let batch = |step: usize| -> Result<(Tensor, Tensor)> {
            let ids = |offset: usize| {
                let vocab = CONFIG.vocab_size;
                (0..n).map(|i| ((i * 31 + offset) % vocab) as i64).collect()
            };
            let shape = [BATCH, CONFIG.block_size];
            let x = Tensor::from_vec(ids(step % 8), shape, device)?;
            Ok((x, Tensor::from_vec(ids(step % 8 + 1), shape, device)?))
        };
        let mut rows = Vec::new();
        for step in 1..=steps {
            let (x, y) = batch(step)?;
            let loss = model.loss(&x, &y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            let loss = loss.item()?;
            if step % every == 0 {
                let row = sample(step, loss);
                println!(
                    "{:>7} {:>12} {:>9} {:>9.1} {:>8.4}",
                    row.step,
                    row.live_bytes,
                    row.programs,
                    row.rss as f64 / f64::from(1 << 20),
                    row.loss
                );
                rows.push(row);
            }
        }
        Ok(rows)
    })?;
    let verdict = verdict(&rows, warmup);
    println!("verdict ({mode}, after step {warmup}): {verdict}");
    Ok(verdict)
}

/// `flat`, or what grew from the first row at or past `warmup` on.
fn verdict(rows: &[Sample], warmup: usize) -> String {
    let after: Vec<&Sample> = rows.iter().filter(|r| r.step >= warmup).collect();
    let Some(base) = after.first() else {
        return format!("too short: no sample from step {warmup} on");
    };
    let mut grew = Vec::new();
    if after.iter().any(|r| r.live_bytes != base.live_bytes) {
        let top = after.iter().map(|r| r.live_bytes).max().unwrap_or(0);
        grew.push(format!("live bytes {} -> max {top}", base.live_bytes));
    }
    if after.iter().any(|r| r.programs != base.programs) {
        let last = after.last().map_or(0, |r| r.programs);
        grew.push(format!("programs {} -> {last}", base.programs));
    }
    let top = after.iter().map(|r| r.rss).max().unwrap_or(0);
    if top as f64 > base.rss as f64 * (1.0 + RSS_TOLERANCE) {
        let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
        grew.push(format!(
            "rss {:.1} -> max {:.1} MiB",
            mib(base.rss),
            mib(top)
        ));
    }
    if grew.is_empty() {
        "flat".to_string()
    } else {
        format!("grew: {}", grew.join("; "))
    }
}

/// `--name N` from the command line, else `default`.
fn flag(args: &[String], name: &str, default: usize) -> usize {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a positive integer, got `{v}`"))
        })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let steps = flag(&args, "--steps", 10_000);
    let every = flag(&args, "--every", 500).max(1);
    let warmup = flag(&args, "--warmup", 1_000);
    let mut failed = Vec::new();
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        let verdict = soak(mode, steps, every, warmup)?;
        if verdict != "flat" {
            failed.push(format!("{mode}: {verdict}"));
        }
    }
    // A failing exit status is what makes `cargo xtask soak` fail on growth.
    if !failed.is_empty() {
        eprintln!("soak: not flat ({})", failed.join("; "));
        std::process::exit(1);
    }
    Ok(())
}
