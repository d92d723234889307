//! What profiling costs, measured in one run:
//!
//! - a probe while no trace is recorded (one relaxed atomic load), beside
//!   a small op's dispatch under Strict (which passes a few probes: its
//!   dispatch and launch spans, counters for its buffers);
//! - the same op while a trace is recorded.
//!
//! `cargo bench -p tpu-rs --bench profile` (plugin from `TPU_RS_PLUGIN`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use tpu_rs::prelude::*;
use tpu_rs::{Result, profile, sync};

const OPS: usize = 20_000;
const PROBES: usize = 10_000_000;

/// Time per op of `OPS` Strict adds on small tensors.
fn per_op() -> Result<Duration> {
    let x = Tensor::ones([8], DType::F32, Device::Tpu(0))?;
    let mut y = x.clone();
    for _ in 0..100 {
        y = (&y + &x)?;
    }
    sync()?;
    let started = Instant::now();
    for _ in 0..OPS {
        y = (&y + &x)?;
    }
    y.to_vec::<f32>()?;
    Ok(started.elapsed() / OPS as u32)
}

fn main() -> Result<()> {
    with_eager_mode(EagerMode::Strict, || -> Result<()> {
        let off = per_op()?;

        let started = Instant::now();
        for _ in 0..PROBES {
            drop(black_box(profile::span("op", "probe")));
        }
        let probe = started.elapsed().as_secs_f64() / PROBES as f64;

        let path = std::env::temp_dir().join(format!("tpu-rs-bench-{}.json", std::process::id()));
        let on = profile::record(&path, per_op)??;
        let _ = std::fs::remove_file(&path);

        let op = off.as_secs_f64();
        println!(
            "Strict add of f32[8], {OPS} ops; plugin {}",
            tpu_rs::Runtime::global()?.client().platform_name()
        );
        println!("  dispatch, no trace recorded:   {:>8.2} µs/op", op * 1e6);
        println!(
            "  a probe, no trace recorded:    {:>8.2} ns = {:.4}% of the op",
            probe * 1e9,
            100.0 * probe / op
        );
        println!(
            "  dispatch, trace recorded:      {:>8.2} µs/op = {:.2}x the unrecorded op",
            on.as_secs_f64() * 1e6,
            on.as_secs_f64() / op
        );
        Ok(())
    })
}
