//! Resumable training across processes: an MLP trained 100 AdamW steps in
//! one process, and the same training stopped at step 50 (model and
//! optimizer saved), then resumed from the files by a new process up to
//! step 100. The two final models must be equal bit for bit.
//!
//! ```text
//! cargo run --release -p tpu-rs --example resume
//! ```
//!
//! Without arguments it runs the three trainings as child processes of
//! itself; `train --to N [--from DIR] [--save DIR] --out FILE` is one of
//! them.

use std::path::{Path, PathBuf};
use std::process::Command;

use tpu_rs::checkpoint;
use tpu_rs::nn::{Activation, Linear, Module, ParamStore, Sequential, mse};
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

/// Errors of the files and processes as well as of training.
type Fallible<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const BATCH: usize = 32;

fn fail(reason: impl Into<String>) -> Error {
    Error::shape("resume", reason)
}

/// Batch `step`: inputs `[BATCH, 4]` and targets `[BATCH, 1]` made from the
/// step number alone, so a resumed run sees the batches the uninterrupted
/// one saw.
fn batch(step: usize, device: Device) -> Result<(Tensor, Tensor)> {
    let xs: Vec<f32> = (0..BATCH * 4)
        .map(|i| ((step * BATCH * 4 + i) as f32 * 0.618).sin())
        .collect();
    let ys: Vec<f32> = xs
        .chunks(4)
        .map(|r| r[0] * r[1] - r[2] + 0.5 * r[3].cos())
        .collect();
    Ok((
        Tensor::from_vec(xs, [BATCH, 4], device)?,
        Tensor::from_vec(ys, [BATCH, 1], device)?,
    ))
}

/// One training process: from scratch or from `from` (model and
/// optimizer), steps up to `to`, then optionally saving both to `save`,
/// and the final model to `out`.
fn train(from: Option<&Path>, to: usize, save: Option<&Path>, out: &Path) -> Fallible<()> {
    let device = Device::default();
    let store = ParamStore::new(device, DType::F32, 21);
    let root = store.root();
    let model = Sequential::new()
        .push(Linear::new(&root.sub("0"), 4, 32, true)?)
        .push(Activation::Tanh)
        .push(Linear::new(&root.sub("2"), 32, 1, true)?);
    let mut opt = AdamW::new(store.parameters(), 0.01, 0.01);
    let mut step = 0;
    if let Some(dir) = from {
        checkpoint::load(&store, dir.join("model.safetensors"))?;
        checkpoint::load_optimizer(&mut opt, dir.join("optimizer.safetensors"))?;
        step = std::fs::read_to_string(dir.join("step"))?
            .trim()
            .parse()
            .map_err(|_| fail("a malformed step file"))?;
    }
    let first = step;
    let mut loss = None;
    while step < to {
        let (x, y) = batch(step, device)?;
        let l = mse(&model.forward(&x)?, &y)?;
        opt.zero_grad();
        l.backward()?;
        opt.step()?;
        loss = Some(l);
        step += 1;
    }
    if let Some(dir) = save {
        std::fs::create_dir_all(dir)?;
        checkpoint::save(&store, dir.join("model.safetensors"))?;
        checkpoint::save_optimizer(&opt, dir.join("optimizer.safetensors"))?;
        std::fs::write(dir.join("step"), step.to_string())?;
    }
    checkpoint::save(&store, out)?;
    let loss = loss.map(|l| l.item()).transpose()?.unwrap_or(f64::NAN);
    println!("trained steps {first}..{step} on {device}, last loss {loss:.6}");
    Ok(())
}

/// Runs this program as a child with `args`; its output must show that it
/// trained.
fn child(args: &[&str]) -> Fallible<()> {
    let out = Command::new(std::env::current_exe()?).args(args).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("  {}", text);
    if !out.status.success() || !text.contains("trained steps") {
        return Err(fail(format!(
            "the child `{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
        .into());
    }
    Ok(())
}

fn main() -> Fallible<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    if args.first().map(String::as_str) == Some("train") {
        let to = flag("--to")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| fail("train needs --to N"))?;
        let out = flag("--out").ok_or_else(|| fail("train needs --out FILE"))?;
        return train(
            flag("--from").map(Path::new),
            to,
            flag("--save").map(Path::new),
            Path::new(out),
        );
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("tpu-rs-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (whole, resumed, saved) = (
        path("whole.safetensors"),
        path("resumed.safetensors"),
        path("at50"),
    );
    println!("uninterrupted:");
    child(&["train", "--to", "100", "--out", &whole])?;
    println!("stopped at step 50, then resumed in a new process:");
    child(&[
        "train",
        "--to",
        "50",
        "--save",
        &saved,
        "--out",
        &path("half.safetensors"),
    ])?;
    child(&["train", "--from", &saved, "--to", "100", "--out", &resumed])?;
    let equal = std::fs::read(&whole)? == std::fs::read(&resumed)?;
    std::fs::remove_dir_all(&dir)?;
    if !equal {
        return Err(fail("the resumed model differs from the uninterrupted one").into());
    }
    println!("the resumed model equals the uninterrupted one bit for bit");
    Ok(())
}
