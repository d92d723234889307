//! Optimizers and schedules against their update rules computed by hand in
//! f64.

use tpu_rs::Result;
use tpu_rs::nn::{Init, ParamStore};
use tpu_rs::optim::{AdamW, CosineSchedule, Optimizer, Sgd, clip_grad_norm};
use tpu_rs::prelude::*;

/// A store with one parameter `w` of the given values.
fn param(values: &[f64], device: Device) -> Result<(ParamStore, tpu_rs::nn::Parameter)> {
    let store = ParamStore::new(device, DType::F64, 0);
    let p = store.root().param("w", [values.len()], Init::Zeros)?;
    p.set(&Tensor::from_slice(values, [values.len()], device)?);
    Ok((store, p))
}

/// Sets the gradient of loss = sum(c * w) (so grad = c).
fn set_grad(p: &tpu_rs::nn::Parameter, c: &[f64]) -> Result<()> {
    let w = p.get();
    let c = Tensor::from_slice(c, [c.len()], w.device())?;
    (&w * &c)?.sum_all()?.backward()
}

fn close(a: &[f64], b: &[f64]) {
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-9 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn sgd_with_momentum_and_weight_decay_follows_its_rule() -> Result<()> {
    for device in [Device::cpu(), Device::tpu(0)] {
        let (w0, c) = ([1.0, -2.0], [0.5, 0.25]);
        let (_store, p) = param(&w0, device)?;
        let mut opt = Sgd::new(vec![p.clone()], 0.1, 0.9, 0.01);
        let (mut w, mut v) = (w0.to_vec(), vec![0.0; 2]);
        for step in 0..3 {
            set_grad(&p, &c)?;
            opt.step()?;
            opt.zero_grad();
            for i in 0..2 {
                let g = c[i] + 0.01 * w[i];
                v[i] = if step == 0 { g } else { 0.9 * v[i] + g };
                w[i] -= 0.1 * v[i];
            }
        }
        close(&p.get().to_f64_vec()?, &w);
    }
    Ok(())
}

#[test]
fn adamw_follows_its_rule() -> Result<()> {
    let (w0, c) = ([0.3, -0.7, 1.1], [0.2, -0.4, 0.05]);
    let (_store, p) = param(&w0, Device::tpu(0))?;
    let mut opt = AdamW::new(vec![p.clone()], 0.01, 0.1);
    let (mut w, mut m, mut v) = (w0.to_vec(), vec![0.0; 3], vec![0.0; 3]);
    for t in 1..=4 {
        set_grad(&p, &c)?;
        opt.step()?;
        opt.zero_grad();
        for i in 0..3 {
            m[i] = 0.9 * m[i] + 0.1 * c[i];
            v[i] = 0.999 * v[i] + 0.001 * c[i] * c[i];
            let m_hat = m[i] / (1.0 - 0.9f64.powi(t));
            let v_hat = v[i] / (1.0 - 0.999f64.powi(t));
            w[i] -= 0.01 * (m_hat / (v_hat.sqrt() + 1e-8) + 0.1 * w[i]);
        }
    }
    close(&p.get().to_f64_vec()?, &w);
    Ok(())
}

#[test]
fn clipping_scales_gradients_to_the_max_norm() -> Result<()> {
    let (_store, p) = param(&[1.0, 1.0], Device::tpu(0))?;
    set_grad(&p, &[3.0, 4.0])?;
    let norm = clip_grad_norm(std::slice::from_ref(&p), 1.0)?.expect("a gradient");
    assert!((norm.item()? - 5.0).abs() < 1e-5);
    close(
        &p.get()
            .grad()
            .unwrap()
            .to_f64_vec()?
            .iter()
            .map(|g| (g * 1e6).round() / 1e6)
            .collect::<Vec<_>>(),
        &[0.6, 0.8],
    );
    Ok(())
}

#[test]
fn the_schedule_warms_up_then_decays_by_cosine() {
    let s = CosineSchedule {
        base_lr: 1.0,
        min_lr: 0.1,
        warmup_steps: 10,
        total_steps: 110,
    };
    assert!((s.lr(0) - 0.1).abs() < 1e-12);
    assert!((s.lr(9) - 1.0).abs() < 1e-12);
    assert!((s.lr(60) - 0.55).abs() < 1e-12);
    assert!((s.lr(110) - 0.1).abs() < 1e-12);
}
