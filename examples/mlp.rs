//! Trains a 3-layer MLP on synthetic regression data with the tensor API:
//! autograd, `nn::Linear`, SGD with momentum. The loss falls.
//!
//! ```text
//! cargo run --release -p tpu-rs --example mlp [-- --eager defer_and_fuse]
//! ```

use tpu_rs::Result;
use tpu_rs::nn::{Linear, Module, ParamStore, mse};
use tpu_rs::optim::{Optimizer, Sgd};
use tpu_rs::prelude::*;

fn main() -> Result<()> {
    let mode = match std::env::args().skip_while(|a| a != "--eager").nth(1) {
        Some(m) => m.parse()?,
        None => EagerMode::from_env()?,
    };
    let device = Device::default();
    let store = ParamStore::new(device, DType::F32, 42);
    let root = store.root();
    let layers = [
        Linear::new(&root.sub("0"), 8, 64, true)?,
        Linear::new(&root.sub("1"), 64, 64, true)?,
        Linear::new(&root.sub("2"), 64, 1, true)?,
    ];
    // y = sin(x0) + x1 * x2 - 0.5 * x3 on 256 points in [-1, 1)^8.
    let mut seed = 0x5eedu64;
    let mut uniform = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f64 / (1u64 << 24) as f64) * 2.0 - 1.0
    };
    let xs: Vec<f32> = (0..256 * 8).map(|_| uniform() as f32).collect();
    let ys: Vec<f32> = xs
        .chunks(8)
        .map(|r| r[0].sin() + r[1] * r[2] - 0.5 * r[3])
        .collect();
    let x = Tensor::from_vec(xs, [256, 8], device)?;
    let y = Tensor::from_vec(ys, [256, 1], device)?;
    let mut opt = Sgd::new(store.parameters(), 0.05, 0.9, 0.0);
    println!("device {device}, eager mode {mode}");
    with_eager_mode(mode, || -> Result<()> {
        for step in 0..300 {
            let mut h = x.clone();
            for (i, layer) in layers.iter().enumerate() {
                h = layer.forward(&h)?;
                if i + 1 < layers.len() {
                    h = h.relu()?;
                }
            }
            let loss = mse(&h, &y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            if step % 50 == 0 || step == 299 {
                println!("step {step:>3}  loss {:.5}", loss.item()?);
            }
        }
        Ok(())
    })
}
