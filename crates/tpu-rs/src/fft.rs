//! The discrete Fourier transforms of `torch.fft`: `fft`, `ifft`, `rfft`,
//! `irfft`, `hfft`, `ihfft` along one dim, their n-dimensional forms over
//! any dims, `fftshift`, and the sample frequencies. Each runs the core
//! `fft` op (three dims at a time, as `stablehlo.fft` takes them) after
//! trimming or zero-padding every transformed dim to its signal length.

use tpu_core::op::Attrs;
use tpu_core::{DType, Device};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// How a transform is scaled, as PyTorch's `norm` argument: `Backward`
/// leaves the forward transform unscaled and scales the inverse by `1/n`,
/// `Forward` the reverse, `Ortho` both by `1/sqrt(n)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FftNorm {
    /// Inverse transforms scaled by `1/n` (the default).
    #[default]
    Backward,
    /// Forward transforms scaled by `1/n`.
    Forward,
    /// Both scaled by `1/sqrt(n)`: the transforms are unitary.
    Ortho,
}

impl FftNorm {
    /// The norm of the dual transform (`hfft` is an `irfft` with the
    /// forward and backward scalings swapped).
    fn swapped(self) -> FftNorm {
        match self {
            FftNorm::Backward => FftNorm::Forward,
            FftNorm::Forward => FftNorm::Backward,
            FftNorm::Ortho => FftNorm::Ortho,
        }
    }
}

/// The transforms the core op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fft,
    Ifft,
    Rfft,
    Irfft,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fft => "fft",
            Kind::Ifft => "ifft",
            Kind::Rfft => "rfft",
            Kind::Irfft => "irfft",
        }
    }

    fn inverse(self) -> bool {
        matches!(self, Kind::Ifft | Kind::Irfft)
    }
}

/// The factor a result is multiplied by: the core op scales inverse
/// transforms by `1/n` already.
fn scale_factor(kind: Kind, norm: FftNorm, n: f64) -> f64 {
    match (norm, kind.inverse()) {
        (FftNorm::Backward, _) => 1.0,
        (FftNorm::Forward, false) => 1.0 / n,
        (FftNorm::Forward, true) => n,
        (FftNorm::Ortho, false) => 1.0 / n.sqrt(),
        (FftNorm::Ortho, true) => n.sqrt(),
    }
}

/// `x` with its dims `dims` (absolute, at most three) moved last, in
/// order, transformed by the core op, and moved back.
fn along(x: &Tensor, dims: &[usize], kind: Kind, lengths: &[usize]) -> Result<Tensor> {
    let rank = x.rank();
    let mut order: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    order.extend(dims);
    let moved = order.iter().enumerate().any(|(i, &d)| i != d);
    let perm: Vec<i64> = order.iter().map(|&d| d as i64).collect();
    let x = if moved { x.permute(&perm)? } else { x.clone() };
    let lengths: Vec<i64> = lengths.iter().map(|&n| n as i64).collect();
    let attrs = Attrs::new()
        .with("kind", kind.name())
        .with("lengths", lengths);
    let y = Tensor::apply1("fft", &[&x], attrs)?;
    if !moved {
        return Ok(y);
    }
    let mut back = vec![0i64; rank];
    for (i, &d) in order.iter().enumerate() {
        back[d] = i as i64;
    }
    y.permute(&back)
}

