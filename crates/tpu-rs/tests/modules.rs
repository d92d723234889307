//! `Sequential`, activation and pooling modules, `Flatten`,
//! `BatchNorm2d`'s running statistics against PyTorch's formulas, and
//! `GroupNorm` / `AdaptiveAvgPool2d` against PyTorch itself.

mod torch;

use tpu_rs::Result;
use tpu_rs::nn::{
    Activation, AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Flatten,
    GroupNorm, Linear, MaxPool2d, Module, ParamStore, Sequential, mse,
};
use tpu_rs::optim::{Optimizer, Sgd};
use tpu_rs::prelude::*;

fn input(device: Device) -> Result<Tensor> {
    Tensor::arange(0.0, 2.0 * 3.0 * 8.0 * 8.0, 1.0, DType::F32, device)?
        .reshape([2, 3, 8, 8])?
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

/// `sin(0.37 k)` over `shape` in float64, `k` counting the elements.
fn wave(shape: &[usize], rate: f64, device: Device) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n).map(|k| (rate * k as f64).sin()).collect();
    Tensor::from_vec(values, shape.to_vec(), device)
}

/// PyTorch's float64 `group_norm` of the same inputs, and the gradients of
/// `sum(y * r)`, as JSON: `y`, `dx`, `dw`, `db`.
const GROUP_NORM: &str = r#"
import json, math, torch
n = lambda s: math.prod(s)
wave = lambda s, r: torch.sin(r * torch.arange(n(s), dtype=torch.float64)).reshape(s)
x = wave([2, 6, 5, 7], 0.37).requires_grad_()
w = (1 + 0.1 * torch.arange(6, dtype=torch.float64)).requires_grad_()
b = (0.05 * torch.arange(6, dtype=torch.float64)).requires_grad_()
y = torch.nn.functional.group_norm(x, 3, w, b, 1e-5)
(y * wave([2, 6, 5, 7], 0.11)).sum().backward()
flat = lambda t: t.detach().flatten().tolist()
print(json.dumps({"y": flat(y), "dx": flat(x.grad), "dw": flat(w.grad), "db": flat(b.grad)}))
"#;

fn assert_near(got: &[f64], want: &serde_json::Value, what: &str) {
    let want: Vec<f64> = want
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs PyTorch's {w}"
        );
    }
}

#[test]
fn group_norm_equals_pytorch_with_gradients() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    let want = torch::run_json(&python, GROUP_NORM);
    for device in [Device::Cpu, Device::Tpu(0)] {
        let store = ParamStore::new(device, DType::F64, 0);
        let gn = GroupNorm::new(&store.root().sub("gn"), 3, 6)?;
        let ramp = |scale: f64, offset: f64| -> Result<Tensor> {
            Tensor::from_vec(
                (0..6).map(|c| offset + scale * c as f64).collect(),
                [6],
                device,
            )
        };
        gn.weight.set(&ramp(0.1, 1.0)?);
        gn.bias.set(&ramp(0.05, 0.0)?);
        let x = wave(&[2, 6, 5, 7], 0.37, device)?.with_requires_grad(true);
        let y = gn.forward(&x)?;
        (&y * &wave(&[2, 6, 5, 7], 0.11, device)?)?
            .sum_all()?
            .backward()?;
        assert_near(&y.to_f64_vec()?, &want["y"], "y");
        assert_near(&x.grad().expect("dx").to_f64_vec()?, &want["dx"], "dx");
        let grad = |p: &tpu_rs::nn::Parameter| p.get().grad().expect("a gradient").to_f64_vec();
        assert_near(&grad(&gn.weight)?, &want["dw"], "dw");
        assert_near(&grad(&gn.bias)?, &want["db"], "db");
    }
    let store = ParamStore::new(Device::Cpu, DType::F64, 0);
    let err = GroupNorm::new(&store.root().sub("bad"), 4, 6)
        .err()
        .expect("4 groups of 6");
    assert!(
        err.to_string()
            .contains("6 channels do not split into 4 groups"),
        "{err}"
    );
    let err = wave(&[2, 6, 4], 0.1, Device::Cpu)?
        .group_norm(4, None, None, 1e-5)
        .unwrap_err();
    assert!(
        err.to_string().contains("do not split into 4 groups"),
        "{err}"
    );
    Ok(())
}

/// PyTorch's `adaptive_avg_pool2d` of `[2, 3, 7, 10]` to each output size,
/// with the gradient of `sum(y * r)`.
const ADAPTIVE_POOL: &str = r#"
import json, math, torch
wave = lambda s, r: torch.sin(r * torch.arange(math.prod(s), dtype=torch.float64)).reshape(s)
out = {}
for size in [(3, 4), (1, 1), (7, 10), (9, 13)]:
    x = wave([2, 3, 7, 10], 0.37).requires_grad_()
    y = torch.nn.functional.adaptive_avg_pool2d(x, size)
    (y * wave(list(y.shape), 0.11)).sum().backward()
    out[str(size)] = {"y": y.detach().flatten().tolist(), "dx": x.grad.flatten().tolist()}
