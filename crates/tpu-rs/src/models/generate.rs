//! Autoregressive generation with a KV cache: the prompt fills the cache
//! in one pass, then each step feeds one token per sequence at a position
//! held on the device, so every step after the first runs the same
//! programs (no compile per token) and nothing is read back until the end.

use std::panic::Location;

use tpu_core::profile;

use crate::error::{Error, Result};
use crate::models::Gpt;
use crate::tensor::Tensor;
use crate::{DType, no_grad, sync};

/// How [`Gpt::generate`] picks each next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The most likely token.
    Greedy,
    /// A draw from the softmax of `logits / temperature`, among the
    /// `top_k` most likely tokens when given; `seed` fixes the draws.
    Random {
        /// Above 1 flattens the distribution, below 1 sharpens it.
        temperature: f64,
        /// Only the `k` most likely tokens can be drawn.
        top_k: Option<usize>,
        /// The draws' seed.
        seed: u64,
    },
}

impl Gpt {
    /// `prompt` (i64 `[batch, time]`) followed by `max_new_tokens` tokens
    /// per sequence, each picked by `sampling` from the model's
    /// next-token logits. The whole sequence must fit in the block size.
    /// Profile traces attribute its ops to the caller.
    #[track_caller]
    pub fn generate(
        &self,
        prompt: &Tensor,
        max_new_tokens: usize,
        sampling: Sampling,
    ) -> Result<Tensor> {
        profile::at(Location::caller(), || {
            self.generate_tokens(prompt, max_new_tokens, sampling)
        })
    }

    fn generate_tokens(
        &self,
        prompt: &Tensor,
        max_new_tokens: usize,
        sampling: Sampling,
    ) -> Result<Tensor> {
        let [batch, time] = prompt.dims() else {
            return Err(shape_error(format!(
                "expects prompt token ids [batch, time], got {}",
                prompt.shape()
            )));
        };
        let (batch, time) = (*batch, *time);
        let capacity = self.config().block_size;
        if time == 0 || time + max_new_tokens > capacity {
            return Err(shape_error(format!(
                "a prompt of {time} tokens and {max_new_tokens} new ones must fit in the block size of {capacity} (and the prompt must not be empty)"
            )));
        }
        if let Sampling::Random {
            temperature, top_k, ..
        } = sampling
        {
            if !(temperature > 0.0 && temperature.is_finite()) || top_k == Some(0) {
                return Err(shape_error(format!(
                    "sampling needs a positive finite temperature and top_k of at least 1, got {temperature} and {top_k:?}"
                )));
            }
        }
        let device = prompt.device();
        no_grad(|| {
            let mut cache = self.kv_cache(batch)?;
            let positions = Tensor::arange(0.0, time as f64, 1.0, DType::I64, device)?;
            let logits = self.forward_cached(prompt, &positions, &mut cache)?;
            let mut last = logits.narrow(1, time as i64 - 1, 1)?;
            // Under DeferAndFuse each step is cut off as one program, the
            // same one every step (a no-op in the other modes).
            sync()?;
            let mut position = Tensor::from_slice(&[time as i64], [1], device)?;
            let one = Tensor::from_slice(&[1i64], [1], device)?;
            let mut tokens = vec![prompt.clone()];
            for step in 0..max_new_tokens {
                let next = pick(&last, sampling, step)?;
                if step + 1 < max_new_tokens {
                    last = self.forward_cached(&next, &position, &mut cache)?;
                    position = position.add(&one)?;
                    sync()?;
                }
                tokens.push(next);
            }
            Tensor::cat(&tokens.iter().collect::<Vec<_>>(), 1)
        })
    }
}

/// The next token `[batch, 1]` from the last position's logits `[batch, 1, vocab]`.
fn pick(logits: &Tensor, sampling: Sampling, step: usize) -> Result<Tensor> {
    let vocab = logits.dims()[2];
    let logits = logits.reshape([-1, vocab as i64])?;
    let Sampling::Random {
        temperature,
        top_k,
        seed,
    } = sampling
    else {
        return logits.argmax(-1, true);
    };
    let mut scaled = logits.to_dtype(DType::F32)?.scale(1.0 / temperature)?;
    if let Some(k) = top_k.filter(|&k| k < vocab) {
        let (values, _) = scaled.topk(k as i64, -1, true)?;
        let threshold = values.narrow(-1, k as i64 - 1, 1)?;
        let kept = scaled.ge(&threshold)?;
        let never = Tensor::full([1], f64::NEG_INFINITY, DType::F32, scaled.device())?;
        scaled = scaled.where_else(&kept, &never)?;
    }
    // The Gumbel-max trick: argmax(logits + Gumbel noise) is a draw from
    // softmax(logits), with no host round trip.
    let key = Tensor::random_key(mix(seed, step as u64), scaled.device())?;
    let u = Tensor::uniform(
        &key,
        scaled.shape().clone(),
        DType::F32,
        f64::from(f32::MIN_POSITIVE),
        1.0,
    )?;
    let gumbel = u.log()?.neg()?.log()?.neg()?;
    (&scaled + &gumbel)?.argmax(-1, true)
}

/// A per-step seed (SplitMix64's finaliser), so steps draw independently.
fn mix(seed: u64, step: u64) -> u64 {
    let mut z = seed ^ step.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[track_caller]
fn shape_error(reason: String) -> Error {
    Error::shape("Gpt::generate", reason)
}
