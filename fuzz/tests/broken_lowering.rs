//! The `op_call` target catches a wrong lowering: this test binary
//! registers an op whose StableHLO triples its input where its reference
//! doubles it, and the target must fail on it within the fuzz budget the
//! test suite gives each target.

use std::path::PathBuf;
use std::time::Duration;

use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::op::{Arity, Attrs, Flags, Gen, OpDef, OpResult, Sample};
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_rs_fuzz::{op_call, runner};

const NAME: &str = "fuzz_test_wrong_double";

fn infer(inputs: &[TensorType], _: &Attrs) -> OpResult<Vec<TensorType>> {
    match inputs {
        [x] if x.dtype == DType::F32 => Ok(vec![x.clone()]),
        _ => Err("takes one f32 tensor".into()),
    }
}

/// Deliberately wrong: `3 x` where the reference says `2 x`.
fn lower(b: &mut Builder, x: &[Value], _: &Attrs) -> OpResult<Vec<Value>> {
    let three = b.constant(x[0].dtype(), x[0].dims(), 3.0);
    Ok(vec![b.binary("stablehlo.multiply", &x[0], &three)])
}

fn reference(x: &[HostTensor], _: &Attrs) -> OpResult<Vec<HostTensor>> {
    let doubled: Vec<f64> = x[0].to_f64().iter().map(|v| 2.0 * v).collect();
    let out = HostTensor::from_f64(DType::F32, x[0].dims().to_vec(), doubled);
    Ok(vec![out.ok_or("a tensor of the input's shape")?])
}

fn arbitrary(g: &mut Gen) -> Sample {
    let shape = g.shape_nonempty(1, 3);
    Sample::new(
        vec![g.tensor_in(DType::F32, &shape, 1.0, 2.0)],
        Attrs::new(),
    )
}

inventory::submit! {
    OpDef {
        name: NAME,
        arity: Arity::Exactly(1),
        flags: Flags::ELEMENTWISE,
        dtypes: &[DType::F32],
        infer,
        lower,
        reference,
        arbitrary,
        location: concat!(file!(), ":", line!()),
        ..OpDef::DEFAULT
    }
}

#[test]
fn a_wrong_lowering_fails_the_op_call_target() {
    let corpus = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wrong-lowering-corpus");
    std::fs::create_dir_all(&corpus).unwrap();
    let mut seed = NAME.as_bytes().to_vec();
    seed.push(0);
    seed.extend_from_slice(&[7; 32]);
    std::fs::write(corpus.join("seed"), seed).unwrap();
    let failure = runner::run(
        "op_call_wrong_lowering",
        op_call,
        &corpus,
        Duration::from_secs(10),
        1,
    )
    .expect_err("the op_call target passed an op whose lowering is wrong");
    assert!(
        failure.message.contains(NAME) && failure.message.contains("not the reference"),
        "{}",
        failure.message
    );
}
