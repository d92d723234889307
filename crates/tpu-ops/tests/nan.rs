//! NaN in, NaN out: the maximum and minimum reductions, and what is built
//! on them, propagate NaN on the device as their references (and PyTorch)
//! do. XLA's CPU reductions skip NaN unless told otherwise.

use tpu_core::DType;
use tpu_core::host::{HostTensor, assert_close};
use tpu_core::op::{Attrs, run_reference};
use tpu_ops::conformance::run_on_tpu;

/// Two rows of four, the first holding a NaN, shaped `dims`.
fn rows(dims: &[usize]) -> HostTensor {
    let values = vec![1.5, f64::NAN, 0.5, -2.0, 2.0, 3.0, -1.0, 0.0];
    HostTensor::from_f64(DType::F32, dims.to_vec(), values).expect("values fill the shape")
}

#[test]
fn max_min_softmax_and_max_pool_propagate_nan_on_the_device() {
    tpu_eager::link();
    let registry = tpu_ops::registry().expect("registry");
    let over_rows = || Attrs::new().with("dims", vec![1i64]).with("keepdim", false);
    let cases: [(&str, HostTensor, Attrs); 5] = [
        ("max", rows(&[2, 4]), over_rows()),
        ("min", rows(&[2, 4]), over_rows()),
        (
            "max",
            rows(&[2, 4]),
            Attrs::new()
                .with("dims", vec![0i64, 1])
                .with("keepdim", false),
        ),
        ("softmax", rows(&[2, 4]), Attrs::new().with("dim", 1i64)),
        (
            "max_pool2d",
            rows(&[1, 1, 2, 4]),
            Attrs::new().with("kernel_size", vec![2i64, 2]),
        ),
    ];
    for (name, x, attrs) in cases {
        let op = registry.get(name).expect("op");
        let inputs = [x];
        let want = run_reference(op, &inputs, &attrs).expect("reference");
        let got = run_on_tpu(0, op, &inputs, &attrs).expect("device");
        let (want, got) = (&want[0], &got[0]);
        assert!(
            want.to_f64().iter().any(|v| v.is_nan()),
            "{name}: the reference keeps NaN"
        );
        let tolerance = (op.tolerance)(DType::F32);
        if let Err(e) = assert_close(got, want, tolerance) {
            panic!("{name} {attrs}: {e}");
        }
    }
}
