//! The three policies against each other, against the host reference, and
//! the behaviour each promises: fusion, no recompiles for new values, cut
//! reasons, donation, error reporting, scoping.

mod common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tpu_core::op::Attrs;

use tpu_core::metrics::CutReason;
use tpu_core::policy::{
    EagerMode, ExecutionPolicy, OpCall, PolicyFactory, current_policy_name, policy_names,
    with_eager_mode, with_policy, with_policy_named,
};
use tpu_core::{Device, Error, Tensor};
use tpu_eager::{Debug, DebugChecks, Strict};

/// A random program: each step applies an op to earlier values.
#[derive(Clone, Debug)]
struct Step {
    op: usize,
    a: usize,
    b: usize,
}

const UNARY: [&str; 6] = ["tanh", "sigmoid", "sin", "neg", "relu", "cos"];
const BINARY: [&str; 4] = ["add", "sub", "mul", "maximum"];

fn run_program(steps: &[Step], device: Device) -> Vec<Vec<f64>> {
    let mut vals = vec![
        ramp(&[3, 5], 0.1, device),
        ramp(&[1, 5], 0.07, device),
        ramp(&[3, 1], -0.05, device),
    ];
    for s in steps {
        let a = vals[s.a % vals.len()].clone();
        let b = vals[s.b % vals.len()].clone();
        let out = match s.op % 12 {
            k if k < 6 => op(UNARY[k], &[&a]),
            k if k < 10 => op(BINARY[k - 6], &[&a, &b]),
            10 => op_with(
                "sum",
                &[&a],
                Attrs::new().with("dims", vec![-1i64]).with("keepdim", true),
            ),
            // Flattened, through an op, and back: Strict reads and writes
            // reshapes without programs of their own.
            _ => {
                let dims: Vec<i64> = a.shape().dims().iter().map(|&d| d as i64).collect();
                let flat = op_with("reshape", &[&a], Attrs::new().with("shape", vec![-1i64]));
                let y = op(UNARY[s.b % UNARY.len()], &[&flat]);
                op_with("reshape", &[&y], Attrs::new().with("shape", dims))
            }
        };
        vals.push(out);
    }
    vals.iter().map(values).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn policies_agree_with_each_other_and_the_reference(
        steps in proptest::collection::vec((0usize..12, 0usize..64, 0usize..64).prop_map(|(op, a, b)| Step { op, a, b }), 1..24)
    ) {
        let expected = run_program(&steps, Device::Cpu);
        for mode in MODES {
            let got = with_eager_mode(mode, || run_program(&steps, Device::Tpu(0))).unwrap();
            for (g, e) in got.iter().zip(&expected) {
                assert_close(g, e, 1e-4);
            }
        }
    }
}

#[test]
fn a_strict_reshape_runs_no_program_and_reads_back_in_its_own_shape() {
    let x = ramp(&[4, 6], 0.1, Device::Tpu(0));
    let expected = values(&x);
    with_eager_mode(EagerMode::Strict, || {
        let before = tpu_core::metrics::metrics().executions;
        let y = op_with("reshape", &[&x], Attrs::new().with("shape", vec![3i64, 8]));
        let z = op_with("reshape", &[&y], Attrs::new().with("shape", vec![2i64, -1]));
        assert_eq!(
            tpu_core::metrics::metrics().executions,
            before,
            "a reshape ran a program"
        );
        assert_eq!(z.shape().dims(), &[2, 12]);
        assert_eq!(values(&z), expected);
        // A consumer reshapes inside its own program.
        let doubled = op("add", &[&z, &z]);
        let twice: Vec<f64> = expected.iter().map(|v| 2.0 * v).collect();
        assert_close(&values(&doubled), &twice, 1e-6);
        // Asked for a buffer, it gets one of its own shape.
        let buffer = z.buffer().unwrap();
        assert_eq!(buffer.shape().dims(), &[2, 12]);
        assert_eq!(values(&z), expected);
    })
    .unwrap();
    // DeferAndFuse takes a reshape Strict made as an input.
    let y = with_eager_mode(EagerMode::Strict, || {
        op_with("reshape", &[&x], Attrs::new().with("shape", vec![24i64]))
    })
    .unwrap();
    let fused = with_eager_mode(EagerMode::DeferAndFuse, || values(&op("neg", &[&y]))).unwrap();
    let negated: Vec<f64> = expected.iter().map(|v| -v).collect();
    assert_close(&fused, &negated, 0.0);
}

