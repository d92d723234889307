//! Tells horizontal from vertical bars in noisy 12 x 12 images with a small
//! CNN: `Conv2d`, `GroupNorm`, `MaxPool2d`, `AdaptiveAvgPool2d`, `Flatten`,
//! `Linear` in a `Sequential`, trained with AdamW on one set of images and
//! scored on another. Prints the held-out accuracy and fails below 95%.
//!
//! ```text
//! cargo run --release -p tpu-rs --example cnn
//! ```

use std::sync::Arc;

use tpu_rs::data::{DataLoader, TensorDataset};
use tpu_rs::nn::{
    Activation, AdaptiveAvgPool2d, Conv2d, Conv2dConfig, Flatten, GroupNorm, Linear, MaxPool2d,
    Module, ParamStore, Sequential, cross_entropy,
};
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

const SIDE: usize = 12;

/// `n` images `[n, 1, SIDE, SIDE]` and labels `[n]`: label 0 is a
/// horizontal bar, label 1 a vertical one, each two pixels wide at a random
/// place, over uniform noise; `seed` picks the set.
fn bars(n: usize, seed: u64) -> Result<(Tensor, Tensor)> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as f64 / (1u64 << 31) as f64
    };
    let (mut pixels, mut labels) = (Vec::with_capacity(n * SIDE * SIDE), Vec::new());
    for i in 0..n {
        let label = (i % 2) as i64;
        let at = (next() * (SIDE - 1) as f64) as usize;
        for row in 0..SIDE {
            for col in 0..SIDE {
                let across = if label == 0 { row } else { col };
                let bar = if across == at || across == at + 1 {
                    1.0
                } else {
                    0.0
                };
                pixels.push((bar + 0.6 * next()) as f32);
            }
        }
        labels.push(label);
    }
    Ok((
        Tensor::from_vec(pixels, [n, 1, SIDE, SIDE], Device::Cpu)?,
        Tensor::from_vec(labels, [n], Device::Cpu)?,
    ))
}

fn model(store: &ParamStore) -> Result<Sequential> {
    let root = store.root();
    let same = Conv2dConfig {
        padding: 1,
        ..Conv2dConfig::default()
    };
    Ok(Sequential::new()
        .push(Conv2d::new(&root.sub("0"), 1, 8, 3, same)?)
        .push(GroupNorm::new(&root.sub("1"), 2, 8)?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::new(&root.sub("4"), 8, 16, 3, same)?)
        .push(GroupNorm::new(&root.sub("5"), 4, 16)?)
        .push(Activation::Relu)
        .push(AdaptiveAvgPool2d::new([1, 1]))
        .push(Flatten)
        .push(Linear::new(&root.sub("9"), 16, 2, true)?))
}

fn main() -> Result<()> {
    let device = Device::default();
    let (train_x, train_y) = bars(256, 1)?;
    let (test_x, test_y) = bars(128, 2)?;
    let data = Arc::new(TensorDataset::new(vec![train_x, train_y])?);
    let loader = DataLoader::new(data, 32).shuffle(5).to_device(device);
    let store = ParamStore::new(device, DType::F32, 11);
    let net = model(&store)?;
    print!("{}", store.summary());
    let mut opt = AdamW::new(store.parameters(), 0.01, 0.0);
    for epoch in 0..8 {
        let mut total = 0.0;
        for batch in loader.epoch(epoch) {
            let batch = batch?;
            let loss = cross_entropy(&net.forward(&batch[0])?, &batch[1])?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
            total += loss.item()?;
        }
        println!(
            "epoch {:2}: mean loss {:.4}",
            epoch + 1,
            total / loader.len() as f64
        );
    }
    let predicted = no_grad(|| net.forward(&test_x.to_device(device)?)?.argmax(1, false))?;
    let (predicted, labels) = (predicted.to_vec::<i64>()?, test_y.to_vec::<i64>()?);
    let right = predicted
        .iter()
        .zip(&labels)
        .filter(|(p, l)| p == l)
        .count();
    let accuracy = right as f64 / labels.len() as f64;
    println!(
        "held-out accuracy {:.1}% ({right} of {})",
        100.0 * accuracy,
        labels.len()
    );
    if accuracy < 0.95 {
        return Err(Error::shape(
            "cnn",
            format!("held-out accuracy {accuracy:.3} is below 0.95"),
        ));
    }
    Ok(())
}
