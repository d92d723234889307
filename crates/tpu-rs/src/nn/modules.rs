//! Modules that compose others or hold no weights (`Sequential`,
//! activations, pooling, `Flatten`), and the channel normalisations:
//! `BatchNorm2d` with its running statistics, `GroupNorm`.

use crate::error::{Error, Result};
use crate::functional::Window;
use crate::nn::{Init, Module, ParamStore, Parameter, Path};
use crate::tensor::Tensor;

/// Layers applied in order (PyTorch's `nn.Sequential`).
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module + Send + Sync>>,
}

impl Sequential {
    /// No layers: the identity.
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// `self` followed by `layer`.
    pub fn push(mut self, layer: impl Module + Send + Sync + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// How many layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.layers
            .iter()
            .try_fold(x.clone(), |x, layer| layer.forward(&x))
    }

    #[track_caller]
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        self.layers
            .iter()
            .try_fold(x.clone(), |x, layer| layer.forward_t(&x, train))
    }
}

/// An elementwise activation as a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU, exact (erf).
    Gelu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// `tanh`.
    Tanh,
    /// The logistic sigmoid.
    Sigmoid,
    /// `x * sigmoid(x)`.
    Silu,
}

impl Module for Activation {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(false),
            Activation::GeluTanh => x.gelu(true),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Silu => x.silu(),
        }
    }
}

/// `[N, d1, d2, ...]` to `[N, d1 * d2 * ...]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flatten;

impl Module for Flatten {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let Some(&n) = x.dims().first() else {
            return Err(Error::shape(
                "Flatten",
                "needs a batch dimension, got a scalar",
            ));
        };
        x.reshape([n as i64, -1])
    }
}

/// 2-D max pooling over NCHW with a square kernel (stride: the kernel's,
/// unless the window gives one).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d {
    /// Kernel size.
    pub kernel: usize,
    /// Stride, padding, dilation.
    pub window: Window,
}

impl MaxPool2d {
    /// Pooling over `kernel` x `kernel` windows, `kernel` apart.
    pub fn new(kernel: usize) -> MaxPool2d {
        MaxPool2d {
            kernel,
            window: Window::default(),
        }
    }
}

impl Module for MaxPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.kernel, self.window)
    }
}

/// 2-D average pooling over NCHW with a square kernel (padding counts).
#[derive(Clone, Copy, Debug)]
pub struct AvgPool2d {
    /// Kernel size.
    pub kernel: usize,
    /// Stride; `None` is the kernel size.
    pub stride: Option<usize>,
    /// Zero padding on each side.
    pub padding: usize,
}

impl AvgPool2d {
    /// Averages over `kernel` x `kernel` windows, `kernel` apart.
    pub fn new(kernel: usize) -> AvgPool2d {
        AvgPool2d {
            kernel,
            stride: None,
            padding: 0,
        }
    }
}

impl Module for AvgPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(
            self.kernel,
            self.stride.unwrap_or(self.kernel),
            self.padding,
        )
    }
}

/// Adaptive 2-D average pooling to a fixed `[oh, ow]` output, whatever the
/// input's height and width (`[1, 1]`: global average pooling).
#[derive(Clone, Copy, Debug)]
pub struct AdaptiveAvgPool2d {
    /// Output height and width.
    pub output: [usize; 2],
}

impl AdaptiveAvgPool2d {
    /// Pooling to `output` (height, width).
    pub fn new(output: [usize; 2]) -> AdaptiveAvgPool2d {
        AdaptiveAvgPool2d { output }
    }
}

impl Module for AdaptiveAvgPool2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.adaptive_avg_pool2d(self.output)
    }
}

/// Group normalisation of `[N, C, ..]` inputs with a per-channel affine
/// (`weight`, `bias`, as PyTorch names them); the same in training and
/// evaluation, as it keeps no running statistics.
pub struct GroupNorm {
    /// Scale, `[C]`.
    pub weight: Parameter,
    /// Shift, `[C]`.
    pub bias: Parameter,
    groups: usize,
    eps: f64,
}

impl GroupNorm {
    /// `channels` split into `groups` (which must divide them), with
    /// PyTorch's eps (1e-5).
    pub fn new(path: &Path, groups: usize, channels: usize) -> Result<GroupNorm> {
        if groups == 0 || channels % groups != 0 {
            return Err(Error::shape(
                format!("GroupNorm({groups}, {channels})"),
                format!("{channels} channels do not split into {groups} groups"),
            ));
        }
        Ok(GroupNorm {
            weight: path.param("weight", [channels], Init::Ones)?,
            bias: path.param("bias", [channels], Init::Zeros)?,
            groups,
            eps: 1e-5,
        })
    }
}

impl Module for GroupNorm {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = (self.weight.get(), self.bias.get());
        x.group_norm(self.groups, Some(&w), Some(&b), self.eps)
    }
}

/// Batch normalisation over the channels of NCHW (or `[N, C]`) inputs:
/// batch statistics in training mode, which also update the running
/// statistics; the running statistics in evaluation mode (the store's
/// [`ParamStore::set_training`]). The running statistics are kept in the
/// store beside the weights (`running_mean`, `running_var`, as PyTorch's
/// `state_dict` names them), so checkpoints carry them; they take no
/// gradient.
pub struct BatchNorm2d {
    /// Scale, `[C]`.
    pub weight: Parameter,
    /// Shift, `[C]`.
    pub bias: Parameter,
    running_mean: Parameter,
    running_var: Parameter,
    channels: usize,
    momentum: f64,
    eps: f64,
    store: ParamStore,
}

impl BatchNorm2d {
    /// Over `channels` channels, with PyTorch's momentum (0.1) and eps (1e-5).
    pub fn new(path: &Path, channels: usize) -> Result<BatchNorm2d> {
        Ok(BatchNorm2d {
            weight: path.param("weight", [channels], Init::Ones)?,
            bias: path.param("bias", [channels], Init::Zeros)?,
            running_mean: path.param("running_mean", [channels], Init::Zeros)?,
            running_var: path.param("running_var", [channels], Init::Ones)?,
            channels,
            momentum: 0.1,
            eps: 1e-5,
            store: path.store().clone(),
        })
    }

    /// The running mean and variance.
    pub fn running_stats(&self) -> (Tensor, Tensor) {
        (self.running_mean.get(), self.running_var.get())
    }
}

impl Module for BatchNorm2d {
    #[track_caller]
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_t(x, self.store.is_training())
    }

    #[track_caller]
    fn forward_t(&self, x: &Tensor, training: bool) -> Result<Tensor> {
        if x.rank() < 2 || x.dims()[1] != self.channels {
            return Err(Error::shape(
                format!("BatchNorm2d({})", self.channels),
                format!(
                    "expects [N, {}, ...], got shape {}",
                    self.channels,
                    x.shape()
                ),
            ));
        }
        let stats = |p: &Parameter| p.get().detach();
        let (y, mean, var) = x.batch_norm(
            &self.weight.get(),
            &self.bias.get(),
            &stats(&self.running_mean),
            &stats(&self.running_var),
            training,
            self.momentum,
            self.eps,
        )?;
        if training {
            self.running_mean.set(&mean.detach());
            self.running_var.set(&var.detach());
        }
        Ok(y)
    }
}
