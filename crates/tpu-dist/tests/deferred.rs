//! Collectives on values DeferAndFuse has not computed yet: the pending
//! graphs of the member devices run first, and the cut is counted as a
//! collective's, once per device that had work pending.

use tpu_core::metrics::{CutReason, metrics};
use tpu_core::op::Attrs;
use tpu_core::policy::{EagerMode, call, with_eager_mode};
use tpu_core::{DType, HostTensor, Tensor};
use tpu_dist::{DeviceGroup, ReduceOp};

#[test]
fn a_collective_runs_the_pending_graphs_of_its_members_and_counts_the_cut() {
    tpu_eager::link();
    let group = DeviceGroup::new(vec![0, 1]).unwrap();
    with_eager_mode(EagerMode::DeferAndFuse, || {
        let xs: Vec<Tensor> = (0..2)
            .map(|r| {
                let host =
                    HostTensor::from_f64(DType::F32, vec![3], vec![r as f64 + 1.0; 3]).unwrap();
                let x = Tensor::from_host(host, group.device(r)).unwrap();
                // x * x, deferred.
                call("mul", &[x.clone(), x], &Attrs::new(), None)
                    .unwrap()
                    .remove(0)
            })
            .collect();
        assert!(xs.iter().all(Tensor::is_pending));
        let before = metrics().cuts(CutReason::Collective);
        let sums = group.all_reduce(&xs, ReduceOp::Sum).unwrap();
        assert_eq!(metrics().cuts(CutReason::Collective) - before, 2);
        for s in &sums {
            assert_eq!(
                s.to_host()
                    .unwrap()
                    .to_f64()
                    .iter()
                    .copied()
                    .collect::<Vec<_>>(),
                [5.0; 3]
            );
        }
        // Nothing is pending now: a second collective cuts nothing.
        let before = metrics().cuts(CutReason::Collective);
        group.all_reduce(&sums, ReduceOp::Max).unwrap();
        assert_eq!(metrics().cuts(CutReason::Collective), before);
    })
    .unwrap();
}
