//! The tensor API: construction, interop, printing and layer misuse.

use ndarray::ArrayD;
use tpu_rs::nn::{Linear, Module, ParamStore};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

#[test]
fn ndarray_and_slices_round_trip_on_every_device() -> Result<()> {
    for device in [Device::Cpu, Device::Tpu(0)] {
        let a = ArrayD::from_shape_vec(vec![2, 3], vec![1i32, 2, 3, 4, 5, 6]).unwrap();
        let t = Tensor::from_ndarray(&a, device)?;
        assert_eq!(t.to_ndarray::<i32>()?, a);
        let h = Tensor::from_slice(&[half::bf16::from_f32(1.5)], [1], device)?;
        assert_eq!(h.dtype(), DType::BF16);
        assert!(t.to_vec::<f32>().is_err(), "typed reads check the dtype");
    }
    Ok(())
}

#[test]
fn printing_looks_like_pytorch() -> Result<()> {
    let t = Tensor::from_slice(&[1.0f32, 2.5, -3.0, 4.0], [2, 2], Device::Tpu(0))?;
    assert_eq!(
        t.to_string(),
        "tensor([[1.0000, 2.5000],\n        [-3.0000, 4.0000]], device='tpu:0')"
    );
    let i = Tensor::from_slice(&[1i64, 2, 3], [3], Device::Cpu)?;
    assert_eq!(i.to_string(), "tensor([1, 2, 3])");
    let big = Tensor::zeros([2000], DType::F16, Device::Cpu)?;
    assert_eq!(
        big.to_string(),
        "tensor([0.0000, 0.0000, 0.0000, ..., 0.0000, 0.0000, 0.0000], dtype=f16)"
    );
    Ok(())
}

#[test]
fn methods_agree_across_devices() -> Result<()> {
    let x = Tensor::from_slice(&[3.0f32, 1.0, 2.0, -1.0, 5.0, 0.5], [2, 3], Device::Cpu)?;
    let xt = x.to_device(Device::Tpu(0))?;
    let run = |x: &Tensor| -> Result<Vec<Vec<f64>>> {
        let (values, indices) = x.sort(-1, true)?;
        Ok(vec![
            values.to_f64_vec()?,
            indices.to_f64_vec()?,
            x.softmax(-1)?.to_f64_vec()?,
            x.transpose(0, 1)?.matmul(x)?.to_f64_vec()?,
            x.var([1], 1, false)?.to_f64_vec()?,
            x.cumsum(1)?.to_f64_vec()?,
        ])
    };
    let (a, b) = (run(&x)?, run(&xt)?);
    for (u, v) in a.iter().zip(&b) {
        for (p, q) in u.iter().zip(v) {
            assert!((p - q).abs() < 1e-5 * (1.0 + q.abs()), "{u:?} vs {v:?}");
        }
    }
    Ok(())
}

#[test]
fn layers_reject_wrong_shapes_with_their_name() -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 0);
    let layer = Linear::new(&store.root().sub("fc"), 4, 3, true)?;
    let x = Tensor::zeros([2, 5], DType::F32, Device::Tpu(0))?;
    let line = line!() + 1;
    match layer.forward(&x) {
        Err(Error::Shape { layer, reason, at }) => {
            assert_eq!(layer, "Linear(in=4, out=3)");
            assert!(reason.contains("[2, 5]"), "{reason}");
            // The user's call, not the layer's code.
            assert!(at.starts_with(&format!("{}:{line}:", file!())), "{at}");
        }

        other => panic!("expected a shape error, got {other:?}"),
    }
    assert_eq!(
        layer
            .forward(&Tensor::zeros([2, 4], DType::F32, Device::Tpu(0))?)?
            .dims(),
        &[2, 3]
    );
    Ok(())
}

#[test]
fn functional_methods_agree_across_devices() -> Result<()> {
    use tpu_rs::Window;
    let run = |device: Device| -> Result<Vec<Vec<f64>>> {
        let key = Tensor::random_key(7, device)?;
        let x = Tensor::uniform(&key, [1, 2, 6, 6], DType::F32, -1.0, 1.0)?;
        let w = Tensor::normal(
            &Tensor::random_key(8, device)?,
            [3, 2, 3, 3],
            DType::F32,
            0.0,
            0.5,
        )?;
        let conv = x.conv2d(
            &w,
            None,
            Window {
                padding: 1,
                ..Window::default()
            },
            1,
        )?;
        let pooled = conv.max_pool2d(
            2,
            Window {
                stride: Some(2),
                ..Window::default()
            },
        )?;
        let avg = conv.avg_pool2d(2, 2, 0)?;
        let flat = pooled.reshape([1, -1])?;
        let ln = flat.layer_norm(1, None, None, 1e-5)?;
        let rms = flat.rms_norm(1, None, 1e-6)?;
        let q = Tensor::uniform(&key, [1, 2, 4, 8], DType::F32, -1.0, 1.0)?;
        let att = q.scaled_dot_product_attention(&q, &q, None, true)?;
        let idx = Tensor::from_slice(&[2i64, 0, 1], [3], device)?;
        let rows = Tensor::eye(3, 4, DType::F32, device)?.index_add(
            0,
            &idx,
            &Tensor::ones([3, 4], DType::F32, device)?,
        )?;
        let logits = Tensor::arange(0.0, 12.0, 1.0, DType::F32, device)?
            .reshape([3, 4])?
            .scale(0.1)?;
        let ce = logits.cross_entropy(&idx)?;
        let nll = logits.log_softmax(-1)?.nll_loss(&idx)?;
        let coins = Tensor::bernoulli(&key, [64], 0.5)?.to_dtype(DType::F32)?;
        [conv, pooled, avg, ln, rms, att, rows, ce, nll, coins]
            .iter()
            .map(|t| t.to_f64_vec())
            .collect()
    };
    let (cpu, tpu) = (run(Device::Cpu)?, run(Device::Tpu(0))?);
    for (a, b) in cpu.iter().zip(&tpu) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4 * (1.0 + x.abs()), "{a:?} vs {b:?}");
        }
    }
    Ok(())
}