impl Tensor {
    /// The n-dimensional transform `kind` of `self` over `dims` (all when
    /// `None`; the last `s.len()` when only `s` is given) with signal
    /// lengths `s` (the input's sizes when `None`; for `irfft`, the last
    /// is `2 * (m - 1)` for an input of `m` bins).
    #[track_caller]
    fn fft_general(
        &self,
        kind: Kind,
        s: Option<&[usize]>,
        dims: Option<&[i64]>,
        norm: FftNorm,
    ) -> Result<Tensor> {
        let call = format!("{}n on {}", kind.name(), self.ty());
        let fail = |reason: String| Error::shape(call.clone(), reason);
        let rank = self.rank();
        let dims: Vec<i64> = match (dims, s) {
            (Some(d), _) => d.to_vec(),
            (None, Some(s)) => (rank as i64 - s.len() as i64..rank as i64).collect(),
            (None, None) => (0..rank as i64).collect(),
        };
        if dims.is_empty() {
            return Err(fail("needs at least one dim to transform".into()));
        }
        let mut axes = Vec::with_capacity(dims.len());
        for &d in &dims {
            let a = if d < 0 { d + rank as i64 } else { d };
            if a < 0 || a >= rank as i64 {
                return Err(fail(format!("dim {d} is out of range for rank {rank}")));
            }
            if axes.contains(&(a as usize)) {
                return Err(fail(format!("dim {d} appears twice in {dims:?}")));
            }
            axes.push(a as usize);
        }
        let lengths: Vec<usize> = match s {
            Some(s) if s.len() != axes.len() => {
                return Err(fail(format!(
                    "s {s:?} must give one length per transformed dim {dims:?}"
                )));
            }
            Some(s) => s.to_vec(),
            None => {
                let mut l: Vec<usize> = axes.iter().map(|&a| self.dims()[a]).collect();
                if kind == Kind::Irfft
                    && let Some(last) = l.last_mut()
                {
                    *last = 2 * last.saturating_sub(1);
                }
                l
            }
        };
        if let Some(bad) = lengths.iter().find(|&&n| n < 1) {
            return Err(fail(format!(
                "signal length {bad} must be at least 1 (dims {dims:?} of {})",
                self.ty()
            )));
        }

        let x = self.fft_input(kind)?;
        // Each dim trimmed or zero-padded to what the transform reads.
        let mut x = x;
        for (i, (&axis, &n)) in axes.iter().zip(&lengths).enumerate() {
            let wanted = if kind == Kind::Irfft && i + 1 == axes.len() {
                n / 2 + 1
            } else {
                n
            };
            x = x.resized(axis, wanted)?;
        }

        let split = axes.len().saturating_sub(3);
        let (lead, last) = (&axes[..split], &axes[split..]);
        let (lead_n, last_n) = (&lengths[..split], &lengths[split..]);
        let lead_kind = if kind.inverse() {
            Kind::Ifft
        } else {
            Kind::Fft
        };
        let leading = |x: Tensor| -> Result<Tensor> {
            lead.chunks(3)
                .zip(lead_n.chunks(3))
                .try_fold(x, |x, (a, n)| along(&x, a, lead_kind, n))
        };
        // rfft halves its last dim first; irfft restores it last.
        let x = if kind == Kind::Irfft {
            along(&leading(x)?, last, kind, last_n)?
        } else {
            leading(along(&x, last, kind, last_n)?)?
        };
        let n: f64 = lengths.iter().map(|&n| n as f64).product();
        let factor = scale_factor(kind, norm, n);
        if factor == 1.0 {
            Ok(x)
        } else {
            x.scale(factor)
        }
    }

    /// `self` in the dtype transform `kind` reads: complex for `fft`,
    /// `ifft` and `irfft` (real values become complex ones), f32 or f64 for
    /// `rfft` (integers and half floats compute in f32).
    #[track_caller]
    fn fft_input(&self, kind: Kind) -> Result<Tensor> {
        let d = self.dtype();
        let real = if d == DType::F64 || d.is_complex() {
            d
        } else {
            DType::F32
        };
        if kind == Kind::Rfft {
            if d.is_complex() {
                return Err(Error::shape(
                    format!("rfft on {}", self.ty()),
                    "takes a real tensor; use fft for complex input",
                ));
            }
            return self.to_dtype(real);
        }
        let complex = real.complex_of().unwrap_or(DType::C64);
        self.to_dtype(complex)
    }

    /// `self` along `axis` cut to its first `n` entries or padded with
    /// zeros to `n`.
    #[track_caller]
    fn resized(&self, axis: usize, n: usize) -> Result<Tensor> {
        let size = self.dims()[axis];
        if size == n {
            return Ok(self.clone());
        }
        if size > n {
            return self.narrow(axis as i64, 0, n as i64);
        }
        let from_last = self.rank() - 1 - axis;
        let mut pad = vec![0i64; 2 * (from_last + 1)];
        pad[2 * from_last + 1] = (n - size) as i64;
        self.pad(&pad, 0.0)
    }

    /// The 1-D signal length and dim of a one-dim transform.
    fn one_dim(n: Option<usize>, dim: i64) -> (Option<Vec<usize>>, [i64; 1]) {
        (n.map(|n| vec![n]), [dim])
    }

    /// The discrete Fourier transform along `dim`, of length `n` (the
    /// input cut or zero-padded to it; its size when `None`). Real input
    /// gives a complex result.
    #[track_caller]
    pub fn fft(&self, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
        let (s, dims) = Tensor::one_dim(n, dim);
        self.fft_general(Kind::Fft, s.as_deref(), Some(&dims), norm)
    }

    /// The inverse of [`Tensor::fft`].
    #[track_caller]
    pub fn ifft(&self, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
        let (s, dims) = Tensor::one_dim(n, dim);
        self.fft_general(Kind::Ifft, s.as_deref(), Some(&dims), norm)
    }

    /// The transform of a real signal: its first `n / 2 + 1` bins (the
    /// rest mirror them).
    #[track_caller]
    pub fn rfft(&self, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
        let (s, dims) = Tensor::one_dim(n, dim);
        self.fft_general(Kind::Rfft, s.as_deref(), Some(&dims), norm)
    }

    /// The inverse of [`Tensor::rfft`]: a real signal of length `n`
    /// (`2 * (m - 1)` for `m` bins when `None`) from its half spectrum.
    #[track_caller]
    pub fn irfft(&self, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
        let (s, dims) = Tensor::one_dim(n, dim);
        self.fft_general(Kind::Irfft, s.as_deref(), Some(&dims), norm)
    }

