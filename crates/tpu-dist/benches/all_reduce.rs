//! In-process `all_reduce` (sum, f32) over 2 and 4 devices, 1 KiB to 64 MiB
//! per member, against a host `memcpy` of the same bytes, in one run.
//! `cargo bench -p tpu-dist`.

mod common;

use std::hint::black_box;

use common::median;
use tpu_core::{DType, HostTensor, Result, Tensor};
use tpu_dist::{DeviceGroup, ReduceOp};

fn main() -> Result<()> {
    println!("{}", tpu_core::Runtime::global()?.describe(0)?);
    println!(
        "{:<8}{:>10}{:>16}{:>14}{:>20}",
        "devices", "bytes", "all_reduce us", "memcpy us", "all_reduce/memcpy"
    );
    for n in [2usize, 4] {
        let group = DeviceGroup::new((0..n).collect())?;
        for kib in [1usize, 16, 256, 4096, 65536] {
            let len = kib * 1024 / 4;
            let xs = (0..n)
                .map(|r| {
                    let host = HostTensor::from_f64(DType::F32, vec![len], vec![r as f64; len])
                        .expect("a host tensor");
                    Tensor::from_host(host, group.device(r))
                })
                .collect::<Result<Vec<_>>>()?;
            let runs = if kib >= 4096 { 5 } else { 21 };
            let reduce = median(runs, || {
                for y in group.all_reduce(&xs, ReduceOp::Sum)? {
                    y.buffer()?.block_until_ready()?;
                }
                Ok(())
            })?;
            let src = vec![1u8; kib * 1024];
            let mut dst = vec![0u8; kib * 1024];
            let copy = median(runs, || {
                dst.copy_from_slice(black_box(&src));
                black_box(&dst);
                Ok(())
            })?;
            println!(
                "{n:<8}{:>10}{:>16.1}{:>14.1}{:>19.1}x",
                kib * 1024,
                reduce * 1e6,
                copy * 1e6,
                reduce / copy
            );
        }
    }
    Ok(())
}
