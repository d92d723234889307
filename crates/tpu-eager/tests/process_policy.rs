//! A policy chosen for the whole process (what the PyTorch bridge does):
//! every thread outside its own scopes runs under it, scopes still win,
//! and switching runs the previous choice's pending work. Its own test
//! binary, since the choice is process-wide.

mod common;

use std::sync::Arc;

use common::*;
use tpu_core::Device;
use tpu_core::policy::{
    EagerMode, current_policy, current_policy_name, policy_name_from_env, process_policy,
    set_process_policy, shared_policy, with_eager_mode,
};

#[test]
fn a_process_wide_policy_spans_threads_and_yields_to_scopes() {
    tpu_eager::link();
    assert!(process_policy().is_none());
    let from_env = policy_name_from_env().unwrap();
    assert_eq!(current_policy_name().unwrap(), from_env);

    let fused = shared_policy("defer-and-fuse").unwrap();
    assert!(Arc::ptr_eq(
        &fused,
        &shared_policy("defer_and_fuse").unwrap()
    ));
    set_process_policy(fused.clone()).unwrap();

    // Another thread records into the same policy instance: its op waits
    // in the deferred graph until a value is needed.
    let x = ramp(&[4, 3], 0.5, Device::Tpu(0));
    let (sum, on_thread) = std::thread::spawn(move || {
        let on_thread = current_policy().unwrap();
        (op("add", &[&x, &x]), on_thread)
    })
    .join()
    .unwrap();
    assert!(Arc::ptr_eq(&on_thread, &fused));
    assert!(sum.is_pending());

    // A scope still chooses for its thread.
    let scoped = with_eager_mode(EagerMode::Strict, || current_policy_name().unwrap()).unwrap();
    assert_eq!(scoped, "strict");
    assert_eq!(current_policy_name().unwrap(), "defer_and_fuse");

    // Switching runs what the previous choice holds.
    set_process_policy(shared_policy("strict").unwrap()).unwrap();
    assert!(
        !sum.is_pending(),
        "the switch left the deferred add pending"
    );
    let expected: Vec<f64> = values(&ramp(&[4, 3], 0.5, Device::Cpu))
        .iter()
        .map(|v| 2.0 * v)
        .collect();
    assert_close(&values(&sum), &expected, 1e-6);
    assert_eq!(current_policy_name().unwrap(), "strict");
}
