//! Layers: Linear, Embedding, LayerNorm, RMSNorm, Conv2d, Dropout.

use std::sync::atomic::{AtomicU64, Ordering};

use tpu_core::op::Attrs;

use super::params::{Init, ParamStore, Parameter, Path};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Something with a forward pass.
pub trait Module {
    /// Applies the layer, in the parameter store's mode (training or
    /// evaluation: dropout, batch statistics).
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// Applies the layer in training (`true`) or evaluation mode for this
    /// call alone, whatever the store's mode. Layers without a mode of
    /// their own run [`Module::forward`].
    #[track_caller]
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let _ = train;
        self.forward(x)
    }
}

/// `y = x W^T + b` with `W: [out, in]` (PyTorch's layout).
pub struct Linear {
    /// `[out, in]`.
    pub weight: Parameter,
    /// `[out]`, if any.
    pub bias: Option<Parameter>,
    in_features: usize,
    out_features: usize,
}

impl Linear {
    /// A linear layer under `path` (`path.weight`, `path.bias`), PyTorch's
    /// default initialisation.
    pub fn new(path: &Path, in_features: usize, out_features: usize, bias: bool) -> Result<Linear> {
        let bound = 1.0 / (in_features as f64).sqrt();
        Ok(Linear {
            weight: path.param("weight", [out_features, in_features], Init::Uniform(bound))?,
            bias: if bias {
                Some(path.param("bias", [out_features], Init::Uniform(bound))?)
            } else {
                None
            },
            in_features,
            out_features,
        })
    }
}

impl Module for Linear {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.dims().last() != Some(&self.in_features) {
            return Err(Error::shape(
                format!("Linear(in={}, out={})", self.in_features, self.out_features),
                format!(
                    "expects inputs with last dimension {}, got shape {}",
                    self.in_features,
                    x.shape()
                ),
            ));
        }
        let w = self.weight.get().transpose(0, 1)?;
        let y = x.matmul(&w)?;
        match &self.bias {
            Some(b) => &y + &b.get(),
            None => Ok(y),
        }
    }
}

/// A lookup table `[num, dim]` indexed by integer tensors.
pub struct Embedding {
    /// `[num, dim]`.
    pub weight: Parameter,
    num: usize,
}

impl Embedding {
    /// `num` embeddings of size `dim`, normal(0, 1) as in PyTorch.
    pub fn new(path: &Path, num: usize, dim: usize) -> Result<Embedding> {
        Ok(Embedding {
            weight: path.param("weight", [num, dim], Init::Normal(1.0))?,
            num,
        })
    }

    /// With a custom init standard deviation (GPT-2 uses 0.02).
    pub fn with_std(path: &Path, num: usize, dim: usize, std: f64) -> Result<Embedding> {
        Ok(Embedding {
            weight: path.param("weight", [num, dim], Init::Normal(std))?,
            num,
        })
    }
}

impl Module for Embedding {
    #[track_caller]
    fn forward(&self, indices: &Tensor) -> Result<Tensor> {
        if indices.dtype().is_float() {
            return Err(Error::shape(
                format!("Embedding({})", self.num),
                format!("indices must be integers, got {}", indices.dtype()),
            ));
        }
        self.weight.get().embedding(indices)
    }
}

/// Layer normalisation over the last dimension.
pub struct LayerNorm {
    /// Scale.
    pub weight: Parameter,
    /// Shift.
    pub bias: Parameter,
    eps: f64,
    dim: usize,
}

impl LayerNorm {
    /// Over a last dimension of size `dim`.
    pub fn new(path: &Path, dim: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: path.param("weight", [dim], Init::Ones)?,
            bias: path.param("bias", [dim], Init::Zeros)?,
            eps,
            dim,
        })
    }
}

impl Module for LayerNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.dims().last() != Some(&self.dim) {
            return Err(Error::shape(
                format!("LayerNorm({})", self.dim),
                format!("got shape {}", x.shape()),
            ));
        }
        let attrs = Attrs::new()
            .with("normalized_dims", 1i64)
            .with("eps", self.eps);
        Tensor::apply1(
            "layer_norm",
            &[x, &self.weight.get(), &self.bias.get()],
            attrs,
        )
    }
}

/// RMS normalisation over the last dimension.
pub struct RmsNorm {
    /// Scale.
    pub weight: Parameter,
    eps: f64,
    dim: usize,
}

