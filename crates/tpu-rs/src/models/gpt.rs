//! A GPT-2 style decoder with nanoGPT's parameter names
//! (`transformer.wte.weight`, `transformer.h.0.attn.c_attn.weight`, ...),
//! so checkpoints of the same architecture in PyTorch load directly.

use crate::error::{Error, Result};
use crate::nn::{
    CausalSelfAttention, Embedding, LayerCache, LayerNorm, Linear, Mlp, Module, ParamStore, Path,
};
use crate::tensor::Tensor;

/// Model dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Longest sequence.
    pub block_size: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Channels.
    pub n_embd: usize,
}

impl GptConfig {
    /// The small model the `gpt` example trains (and the soak bench runs):
    /// a byte vocabulary, 64-token context, 2 blocks of 4 heads, 64 channels.
    pub const fn tiny() -> GptConfig {
        GptConfig {
            vocab_size: 256,
            block_size: 64,
            n_layer: 2,
            n_head: 4,
            n_embd: 64,
        }
    }
}

struct Block {
    ln_1: LayerNorm,
    attn: CausalSelfAttention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

impl Block {
    fn new(path: &Path, c: &GptConfig) -> Result<Block> {
        Ok(Block {
            ln_1: LayerNorm::new(&path.sub("ln_1"), c.n_embd, 1e-5)?,
            attn: CausalSelfAttention::new(&path.sub("attn"), c.n_embd, c.n_head)?,
            ln_2: LayerNorm::new(&path.sub("ln_2"), c.n_embd, 1e-5)?,
            mlp: Mlp::new(&path.sub("mlp"), c.n_embd)?,
        })
    }

    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = (x + &self.attn.forward(&self.ln_1.forward(x)?)?)?;
        &x + &self.mlp.forward(&self.ln_2.forward(&x)?)?
    }

    fn forward_cached(
        &self,
        x: &Tensor,
        positions: &Tensor,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let attn = self
            .attn
            .forward_cached(&self.ln_1.forward(x)?, positions, cache)?;
        let x = (x + &attn)?;
        &x + &self.mlp.forward(&self.ln_2.forward(&x)?)?
    }
}

/// The keys and values of every layer for `batch` sequences of up to the
/// model's block size, filled as [`Gpt::forward_cached`] runs.
pub struct KvCache {
    layers: Vec<LayerCache>,
}

/// The decoder.
pub struct Gpt {
    config: GptConfig,
    wte: Embedding,
    wpe: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    lm_head: Linear,
}

impl Gpt {
    /// A freshly initialised model whose parameters live in `store`.
    pub fn new(store: &ParamStore, config: GptConfig) -> Result<Gpt> {
        let t = store.root().sub("transformer");
        Ok(Gpt {
            config,
            wte: Embedding::with_std(&t.sub("wte"), config.vocab_size, config.n_embd, 0.02)?,
            wpe: Embedding::with_std(&t.sub("wpe"), config.block_size, config.n_embd, 0.02)?,
            blocks: (0..config.n_layer)
                .map(|i| Block::new(&t.sub("h").sub(i), &config))
                .collect::<Result<_>>()?,
            ln_f: LayerNorm::new(&t.sub("ln_f"), config.n_embd, 1e-5)?,
            lm_head: Linear::new(
                &store.root().sub("lm_head"),
                config.n_embd,
                config.vocab_size,
                false,
            )?,
        })
    }

    /// The dimensions.
    pub fn config(&self) -> GptConfig {
        self.config
    }

    /// Logits `[batch, time, vocab]` for token ids `[batch, time]` (i64).
    #[track_caller]
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let [_, t] = tokens.dims() else {
            return Err(Error::shape(
                "Gpt",
                format!("expects token ids [batch, time], got {}", tokens.shape()),
            ));
        };
        let t = *t;
        if t == 0 || t > self.config.block_size {
            return Err(Error::shape(
                "Gpt",
                format!(
                    "sequence length {t} is outside 1..={}",
                    self.config.block_size
                ),
            ));
        }
        let positions: Vec<i64> = (0..t as i64).collect();
        let positions = Tensor::from_slice(&positions, [t], tokens.device())?;
        let mut x = (&self.wte.forward(tokens)? + &self.wpe.forward(&positions)?)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        self.lm_head.forward(&self.ln_f.forward(&x)?)
    }

    /// An empty cache for `batch` sequences, on the model's device.
    pub fn kv_cache(&self, batch: usize) -> Result<KvCache> {
        let like = self.wte.weight.get();
        let layers = self
            .blocks
            .iter()
            .map(|block| block.attn.cache(batch, self.config.block_size, &like))
            .collect::<Result<_>>()?;
        Ok(KvCache { layers })
    }

    /// Logits `[batch, time, vocab]` for token ids `[batch, time]` at
    /// `positions` (an i64 `[time]` device tensor), attending to everything
    /// `cache` holds before them; their keys and values join the cache.
    pub fn forward_cached(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let mut x = (&self.wte.forward(tokens)? + &self.wpe.forward(positions)?)?;
        for (block, layer) in self.blocks.iter().zip(&mut cache.layers) {
            x = block.forward_cached(&x, positions, layer)?;
        }
        self.lm_head.forward(&self.ln_f.forward(&x)?)
    }

    /// Mean cross entropy of next-token prediction.
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let logits = self.forward(tokens)?;
        let v = self.config.vocab_size as i64;
        crate::nn::cross_entropy(&logits.reshape([-1, v])?, &targets.reshape([-1])?)
    }
}