    /// The transform of a signal with Hermitian symmetry given by its first
    /// half: a real result of length `n`.
    #[track_caller]
    pub fn hfft(&self, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
        self.conj()?.irfft(n, dim, norm.swapped())
    }

    /// The inverse of [`Tensor::hfft`]: the half spectrum of a real signal
    /// under the inverse transform.
    #[track_caller]
    pub fn ihfft(&self, n: Option<usize>, dim: i64, norm: FftNorm) -> Result<Tensor> {
        self.rfft(n, dim, norm.swapped())?.conj()
    }

    /// The n-dimensional [`Tensor::fft`] over `dims` (all when `None`, or
    /// the last `s.len()` when only `s` is given) with signal lengths `s`.
    /// `fft2` is `fftn(s, Some(&[-2, -1]), norm)`.
    #[track_caller]
    pub fn fftn(&self, s: Option<&[usize]>, dims: Option<&[i64]>, norm: FftNorm) -> Result<Tensor> {
        self.fft_general(Kind::Fft, s, dims, norm)
    }

    /// The n-dimensional [`Tensor::ifft`].
    #[track_caller]
    pub fn ifftn(
        &self,
        s: Option<&[usize]>,
        dims: Option<&[i64]>,
        norm: FftNorm,
    ) -> Result<Tensor> {
        self.fft_general(Kind::Ifft, s, dims, norm)
    }

    /// The n-dimensional [`Tensor::rfft`]: the last dim halved.
    #[track_caller]
    pub fn rfftn(
        &self,
        s: Option<&[usize]>,
        dims: Option<&[i64]>,
        norm: FftNorm,
    ) -> Result<Tensor> {
        self.fft_general(Kind::Rfft, s, dims, norm)
    }

    /// The n-dimensional [`Tensor::irfft`].
    #[track_caller]
    pub fn irfftn(
        &self,
        s: Option<&[usize]>,
        dims: Option<&[i64]>,
        norm: FftNorm,
    ) -> Result<Tensor> {
        self.fft_general(Kind::Irfft, s, dims, norm)
    }

    /// Rolls each of `dims` (all when empty) by half its size, so the
    /// zero frequency moves to the centre.
    #[track_caller]
    pub fn fftshift(&self, dims: impl Into<crate::Dims>) -> Result<Tensor> {
        self.shift_half(dims.into().as_slice(), false)
    }

    /// The inverse of [`Tensor::fftshift`].
    #[track_caller]
    pub fn ifftshift(&self, dims: impl Into<crate::Dims>) -> Result<Tensor> {
        self.shift_half(dims.into().as_slice(), true)
    }

    #[track_caller]
    fn shift_half(&self, dims: &[i64], inverse: bool) -> Result<Tensor> {
        let dims: Vec<i64> = if dims.is_empty() {
            (0..self.rank() as i64).collect()
        } else {
            dims.to_vec()
        };
        let rank = self.rank() as i64;
        let mut shifts = Vec::with_capacity(dims.len());
        for &d in &dims {
            let a = if d < 0 { d + rank } else { d };
            let size = usize::try_from(a)
                .ok()
                .and_then(|a| self.dims().get(a))
                .ok_or_else(|| {
                    Error::shape(
                        "fftshift",
                        format!("dim {d} is out of range for {}", self.ty()),
                    )
                })?;
            let half = (size / 2) as i64;
            shifts.push(if inverse { -half } else { half });
        }
        let attrs = Attrs::new().with("shifts", shifts).with("dims", dims);
        Tensor::apply1("roll", &[self], attrs)
    }

    /// The sample frequencies of an `n`-point transform with sample
    /// spacing `d`: `[0, 1, ..., (n - 1) / 2, -(n / 2), ..., -1] / (d n)`.
    pub fn fftfreq(n: usize, d: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let values: Vec<f64> = (0..n)
            .map(|k| {
                let k = if k < n.div_ceil(2) {
                    k as f64
                } else {
                    k as f64 - n as f64
                };
                k / (d * n as f64)
            })
            .collect();
        Tensor::from_vec(values, [n], device)?.to_dtype(dtype)
    }

    /// The sample frequencies of [`Tensor::rfft`]'s `n / 2 + 1` bins.
    pub fn rfftfreq(n: usize, d: f64, dtype: DType, device: Device) -> Result<Tensor> {
        let values: Vec<f64> = (0..n / 2 + 1).map(|k| k as f64 / (d * n as f64)).collect();
        Tensor::from_vec(values, [n / 2 + 1], device)?.to_dtype(dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_scale_as_pytorch_does() {
        assert_eq!(scale_factor(Kind::Fft, FftNorm::Backward, 4.0), 1.0);
        assert_eq!(scale_factor(Kind::Fft, FftNorm::Forward, 4.0), 0.25);
        assert_eq!(scale_factor(Kind::Irfft, FftNorm::Forward, 4.0), 4.0);
        assert_eq!(scale_factor(Kind::Ifft, FftNorm::Ortho, 4.0), 2.0);
        assert_eq!(FftNorm::Ortho.swapped(), FftNorm::Ortho);
    }
}
