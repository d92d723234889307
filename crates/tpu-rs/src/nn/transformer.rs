//! GPT-2 style building blocks: causal self-attention and the MLP, named as
//! in Hugging Face's GPT-2 (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`,
//! `mlp.c_proj`) but with PyTorch `nn.Linear` weight layout.

use tpu_core::op::Attrs;

use super::layers::{Linear, Module};
use super::params::Path;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Multi-head causal self-attention over `[batch, time, channels]`.
pub struct CausalSelfAttention {
    /// Query, key and value projections in one: `[3C, C]`.
    pub c_attn: Linear,
    /// Output projection.
    pub c_proj: Linear,
    heads: usize,
    channels: usize,
}

impl CausalSelfAttention {
    /// `heads` heads over `channels` channels (`channels % heads == 0`).
    pub fn new(path: &Path, channels: usize, heads: usize) -> Result<CausalSelfAttention> {
        if heads == 0 || channels % heads != 0 {
            return Err(Error::Shape {
                layer: "CausalSelfAttention".into(),
                reason: format!("{channels} channels do not split into {heads} heads"),
            });
        }
        Ok(CausalSelfAttention {
            c_attn: Linear::new(&path.sub("c_attn"), channels, 3 * channels, true)?,
            c_proj: Linear::new(&path.sub("c_proj"), channels, channels, true)?,
            heads,
            channels,
        })
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [b, t, c] = x.dims() else {
            return Err(Error::Shape {
                layer: "CausalSelfAttention".into(),
                reason: format!("expects [batch, time, channels], got {}", x.shape()),
            });
        };
        let (b, t, c) = (*b as i64, *t as i64, *c as i64);
        if c as usize != self.channels {
            return Err(Error::Shape {
                layer: "CausalSelfAttention".into(),
                reason: format!("expects {} channels, got {c}", self.channels),
            });
        }
        let h = self.heads as i64;
        let qkv = self.c_attn.forward(x)?;
        let split = |i: i64| -> Result<Tensor> {
            qkv.slice(-1, i * c, (i + 1) * c, 1)?
                .reshape(&[b, t, h, c / h])?
                .permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let y = Tensor::apply1(
            "scaled_dot_product_attention",
            &[&q, &k, &v],
            Attrs::new().with("causal", true),
        )?;
        let y = y.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?;
        self.c_proj.forward(&y)
    }
}

/// The transformer MLP: `c_proj(gelu_tanh(c_fc(x)))` with a 4x hidden width.
pub struct Mlp {
    /// Expansion.
    pub c_fc: Linear,
    /// Projection back.
    pub c_proj: Linear,
}

impl Mlp {
    /// Over `channels` channels.
    pub fn new(path: &Path, channels: usize) -> Result<Mlp> {
        Ok(Mlp {
            c_fc: Linear::new(&path.sub("c_fc"), channels, 4 * channels, true)?,
            c_proj: Linear::new(&path.sub("c_proj"), 4 * channels, channels, true)?,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.c_proj.forward(&self.c_fc.forward(x)?.gelu(true)?)
    }
}
