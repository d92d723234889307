//! Trains a small GPT-2 style decoder on `tpu` (the XLA CPU plugin when no
//! TPU is attached) with a byte-level tokenizer, then generates text.
//!
//! ```text
//! cargo run --release -p tpu-rs --example gpt -- [--steps N] [--devices N] [--eager MODE] [--corpus FILE]
//! ```
//!
//! Without `--corpus` it trains on this repository's own docs and sources.
//! `--devices N` trains data-parallel over `tpu:0 .. tpu:N-1`: each device
//! takes an equal share of every batch's rows and the gradients are
//! averaged, so the losses are those of one device. Started by torchrun
//! (`torchrun --no-python --nproc-per-node 2 target/release/examples/gpt`)
//! or `tpu-rs launch -n 2 -- target/release/examples/gpt`, every process
//! trains its devices' share the same way and rank 0 reports.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tpu_rs::Result;
use tpu_rs::dist::{DataParallel, DeviceGroup, JobOptions, World};
use tpu_rs::models::{Gpt, GptConfig, Sampling};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, CosineSchedule, Optimizer, clip_grad_norm};
use tpu_rs::prelude::*;

const CONFIG: GptConfig = GptConfig::tiny();
const BATCH: usize = 8;

const USAGE: &str = "\
usage: gpt [--steps N] [--devices N] [--eager MODE] [--corpus FILE]

Trains a small GPT-2 style decoder, then samples from it.

options:
  --steps N       training steps, at least 1 (default 300)
  --devices N     train data-parallel over tpu:0 .. tpu:N-1; N divides the
                  batch of 8 rows (default 1: one device)
  --eager MODE    strict, debug or defer_and_fuse (default: TPU_RS_EAGER,
                  else strict)
  --corpus FILE   train on FILE (default: this repository's docs and sources)
  -h, --help      print this help and exit";

struct Args {
    steps: usize,
    devices: usize,
    corpus: Option<PathBuf>,
    eager: Option<EagerMode>,
}

/// What the command line asks for: a run, the help text, or a mistake.
enum Parsed {
    Run(Args),
    Help,
    Bad(String),
}

/// A count of at least 1.
fn count(flag: &str, value: &str) -> std::result::Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{flag} takes a whole number of at least 1, got `{value}`"
        )),
    }
}

fn parse(args: impl IntoIterator<Item = String>) -> Parsed {
    let mut out = Args {
        steps: 300,
        devices: 1,
        corpus: None,
        eager: None,
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Parsed::Help;
        }
        // `--flag value` or `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        if !matches!(
            flag.as_str(),
            "--steps" | "--devices" | "--eager" | "--corpus"
        ) {
            return Parsed::Bad(format!("unknown argument `{flag}`"));
        }
        let Some(value) = inline.or_else(|| it.next()) else {
            return Parsed::Bad(format!("{flag} needs a value"));
        };
        let set = match flag.as_str() {
            "--steps" => count(&flag, &value).map(|n| out.steps = n),
            "--devices" => count(&flag, &value).and_then(|n| {
                if BATCH % n == 0 {
                    out.devices = n;
                    Ok(())
                } else {
                    Err(format!(
                        "--devices {n} does not divide the batch of {BATCH} rows"
                    ))
                }
            }),
            "--eager" => match value.parse::<EagerMode>() {
                Ok(m) => {
                    out.eager = Some(m);
                    Ok(())
                }
                Err(_) => Err(format!(
                    "--eager takes strict, debug or defer_and_fuse, got `{value}`"
                )),
            },
            _ => {
                out.corpus = Some(PathBuf::from(value));
                Ok(())
            }
        };
        if let Err(reason) = set {
            return Parsed::Bad(reason);
        }
    }
    Parsed::Run(out)
}

