//! Under Strict an optimizer step runs as one program: counted through the
//! process-wide metrics, so this file holds this test alone.

use tpu_rs::Result;
use tpu_rs::nn::{Init, ParamStore};
use tpu_rs::optim::{AdamW, Optimizer, Sgd};
use tpu_rs::prelude::*;

#[test]
fn a_strict_step_over_many_parameters_is_one_program() -> Result<()> {
    let device = Device::tpu(0);
    let store = ParamStore::new(device, DType::F32, 0);
    let params: Vec<_> = (0..6)
        .map(|i| store.root().param(&format!("w{i}"), [3 + i], Init::Zeros))
        .collect::<Result<_>>()?;
    let mut opts: Vec<Box<dyn Optimizer>> = vec![
        Box::new(AdamW::new(params.clone(), 1e-2, 0.1)),
        Box::new(Sgd::new(params.clone(), 0.1, 0.9, 0.01)),
    ];
    tpu_rs::with_eager_mode(tpu_rs::EagerMode::Strict, || -> Result<()> {
        for opt in &mut opts {
            for _ in 0..2 {
                for p in &params {
                    let w = p.get();
                    (&w * &w)?.sum_all()?.backward()?;
                }
                // Backward's calls may still wait on their compiles.
                tpu_core::policy::sync()?;
                let before = tpu_core::metrics::metrics().executions;
                opt.step()?;
                let ran = tpu_core::metrics::metrics().executions - before;
                assert_eq!(ran, 1, "one program per step, not one per op and parameter");
                opt.zero_grad();
            }
        }
        Ok(())
    })
}
