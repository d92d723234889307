//! Mixed precision: what autocast runs in which type, gradients reaching
//! f32 parameters, the gradient scaler's skipped and taken steps, and a
//! GPT trained 200 steps under bf16 autocast against f32.

use tpu_rs::Result;
use tpu_rs::amp::{GradScaler, autocast, autocast_dtype};
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::{Linear, Module, ParamStore};
use tpu_rs::optim::{AdamW, Optimizer, Sgd};
use tpu_rs::prelude::*;

fn wave(shape: &[usize], rate: f64, dtype: DType) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n).map(|k| (rate * k as f64).sin()).collect();
    Tensor::from_vec(values, shape.to_vec(), Device::Tpu(0))?.to_dtype(dtype)
}

#[test]
fn autocast_runs_products_in_the_half_type_and_reductions_in_f32() -> Result<()> {
    let (a, b) = (
        wave(&[4, 8], 0.3, DType::F32)?,
        wave(&[8, 3], 0.7, DType::F32)?,
    );
    let product = autocast(DType::BF16, || a.matmul(&b))??;
    assert_eq!(product.dtype(), DType::BF16);
    // Exactly the product of the inputs rounded to bf16.
    let rounded = a.to_dtype(DType::BF16)?.matmul(&b.to_dtype(DType::BF16)?)?;
    assert_eq!(product.to_f64_vec()?, rounded.to_f64_vec()?);
    autocast(DType::BF16, || -> Result<()> {
        assert_eq!(autocast_dtype(), Some(DType::BF16));
        let half = a.to_dtype(DType::BF16)?;
        assert_eq!(half.softmax(1)?.dtype(), DType::F32);
        assert_eq!(half.sum_all()?.dtype(), DType::F32);
        // Mixed widths compute in the wider; one width stays as it is.
        assert_eq!(half.add(&a)?.dtype(), DType::F32);
        assert_eq!(half.add(&half)?.dtype(), DType::BF16);
        let image = wave(&[1, 2, 5, 5], 0.2, DType::F32)?;
        let kernel = wave(&[3, 2, 3, 3], 0.5, DType::F32)?;
        let conv = image.conv2d(&kernel, None, tpu_rs::Window::default(), 1)?;
        assert_eq!(conv.dtype(), DType::BF16);
        // f64 products stay f64.
        let wide = a.to_dtype(DType::F64)?;
        assert_eq!(wide.matmul(&b.to_dtype(DType::F64)?)?.dtype(), DType::F64);
        // Scopes nest; the inner one wins and ends with its closure.
        autocast(DType::F16, || {
            assert_eq!(a.matmul(&b).unwrap().dtype(), DType::F16)
        })?;
        assert_eq!(a.matmul(&b)?.dtype(), DType::BF16);
        Ok(())
    })??;
    assert_eq!(autocast_dtype(), None);
    assert_eq!(a.matmul(&b)?.dtype(), DType::F32);
    let err = autocast(DType::F32, || ()).unwrap_err().to_string();
    assert!(err.contains("bf16 or f16"), "{err}");
    Ok(())
}

#[test]
fn gradients_under_autocast_reach_f32_parameters_close_to_f32_ones() -> Result<()> {
    let grads = |half: Option<DType>| -> Result<Vec<f64>> {
        let store = ParamStore::new(Device::Tpu(0), DType::F32, 4);
        let layer = Linear::new(&store.root().sub("l"), 8, 4, true)?;
        let x = wave(&[16, 8], 0.37, DType::F32)?;
        let loss = || -> Result<Tensor> { layer.forward(&x)?.tanh()?.sum_all() };
        let loss = match half {
            Some(d) => autocast(d, loss)??,
            None => loss()?,
        };
        loss.backward()?;
        let w = layer.weight.get();
        let g = w.grad().expect("a gradient");
        assert_eq!(g.dtype(), DType::F32);
        g.to_f64_vec()
    };
    let full = grads(None)?;
    for half in [DType::BF16, DType::F16] {
        let got = grads(Some(half))?;
        let tol = if half == DType::BF16 { 3e-2 } else { 4e-3 };
        for (g, f) in got.iter().zip(&full) {
            assert!(
                (g - f).abs() <= tol * (1.0 + f.abs()),
                "{half}: {g} vs f32's {f}"
            );
        }
    }
    Ok(())
}

