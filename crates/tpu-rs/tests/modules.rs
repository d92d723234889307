//! `Sequential`, activation and pooling modules, `Flatten`, and
//! `BatchNorm2d`'s running statistics against PyTorch's formulas.

use tpu_rs::Result;
use tpu_rs::nn::{
    Activation, AvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Flatten, Linear, MaxPool2d, Module,
    ParamStore, Sequential, mse,
};
use tpu_rs::optim::{Optimizer, Sgd};
use tpu_rs::prelude::*;

fn input(device: Device) -> Result<Tensor> {
    Tensor::arange(0.0, 2.0 * 3.0 * 8.0 * 8.0, 1.0, DType::F32, device)?
        .reshape(&[2, 3, 8, 8])?
        .scale(0.01)?
        .sin()
}

fn cnn(store: &ParamStore) -> Result<Sequential> {
    let root = store.root();
    Ok(Sequential::new()
        .push(Conv2d::new(
            &root.sub("0"),
            3,
            4,
            3,
            Conv2dConfig {
                padding: 1,
                ..Conv2dConfig::default()
            },
        )?)
        .push(BatchNorm2d::new(&root.sub("1"), 4)?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(AvgPool2d::new(2))
        .push(Flatten)
        .push(Linear::new(&root.sub("4"), 16, 1, true)?))
}

#[test]
fn a_sequential_cnn_trains_alike_on_the_device_and_the_cpu() -> Result<()> {
    let run = |device: Device| -> Result<Vec<f64>> {
        let store = ParamStore::new(device, DType::F32, 9);
        let model = cnn(&store)?;
        assert_eq!(model.len(), 7);
        let mut opt = Sgd::new(store.parameters(), 0.05, 0.0, 0.0);
        let x = input(device)?;
        let y = Tensor::from_slice(&[0.5f32, -0.5], [2, 1], device)?;
        let mut losses = Vec::new();
        for _ in 0..4 {
            let loss = mse(&model.forward(&x)?, &y)?;
            opt.zero_grad();
            loss.backward()?;
            opt.step()?;
            losses.push(loss.item()?);
        }
        Ok(losses)
    };
    let (cpu, tpu) = (run(Device::Cpu)?, run(Device::Tpu(0))?);
    for (a, b) in cpu.iter().zip(&tpu) {
        assert!((a - b).abs() < 1e-4 * (1.0 + a.abs()), "{cpu:?} vs {tpu:?}");
    }
    assert!(cpu[3] < cpu[0], "{cpu:?}");
    Ok(())
}

#[test]
fn batch_norm_keeps_running_statistics_as_pytorch_does() -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 1);
    let bn = BatchNorm2d::new(&store.root().sub("bn"), 3)?;
    let x = input(Device::Tpu(0))?;
    let values = x.to_f64_vec()?;
    // Per channel: the batch mean and unbiased variance over N, H, W.
    let per_channel = |c: usize| -> Vec<f64> {
        (0..2)
            .flat_map(|n| (0..64).map(move |k| (n, k)))
            .map(|(n, k)| values[(n * 3 + c) * 64 + k])
            .collect()
    };
    let stats: Vec<(f64, f64)> = (0..3)
        .map(|c| {
            let v = per_channel(c);
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (v.len() - 1) as f64;
            (mean, var)
        })
        .collect();
    bn.forward(&x)?;
    let (mean, var) = bn.running_stats();
    let (mean, var) = (mean.to_f64_vec()?, var.to_f64_vec()?);
    for c in 0..3 {
        assert!((mean[c] - 0.1 * stats[c].0).abs() < 1e-5, "{mean:?}");
        assert!((var[c] - (0.9 + 0.1 * stats[c].1)).abs() < 1e-5, "{var:?}");
    }
    // Evaluation normalises with the running statistics and keeps them.
    store.set_training(false);
    let y = bn.forward(&x)?.to_f64_vec()?;
    for (i, (&got, &xv)) in y.iter().zip(&values).enumerate() {
        let c = (i / 64) % 3;
        let want = (xv - mean[c]) / (var[c] + 1e-5).sqrt();
        assert!((got - want).abs() < 1e-4, "{i}: {got} vs {want}");
    }
    assert_eq!(bn.running_stats().0.to_f64_vec()?, mean);
    // Checkpoints carry them under PyTorch's names.
    assert!(store.get("bn.running_mean").is_some() && store.get("bn.running_var").is_some());
    Ok(())
}

#[test]
fn pooling_activation_and_flatten_shapes() -> Result<()> {
    let x = input(Device::Tpu(0))?;
    assert_eq!(MaxPool2d::new(2).forward(&x)?.dims(), &[2, 3, 4, 4]);
    assert_eq!(AvgPool2d::new(4).forward(&x)?.dims(), &[2, 3, 2, 2]);
    assert_eq!(Flatten.forward(&x)?.dims(), &[2, 192]);
    let relu = Activation::Relu.forward(&x)?.to_f64_vec()?;
    assert!(relu.iter().all(|&v| v >= 0.0));
    let scalar = Tensor::scalar(1.0, DType::F32, Device::Tpu(0))?;
    assert!(Flatten.forward(&scalar).is_err());
    assert_eq!(
        Sequential::new().forward(&x)?.to_f64_vec()?,
        x.to_f64_vec()?
    );
    Ok(())
}

#[test]
fn a_configured_convolution_strides_dilates_and_groups_alike_everywhere() -> Result<()> {
    let config = Conv2dConfig {
        stride: 2,
        padding: 1,
        dilation: 2,
        groups: 3,
        bias: false,
    };
    let run = |device: Device| -> Result<(Vec<usize>, Vec<f64>)> {
        let store = ParamStore::new(device, DType::F32, 4);
        let conv = Conv2d::new(&store.root().sub("c"), 3, 6, 3, config)?;
        assert!(conv.bias.is_none());
        let y = conv.forward(&input(device)?)?;
        Ok((y.dims().to_vec(), y.to_f64_vec()?))
    };
    let (cpu, tpu) = (run(Device::Cpu)?, run(Device::Tpu(0))?);
    // (8 + 2 - 2 * (3 - 1) - 1) / 2 + 1 = 3.
    assert_eq!(cpu.0, [2, 6, 3, 3]);
    assert_eq!(tpu.0, cpu.0);
    for (a, b) in cpu.1.iter().zip(&tpu.1) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    Ok(())
}
