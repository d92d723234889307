//! Generation builds its programs once: after a warm-up, more decode
//! steps add no programs. (Alone in its binary: the counters are
//! process-wide, and other tests would compile alongside it.)

use tpu_rs::Result;
use tpu_rs::models::{Gpt, GptConfig, Sampling};
use tpu_rs::nn::ParamStore;
use tpu_rs::prelude::*;

/// Programs built (compiled, or loaded from the disk cache) so far.
fn programs_built() -> u64 {
    let m = tpu_rs::metrics();
    m.compiles + m.disk_hits
}

#[test]
fn generation_reuses_its_programs_every_step() -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 5);
    let model = Gpt::new(&store, GptConfig::tiny())?;
    let prompt = Tensor::from_vec((0..8).collect::<Vec<i64>>(), [2, 4], Device::Tpu(0))?;
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        with_eager_mode(mode, || -> Result<()> {
            model
                .generate(&prompt, 3, Sampling::Greedy)?
                .to_vec::<i64>()?;
            let before = programs_built();
            let out = model.generate(&prompt, 12, Sampling::Greedy)?;
            assert_eq!(out.dims(), &[2, 16]);
            out.to_vec::<i64>()?;
            // Nine more decode steps than the warm-up: at most the final
            // concatenation (its piece count) and a cut in a new place.
            let built = programs_built() - before;
            assert!(
                built <= 2,
                "{mode:?}: {built} programs built for 9 more tokens"
            );
            Ok(())
        })?;
    }
    Ok(())
}
