//! GPT-2 style building blocks: causal self-attention and the MLP, named as
//! in Hugging Face's GPT-2 (`attn.c_attn`, `attn.c_proj`, `mlp.c_fc`,
//! `mlp.c_proj`) but with PyTorch `nn.Linear` weight layout.

use tpu_core::DType;
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
    #[track_caller]
    pub fn new(path: &Path, channels: usize, heads: usize) -> Result<CausalSelfAttention> {
        if heads == 0 || channels % heads != 0 {
            return Err(Error::shape(
                "CausalSelfAttention",
                format!("{channels} channels do not split into {heads} heads"),
            ));
        }
        Ok(CausalSelfAttention {
            c_attn: Linear::new(&path.sub("c_attn"), channels, 3 * channels, true)?,
            c_proj: Linear::new(&path.sub("c_proj"), channels, channels, true)?,
            heads,
            channels,
        })
    }

    /// Queries, keys and values `[batch, heads, time, head_dim]` of `x`
    /// (`[batch, time, channels]`).
    #[track_caller]
    fn heads_of(&self, x: &Tensor) -> Result<[Tensor; 3]> {
        let [b, t, c] = x.dims() else {
            return Err(Error::shape(
                "CausalSelfAttention",
                format!("expects [batch, time, channels], got {}", x.shape()),
            ));
        };
        let (b, t, c) = (*b as i64, *t as i64, *c as i64);
        if c as usize != self.channels {
            return Err(Error::shape(
                "CausalSelfAttention",
                format!("expects {} channels, got {c}", self.channels),
            ));
        }
        let h = self.heads as i64;
        let qkv = self.c_attn.forward(x)?;
        let split = |i: i64| -> Result<Tensor> {
            qkv.slice(-1, i * c, (i + 1) * c, 1)?
                .reshape([b, t, h, c / h])?
                .permute([0, 2, 1, 3])
        };
        Ok([split(0)?, split(1)?, split(2)?])
    }

    /// The heads' outputs `[batch, heads, time, head_dim]` merged and
    /// projected back to `x`'s `[batch, time, channels]`.
    fn merge(&self, y: &Tensor, x: &Tensor) -> Result<Tensor> {
        let dims: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
        self.c_proj
            .forward(&y.permute([0, 2, 1, 3])?.reshape(&dims)?)
    }
}

impl Module for CausalSelfAttention {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let [q, k, v] = self.heads_of(x)?;
        let y = Tensor::apply1(
            "scaled_dot_product_attention",
            &[&q, &k, &v],
            Attrs::new().with("causal", true),
        )?;
        self.merge(&y, x)
    }
}

/// One attention layer's keys and values for a whole context,
/// `[batch, heads, capacity, head_dim]`: decoding writes each new position
/// into it, so every step has the same shapes (and reuses its programs).
pub struct LayerCache {
    /// Keys by position.
    pub keys: Tensor,
    /// Values by position.
    pub values: Tensor,
}

impl CausalSelfAttention {
    /// An empty cache for `batch` sequences of up to `capacity` positions.
    pub fn cache(&self, batch: usize, capacity: usize, like: &Tensor) -> Result<LayerCache> {
        let shape = [batch, self.heads, capacity, self.channels / self.heads];
        Ok(LayerCache {
            keys: Tensor::zeros(shape, like.dtype(), like.device())?,
            values: Tensor::zeros(shape, like.dtype(), like.device())?,
        })
    }

    /// Attention of `x` (`[batch, time, channels]`, at `positions`, an i64
    /// `[time]` device tensor) over every cached position up to each
    /// token's own: its keys and values are written into `cache` first.
    /// The positions stay on the device, so a decode step's program does
    /// not depend on where in the sequence it is.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        positions: &Tensor,
        cache: &mut LayerCache,
    ) -> Result<Tensor> {
        let [q, k, v] = self.heads_of(x)?;
        let (b, t) = (x.dims()[0], x.dims()[1]);
        let (h, d) = (self.heads, self.channels / self.heads);
        let capacity = cache.keys.dims()[2];
        let at = positions
            .reshape([1, 1, t as i64, 1])?
            .broadcast_to(&[b, h, t, d])?;
        cache.keys = cache.keys.scatter(2, &at, &k)?;
        cache.values = cache.values.scatter(2, &at, &v)?;
        // Token i sees the cached positions up to its own.
        let keys = Tensor::iota([1, capacity], 1, DType::I64, x.device())?;
        let visible = keys.le(&positions.reshape([t as i64, 1])?)?;
        let scores = q
            .matmul(&cache.keys.transpose(-2, -1)?)?
            .scale(1.0 / (d as f64).sqrt())?;
        let hidden = Tensor::full([1], f64::NEG_INFINITY, scores.dtype(), x.device())?;
        let y = scores
            .where_else(&visible, &hidden)?
            .softmax(-1)?
            .matmul(&cache.values)?;
        self.merge(&y, x)
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
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.c_proj.forward(&self.c_fc.forward(x)?.gelu(true)?)
    }
}
