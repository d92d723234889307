//! Hostile input through the public API: every case is an error that names
//! the op, the input shapes and the device, on `cpu` and on `tpu:0`; the
//! process never panics or aborts, and the device keeps working after.
//! (`docs/reliability.md` lists the cases.)

use tpu_core::autograd::GradTape;
use tpu_core::op::{Attrs, HostTape, OpErrorKind, Tape};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

const DEVICES: [Device; 2] = [Device::Cpu, Device::Tpu(0)];

fn t(dims: &[usize], dtype: DType, device: Device) -> Tensor {
    Tensor::zeros(dims.to_vec(), dtype, device).expect("a small tensor")
}

/// One hostile call: its family, the op, and how to build its inputs and
/// attributes on a device.
struct Case {
    family: &'static str,
    op: &'static str,
    inputs: fn(Device) -> Vec<Tensor>,
    attrs: fn() -> Attrs,
    /// Words the error must contain besides the op, shapes and device.
    says: &'static str,
    /// The kind of mistake (which Python exception the bridge raises).
    kind: OpErrorKind,
}

const F32: DType = DType::F32;

fn cases() -> Vec<Case> {
    vec![
        Case {
            family: "elementwise",
            op: "add",
            inputs: |d| vec![t(&[2, 3], F32, d), t(&[4], F32, d)],
            attrs: Attrs::new,
            says: "broadcast",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "elementwise",
            op: "bitwise_and",
            inputs: |d| vec![t(&[3], F32, d), t(&[3], F32, d)],
            attrs: Attrs::new,
            says: "",
            kind: OpErrorKind::Unsupported,
        },
        Case {
            family: "elementwise",
            op: "add",
            inputs: |d| vec![t(&[3], F32, d)],
            attrs: Attrs::new,
            says: "takes 2 inputs, got 1",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "reduction",
            op: "sum",
            inputs: |d| vec![t(&[2, 3], F32, d)],
            attrs: || Attrs::new().with("dims", vec![5i64]).with("keepdim", false),
            says: "",
            kind: OpErrorKind::OutOfRange,
        },
        Case {
            family: "reduction",
            op: "softmax",
            inputs: |d| vec![t(&[2, 3], F32, d)],
            attrs: || Attrs::new().with("dim", "last"),
            says: "attribute `dim`",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "linalg",
            op: "matmul",
            inputs: |d| vec![t(&[2, 3], F32, d), t(&[4, 5], F32, d)],
            attrs: Attrs::new,
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "linalg",
            op: "conv2d",
            inputs: |d| vec![t(&[1, 3, 8, 8], F32, d), t(&[4, 2, 3, 3], F32, d)],
            attrs: Attrs::new,
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "movement",
            op: "reshape",
            inputs: |d| vec![t(&[2, 3], F32, d)],
            attrs: || Attrs::new().with("shape", vec![7i64]),
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "movement",
            op: "permute",
            inputs: |d| vec![t(&[2, 3], F32, d)],
            attrs: || Attrs::new().with("dims", vec![0i64, 0]),
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "movement",
            op: "gather",
            inputs: |d| vec![t(&[2, 3], F32, d), t(&[2, 3], F32, d)],
            attrs: || Attrs::new().with("dim", 0i64),
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "movement",
            op: "reshape",
            inputs: |d| vec![t(&[2, 3], F32, d)],
            attrs: Attrs::new,
            says: "missing attribute `shape`",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "nn",
            op: "layer_norm",
            inputs: |d| vec![t(&[2, 3], F32, d), t(&[4], F32, d)],
            attrs: || Attrs::new().with("normalized_dims", 1i64).with("eps", 1e-5),
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "nn",
            op: "cross_entropy",
            inputs: |d| vec![t(&[2, 5], F32, d), t(&[3], DType::I64, d)],
            attrs: Attrs::new,
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "nn",
            op: "embedding",
            inputs: |d| vec![t(&[10, 4], F32, d), t(&[3], F32, d)],
            attrs: Attrs::new,
            says: "",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "creation",
            op: "full",
            inputs: |_| vec![],
            attrs: || {
                let shape = vec![1i64 << 40, 1 << 40];
                Attrs::new()
                    .with("shape", shape)
                    .with("dtype", F32)
                    .with("value", 0.0)
            },
            says: "larger than any device can hold",
            kind: OpErrorKind::Invalid,
        },
        Case {
            family: "creation",
            op: "full",
            inputs: |_| vec![],
            attrs: || {
                let shape = vec![2i64, -3];
                Attrs::new()
                    .with("shape", shape)
                    .with("dtype", F32)
                    .with("value", 0.0)
            },
            says: "",
            kind: OpErrorKind::Invalid,
        },
    ]
}

fn call(case: &Case, device: Device) -> Result<Vec<Tensor>> {
    let inputs = (case.inputs)(device);
    let refs: Vec<&Tensor> = inputs.iter().collect();
    if refs.is_empty() {
        Tensor::create(case.op, (case.attrs)(), device).map(|t| vec![t])
    } else {
        Tensor::apply(case.op, &refs, (case.attrs)())
    }
}