/// The command line's arguments; prints the help and exits 0 for `--help`,
/// prints the problem and the usage to stderr and exits 2 for a mistake.
fn args() -> Args {
    match parse(std::env::args().skip(1)) {
        Parsed::Run(args) => args,
        Parsed::Help => {
            println!("{USAGE}");
            std::process::exit(0);
        }
        Parsed::Bad(reason) => {
            eprintln!("gpt: {reason}\n\n{USAGE}");
            std::process::exit(2);
        }
    }
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

/// A small deterministic generator for batches and the sampling seed.
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

/// Fills the rest of the context after `prompt` by sampling with the KV
/// cache, and reports the generation speed.
fn generate(model: &Gpt, prompt: &[u8], seed: u64, device: Device) -> Result<Vec<u8>> {
    let ids: Vec<i64> = prompt.iter().map(|&b| i64::from(b)).collect();
    let prompt_tensor = Tensor::from_vec(ids, [1, prompt.len()], device)?;
    let new = CONFIG.block_size - prompt.len();
    let sampling = Sampling::Random {
        temperature: 0.8,
        top_k: None,
        seed,
    };
    let before = tpu_rs::metrics();
    let started = Instant::now();
    let tokens = model
        .generate(&prompt_tensor, new, sampling)?
        .to_vec::<i64>()?;
    let secs = started.elapsed().as_secs_f64();
    let after = tpu_rs::metrics();
    println!(
        "generated {new} tokens in {secs:.2} s: {:.0} tokens/s ({} programs built)",
        new as f64 / secs,
        after.compiles + after.disk_hits - before.compiles - before.disk_hits
    );
    Ok(tokens.into_iter().map(|t| t as u8).collect())
}

/// The model being trained: one copy on one device, or one replica per
/// device of a group.
enum Replicas {
    One { model: Box<Gpt>, store: ParamStore },
    Many(DataParallel<Gpt>),
}

impl Replicas {
    fn new(devices: usize, device: Device) -> Result<Replicas> {
        let build = |device: Device| -> Result<(Gpt, ParamStore)> {
            let store = ParamStore::new(device, DType::F32, 1337);
            Ok((Gpt::new(&store, CONFIG)?, store))
        };
        let launched = JobOptions::launched();
        if devices == 1 && !launched {
            let (model, store) = build(device)?;
            return Ok(Replicas::One {
                model: Box::new(model),
                store,
            });
        }
        let world = World::from_env(DeviceGroup::new((0..devices).collect())?)?;
        Ok(Replicas::Many(DataParallel::new(world, build)?))
    }

    /// Whether this process reports: rank 0 of a job, or the only one.
    fn leader(&self) -> bool {
        match self {
            Replicas::One { .. } => true,
            Replicas::Many(dp) => dp.world().first_rank() == 0,
        }
    }

    /// ` | data-parallel over ...`, or nothing on one device.
    fn describe(&self) -> String {
        let Replicas::Many(dp) = self else {
            return String::new();
        };
        let local = dp.group().len();
        match dp.world().processes() {
            Some(pg) => format!(
                " | data-parallel over {local} device(s) in each of {} processes",
                pg.world_size()
            ),
            None => format!(" | data-parallel over tpu:0..tpu:{}", local - 1),
        }
    }

    /// The model to sample from (rank 0's).
    fn model(&self) -> &Gpt {
        match self {
            Replicas::One { model, .. } => model,
            Replicas::Many(dp) => dp.model(),
        }
    }

    /// Every replica's parameters, in rank order.
    fn stores(&self) -> Vec<ParamStore> {
        match self {
            Replicas::One { store, .. } => vec![store.clone()],
            Replicas::Many(dp) => dp.replicas().iter().map(|r| r.store().clone()).collect(),
        }
    }

    /// The loss on the batch, with every replica's gradients of it.
    fn forward_backward(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        match self {
            Replicas::One { model, .. } => {
                let loss = model.loss(x, y)?;
                loss.backward()?;
                Ok(loss)
            }
            Replicas::Many(dp) => dp.forward_backward(x, y, |model, x, y| model.loss(x, y)),
        }
    }
}

fn main() -> Result<()> {
    let args = args();
    let eager = match args.eager {
        Some(mode) => mode,
        None => EagerMode::from_env()?,
    };
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
    let replicas = Replicas::new(args.devices, device)?;
    let stores = replicas.stores();
    let model = replicas.model();
    let leader = replicas.leader();
    macro_rules! report {
        ($($t:tt)*) => { if leader { print!($($t)*); } };
    }
    if leader {
        match device {
            Device::Tpu(i) => println!("{}", tpu_rs::Runtime::global()?.describe(i)?),
            Device::Cpu => println!("device: cpu (host reference)"),
        }
    }
    let parallel = replicas.describe();
    report!(
        "eager mode: {} | {} parameters | corpus {} bytes | {} steps of {}x{} tokens{parallel}\n",
        eager,
        stores[0].num_elements(),
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
    let mut opts: Vec<AdamW> = stores
        .iter()
        .map(|s| AdamW::new(s.parameters(), schedule.base_lr, 0.01))
        .collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let started = Instant::now();
    let mut first = None;
    let mut last = 0.0;
    with_eager_mode(eager, || -> Result<()> {
        for step in 0..args.steps {
            let (x, y) = batch(&data, &mut rng, device)?;
            let loss = replicas.forward_backward(&x, &y)?;
            for (store, opt) in stores.iter().zip(&mut opts) {
                clip_grad_norm(&store.parameters(), 1.0)?;
                opt.set_lr(schedule.lr(step));
                opt.step()?;
                opt.zero_grad();
            }
            if step % 10 == 0 || step + 1 == args.steps {
                last = loss.item()?;
                first.get_or_insert(last);
                let done = step + 1;
                let bar = "#".repeat(30 * done / args.steps);
                let tokens =
                    (done * BATCH * CONFIG.block_size) as f64 / started.elapsed().as_secs_f64();
                report!(
                    "\r[{bar:<30}] step {done:>4}/{} loss {last:.3} {tokens:>8.0} tokens/s",
                    args.steps
                );
                let _ = std::io::stdout().flush();
            }
        }
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    if !leader {
        return Ok(());
    }
    println!();
    println!(
        "trained in {secs:.1} s: {:.0} tokens/s, loss {:.3} -> {last:.3}",
        (args.steps * BATCH * CONFIG.block_size) as f64 / secs,
        first.unwrap_or_default()
    );
    stores[0].set_training(false);
    let sample = generate(model, b"fn main() {", rng.next(), device)?;
    println!("--- sample ---\n{}", String::from_utf8_lossy(&sample));
    Ok(())
}