#[test]
fn pooling_steps_by_its_kernel_unless_told_otherwise() -> Result<()> {
    use tpu_rs::Window;
    let x = Tensor::ones([1, 1, 16, 16], DType::F32, Device::Tpu(0))?;
    assert_eq!(x.max_pool2d(2, Window::default())?.dims(), &[1, 1, 8, 8]);
    let stride_one = Window {
        stride: Some(1),
        ..Window::default()
    };
    assert_eq!(x.max_pool2d(2, stride_one)?.dims(), &[1, 1, 15, 15]);
    Ok(())
}

#[test]
fn indices_out_of_range_raise_on_the_cpu_and_under_debug_only() -> Result<()> {
    let is_out_of_range = |r: Result<Tensor>| match r.and_then(|t| t.to_f64_vec().map(|_| t)) {
        Err(Error::Core(e)) => e.op_error_kind() == Some(tpu_rs::OpErrorKind::OutOfRange),
        _ => false,
    };
    for device in [Device::Cpu, Device::Tpu(0)] {
        let rows = Tensor::ones([3, 4], DType::F32, device)?;
        let ten = Tensor::from_slice(&[10i64], [1], device)?;
        let seven = Tensor::from_slice(&[0i64, 7], [2], device)?;
        let logits = Tensor::zeros([2, 3], DType::F32, device)?;
        let raises = |mode| -> Result<(bool, bool)> {
            with_eager_mode(mode, || {
                Ok((
                    is_out_of_range(rows.index_select(0, &ten)),
                    is_out_of_range(logits.cross_entropy(&seven)),
                ))
            })
        };
        let expected = device == Device::Cpu;
        assert_eq!(
            raises(EagerMode::Debug)?,
            (true, true),
            "{device} under Debug"
        );
        for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
            assert_eq!(
                raises(mode)?,
                (expected, expected),
                "{device} under {mode:?}"
            );
        }
    }
    Ok(())
}

#[test]
fn errors_say_what_was_asked_for() -> Result<()> {
    // A device this process lacks is named as asked for.
    let err = Tensor::zeros([2], DType::F32, Device::Tpu(97)).unwrap_err();
    assert!(err.to_string().contains("tpu:97 does not exist"), "{err}");
    // Too few values are counted in elements.
    let err = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [2, 2], Device::Cpu).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("3 f32 values") && text.contains("holds 4 elements"),
        "{text}"
    );
    // A mode parsed from a string is not blamed on the environment.
    let err = "fast".parse::<EagerMode>().unwrap_err().to_string();
    assert!(
        err.contains("\"fast\"") && !err.contains("TPU_RS_EAGER"),
        "{err}"
    );
    Ok(())
}

#[test]
fn arithmetic_takes_tensors_owned_or_borrowed_and_numbers_on_either_side() -> Result<()> {
    let x = || Tensor::from_slice(&[1.0f32, 2.0], [2], Device::Tpu(0));
    let y = || Tensor::from_slice(&[3.0f32, 5.0], [2], Device::Tpu(0));
    let cases = [
        ((&x()? + &y()?)?, [4.0, 7.0]),
        ((x()? + y()?)?, [4.0, 7.0]),
        ((&x()? * y()?)?, [3.0, 10.0]),
        ((x()? - &y()?)?, [-2.0, -3.0]),
        ((&x()? * 2.0)?, [2.0, 4.0]),
        ((x()? - 1.0)?, [0.0, 1.0]),
        ((2.0 * &x()?)?, [2.0, 4.0]),
        ((10.0 / x()?)?, [10.0, 5.0]),
        ((1.0 - x()?)?, [0.0, -1.0]),
        ((-x()?)?, [-1.0, -2.0]),
    ];
    for (i, (got, want)) in cases.iter().enumerate() {
        assert_eq!(got.to_f64_vec()?, want, "case {i}");
        assert_eq!(got.dtype(), DType::F32, "case {i}");
    }
    Ok(())
}

#[test]
fn dims_are_taken_in_every_spelling() -> tpu_rs::Result<()> {
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, Device::Tpu(0))?;
    let want = x.reshape([2, 3, 4])?;
    let dims: Vec<usize> = want.dims().to_vec();
    for y in [
        x.reshape((2, 3, 4))?,
        x.reshape([2i64, 3, -1])?,
        x.reshape(vec![2usize, 3, 4])?,
        x.reshape(&dims)?,
        x.reshape(want.dims())?,
    ] {
        assert_eq!(y.dims(), &[2, 3, 4]);
        assert_eq!(y.to_f64_vec()?, want.to_f64_vec()?);
    }
    let s = want.sum(1, false)?;
    assert_eq!(s.to_f64_vec()?, want.sum([1], false)?.to_f64_vec()?);
    assert_eq!(s.dims(), &[2, 4]);
    assert_eq!(want.sum((), false)?.item()?, 276.0);
    assert_eq!(want.permute((2, 0, 1))?.dims(), &[4, 2, 3]);
    assert_eq!(want.mean(&[0usize, 2][..], true)?.dims(), &[1, 3, 1]);
    Ok(())
}
