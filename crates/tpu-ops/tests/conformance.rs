//! One suite for every registered op: its samples plus generated cases, on
//! `tpu` (the PJRT plugin TPU_RS_PLUGIN selects) against its reference, and
//! its backward rule against finite differences. No per-op lists.

use std::sync::Mutex;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tpu_core::op::{Flags, Gen, OpDef, check_inputs, single_op_program};
use tpu_ops::conformance::{
    VjpCheck, cases, check_sample, check_vjp, looks_differentiable, run_on_tpu, selected_ops,
};

/// Generated cases per op (`TPU_RS_CONFORMANCE_CASES`, default 12).
fn random_cases() -> u32 {
    std::env::var("TPU_RS_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

/// The ops under test: all, or those `TPU_RS_OPS` names.
fn ops() -> Vec<&'static OpDef> {
    selected_ops().unwrap_or_else(|e| panic!("TPU_RS_OPS: {e}"))
}

/// Runs `check` on each op in parallel threads and reports every failure.
fn for_each_op(check: impl Fn(&'static OpDef) -> Vec<String> + Sync) {
    let ops = ops();
    let failures = Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(op) = ops.get(i) else { break };
                    let found = check(op);
                    failures
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(found);
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn registered_names_match_the_checked_in_list() {
    let listed: Vec<&str> = include_str!("ops.txt")
        .lines()
        .filter(|l| !l.is_empty())
        .collect();
    let registered = tpu_ops::registry().expect("registry").names();
    assert_eq!(
        registered, listed,
        "update crates/tpu-ops/tests/ops.txt with the registered names"
    );
}

#[test]
fn every_op_matches_its_reference_on_tpu() {
    tpu_eager::link(); // the device runs go through the Strict policy
    for_each_op(|op| {
        let mut failures = Vec::new();
        for sample in (op.samples)() {
            if let Err(e) = check_sample(op, &sample, |op, x, a| run_on_tpu(0, op, x, a)) {
                failures.push(e.message);
            }
        }
        let mut runner = TestRunner::new(Config {
            cases: random_cases(),
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&any::<u64>(), |seed| {
            let sample = (op.arbitrary)(&mut Gen::new(seed));
            check_sample(op, &sample, |op, x, a| run_on_tpu(0, op, x, a))
                .map_err(|e| TestCaseError::fail(e.message))
        });
        if let Err(e) = result {
            failures.push(e.to_string());
        }
        failures
    });
}

#[test]
fn every_backward_rule_matches_finite_differences() {
    // Every op with a rule must have it checked on some case; the cases
    // that could not be checked are counted and printed by reason.
    let unchecked = Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    let checked_ops = std::sync::atomic::AtomicUsize::new(0);
    for_each_op(|op| {
        let mut failures = Vec::new();
        let mut checked = 0;
        for (i, sample) in cases(op, random_cases() as usize, 0x9ad).iter().enumerate() {
            match check_vjp(op, sample, i as u64) {
                Ok(VjpCheck::Checked) => checked += 1,
                Ok(VjpCheck::Unchecked(why)) if op.vjp.is_some() => {
                    *unchecked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .entry(format!("{}: {why}", op.name))
                        .or_default() += 1;
                }
                Ok(VjpCheck::Unchecked(_)) => {}
                Err(e) => failures.push(e.message),
            }
        }
        if checked > 0 {
            checked_ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else if op.vjp.is_some() {
            failures.push(format!(
                "{}: backward rule, but no case could check it",
                op.name
            ));
        }
        failures
    });
    let with_rule = ops().iter().filter(|op| op.vjp.is_some()).count();
    let checked = checked_ops.into_inner();
    println!("backward rules checked against finite differences: {checked} of {with_rule} ops");
    for (what, n) in unchecked.into_inner().unwrap_or_else(|e| e.into_inner()) {
        println!("  unchecked: {what} ({n} cases)");
    }
    assert_eq!(checked, with_rule, "every backward rule is checked");
}

#[test]
fn float_ops_without_a_backward_rule_say_so() {
    for_each_op(|op| {
        let needs = op.vjp.is_none()
            && !op.flags.contains(Flags::NOT_DIFFERENTIABLE)
            && cases(op, 4, 1).iter().any(|s| looks_differentiable(op, s));
        if needs {
            vec![format!(
                "{}: float in, float out, but no backward rule and no NOT_DIFFERENTIABLE flag",
                op.name
            )]
        } else {
            vec![]
        }
    });
}

#[test]
fn mutated_inputs_give_errors_or_consistent_results_never_panics() {
    // Take valid samples, then change one input's shape or dtype: inference
    // must answer Ok or a typed error; when it accepts, the reference and the
    // lowering must produce exactly the inferred types.
    for_each_op(|op| {
        let mut failures = Vec::new();
        let mut runner = TestRunner::new(Config {
            cases: 24,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&any::<u64>(), |seed| {
            let mut g = Gen::new(seed);
            let mut sample = (op.arbitrary)(&mut g);
            if !sample.inputs.is_empty() {
                let i = g.below(sample.inputs.len());
                let x = &sample.inputs[i];
                let (dtype, shape) = if g.bool() {
                    (g.pick(&tpu_core::DType::ALL), x.shape())
                } else {
                    (x.dtype(), g.shape(0, 4))
                };
                sample.inputs[i] = g.tensor(dtype, &shape);
            }
            let types: Vec<_> = sample.inputs.iter().map(|x| x.ty()).collect();
            let outcome = std::panic::catch_unwind(|| {
                if check_inputs(op, &types, &sample.attrs, "tpu:0").is_ok() {
                    tpu_core::op::run_reference(op, &sample.inputs, &sample.attrs)
                        .map_err(|e| e.to_string())?;
                    single_op_program(op, &types, &sample.attrs).map_err(|e| e.to_string())?;
                }
                Ok::<(), String>(())
            });
            match outcome {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(TestCaseError::fail(format!(
                    "accepted but inconsistent: {e}"
                ))),
                Err(_) => Err(TestCaseError::fail(format!(
                    "panicked on {types:?} {}",
                    sample.attrs
                ))),
            }
        });
        if let Err(e) = result {
            failures.push(format!("{}: {e}", op.name));
        }
        failures
    });
}
