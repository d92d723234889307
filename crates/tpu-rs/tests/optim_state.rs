//! Resuming training: parameters and optimizer state saved part way,
//! loaded into a fresh model and optimizer, continue exactly as the run
//! that never stopped.

use tpu_rs::nn::{Linear, Module, ParamStore, mse};
use tpu_rs::optim::{AdamW, Optimizer, RmsProp, Sgd};
use tpu_rs::prelude::*;
use tpu_rs::{Result, checkpoint};

struct Run {
    store: ParamStore,
    layers: [Linear; 2],
    opt: Box<dyn Optimizer>,
}

/// The optimizers resumed: AdamW, SGD with momentum, RMSprop.
const KINDS: [&str; 3] = ["adamw", "sgd", "rmsprop"];

fn run(kind: &str) -> Result<Run> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 3);
    let layers = [
        Linear::new(&store.root().sub("0"), 4, 8, true)?,
        Linear::new(&store.root().sub("1"), 8, 1, true)?,
    ];
    let opt: Box<dyn Optimizer> = match kind {
        "adamw" => Box::new(AdamW::new(store.parameters(), 1e-2, 0.01)),
        "sgd" => Box::new(Sgd::new(store.parameters(), 1e-2, 0.9, 0.0)),
        _ => Box::new(RmsProp::new(store.parameters(), 1e-3, 0.0)),
    };
    Ok(Run { store, layers, opt })
}

fn step(r: &mut Run, k: usize) -> Result<f64> {
    let x = Tensor::arange(0.0, 24.0, 1.0, DType::F32, Device::Tpu(0))?
        .reshape([6, 4])?
        .scale(0.05 * (1.0 + k as f64))?;
    let y = x.sum([1], true)?.sin()?;
    let h = r.layers[0].forward(&x)?.tanh()?;
    let loss = mse(&r.layers[1].forward(&h)?, &y)?;
    r.opt.zero_grad();
    loss.backward()?;
    r.opt.step()?;
    loss.item()
}

fn parameters(r: &Run) -> Result<Vec<Vec<f64>>> {
    r.store
        .parameters()
        .iter()
        .map(|p| p.get().to_f64_vec())
        .collect()
}

#[test]
fn a_run_resumed_from_its_checkpoint_equals_the_uninterrupted_one() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("tpu-rs-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        for kind in KINDS {
            with_eager_mode(mode, || {
                let mut whole = run(kind)?;
                let losses: Vec<f64> =
                    (0..6).map(|k| step(&mut whole, k)).collect::<Result<_>>()?;

                let mut first = run(kind)?;
                for k in 0..3 {
                    step(&mut first, k)?;
                }
                checkpoint::save(&first.store, dir.join("model.safetensors"))?;
                checkpoint::save_optimizer(first.opt.as_ref(), dir.join("optim.safetensors"))?;
                let state: Vec<String> = first.opt.state()?.into_iter().map(|(n, _)| n).collect();
                let expected = match kind {
                    "adamw" => "state.0.exp_avg_sq",
                    "sgd" => "state.0.momentum_buffer",
                    _ => "state.0.square_avg",
                };
                assert!(state.iter().any(|n| n == expected), "{state:?}");

                let mut resumed = run(kind)?;
                checkpoint::load(&resumed.store, dir.join("model.safetensors"))?;
                checkpoint::load_optimizer(resumed.opt.as_mut(), dir.join("optim.safetensors"))?;
                let rest: Vec<f64> = (3..6)
                    .map(|k| step(&mut resumed, k))
                    .collect::<Result<_>>()?;
                assert_eq!(rest, losses[3..], "{mode:?} {kind}: losses");
                assert_eq!(
                    parameters(&resumed)?,
                    parameters(&whole)?,
                    "{mode:?} {kind}"
                );
                Ok(())
            })?;
        }
    }
    // A state file for another optimizer is refused, naming what it has.
    let mut rms = run("rmsprop")?;
    let err = checkpoint::load_optimizer(rms.opt.as_mut(), dir.join("optim.safetensors"));
    assert!(err.is_ok(), "an RMSprop state loads into RMSprop");
    let mut adam = run("adamw")?;
    let err = checkpoint::load_optimizer(adam.opt.as_mut(), dir.join("optim.safetensors"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("square_avg"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
