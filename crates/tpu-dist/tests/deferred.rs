//! Collectives on values DeferAndFuse has not computed yet. When every
//! member device holds the same pending work, it and the collective run as
//! one program launched once over the devices; otherwise the pending
//! graphs run first and the collective on its own. Either way the cut is
//! counted as a collective's, once per device that had work pending.

use tpu_core::metrics::{CutReason, metrics};
use tpu_core::op::Attrs;
use tpu_core::policy::{EagerMode, call, with_eager_mode};
use tpu_core::{DType, HostTensor, Tensor};
use tpu_dist::{DeviceGroup, ReduceOp};

/// The metrics are process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn input(group: &DeviceGroup, r: usize) -> Tensor {
    let host = HostTensor::from_f64(DType::F32, vec![3], vec![r as f64 + 1.0; 3]).unwrap();
    Tensor::from_host(host, group.device(r)).unwrap()
}

fn square(x: &Tensor) -> Tensor {
    call("mul", &[x.clone(), x.clone()], &Attrs::new(), None)
        .unwrap()
        .remove(0)
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64().iter().copied().collect()
}

#[test]
fn the_same_pending_work_on_every_member_runs_with_the_collective_as_one_program() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tpu_eager::link();
    let group = DeviceGroup::new(vec![0, 1]).unwrap();
    with_eager_mode(EagerMode::DeferAndFuse, || {
        let inputs: Vec<Tensor> = (0..2).map(|r| input(&group, r)).collect();
        let squares: Vec<Tensor> = inputs.iter().map(square).collect();
        // Pending work of each member the collective does not read.
        let cubes: Vec<Tensor> = inputs
            .iter()
            .zip(&squares)
            .map(|(x, s)| {
                call("mul", &[x.clone(), s.clone()], &Attrs::new(), None)
                    .unwrap()
                    .remove(0)
            })
            .collect();
        assert!(squares.iter().chain(&cubes).all(Tensor::is_pending));
        let before = metrics();
        let sums = group.all_reduce(&squares, ReduceOp::Sum).unwrap();
        let after = metrics();
        assert_eq!(
            after.cuts(CutReason::Collective) - before.cuts(CutReason::Collective),
            2
        );
        assert_eq!(
            after.executions - before.executions,
            1,
            "one launch over both devices"
        );
        for s in &sums {
            assert_eq!(values(s), [5.0; 3]);
        }
        // The pending values the collective did not read were computed too.
        assert!(!cubes[1].is_pending());
        assert_eq!(values(&cubes[1]), [8.0; 3]);
        assert_eq!(values(&squares[0]), [1.0; 3]);
        // Nothing is pending now: a second collective cuts nothing.
        let before = metrics().cuts(CutReason::Collective);
        let maxima = group.all_reduce(&sums, ReduceOp::Max).unwrap();
        assert_eq!(values(&maxima[0]), [5.0; 3]);
        assert_eq!(metrics().cuts(CutReason::Collective), before);
    })
    .unwrap();
}

#[test]
fn different_pending_work_runs_first_then_the_collective() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tpu_eager::link();
    let group = DeviceGroup::new(vec![2, 3]).unwrap();
    with_eager_mode(EagerMode::DeferAndFuse, || {
        let a = square(&input(&group, 0));
        // The second member squares twice: its graph differs.
        let b = square(&square(&input(&group, 1)));
        let before = metrics();
        let sums = group.all_reduce(&[a, b], ReduceOp::Sum).unwrap();
        let after = metrics();
        assert_eq!(
            after.cuts(CutReason::Collective) - before.cuts(CutReason::Collective),
            2
        );
        assert_eq!(
            after.executions - before.executions,
            3,
            "two graphs, then the collective"
        );
        for s in &sums {
            assert_eq!(values(s), [17.0; 3]);
        }
    })
    .unwrap();
}
