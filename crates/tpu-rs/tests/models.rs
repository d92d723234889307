//! The GPT model on `tpu` against the same model on `cpu`, against PyTorch,
//! and training under each eager mode; checkpoints round-trip.

mod torch;

use tpu_rs::checkpoint;
use tpu_rs::models::{Gpt, GptConfig, Sampling};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

const CONFIG: GptConfig = GptConfig {
    vocab_size: 64,
    block_size: 16,
    n_layer: 2,
    n_head: 4,
    n_embd: 32,
};

fn tokens(device: Device) -> Result<(Tensor, Tensor)> {
    let x: Vec<i64> = (0..2 * 16).map(|i| (i * 7 + 3) % 64).collect();
    let y: Vec<i64> = (0..2 * 16).map(|i| (i * 7 + 10) % 64).collect();
    Ok((
        Tensor::from_vec(x, [2, 16], device)?,
        Tensor::from_vec(y, [2, 16], device)?,
    ))
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tpu-rs-{name}-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

#[test]
fn gpt_on_tpu_matches_gpt_on_cpu() -> Result<()> {
    let cpu_store = ParamStore::new(Device::Cpu, DType::F32, 7);
    let cpu = Gpt::new(&cpu_store, CONFIG)?;
    let tpu_store = ParamStore::new(Device::Tpu(0), DType::F32, 7);
    let tpu = Gpt::new(&tpu_store, CONFIG)?;
    let (x, _) = tokens(Device::Cpu)?;
    let want = cpu.forward(&x)?.to_f64_vec()?;
    let got = tpu.forward(&x.to_device(Device::Tpu(0))?)?.to_f64_vec()?;
    assert_eq!(want.len(), 2 * 16 * 64);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
    }
    Ok(())
}

#[test]
fn training_reduces_the_loss_under_every_eager_mode() -> Result<()> {
    for mode in [EagerMode::Strict, EagerMode::Debug, EagerMode::DeferAndFuse] {
        with_eager_mode(mode, || -> Result<()> {
            let store = ParamStore::new(Device::Tpu(0), DType::F32, 3);
            let model = Gpt::new(&store, CONFIG)?;
            let mut opt = AdamW::new(store.parameters(), 3e-3, 0.0);
            let (x, y) = tokens(Device::Tpu(0))?;
            let mut losses = Vec::new();
            for _ in 0..25 {
                let loss = model.loss(&x, &y)?;
                loss.backward()?;
                opt.step()?;
                opt.zero_grad();
                losses.push(loss.item()?);
            }
            assert!(losses[24] < 0.7 * losses[0], "{mode}: {losses:?}");
            Ok(())
        })?;
    }
    Ok(())
}

#[test]
fn checkpoints_round_trip_and_mismatches_are_named() -> Result<()> {
    let dir = temp_dir("ckpt");
    let path = dir.join("gpt.safetensors");
    let a = ParamStore::new(Device::Tpu(0), DType::F32, 1);
    let model_a = Gpt::new(&a, CONFIG)?;
    checkpoint::save(&a, &path)?;
    let b = ParamStore::new(Device::Tpu(0), DType::F32, 2);
    let model_b = Gpt::new(&b, CONFIG)?;
    checkpoint::load(&b, &path)?;
    let (x, _) = tokens(Device::Tpu(0))?;
    assert_eq!(
        model_a.forward(&x)?.to_vec::<f32>()?,
        model_b.forward(&x)?.to_vec::<f32>()?
    );

    let smaller = ParamStore::new(Device::Tpu(0), DType::F32, 2);
    let _ = Gpt::new(
        &smaller,
        GptConfig {
            n_layer: 1,
            n_embd: 16,
            ..CONFIG
        },
    )?;
    match checkpoint::load(&smaller, &path) {
        Err(e) if matches!(e, Error::Checkpoint { .. }) => {
            let Error::Checkpoint {
                unexpected,
                mismatched,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert!(
                unexpected.contains("transformer.h.1.attn.c_attn.weight"),
                "{unexpected}"
            );
            assert!(
                mismatched.contains("transformer.wte.weight: [64, 32] vs [64, 16]"),
                "{mismatched}"
            );
            // Only the categories that have names.
            assert!(!e.to_string().contains("missing"), "{e}");
        }
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_pytorch_checkpoint_loads_and_gives_pytorchs_logits() -> Result<()> {
    let Some(python) = torch::python("torch, safetensors") else {
        return Ok(());
    };
    let dir = temp_dir("torch");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/torch_gpt.py");
    let c = CONFIG;
    let status = std::process::Command::new(&python)
        .arg(script)
        .arg(&dir)
        .args([c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd].map(|v| v.to_string()))
        .status()
        .expect("python runs");
    assert!(status.success(), "the PyTorch fixture failed");
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 9);
    let model = Gpt::new(&store, CONFIG)?;
    checkpoint::load(&store, dir.join("gpt.safetensors"))?;
    let read = |name: &str| std::fs::read(dir.join(name)).expect("fixture output");
    let tokens: Vec<i64> = read("tokens.i64")
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = read("logits.f32")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let x = Tensor::from_vec(tokens, [2, c.block_size], Device::Tpu(0))?;
    let got = model.forward(&x)?.to_vec::<f32>()?;
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
    }
    // Greedy decoding with the KV cache gives PyTorch's tokens (which
    // recomputes the whole sequence each step), in every eager mode.
    let greedy: Vec<i64> = read("greedy.i64")
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let prompt: Vec<i64> = greedy
        .chunks(c.block_size)
        .flat_map(|row| row[..5].to_vec())
        .collect();
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        let got = with_eager_mode(mode, || -> Result<Vec<i64>> {
            let prompt = Tensor::from_vec(prompt.clone(), [2, 5], Device::Tpu(0))?;
            model
                .generate(&prompt, c.block_size - 5, Sampling::Greedy)?
                .to_vec::<i64>()
        })?;
        assert_eq!(got, greedy, "{mode:?}");
    }
    Ok(())
}

#[test]
fn sampling_is_seeded_and_top_k_one_is_greedy() -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 5);
    let model = Gpt::new(&store, CONFIG)?;
    let prompt = Tensor::from_vec(vec![1i64, 2, 3], [1, 3], Device::Tpu(0))?;
    let run =
        |sampling| -> Result<Vec<i64>> { model.generate(&prompt, 13, sampling)?.to_vec::<i64>() };
    let random = |seed, top_k| Sampling::Random {
        temperature: 1.5,
        top_k,
        seed,
    };
    let a = run(random(7, None))?;
    assert_eq!(a, run(random(7, None))?, "same seed, same tokens");
    assert_ne!(a, run(random(8, None))?, "another seed, other tokens");
    assert!(
        a.iter()
            .all(|&t| (0..CONFIG.vocab_size as i64).contains(&t))
    );
    assert_eq!(run(random(9, Some(1)))?, run(Sampling::Greedy)?);
    // Too long, an empty prompt and a bad temperature are shape errors.
    assert!(matches!(
        model.generate(&prompt, 14, Sampling::Greedy),
        Err(Error::Shape { .. })
    ));
    let cold = Sampling::Random {
        temperature: 0.0,
        top_k: None,
        seed: 1,
    };
    assert!(matches!(
        model.generate(&prompt, 2, cold),
        Err(Error::Shape { .. })
    ));
    Ok(())
}
