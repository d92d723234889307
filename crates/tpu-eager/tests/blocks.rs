//! Recorded blocks: the same values as the calls run one by one in every
//! mode, DeferAndFuse takes a block into its pending graph at once (one
//! program with the work around it), and bad blocks or inputs are errors.

mod common;

use std::sync::Mutex;

use common::*;
use tpu_core::block::{Block, BlockCall, BlockSrc};
use tpu_core::metrics::metrics;
use tpu_core::op::{Attrs, check_inputs, registry};
use tpu_core::policy::{EagerMode, current_policy, with_eager_mode, with_policy};
use tpu_core::profile::CallSite;
use tpu_core::stablehlo::TensorType;
use tpu_core::{Device, Error, Tensor};
use tpu_eager::{DeferAndFuse, DeferConfig};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A call of `name` on `inputs` whose types are `types` (for inference).
fn block_call(name: &str, inputs: Vec<BlockSrc>, types: &[&TensorType], attrs: Attrs) -> BlockCall {
    let registry = registry().unwrap();
    let id = registry.id(name).unwrap();
    let op = registry.op(id);
    let types: Vec<TensorType> = types.iter().map(|t| (*t).clone()).collect();
    let outputs = check_inputs(op, &types, &attrs, "tpu:0").unwrap();
    BlockCall {
        op,
        id,
        attrs: std::sync::Arc::new(attrs),
        inputs,
        outputs,
    }
}

/// `y = tanh(x) * s + x`, returning `[y, tanh(x)]`, over `x` and scalar `s`.
fn tanh_block(x: &TensorType, s: &TensorType) -> Block {
    use BlockSrc::{Input, Output};
    let calls = vec![
        block_call("tanh", vec![Input(0)], &[x], Attrs::new()),
        block_call("mul", vec![Output(0, 0), Input(1)], &[x, s], Attrs::new()),
        block_call("add", vec![Output(1, 0), Input(0)], &[x, x], Attrs::new()),
    ];
    Block::new(vec![x.clone(), s.clone()], calls, vec![(2, 0), (0, 0)]).unwrap()
}

fn run(block: &Block, inputs: &[Tensor]) -> tpu_core::Result<Vec<Tensor>> {
    tpu_eager::link();
    current_policy()?.dispatch_block(block, inputs, 0, CallSite::new(file!(), line!()))
}

fn expected(x: &Tensor, s: &Tensor) -> (Vec<f64>, Vec<f64>) {
    with_eager_mode(EagerMode::Strict, || {
        let t = op("tanh", &[x]);
        let y = op("add", &[&op("mul", &[&t, s]), x]);
        (values(&y), values(&t))
    })
    .unwrap()
}

#[test]
fn a_block_gives_the_values_of_its_calls_in_every_mode() {
    let _serial = serial();
    let x = ramp(&[3, 5], 0.3, Device::Tpu(0));
    let s = tensor(&[], vec![0.5], Device::Tpu(0));
    let block = tanh_block(x.ty(), s.ty());
    let (y, t) = expected(&x, &s);
    for mode in MODES {
        let out = with_eager_mode(mode, || run(&block, &[x.clone(), s.clone()]).unwrap()).unwrap();
        assert_eq!(out.len(), 2, "{mode}");
        assert_close(&values(&out[0]), &y, 1e-6);
        assert_close(&values(&out[1]), &t, 1e-6);
    }
}