impl RmsNorm {
    /// Over a last dimension of size `dim`.
    pub fn new(path: &Path, dim: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: path.param("weight", [dim], Init::Ones)?,
            eps,
            dim,
        })
    }
}

impl Module for RmsNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.dims().last() != Some(&self.dim) {
            return Err(Error::shape(
                format!("RmsNorm({})", self.dim),
                format!("got shape {}", x.shape()),
            ));
        }
        let attrs = Attrs::new()
            .with("normalized_dims", 1i64)
            .with("eps", self.eps);
        Tensor::apply1("rms_norm", &[x, &self.weight.get()], attrs)
    }
}

/// How a [`Conv2d`] slides over its input (candle's `Conv2dConfig`):
/// by default stride 1, no padding, no dilation, one group, with a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dConfig {
    /// Step between windows.
    pub stride: usize,
    /// Zero padding on each side.
    pub padding: usize,
    /// Spacing of kernel taps.
    pub dilation: usize,
    /// Channel groups (`in` and `out` channels both divide into them).
    pub groups: usize,
    /// Whether there is a bias.
    pub bias: bool,
}

impl Default for Conv2dConfig {
    fn default() -> Conv2dConfig {
        Conv2dConfig {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
            bias: true,
        }
    }
}

/// 2-D convolution over NCHW inputs.
pub struct Conv2d {
    /// `[out, in / groups, kh, kw]`.
    pub weight: Parameter,
    /// `[out]`, if any.
    pub bias: Option<Parameter>,
    config: Conv2dConfig,
    in_channels: usize,
}

impl Conv2d {
    /// A square-kernel convolution from `in_channels` to `out_channels`,
    /// initialised as PyTorch's.
    pub fn new(
        path: &Path,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        config: Conv2dConfig,
    ) -> Result<Conv2d> {
        let groups = config.groups;
        if groups == 0 || in_channels % groups != 0 || out_channels % groups != 0 {
            return Err(Error::shape(
                "Conv2d",
                format!(
                    "{in_channels} -> {out_channels} channels do not split into {groups} groups"
                ),
            ));
        }
        let fan_in = (in_channels / groups * kernel * kernel) as f64;
        let bound = 1.0 / fan_in.sqrt();
        Ok(Conv2d {
            weight: path.param(
                "weight",
                [out_channels, in_channels / groups, kernel, kernel],
                Init::Uniform(bound),
            )?,
            bias: if config.bias {
                Some(path.param("bias", [out_channels], Init::Uniform(bound))?)
            } else {
                None
            },
            config,
            in_channels,
        })
    }
}

impl Module for Conv2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 || x.dims()[1] != self.in_channels {
            return Err(Error::shape(
                format!("Conv2d(in={})", self.in_channels),
                format!(
                    "expects NCHW with C={}, got shape {}",
                    self.in_channels,
                    x.shape()
                ),
            ));
        }
        let c = self.config;
        let attrs = Attrs::new()
            .with("stride", vec![c.stride as i64; 2])
            .with("padding", vec![c.padding as i64; 2])
            .with("dilation", vec![c.dilation as i64; 2])
            .with("groups", c.groups as i64);
        match &self.bias {
            Some(b) => Tensor::apply1("conv2d", &[x, &self.weight.get(), &b.get()], attrs),
            None => Tensor::apply1("conv2d", &[x, &self.weight.get()], attrs),
        }
    }
}

/// Zeroes elements with probability `p` in training mode (scaling the rest
/// by `1 / (1 - p)`); the identity in evaluation mode.
pub struct Dropout {
    p: f64,
    store: ParamStore,
    calls: AtomicU64,
}

impl Dropout {
    /// Dropout with probability `p`, following `store`'s training mode.
    pub fn new(store: &ParamStore, p: f64) -> Dropout {
        Dropout {
            p,
            store: store.clone(),
            calls: AtomicU64::new(store.next_seed()),
        }
    }
}

impl Module for Dropout {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, self.store.is_training())
    }

    #[track_caller]
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        if !train || self.p == 0.0 {
            return Ok(x.clone());
        }
        // A fresh key per call; a tensor, so new keys never recompile.
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let key = Tensor::from_slice(&[(n >> 32) as u32, n as u32], [2], x.device())?;
        Tensor::apply1("dropout", &[x, &key], Attrs::new().with("p", self.p))
    }
}
