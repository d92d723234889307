//! Index checks. Out of range, a gather's index reads the nearest row on
//! the device and a scatter's writes nothing (XLA's semantics, which the
//! references share); on the `cpu` device and under Debug each op's
//! declared index inputs are read first, and one out of range is a typed
//! `OutOfRange` error naming the op, the index and the size, as PyTorch
//! raises. Strict and DeferAndFuse run asynchronously and do not read
//! indices back, as CUDA kernels do not.

use tpu_core::host::HostTensor;
use tpu_core::op::{OpDef, OpErrorKind, Sample};
use tpu_core::policy::{EagerMode, call, with_eager_mode};
use tpu_core::{Device, Error, Tensor};

/// The ops whose samples must exercise a check.
const INDEXED: &[&str] = &[
    "cross_entropy",
    "embedding",
    "gather",
    "index_add",
    "index_select",
    "nll_loss",
    "one_hot",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "take_along_dim",
];

/// Where a call runs: the `cpu` device, or `tpu:0` under a mode.
#[derive(Clone, Copy, Debug)]
enum On {
    Cpu,
    Tpu(EagerMode),
}

fn run(on: On, def: &OpDef, sample: &Sample, inputs: &[HostTensor]) -> tpu_core::Result<()> {
    let (device, mode) = match on {
        On::Cpu => (Device::Cpu, EagerMode::Strict),
        On::Tpu(mode) => (Device::Tpu(0), mode),
    };
    let tensors: Vec<Tensor> = inputs
        .iter()
        .map(|h| Tensor::from_host(h.clone(), device).expect("upload"))
        .collect();
    with_eager_mode(mode, || {
        let outputs = call(def.name, &tensors, &sample.attrs, None)?;
        outputs.iter().try_for_each(|t| t.to_host().map(drop))
    })?
}

/// `indices` with its last element replaced by `value`.
fn with_last(indices: &HostTensor, value: i64) -> HostTensor {
    let mut values = indices.to_i64();
    if let Some(last) = values.iter_mut().last() {
        *last = value;
    }
    HostTensor::int(indices.dtype(), values)
}

#[test]
fn debug_raises_on_each_declared_index_out_of_range_and_runs_the_rest() {
    tpu_eager::link();
    let registry = tpu_ops::registry().expect("registry");
    let mut checked: Vec<&str> = Vec::new();
    for def in registry.iter() {
        for sample in (def.samples)() {
            let types: Vec<_> = sample.inputs.iter().map(HostTensor::ty).collect();
            let bounds = (def.indices)(&types, &sample.attrs);
            if bounds.is_empty() {
                continue;
            }
            // The sample as generated is in range: it runs.
            for on in [On::Cpu, On::Tpu(EagerMode::Debug)] {
                run(on, def, &sample, &sample.inputs).unwrap_or_else(|e| {
                    panic!("{} sample {:?} on {on:?}: {e}", def.name, sample.attrs)
                });
            }
            for bound in bounds {
                let indices = &sample.inputs[bound.input];
                if indices.shape().numel() == 0 {
                    continue;
                }
                let past_end = i64::try_from(bound.size).unwrap();
                for bad in [past_end, -1] {
                    if bound.ignore == Some(bad) {
                        continue;
                    }
                    let mut inputs = sample.inputs.clone();
                    inputs[bound.input] = with_last(indices, bad);
                    for on in [On::Cpu, On::Tpu(EagerMode::Debug)] {
                        let err = run(on, def, &sample, &inputs)
                            .expect_err(&format!("{} on {on:?} with index {bad}", def.name));
                        assert_eq!(
                            err.op_error_kind(),
                            Some(OpErrorKind::OutOfRange),
                            "{} on {on:?}: {err}",
                            def.name
                        );
                        let text = err.to_string();
                        for part in [
                            format!("`{}`", def.name),
                            format!("index {bad}"),
                            format!("of size {}", bound.size),
                        ] {
                            assert!(
                                text.contains(&part),
                                "{} error lacks {part:?}: {text}",
                                def.name
                            );
                        }
                        assert!(matches!(err, Error::InvalidInput { .. }), "{err:?}");
                    }
                    // Strict does not read indices back: it runs.
                    run(On::Tpu(EagerMode::Strict), def, &sample, &inputs)
                        .unwrap_or_else(|e| panic!("{} under Strict: {e}", def.name));
                }
                if let Some(ignore) = bound.ignore {
                    let mut inputs = sample.inputs.clone();
                    inputs[bound.input] = with_last(indices, ignore);
                    for on in [On::Cpu, On::Tpu(EagerMode::Debug)] {
                        run(on, def, &sample, &inputs).unwrap_or_else(|e| {
                            panic!("{} on {on:?} ignoring {ignore}: {e}", def.name)
                        });
                    }
                }
                checked.push(def.name);
            }
        }
    }
    let missing: Vec<&&str> = INDEXED.iter().filter(|op| !checked.contains(op)).collect();
    assert!(
        missing.is_empty(),
        "no sample checked the indices of {missing:?}"
    );
}