#[test]
fn defer_and_fuse_runs_a_block_and_the_work_around_it_as_one_program() {
    let _serial = serial();
    let policy = DeferAndFuse::new(DeferConfig::default());
    let x0 = ramp(&[4, 6], 0.1, Device::Tpu(0));
    let s = tensor(&[], vec![0.25], Device::Tpu(0));
    let block = tanh_block(x0.ty(), s.ty());
    let step = |x0: &Tensor| {
        // Pending work feeds the block; more work reads its output.
        let x = op("mul", &[x0, x0]);
        let out = run(&block, &[x.clone(), s.clone()]).unwrap();
        values(&op("sub", &[&out[0], &out[1]]))
    };
    with_policy(policy.clone(), || {
        let _ = step(&x0); // compiles
        let before = metrics();
        let got = step(&ramp(&[4, 6], -0.2, Device::Tpu(0)));
        let after = metrics();
        assert_eq!(after.executions - before.executions, 1, "one program");
        assert_eq!(after.compiles, before.compiles, "the program is reused");
        assert_eq!(policy.pending_ops(0), 0);
        let x = with_eager_mode(EagerMode::Strict, || {
            let x0 = ramp(&[4, 6], -0.2, Device::Tpu(0));
            op("mul", &[&x0, &x0])
        })
        .unwrap();
        let (y, t) = expected(&x, &s);
        let want: Vec<f64> = y.iter().zip(&t).map(|(a, b)| a - b).collect();
        assert_close(&got, &want, 1e-6);
    });
}

#[test]
fn a_block_longer_than_the_op_cap_runs_call_by_call() {
    let _serial = serial();
    let policy = DeferAndFuse::new(DeferConfig {
        max_ops: 2,
        ..DeferConfig::default()
    });
    let x = ramp(&[7], 0.2, Device::Tpu(0));
    let s = tensor(&[], vec![2.0], Device::Tpu(0));
    let block = tanh_block(x.ty(), s.ty());
    let (y, _) = expected(&x, &s);
    let out = with_policy(policy.clone(), || {
        run(&block, &[x.clone(), s.clone()]).unwrap()
    });
    assert!(policy.pending_ops(0) < 2);
    assert_close(&values(&out[0]), &y, 1e-6);
}

#[test]
fn inputs_of_other_types_are_an_error_naming_them() {
    let _serial = serial();
    let x = ramp(&[3, 5], 0.3, Device::Tpu(0));
    let s = tensor(&[], vec![0.5], Device::Tpu(0));
    let block = tanh_block(x.ty(), s.ty());
    let wrong = ramp(&[3, 6], 0.3, Device::Tpu(0));
    for mode in MODES {
        let err = with_eager_mode(mode, || {
            run(&block, &[wrong.clone(), s.clone()]).unwrap_err()
        })
        .unwrap();
        assert!(matches!(err, Error::InvalidInput { .. }), "{mode}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("f32[3, 5]") && text.contains("f32[3, 6]") && text.contains("tpu:0"),
            "{text}"
        );
        let short =
            with_eager_mode(mode, || run(&block, std::slice::from_ref(&x)).unwrap_err()).unwrap();
        assert!(
            matches!(short, Error::InvalidInput { .. }),
            "{mode}: {short}"
        );
    }
}

#[test]
fn a_block_that_reads_a_later_value_or_returns_one_twice_is_refused() {
    let x = ramp(&[2], 1.0, Device::Tpu(0));
    let ty = x.ty();
    let forward = Block::new(
        vec![ty.clone()],
        vec![block_call(
            "tanh",
            vec![BlockSrc::Output(0, 0)],
            &[ty],
            Attrs::new(),
        )],
        vec![(0, 0)],
    );
    assert!(matches!(forward, Err(Error::InvalidInput { .. })));
    let twice = Block::new(
        vec![ty.clone()],
        vec![block_call(
            "tanh",
            vec![BlockSrc::Input(0)],
            &[ty],
            Attrs::new(),
        )],
        vec![(0, 0), (0, 0)],
    );
    assert!(matches!(twice, Err(Error::InvalidInput { .. })));
    let missing = Block::new(
        vec![ty.clone()],
        vec![block_call(
            "tanh",
            vec![BlockSrc::Input(1)],
            &[ty],
            Attrs::new(),
        )],
        vec![(0, 0)],
    );
    assert!(matches!(missing, Err(Error::InvalidInput { .. })));
}

#[test]
fn an_empty_block_gives_nothing_in_every_mode() {
    let _serial = serial();
    let x = ramp(&[2], 1.0, Device::Tpu(0));
    let block = Block::new(vec![x.ty().clone()], vec![], vec![]).unwrap();
    for mode in MODES {
        let out = with_eager_mode(mode, || run(&block, std::slice::from_ref(&x)).unwrap()).unwrap();
        assert!(out.is_empty(), "{mode}");
    }
}
