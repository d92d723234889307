//! Helpers shared by the policy tests.
#![allow(dead_code)]

use tpu_core::op::Attrs;
use tpu_core::policy::call;
use tpu_core::{DType, Device, HostTensor, Tensor};

pub const MODES: [tpu_core::policy::EagerMode; 3] = [
    tpu_core::policy::EagerMode::Strict,
    tpu_core::policy::EagerMode::Debug,
    tpu_core::policy::EagerMode::DeferAndFuse,
];

pub fn tensor(shape: &[usize], values: Vec<f64>, device: Device) -> Tensor {
    tpu_eager::link();
    let host =
        HostTensor::from_f64(DType::F32, shape.to_vec(), values).expect("values fill the shape");
    Tensor::from_host(host, device).expect("upload")
}

pub fn ramp(shape: &[usize], scale: f64, device: Device) -> Tensor {
    let n: usize = shape.iter().product();
    tensor(
        shape,
        (0..n).map(|i| ((i % 17) as f64 - 8.0) * scale).collect(),
        device,
    )
}

#[track_caller]
pub fn op(name: &str, inputs: &[&Tensor]) -> Tensor {
    op_with(name, inputs, Attrs::new())
}

#[track_caller]
pub fn op_with(name: &str, inputs: &[&Tensor], attrs: Attrs) -> Tensor {
    let inputs: Vec<Tensor> = inputs.iter().map(|t| (*t).clone()).collect();
    call(name, &inputs, &attrs, None)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .remove(0)
}

pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_host()
        .expect("read back")
        .to_f64()
        .into_iter()
        .collect()
}

pub fn assert_close(a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}