#[test]
fn conformance_samples_pass_under_every_policy() {
    let registry = tpu_ops::registry().expect("registry");
    let mut failures = Vec::new();
    for op in registry.iter() {
        for sample in (op.samples)() {
            for mode in MODES {
                let run = |op: &tpu_core::op::OpDef, x: &[tpu_core::HostTensor], a: &Attrs| {
                    with_eager_mode(mode, || {
                        let inputs = x
                            .iter()
                            .map(|h| Tensor::from_host(h.clone(), Device::Tpu(0)))
                            .collect::<tpu_core::Result<Vec<_>>>()?;
                        let outs =
                            tpu_core::policy::call(op.name, &inputs, a, Some(Device::Tpu(0)))?;
                        outs.iter().map(Tensor::to_host).collect()
                    })?
                };
                if let Err(e) = tpu_ops::conformance::check_sample(op, &sample, run) {
                    failures.push(format!("[{mode}] {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// cut of its own.
#[test]
fn debug_names_the_op_and_the_call_site_of_non_finite_values() {
    let policy = Arc::new(Debug::new(DebugChecks {
        nan: true,
        parity: true,
    }));
    with_policy(policy, || {
        let x = tensor(&[2], vec![-1.0, 1.0], Device::Tpu(0));
        let ok = op("exp", &[&x]);
        assert_eq!(values(&ok).len(), 2);
        let inputs = vec![x.clone()];
        let err = tpu_core::policy::call("log", &inputs, &Attrs::new(), None).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::NonFinite { .. }), "{text}");
        assert!(
            text.contains("`log`") && text.contains("policies.rs"),
            "{text}"
        );
    });
}

#[test]
fn scopes_nest_and_are_per_thread() {
    with_eager_mode(EagerMode::DeferAndFuse, || {
        assert_eq!(current_policy_name().unwrap(), "defer_and_fuse");
        with_eager_mode(EagerMode::Debug, || {
            assert_eq!(current_policy_name().unwrap(), "debug")
        })
        .unwrap();
        assert_eq!(current_policy_name().unwrap(), "defer_and_fuse");
        let other = std::thread::spawn(|| current_policy_name().unwrap())
            .join()
            .unwrap();
        assert_eq!(other, EagerMode::from_env().unwrap().name());
    })
    .unwrap();
    assert!("fused".parse::<EagerMode>().is_err());
}

/// A policy from outside tpu-eager: Strict, counting the ops it runs.
struct Counting {
    strict: Strict,
    ops: AtomicUsize,
}

impl ExecutionPolicy for Counting {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn dispatch(&self, call: OpCall<'_>) -> tpu_core::Result<Vec<Tensor>> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.strict.dispatch(call)
    }
    fn materialize(&self, tensor: &Tensor) -> tpu_core::Result<()> {
        self.strict.materialize(tensor)
    }
    fn flush(&self, reason: CutReason) -> tpu_core::Result<()> {
        self.strict.flush(reason)
    }
}

static COUNTING: std::sync::OnceLock<Arc<Counting>> = std::sync::OnceLock::new();

inventory::submit! {
    PolicyFactory {
        name: "counting",
        create: || {
            let shared = COUNTING.get_or_init(|| {
                Arc::new(Counting { strict: Strict::new(), ops: AtomicUsize::new(0) })
            });
            Ok(shared.clone() as Arc<dyn ExecutionPolicy>)
        },
    }
}

#[test]
fn a_policy_registered_by_name_is_selected_by_name() {
    assert!(policy_names().contains(&"counting"), "{:?}", policy_names());
    let x = ramp(&[4], 0.5, Device::Tpu(0));
    let y = with_policy_named("counting", || {
        assert_eq!(current_policy_name().unwrap(), "counting");
        op("exp", &[&op("neg", &[&x])])
    })
    .unwrap();
    assert!(COUNTING.get().unwrap().ops.load(Ordering::Relaxed) >= 2);
    let expected: Vec<f64> = values(&x).iter().map(|v| (-v).exp()).collect();
    for (a, b) in values(&y).iter().zip(&expected) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
    }
    let err = with_policy_named("nonesuch", || ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nonesuch") && err.contains("counting") && err.contains("strict"),
        "{err}"
    );
}

#[test]
fn mixing_devices_is_a_typed_error() {
    let a = ramp(&[3], 1.0, Device::Tpu(0));
    let b = ramp(&[3], 1.0, Device::Cpu);
    let err = tpu_core::policy::call("add", &[a, b], &Attrs::new(), None).unwrap_err();
    assert!(err.to_string().contains("different devices"), "{err}");
}

/// A deliberately wrong kernel: its device lowering computes `3x` while its
/// reference says `2x`, so Debug's parity check must catch it.
fn wrong_lowering(
    b: &mut tpu_core::stablehlo::Builder,
    x: &[tpu_core::stablehlo::Value],
    _: &Attrs,
) -> tpu_core::op::OpResult<Vec<tpu_core::stablehlo::Value>> {
    let three = b.constant(x[0].dtype(), x[0].dims(), 3.0);
    Ok(vec![b.binary("stablehlo.multiply", &x[0], &three)])
}

/// A kernel whose lowering always fails, to see where DeferAndFuse reports it.
fn failing_lowering(
    _: &mut tpu_core::stablehlo::Builder,
    _: &[tpu_core::stablehlo::Value],
    _: &Attrs,
) -> tpu_core::op::OpResult<Vec<tpu_core::stablehlo::Value>> {
    Err("this kernel cannot be lowered".into())
}

macro_rules! test_op {
    ($name:literal, $lower:expr) => {
        inventory::submit! {
            tpu_core::op::OpDef {
                name: $name,
                arity: tpu_core::op::Arity::Exactly(1),
                flags: tpu_core::op::Flags::ELEMENTWISE,
                dtypes: &[tpu_core::DType::F32],
                infer: |x, _| Ok(x.to_vec()),
                lower: $lower,
                reference: |x, _| Ok(vec![tpu_core::HostTensor::float(x[0].dtype(), x[0].to_f64() * 2.0)]),
                vjp: None,
                indices: |_, _| Vec::new(),
                tolerance: tpu_core::host::Tolerance::for_dtype,
                samples: Vec::new,
                arbitrary: |_| tpu_core::op::Sample::new(vec![], Attrs::new()),
                torch: tpu_core::op::Torch::Unmatched("a deliberately wrong test kernel"),
                location: concat!(file!(), ":", line!()),
            }
        }
    };
}

test_op!("test_wrong_double", wrong_lowering);
test_op!("test_unlowerable", failing_lowering);
test_op!("test_uncompilable", uncompilable_lowering);

/// A kernel whose program lowers but does not compile: it adds operands of
/// different shapes.
fn uncompilable_lowering(
    b: &mut tpu_core::stablehlo::Builder,
    x: &[tpu_core::stablehlo::Value],
    _: &Attrs,
) -> tpu_core::op::OpResult<Vec<tpu_core::stablehlo::Value>> {
    let scalar = b.constant(x[0].dtype(), [7], 1.0);
    Ok(vec![b.binary("stablehlo.add", &x[0], &scalar)])
}

/// A width no earlier run compiled programs for (the disk cache keeps
/// them across runs).
fn fresh_width() -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize);
    1000 + nanos % 100_000
}

#[test]
fn strict_queues_calls_while_their_programs_compile_and_reads_wait_for_them() {
    let n = fresh_width();
    let run = |x: &Tensor, returned_pending: &mut usize| {
        let mut y = x.clone();
        for name in ["tanh", "sin", "neg", "cos", "sigmoid", "relu"] {
            y = op(name, &[&y]);
            let flat = op_with("reshape", &[&y], Attrs::new().with("shape", vec![-1i64]));
            let doubled = op("add", &[&flat, &flat]);
            y = op_with(
                "reshape",
                &[&doubled],
                Attrs::new().with("shape", vec![2i64, -1]),
            );
            *returned_pending += usize::from(y.is_pending());
        }
        y
    };
    let mut pending = 0;
    let expected = values(&run(&ramp(&[2, n], 0.01, Device::Cpu), &mut pending));
    let x = ramp(&[2, n], 0.01, Device::Tpu(0));
    let got = with_eager_mode(EagerMode::Strict, || {
        let y = run(&x, &mut pending);
        values(&y)
    })
    .unwrap();
    assert!(
        pending > 0,
        "every call waited for its program: none was queued"
    );
    assert_close(&got, &expected, 1e-6);
}

#[test]
fn defer_and_fuse_records_the_next_graph_while_the_previous_one_compiles() {
    let n = fresh_width();
    // Forty ops: a program that takes a while to build.
    let layer = |x: &Tensor| {
        let mut y = x.clone();
        for name in ["tanh", "sin", "cos", "sigmoid"].iter().cycle().take(20) {
            let z = op(name, &[&y]);
            y = op("add", &[&z, &y]);
        }
        y
    };
    let mut cpu = ramp(&[2, n], 0.01, Device::Cpu);
    let mut expected = Vec::new();
    for _ in 0..3 {
        cpu = layer(&cpu);
        expected.push(values(&cpu));
    }
    let x = ramp(&[2, n], 0.01, Device::Tpu(0));
    let (got, recorded_behind) = with_eager_mode(EagerMode::DeferAndFuse, || {
        let policy = tpu_core::policy::current_policy().unwrap();
        let mut outs = Vec::new();
        let mut recorded_behind = 0;
        let mut y = x.clone();
        for _ in 0..3 {
            y = layer(&y);
            // Recorded on the previous graph's output while that graph's
            // program was still compiling.
            recorded_behind += usize::from(outs.last().is_some_and(Tensor::is_pending));
            policy.start(CutReason::Sync).unwrap();
            outs.push(y.clone());
        }
        (outs.iter().map(values).collect::<Vec<_>>(), recorded_behind)
    })
    .unwrap();
    assert!(
        recorded_behind > 0,
        "every graph waited for the one before it to compile"
    );
    for (g, e) in got.iter().zip(&expected) {
        assert_close(g, e, 1e-5);
    }
}

#[test]
fn a_queued_program_that_fails_to_compile_raises_at_the_read_naming_the_op() {
    let x = ramp(&[3, fresh_width()], 0.1, Device::Tpu(0));
    with_eager_mode(EagerMode::Strict, || {
        let inputs = [x.clone()];
        let y = tpu_core::policy::call("test_uncompilable", &inputs, &Attrs::new(), None);
        // Queued (or failed at once, had the compile been quick).
        let read = y.and_then(|y| op("neg", &[&y[0]]).to_host());
        let err = read.expect_err("an uncompilable program").to_string();
        assert!(err.contains("test_uncompilable"), "{err}");
        // The policy still runs other calls.
        assert_close(
            &values(&op("neg", &[&x])),
            &values(&x).iter().map(|v| -v).collect::<Vec<_>>(),
            0.0,
        );
    })
    .unwrap();
    // Debug raises it at the call.
    let err = with_eager_mode(EagerMode::Debug, || {
        tpu_core::policy::call(
            "test_uncompilable",
            std::slice::from_ref(&x),
            &Attrs::new(),
            None,
        )
        .map(|_| ())
    })
    .unwrap()
    .expect_err("Debug compiles before returning")
    .to_string();
    assert!(err.contains("test_uncompilable"), "{err}");
}

#[test]
fn debug_parity_names_the_first_diverging_op() {
    let policy = Arc::new(Debug::new(DebugChecks {
        nan: false,
        parity: true,
    }));
    with_policy(policy, || {
        let x = tensor(&[3], vec![1.0, 2.0, 3.0], Device::Tpu(0));
        let y = op("exp", &[&x]);
        let err =
            tpu_core::policy::call("test_wrong_double", &[y], &Attrs::new(), None).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Divergence { .. }), "{text}");
        assert!(
            text.contains("test_wrong_double") && text.contains("policies.rs"),
            "{text}"
        );
    });
}

