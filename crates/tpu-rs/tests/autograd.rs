//! Autograd against finite differences, on `cpu` and `tpu`, under every
//! eager mode; and its misuse as typed errors.

use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

const MODES: [EagerMode; 3] = [EagerMode::Strict, EagerMode::Debug, EagerMode::DeferAndFuse];

/// f(x, w) = sum(tanh(x * w + sin(x)) * x) / 3 + sum(exp(w) * w)
fn f(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let a = (&(x * w)? + &x.sin()?)?.tanh()?;
    let b = (&a * x)?.sum_all()?;
    let c = (&w.exp()? * w)?.sum_all()?;
    &(&b / 3.0)? + &c
}

fn values(n: usize, seed: f64) -> Vec<f64> {
    (0..n).map(|i| ((i as f64 + seed) * 0.37).sin()).collect()
}

fn finite_difference(x: &[f64], w: &[f64], which: usize) -> Result<Vec<f64>> {
    let eps = 1e-6;
    let n = if which == 0 { x.len() } else { w.len() };
    let eval = |x: &[f64], w: &[f64]| -> Result<f64> {
        let xt = Tensor::from_slice(x, [x.len()], Device::Cpu)?;
        let wt = Tensor::from_slice(w, [w.len()], Device::Cpu)?;
        f(&xt, &wt)?.item()
    };
    (0..n)
        .map(|i| {
            let (mut xp, mut wp, mut xm, mut wm) = (x.to_vec(), w.to_vec(), x.to_vec(), w.to_vec());
            if which == 0 {
                xp[i] += eps;
                xm[i] -= eps;
            } else {
                wp[i] += eps;
                wm[i] -= eps;
            }
            Ok((eval(&xp, &wp)? - eval(&xm, &wm)?) / (2.0 * eps))
        })
        .collect()
}

#[test]
fn gradients_of_a_composite_function_match_finite_differences() -> Result<()> {
    let (x, w) = (values(7, 0.0), values(7, 3.0));
    let expect_x = finite_difference(&x, &w, 0)?;
    let expect_w = finite_difference(&x, &w, 1)?;
    // f64 on the host reference, f32 on tpu under each mode.
    let mut runs: Vec<(String, Device, DType, f64)> =
        vec![("cpu f64".into(), Device::Cpu, DType::F64, 1e-6)];
    for mode in MODES {
        runs.push((format!("tpu {mode}"), Device::Tpu(0), DType::F32, 1e-4));
    }
    for (label, device, dtype, tol) in runs {
        let mode = if label.contains("defer") {
            EagerMode::DeferAndFuse
        } else if label.contains("debug") {
            EagerMode::Debug
        } else {
            EagerMode::Strict
        };
        with_eager_mode(mode, || -> Result<()> {
            let xt = Tensor::from_slice(&x, [7], Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)?
                .with_requires_grad(true);
            let wt = Tensor::from_slice(&w, [7], Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(device)?
                .with_requires_grad(true);
            f(&xt, &wt)?.backward()?;
            for (t, expect) in [(&xt, &expect_x), (&wt, &expect_w)] {
                let got = t.grad().expect("a gradient").to_f64_vec()?;
                for (g, e) in got.iter().zip(expect) {
                    assert!(
                        (g - e).abs() <= tol * (1.0 + e.abs()),
                        "{label}: {g} vs {e}"
                    );
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}

#[test]
fn gradients_accumulate_until_zeroed_and_detach_stops_them() -> Result<()> {
    let x = Tensor::from_slice(&[1.0f32, 2.0], [2], Device::Tpu(0))?.with_requires_grad(true);
    for _ in 0..2 {
        (&x * &x)?.sum_all()?.backward()?;
    }
    assert_eq!(x.grad().unwrap().to_vec::<f32>()?, vec![4.0, 8.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
    let y = (&x.detach() * &x)?.sum_all()?;
    y.backward()?;
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>()?,
        vec![1.0, 2.0],
        "only the non-detached factor"
    );
    let z = no_grad(|| &x * &x)?;
    assert!(!z.requires_grad());
    Ok(())
}

#[test]
fn misuse_is_a_typed_error() -> Result<()> {
    let x = Tensor::from_slice(&[1.0f32, 2.0], [2], Device::Tpu(0))?.with_requires_grad(true);
    let y = (&x * &x)?;
    assert!(matches!(y.backward(), Err(Error::NonScalarBackward { .. })));
    let plain = Tensor::from_slice(&[1.0f32], [], Device::Tpu(0))?;
    assert!(matches!(plain.backward(), Err(Error::NoGradient)));
    let cpu = Tensor::from_slice(&[1.0f32, 2.0], [2], Device::Cpu)?;
    let err = (&x + &cpu).unwrap_err();
    assert!(err.to_string().contains("different devices"), "{err}");
    let wrong = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], Device::Tpu(0))?;
    assert!(y.backward_with(&wrong).is_err());
    // The graph is released by backward, as in PyTorch.
    let z = (&x * &x)?.sum_all()?;
    z.backward()?;
    assert!(matches!(z.backward(), Err(Error::GraphFreed)));
    Ok(())
}