#[test]
fn the_grad_scaler_skips_overflowing_steps_and_unscales_the_rest() -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F16, 2);
    let layer = Linear::new(&store.root().sub("l"), 4, 1, false)?;
    let before = layer.weight.get().to_f64_vec()?;
    let mut opt = Sgd::new(store.parameters(), 0.1, 0.0, 0.0);
    let mut scaler = GradScaler::new(65536.0, 2);
    let x = wave(&[8, 4], 0.9, DType::F16)?;
    // The loss times 65536 overflows f16: the step is skipped.
    let big = (&layer.forward(&x)?.sum_all()? * 100.0)?;
    scaler.scale(&big)?.backward()?;
    assert!(!scaler.step(&mut opt, &store.parameters())?);
    assert_eq!(scaler.scale_factor(), 32768.0);
    assert_eq!(layer.weight.get().to_f64_vec()?, before);
    // A loss that fits: the step uses the unscaled gradient.
    opt.zero_grad();
    let small = (&layer.forward(&x)?.sum_all()? * 0.1)?;
    scaler.scale(&small)?.backward()?;
    assert!(scaler.step(&mut opt, &store.parameters())?);
    // d(sum(x w) * 0.1)/dw_j = 0.1 * sum_i x_ij: the update used it
    // unscaled.
    let xs = x.to_f64_vec()?;
    let after = layer.weight.get().to_f64_vec()?;
    for (j, (a, b)) in after.iter().zip(&before).enumerate() {
        let grad = (0..8).map(|i| xs[i * 4 + j]).sum::<f64>() * 0.1;
        assert!(
            (a - (b - 0.1 * grad)).abs() <= 2e-3 * (1.0 + b.abs()),
            "w{j}: {a} vs {b} - 0.1 * {grad}"
        );
        assert_ne!(a, b, "w{j} did not move");
    }
    // Two good steps in a row double the scale (growth interval 2).
    opt.zero_grad();
    scaler
        .scale(&(&layer.forward(&x)?.sum_all()? * 0.1)?)?
        .backward()?;
    assert!(scaler.step(&mut opt, &store.parameters())?);
    assert_eq!(scaler.scale_factor(), 65536.0);
    Ok(())
}

/// Losses of a small GPT trained 200 AdamW steps on a learnable sequence
/// task, with or without bf16 autocast.
fn gpt_losses(half: Option<DType>) -> Result<Vec<f64>> {
    let config = GptConfig {
        vocab_size: 64,
        block_size: 32,
        n_layer: 2,
        n_head: 4,
        n_embd: 64,
    };
    let device = Device::Tpu(0);
    let store = ParamStore::new(device, DType::F32, 5);
    let model = Gpt::new(&store, config)?;
    let mut opt = AdamW::new(store.parameters(), 3e-3, 0.0);
    let (batch, n) = (8usize, config.block_size);
    let mut losses = Vec::new();
    for step in 0..200 {
        // Each row counts up by a stride of its own from a start of its own.
        let seq = |shift: usize| -> Vec<i64> {
            (0..batch * n)
                .map(|k| {
                    let (row, i) = (k / n, k % n + shift);
                    ((row * 5 + step * 3 + i * (1 + row % 3)) % config.vocab_size) as i64
                })
                .collect()
        };
        let x = Tensor::from_vec(seq(0), [batch, n], device)?;
        let y = Tensor::from_vec(seq(1), [batch, n], device)?;
        let loss = match half {
            Some(d) => autocast(d, || model.loss(&x, &y))??,
            None => model.loss(&x, &y)?,
        };
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        losses.push(loss.item()?);
    }
    Ok(losses)
}

#[test]
fn a_gpt_trained_under_bf16_autocast_follows_the_f32_loss_curve() -> Result<()> {
    let (full, half) = (gpt_losses(None)?, gpt_losses(Some(DType::BF16))?);
    assert!(
        full[199] < 0.5 * full[0],
        "the task is not learned: {full:?}"
    );
    assert_ne!(full, half, "bf16 autocast changed no loss: it did not run");
    // Twenty-step windows of the curve within 2% of each other.
    for w in 0..10 {
        let mean = |l: &[f64]| l[w * 20..w * 20 + 20].iter().sum::<f64>() / 20.0;
        let (f, h) = (mean(&full), mean(&half));
        assert!(
            (h - f).abs() <= 0.02 * f,
            "steps {}..{}: bf16 {h} vs f32 {f}",
            w * 20,
            w * 20 + 20
        );
    }
    Ok(())
}
