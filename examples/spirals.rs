//! Classifies two interleaved spirals with an MLP: a `TensorDataset` fed by
//! a shuffling `DataLoader`, `Sequential` layers, AdamW and cross entropy.
//! Prints the accuracy on every point and fails below 95%.
//!
//! ```text
//! cargo run --release -p tpu-rs --example spirals [-- --epochs N]
//! ```

use std::sync::Arc;

use tpu_rs::data::{DataLoader, TensorDataset};
use tpu_rs::nn::{Activation, Linear, Module, ParamStore, Sequential, cross_entropy};
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

/// `n` points on each of two spirals, turning 1.5 times, with a little
/// deterministic jitter: coordinates `[2n, 2]` and labels `[2n]` (0 or 1).
fn spirals(n: usize) -> (Vec<f32>, Vec<i64>) {
    let (mut xs, mut labels) = (Vec::new(), Vec::new());
    for class in 0..2 {
        for i in 0..n {
            let t = i as f64 / n as f64;
            let angle = 3.0 * std::f64::consts::PI * t + class as f64 * std::f64::consts::PI;
            let jitter = 0.02 * ((i * 7919 + class * 104729) as f64).sin();
            let radius = 0.1 + 0.9 * t + jitter;
            xs.extend([(radius * angle.cos()) as f32, (radius * angle.sin()) as f32]);
            labels.push(class as i64);
        }
    }
    (xs, labels)
}

fn main() -> Result<()> {
    let epochs: usize = match std::env::args().skip_while(|a| a != "--epochs").nth(1) {
        Some(n) => n
            .parse()
            .map_err(|_| Error::shape("spirals", format!("--epochs {n}: not a count")))?,
        None => 100,
    };
    let device = Device::default();
    let (xs, labels) = spirals(200);
    let points = labels.len();
    let x = Tensor::from_vec(xs, [points, 2], Device::Cpu)?;
    let y = Tensor::from_vec(labels.clone(), [points], Device::Cpu)?;
    let data = Arc::new(TensorDataset::new(vec![x.clone(), y])?);
    let loader = DataLoader::new(data, 32).shuffle(7).to_device(device);

    let store = ParamStore::new(device, DType::F32, 3);
    let root = store.root();
    let model = Sequential::new()
        .push(Linear::new(&root.sub("0"), 2, 64, true)?)
        .push(Activation::Relu)
        .push(Linear::new(&root.sub("2"), 64, 64, true)?)
        .push(Activation::Relu)
        .push(Linear::new(&root.sub("4"), 64, 2, true)?);
    let mut opt = AdamW::new(store.parameters(), 0.005, 0.0);
    println!("device {device}, {points} points, {epochs} epochs");
    for epoch in 0..epochs as u64 {
        let mut total = 0.0;
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let loss = cross_entropy(&model.forward(&batch[0])?, &batch[1])?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
            total += loss.item()?;
        }
        if epoch % 50 == 49 {
            println!(
                "epoch {:3}: mean loss {:.4}",
                epoch + 1,
                total / loader.len() as f64
            );
        }
    }
    let predicted = no_grad(|| model.forward(&x.to_device(device)?)?.argmax(1, false))?;
    let predicted = predicted.to_vec::<i64>()?;
    let right = predicted
        .iter()
        .zip(&labels)
        .filter(|(p, l)| p == l)
        .count();
    let accuracy = right as f64 / points as f64;
    println!("accuracy {:.1}% ({right} of {points})", 100.0 * accuracy);
    if accuracy < 0.95 {
        return Err(Error::shape(
            "spirals",
            format!("accuracy {accuracy:.3} is below 0.95"),
        ));
    }
    Ok(())
}