#[test]
fn bad_shapes_dtypes_and_attributes_of_every_op_family_name_op_shapes_and_device() {
    for device in DEVICES {
        for case in cases() {
            let shapes: Vec<String> = (case.inputs)(device)
                .iter()
                .map(|t| t.ty().to_string())
                .collect();
            let what = format!("{} `{}` on {device}", case.family, case.op);
            let err = match call(&case, device) {
                Ok(_) => panic!("{what} with ({}) was accepted", shapes.join(", ")),
                Err(e) => {
                    let Error::Core(core) = &e else {
                        panic!("{what}: {e} is not an op error")
                    };
                    assert_eq!(core.op_error_kind(), Some(case.kind), "{what}: {e}");
                    e.to_string()
                }
            };
            assert!(err.contains(&format!("op `{}`", case.op)), "{what}: {err}");
            assert!(err.contains(&format!("on {device}")), "{what}: {err}");
            for shape in &shapes {
                assert!(err.contains(shape), "{what}: {err} does not name {shape}");
            }
            assert!(
                err.contains(case.says),
                "{what}: {err} does not say {:?}",
                case.says
            );
        }
        // The device still computes after every refusal.
        let x = Tensor::from_slice(&[1.0f32, 2.0], [2], device).unwrap();
        assert_eq!(x.sum_all().unwrap().item().unwrap(), 3.0);
    }
}

#[test]
fn ops_on_two_devices_or_on_a_missing_device_are_errors() {
    let cpu = t(&[2], F32, Device::Cpu);
    let tpu = t(&[2], F32, Device::Tpu(0));
    let err = Tensor::apply1("add", &[&cpu, &tpu], Attrs::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("add") && err.contains("cpu") && err.contains("tpu:0"),
        "{err}"
    );
    let err = Tensor::zeros([2], F32, Device::Tpu(4096))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tpu:4096 does not exist"), "{err}");
}

/// True when `err`, or an error it wraps, is PJRT's `ResourceExhausted`.
fn is_resource_exhausted(err: &Error) -> bool {
    // `Error::Core` is transparent: its source is the core error's source.
    let Error::Core(core) = err else {
        return false;
    };
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(core);
    while let Some(e) = next {
        // An op's failure holds its cause in a box.
        let core = e
            .downcast_ref::<tpu_core::Error>()
            .or_else(|| e.downcast_ref::<Box<tpu_core::Error>>().map(|b| &**b));
        if let Some(tpu_core::Error::Pjrt { code, .. }) = core
            && *code == tpu_core::ErrorCode::ResourceExhausted
        {
            return true;
        }
        next = e.source();
    }
    false
}

#[test]
fn device_out_of_memory_is_an_error_and_the_next_op_works() {
    // 256 GiB: more than this machine (or any TPU chip) holds.
    let huge = [1usize << 36];
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        with_eager_mode(mode, || {
            let result = Tensor::zeros(huge, F32, Device::Tpu(0)).and_then(|t| t.sum_all()?.item());
            let err = result.expect_err("a 256 GiB tensor");
            // Typed: PJRT's out-of-memory code, not any message that says
            // "memory".
            assert!(is_resource_exhausted(&err), "{mode}: {err:?}");
            let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0], [3], Device::Tpu(0)).unwrap();
            let y = x.scale(2.0).unwrap().sum_all().unwrap().item().unwrap();
            assert_eq!(
                y, 12.0,
                "{mode}: the device works after running out of memory"
            );
            Ok(())
        })
        .unwrap();
    }
    // On `cpu`, refused before allocating anything.
    let err = Tensor::zeros([1usize << 40], F32, Device::Cpu).unwrap_err();
    assert!(
        matches!(&err, Error::Core(tpu_core::Error::HostOutOfMemory { op, .. }) if op == "full"),
        "{err}"
    );
}

#[test]
fn a_var_from_another_tape_is_an_error_not_another_tapes_value() {
    let mut a = GradTape::new();
    let mut b = GradTape::new();
    let x = a.input(t(&[2], F32, Device::Cpu).value().clone());
    let y = b.input(t(&[3], F32, Device::Cpu).value().clone());
    // `y` has the same index on `b` as `x` on `a`: still refused.
    assert_eq!(x.index(), y.index());
    assert!(a.value(y).is_err());
    let err = a.op("neg", &[y], Attrs::new()).unwrap_err().to_string();
    assert!(err.contains("another"), "{err}");
    // A backward rule given another tape's gradient refuses it too.
    let neg = tpu_core::op::registry().unwrap().get("neg").unwrap();
    assert!(
        a.backward_rule(neg, &Attrs::new(), &[x], &[x], &[y])
            .is_err()
    );

    let mut host = HostTape::new();
    let mut other = HostTape::new();
    let h = other.push(tpu_core::HostTensor::scalar(F32, 1.0));
    assert!(host.value(h).is_err());
    assert!(Tape::ty(&host, h).is_err());
    assert!(host.call("neg", &[h], Attrs::new()).is_err());
}

#[test]
fn a_failed_compile_leaves_the_runtime_usable() {
    let runtime = tpu_core::Runtime::global().unwrap();
    let broken =
        "func.func @main(%x: tensor<3xf32>) -> tensor<3xf32> { return %y : tensor<3xf32> }";
    let options = tpu_core::CompileOptions::default();
    assert!(runtime.compile(broken, &options).is_err());
    let x = Tensor::from_slice(&[1.0f32, -2.0], [2], Device::Tpu(0)).unwrap();
    let y = Tensor::apply1("relu", &[&x], Attrs::new()).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
}