print(json.dumps(out))
"#;

#[test]
fn adaptive_average_pooling_equals_pytorch_for_any_sizes() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    let want = torch::run_json(&python, ADAPTIVE_POOL);
    for device in [Device::Cpu, Device::Tpu(0)] {
        for size in [[3, 4], [1, 1], [7, 10], [9, 13]] {
            let key = format!("({}, {})", size[0], size[1]);
            let x = wave(&[2, 3, 7, 10], 0.37, device)?.with_requires_grad(true);
            let y = AdaptiveAvgPool2d::new(size).forward(&x)?;
            assert_eq!(y.dims(), &[2, 3, size[0], size[1]]);
            (&y * &wave(y.dims(), 0.11, device)?)?
                .sum_all()?
                .backward()?;
            assert_near(
                &y.to_f64_vec()?,
                &want[&key]["y"],
                &format!("{key} y on {device}"),
            );
            let dx = x.grad().expect("dx").to_f64_vec()?;
            assert_near(&dx, &want[&key]["dx"], &format!("{key} dx on {device}"));
        }
    }
    let ints = Tensor::from_vec(vec![1i64; 16], [1, 1, 4, 4], Device::Cpu)?;
    let err = ints.adaptive_avg_pool2d([2, 2]).unwrap_err().to_string();
    assert!(
        err.contains("adaptive_avg_pool2d") && err.contains("i64"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_store_summarises_its_parameters() -> Result<()> {
    let store = ParamStore::new(Device::Cpu, DType::F32, 0);
    cnn(&store)?;
    let summary = store.summary();
    let lines: Vec<&str> = summary.lines().collect();
    // A header, the eight parameters in name order, the totals.
    assert_eq!(lines.len(), 10, "{summary}");
    assert!(
        lines[0].starts_with("parameter") && lines[0].ends_with("elements"),
        "{summary}"
    );
    let conv: Vec<&str> = lines[1]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(conv, ["0.bias", "[4]", "f32", "4"], "{summary}");
    let weight = lines
        .iter()
        .find(|l| l.starts_with("0.weight"))
        .expect("the conv weight");
    assert!(
        weight.contains("[4, 3, 3, 3]") && weight.ends_with(" 108"),
        "{summary}"
    );
    let total = store.num_elements();
    assert_eq!(total, 4 + 108 + 4 * 4 + 16 + 1);
    assert_eq!(
        lines[9],
        format!("8 parameters, {total} elements, {} bytes on cpu", total * 4)
    );
    Ok(())
}

#[test]
fn forward_t_picks_the_mode_per_call_whatever_the_store_says() -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 3);
    let root = store.root();
    let model = Sequential::new()
        .push(BatchNorm2d::new(&root.sub("0"), 3)?)
        .push(tpu_rs::nn::Dropout::new(&store, 0.5));
    let bn = BatchNorm2d::new(&root.sub("probe"), 3)?;
    let x = input(Device::Tpu(0))?;
    let running = |m: &BatchNorm2d| -> Result<Vec<f64>> { m.running_stats().0.to_f64_vec() };

    // The store trains; one call evaluates: running statistics (zero mean,
    // unit variance: y = x / sqrt(1 + eps)), no dropout, nothing updated.
    store.set_training(true);
    let y = model.forward_t(&x, false)?.to_f64_vec()?;
    let scale = 1.0 / (1.0f64 + 1e-5).sqrt();
    for (a, b) in y.iter().zip(x.to_f64_vec()?) {
        assert!((a - b * scale).abs() < 1e-5, "{a} vs {}", b * scale);
    }
    assert!(running(&bn)?.iter().all(|&m| m == 0.0));
    bn.forward_t(&x, false)?;
    assert!(
        running(&bn)?.iter().all(|&m| m == 0.0),
        "an evaluating call updated the statistics"
    );

    // The store evaluates; one call trains: batch statistics update the
    // running mean, and dropout zeroes about half the elements.
    store.set_training(false);
    bn.forward_t(&x, true)?;
    assert!(
        running(&bn)?.iter().any(|&m| m != 0.0),
        "a training call kept the statistics"
    );
    let y = model.forward_t(&x, true)?.to_f64_vec()?;
    let zeros = y.iter().filter(|&&v| v == 0.0).count();
    assert!((100..284).contains(&zeros), "{zeros} of 384 dropped");
    // And plain forward follows the store again.
    assert_eq!(
        model.forward(&x)?.to_f64_vec()?,
        model.forward_t(&x, false)?.to_f64_vec()?
    );
    Ok(())
}
