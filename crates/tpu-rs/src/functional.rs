//! Tensor methods for the linear-algebra, neural-network, indexing, random
//! and creation ops.

use tpu_core::op::Attrs;
use tpu_core::{DType, Device, Shape};

use crate::error::Result;
use crate::tensor::Tensor;

/// Convolution and pooling geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Step between windows; `None` takes PyTorch's default: 1 for a
    /// convolution, the kernel size for pooling.
    pub stride: Option<usize>,
    /// Zero padding on each side.
    pub padding: usize,
    /// Spacing of kernel taps.
    pub dilation: usize,
}

impl Default for Window {
    fn default() -> Window {
        Window {
            stride: None,
            padding: 0,
            dilation: 1,
        }
    }
}

/// The attributes of `w` over `spatial` dims; a stride left out is
/// `default_stride`.
fn window_attrs(w: Window, spatial: usize, default_stride: usize) -> Attrs {
    let stride = w.stride.unwrap_or(default_stride);
    Attrs::new()
        .with("stride", vec![stride as i64; spatial])
        .with("padding", vec![w.padding as i64; spatial])
        .with("dilation", vec![w.dilation as i64; spatial])
}

impl Tensor {
    /// `dot_general` with explicit batch and contracting dims.
    #[track_caller]
    pub fn dot_general(
        &self,
        other: &Tensor,
        batch: (&[i64], &[i64]),
        contract: (&[i64], &[i64]),
    ) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("lhs_batch", batch.0)
            .with("rhs_batch", batch.1)
            .with("lhs_contract", contract.0)
            .with("rhs_contract", contract.1);
        Tensor::apply1("dot_general", &[self, other], attrs)
    }

    /// 1-D convolution (NCL input, OIL weight).
    #[track_caller]
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        window: Window,
        groups: usize,
    ) -> Result<Tensor> {
        let attrs = window_attrs(window, 1, 1).with("groups", groups as i64);
        match bias {
            Some(b) => Tensor::apply1("conv1d", &[self, weight, b], attrs),
            None => Tensor::apply1("conv1d", &[self, weight], attrs),
        }
    }

    /// 2-D convolution (NCHW input, OIHW weight).
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        window: Window,
        groups: usize,
    ) -> Result<Tensor> {
        let attrs = window_attrs(window, 2, 1).with("groups", groups as i64);
        match bias {
            Some(b) => Tensor::apply1("conv2d", &[self, weight, b], attrs),
            None => Tensor::apply1("conv2d", &[self, weight], attrs),
        }
    }

    /// StableHLO's general convolution; `attrs` as the `convolution` op takes them.
    #[track_caller]
    pub fn convolution(&self, weight: &Tensor, attrs: Attrs) -> Result<Tensor> {
        Tensor::apply1("convolution", &[self, weight], attrs)
    }

    /// 2-D max pooling over NCHW with a square `kernel` (stride: the
    /// kernel's, unless `window` gives one).
    #[track_caller]
    pub fn max_pool2d(&self, kernel: usize, window: Window) -> Result<Tensor> {
        let attrs = window_attrs(window, 2, kernel).with("kernel_size", vec![kernel as i64; 2]);
        Tensor::apply1("max_pool2d", &[self], attrs)
    }

    /// 2-D average pooling over NCHW with a square `kernel` (padding counts).
    #[track_caller]
    pub fn avg_pool2d(&self, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("kernel_size", vec![kernel as i64; 2])
            .with("stride", vec![stride as i64; 2])
            .with("padding", vec![padding as i64; 2]);
        Tensor::apply1("avg_pool2d", &[self], attrs)
    }

    /// Adaptive 2-D average pooling of `[.., H, W]` to `[.., oh, ow]`: output
    /// cell `i` averages input rows `floor(i H / oh)` to `ceil((i + 1) H / oh)`
    /// (and the same for columns), as PyTorch's `adaptive_avg_pool2d`; done
    /// as two products with averaging matrices, so any sizes take one program.
    #[track_caller]
    pub fn adaptive_avg_pool2d(&self, output: [usize; 2]) -> Result<Tensor> {
        let op = "adaptive_avg_pool2d";
        let dims = self.dims();
        if dims.len() < 3 || !self.dtype().is_float() || output.contains(&0) {
            return Err(crate::Error::shape(
                op,
                format!(
                    "takes a float [.., C, H, W] tensor and a non-zero output size; got {} {} with output {output:?}",
                    self.dtype(),
                    self.shape()
                ),
            ));
        }
        let (h, w) = (dims[dims.len() - 2], dims[dims.len() - 1]);
        let rows = self.averaging_matrix(output[0], h)?;
        let cols = self.averaging_matrix(output[1], w)?.transpose(0, 1)?;
        rows.matmul(&self.matmul(&cols)?)
    }

    /// The `[out, len]` matrix whose row `i` averages adaptive window `i` of
    /// `len` entries, in this tensor's dtype and on its device.
    fn averaging_matrix(&self, out: usize, len: usize) -> Result<Tensor> {
        let mut m = vec![0.0f64; out * len];
        for i in 0..out {
            let (start, end) = (i * len / out, ((i + 1) * len).div_ceil(out));
            for j in start..end {
                m[i * len + j] = 1.0 / (end - start) as f64;
            }
        }
        Tensor::from_vec(m, [out, len], self.device())?.to_dtype(self.dtype())
    }

    /// Group normalisation of `[N, C, ..]`: the channels split into `groups`,
    /// each group normalised over its channels and the remaining dims
    /// (biased variance, `eps` added), then an optional per-channel affine
    /// (`[C]` weight and bias), as PyTorch's `group_norm`.
    #[track_caller]
    pub fn group_norm(
        &self,
        groups: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let dims = self.dims().to_vec();
        if dims.len() < 2 || groups == 0 || dims[1] % groups != 0 {
            return Err(crate::Error::shape(
                "group_norm",
                format!(
                    "the channels (dim 1) of shape {} do not split into {groups} groups",
                    self.shape()
                ),
            ));
        }
        let per_group = dims[1] / groups * dims[2..].iter().product::<usize>();
        let grouped = self.reshape([dims[0] as i64, groups as i64, per_group as i64])?;
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut y = grouped.layer_norm(1, None, None, eps)?.reshape(&shape)?;
        // Per channel: [C] seen as [1, C, 1, ..].
        let mut channel = vec![1i64; dims.len()];
        channel[1] = dims[1] as i64;
        if let Some(w) = weight {
            y = y.mul(&w.reshape(&channel)?)?;
        }
        if let Some(b) = bias {
            y = y.add(&b.reshape(&channel)?)?;
        }
        Ok(y)
    }

    /// Layer normalisation over the last `dims` dims, with optional affine.
    #[track_caller]
    pub fn layer_norm(
        &self,
        dims: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("normalized_dims", dims as i64)
            .with("eps", eps);
        let mut inputs = vec![self];
        inputs.extend(weight);
        inputs.extend(bias);
        Tensor::apply1("layer_norm", &inputs, attrs)
    }

    /// RMS normalisation over the last `dims` dims, with optional scale.
    #[track_caller]
    pub fn rms_norm(&self, dims: usize, weight: Option<&Tensor>, eps: f64) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("normalized_dims", dims as i64)
            .with("eps", eps);
        let mut inputs = vec![self];
        inputs.extend(weight);
        Tensor::apply1("rms_norm", &inputs, attrs)
    }

    /// Batch normalisation over channel dim 1: returns the output and the
    /// updated running mean and variance.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        weight: &Tensor,
        bias: &Tensor,
        running_mean: &Tensor,
        running_var: &Tensor,
        training: bool,
        momentum: f64,
        eps: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let attrs = Attrs::new()
            .with("training", training)
            .with("momentum", momentum)
            .with("eps", eps);
        let mut out = Tensor::apply(
            "batch_norm",
            &[self, weight, bias, running_mean, running_var],
            attrs,
        )?
        .into_iter();
        match (out.next(), out.next(), out.next()) {
            (Some(y), Some(m), Some(v)) => Ok((y, m, v)),
            _ => Err(crate::Error::shape("batch_norm", "expected three outputs")),
        }
    }

    /// Negative log-likelihood of `self` (log-probabilities `[N, C]`) at
    /// class `targets` (mean over non-ignored targets).
    #[track_caller]
    pub fn nll_loss(&self, targets: &Tensor) -> Result<Tensor> {
        Tensor::apply1("nll_loss", &[self, targets], Attrs::new())
    }

    /// Cross entropy of logits `self` against class `targets`.
    #[track_caller]
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        crate::nn::cross_entropy(self, targets)
    }

    /// Attention of queries `self` over `key`/`value`, optionally causal or
    /// with an additive float / boolean `mask`.
    #[track_caller]
    pub fn scaled_dot_product_attention(
        &self,
        key: &Tensor,
        value: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        let attrs = Attrs::new().with("causal", causal);
        let mut inputs = vec![self, key, value];
        inputs.extend(mask);
        Tensor::apply1("scaled_dot_product_attention", &inputs, attrs)
    }

    /// `torch.take_along_dim`.
    #[track_caller]
    pub fn take_along_dim(&self, index: &Tensor, dim: i64) -> Result<Tensor> {
        Tensor::apply1(
            "take_along_dim",
            &[self, index],
            Attrs::new().with("dim", dim),
        )
    }

    /// `self` with `src` written at `index` along `dim`.
    #[track_caller]
    pub fn scatter(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.write_at("scatter", dim, index, src)
    }

    /// `self` with `src` added at `index` along `dim`.
    #[track_caller]
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.write_at("scatter_add", dim, index, src)
    }

    /// `self` with slices of `src` added at the entries of `index` along `dim`.
    #[track_caller]
    pub fn index_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.write_at("index_add", dim, index, src)
    }

    /// `op(self, index, src; dim)`: the scatter family.
    #[track_caller]
    fn write_at(&self, op: &str, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        Tensor::apply1(op, &[self, index, src], Attrs::new().with("dim", dim))
    }

    /// `self` with elements zeroed with probability `p` (the rest scaled by
    /// `1 / (1 - p)`), drawn from `key` (a `u32[2]` tensor).
    #[track_caller]
    pub fn dropout(&self, key: &Tensor, p: f64) -> Result<Tensor> {
        Tensor::apply1("dropout", &[self, key], Attrs::new().with("p", p))
    }

    /// A random key (a `u32[2]` tensor) for `seed`.
    pub fn random_key(seed: u64, device: Device) -> Result<Tensor> {
        Tensor::from_slice(&[(seed >> 32) as u32, seed as u32], [2], device)
    }

    /// Uniform values in `[low, high)` drawn from `key`.
    #[track_caller]
    pub fn uniform(
        key: &Tensor,
        shape: impl Into<Shape>,
        dtype: DType,
        low: f64,
        high: f64,
    ) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("shape", shape.into().dims())
            .with("dtype", dtype)
            .with("low", low)
            .with("high", high);
        Tensor::apply1("uniform", &[key], attrs)
    }

    /// Normal values drawn from `key`.
    #[track_caller]
    pub fn normal(
        key: &Tensor,
        shape: impl Into<Shape>,
        dtype: DType,
        mean: f64,
        std: f64,
    ) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("shape", shape.into().dims())
            .with("dtype", dtype)
            .with("mean", mean)
            .with("std", std);
        Tensor::apply1("normal", &[key], attrs)
    }

    /// Booleans that are true with probability `p`, drawn from `key`.
    #[track_caller]
    pub fn bernoulli(key: &Tensor, shape: impl Into<Shape>, p: f64) -> Result<Tensor> {
        Tensor::apply1(
            "bernoulli",
            &[key],
            Attrs::new().with("shape", shape.into().dims()).with("p", p),
        )
    }

    /// `start, start + step, ...` below `end`.
    #[track_caller]
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("start", start)
            .with("end", end)
            .with("step", step)
            .with("dtype", dtype);
        Tensor::create("arange", attrs, device)
    }

    /// The `n x m` identity.
    #[track_caller]
    pub fn eye(n: usize, m: usize, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::create(
            "eye",
            Attrs::new().with("n", n).with("m", m).with("dtype", dtype),
            device,
        )
    }

    /// Values counting up along `dim`.
    #[track_caller]
    pub fn iota(
        shape: impl Into<Shape>,
        dim: usize,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let attrs = Attrs::new()
            .with("shape", shape.into().dims())
            .with("dim", dim)
            .with("dtype", dtype);
        Tensor::create("iota", attrs, device)
    }
}