#[test]
fn deferred_errors_surface_at_the_cut_naming_the_users_op() {
    with_eager_mode(EagerMode::DeferAndFuse, || {
        let x = tensor(&[3], vec![1.0, 2.0, 3.0], Device::Tpu(0));
        let y = op("exp", &[&x]);
        let z = op("test_unlowerable", &[&y]); // recorded: nothing runs yet
        let err = z.to_host().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::OpFailed { .. }), "{text}");
        assert!(
            text.contains("test_unlowerable")
                && text.contains("policies.rs")
                && text.contains("cannot be lowered"),
            "{text}"
        );
    })
    .unwrap();
}

#[test]
fn an_op_called_by_interned_name_or_id_equals_the_call_by_name() {
    use tpu_core::policy::{call, call_op};
    let x = ramp(&[2, 3], 0.5, Device::Tpu(0));
    let attrs = Attrs::new();
    let device = Some(Device::Tpu(0));
    let by_name = call("mul", &[x.clone(), x.clone()], &attrs, device).unwrap();
    let interned = tpu_core::op!("mul");
    let by_interned = call_op(interned, &[x.clone(), x.clone()], &attrs, device).unwrap();
    let id = tpu_core::op::registry().unwrap().id("mul").unwrap();
    let by_id = call_op(&id, &[x.clone(), x.clone()], &attrs, device).unwrap();
    assert_eq!(values(&by_interned[0]), values(&by_name[0]));
    assert_eq!(values(&by_id[0]), values(&by_name[0]));
    // An unknown interned name fails as the name does, listing the ops.
    let unknown = call_op(
        tpu_core::op!("no_such_op"),
        std::slice::from_ref(&x),
        &attrs,
        device,
    )
    .unwrap_err()
    .to_string();
    let named = call("no_such_op", &[x], &attrs, device)
        .unwrap_err()
        .to_string();
    assert_eq!(unknown, named);
    assert!(
        unknown.contains("no_such_op") && unknown.contains("mul"),
        "{unknown}"
    );
}
