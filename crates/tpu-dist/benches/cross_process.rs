//! Cross-process `all_reduce` (sum, f32) on 2 processes, 1 KiB to 64 MiB:
//! tpu-dist's host leg on host memory and on `tpu:0` tensors (which adds
//! the copies to and from the device), against PyTorch's Gloo on CPU
//! tensors of the same sizes, in one run. `cargo bench -p tpu-dist --bench
//! cross_process`. The PyTorch peer runs from `TPU_RS_TORCH_PYTHON`, else
//! the workspace's `.venv`; without it only tpu-dist's figures print.

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};

use common::median;
use tpu_core::{DType, Device, HostBuffer, HostTensor, Result, Tensor};
use tpu_dist::{ProcessGroup, ReduceOp};

const SIZES: [usize; 5] = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const ROLE: &str = "TPU_DIST_BENCH_RANK";

fn runs_for(bytes: usize) -> usize {
    if bytes >= 4 << 20 { 5 } else { 21 }
}

/// One rank: prints `BYTES HOST_US DEVICE_US` per size on rank 0.
fn worker() -> Result<()> {
    let pg = ProcessGroup::from_env()?;
    // Warm the pairs up: the first collectives on fresh TCP pairs are
    // slower by milliseconds.
    median(21, || pg.barrier())?;
    for bytes in SIZES {
        let len = bytes / 4;
        let mut host = Some(HostBuffer::from_slice(&vec![1.0f32; len], vec![len])?);
        let on_host = median(runs_for(bytes), || {
            host = Some(pg.all_reduce_host(host.take().expect("a buffer"), ReduceOp::Sum)?);
            Ok(())
        })?;
        let ones = HostTensor::from_f64(DType::F32, vec![len], vec![1.0; len]).expect("ones");
        let x = Tensor::from_host(ones, Device::Tpu(0))?;
        let on_device = median(runs_for(bytes), || {
            pg.all_reduce(&x, ReduceOp::Sum)?
                .buffer()?
                .block_until_ready()
        })?;
        if pg.rank() == 0 {
            println!("{bytes} {:.1} {:.1}", on_host * 1e6, on_device * 1e6);
        }
    }
    pg.barrier()
}

fn parse(text: &str) -> Vec<Vec<f64>> {
    text.lines()
        .filter_map(|l| l.split_whitespace().map(|w| w.parse().ok()).collect())
        .collect()
}

fn ours() -> std::result::Result<Vec<Vec<f64>>, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&me)
                .env(ROLE, rank.to_string())
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("TPU_DIST_TIMEOUT", "300")
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| e.to_string())
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut table = Vec::new();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("rank {rank} failed: {}", out.status));
        }
        if rank == 0 {
            table = parse(&String::from_utf8_lossy(&out.stdout));
        }
    }
    Ok(table)
}

fn torch_gloo() -> std::result::Result<Vec<Vec<f64>>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("TPU_RS_TORCH_PYTHON")
        .unwrap_or_else(|_| root.join("../../.venv/bin/python").display().to_string());
    let out = Command::new(&python)
        .arg(root.join("benches/gloo_all_reduce.py"))
        .args(SIZES.iter().map(ToString::to_string))
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

fn main() -> std::result::Result<(), String> {
    if std::env::var_os(ROLE).is_some() {
        return worker().map_err(|e| e.to_string());
    }
    let ours = ours()?;
    let peer = torch_gloo().unwrap_or_else(|e| {
        println!("torch gloo peer skipped: {e}");
        Vec::new()
    });
    println!("all_reduce sum f32, 2 processes on one host");
    println!(
        "{:>10}{:>12}{:>12}{:>12}{:>12}{:>16}{:>18}",
        "bytes", "host us", "tpu:0 us", "gloo us", "host GB/s", "host/gloo time", "tpu:0/gloo time"
    );
    for (i, row) in ours.iter().enumerate() {
        let (bytes, host, device) = (row[0], row[1], row[2]);
        let gloo = peer.get(i).map(|r| r[1]);
        let ratio = |t: f64| gloo.map_or("-".to_string(), |g| format!("{:.2}x", t / g));
        println!(
            "{:>10}{:>12.1}{:>12.1}{:>12}{:>12.2}{:>16}{:>18}",
            bytes,
            host,
            device,
            gloo.map_or("-".to_string(), |g| format!("{g:.1}")),
            bytes / host / 1e3,
            ratio(host),
            ratio(device)
        );
    }
    Ok(())
}
