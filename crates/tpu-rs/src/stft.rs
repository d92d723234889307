//! The short-time Fourier transform and its inverse, as `torch.stft` and
//! `torch.istft` compute them: frames `hop` samples apart, each windowed
//! and transformed; the inverse overlap-adds the inverse transforms and
//! divides by the summed squared window. Built from gathers, `fft` and
//! `index_add`, so gradients flow through both.

use tpu_core::{DType, Device};

use crate::error::{Error, Result};
use crate::fft::FftNorm;
use crate::tensor::Tensor;

/// The arguments `torch.stft` and `torch.istft` share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stft {
    /// The transform's length.
    pub n_fft: usize,
    /// Samples between frames (PyTorch's default: `n_fft / 4`).
    pub hop_length: usize,
    /// The window's length (at most `n_fft`; the window is centred in the
    /// frame, zeros around it).
    pub win_length: usize,
    /// Pads the signal by `n_fft / 2` on both sides, so frame `t` is
    /// centred on sample `t * hop_length`.
    pub center: bool,
    /// With `center`: reflect the signal at its ends (PyTorch's default)
    /// rather than pad with zeros.
    pub reflect: bool,
    /// Scales the transform by `1 / sqrt(n_fft)`.
    pub normalized: bool,
    /// Keeps only the `n_fft / 2 + 1` frequencies of a real signal's
    /// spectrum that the rest mirror.
    pub onesided: bool,
}

impl Stft {
    /// PyTorch's defaults for `n_fft`.
    pub fn new(n_fft: usize) -> Stft {
        Stft {
            n_fft,
            hop_length: (n_fft / 4).max(1),
            win_length: n_fft,
            center: true,
            reflect: true,
            normalized: false,
            onesided: true,
        }
    }

    /// With frames `hop_length` samples apart.
    pub fn hop(self, hop_length: usize) -> Stft {
        Stft { hop_length, ..self }
    }

    /// The call as an error names it.
    fn call(&self, op: &str, x: &Tensor) -> String {
        format!(
            "{op}(n_fft={}, hop_length={}, win_length={}) of {}{:?} on {}",
            self.n_fft,
            self.hop_length,
            self.win_length,
            x.dtype(),
            x.dims(),
            x.device()
        )
    }

    fn check(&self, op: &str, x: &Tensor, window: Option<&Tensor>) -> Result<()> {
        let fail = |reason: String| Err(Error::shape(self.call(op, x), reason));
        if self.n_fft == 0 || self.hop_length == 0 {
            return fail("n_fft and hop_length must be positive".into());
        }
        if self.win_length == 0 || self.win_length > self.n_fft {
            return fail(format!("win_length must be in 1..={}", self.n_fft));
        }
        if let Some(w) = window
            && w.dims() != [self.win_length]
        {
            return fail(format!(
                "the window must have shape [{}], got {:?}",
                self.win_length,
                w.dims()
            ));
        }
        Ok(())
    }

    /// The window zero-padded to `n_fft`, centred (ones when none is given).
    fn full_window(&self, window: Option<&Tensor>, dtype: DType, device: Device) -> Result<Tensor> {
        let w = match window {
            Some(w) => w.to_dtype(dtype)?,
            None => Tensor::ones([self.win_length], dtype, device)?,
        };
        let left = (self.n_fft - self.win_length) / 2;
        let right = self.n_fft - self.win_length - left;
        if left + right == 0 {
            return Ok(w);
        }
        w.pad(&[left as i64, right as i64], 0.0)
    }

    /// The positions of every frame's samples, frame after frame.
    fn positions(&self, frames: usize, device: Device) -> Result<Tensor> {
        let at: Vec<i64> = (0..frames)
            .flat_map(|f| (0..self.n_fft).map(move |k| (f * self.hop_length + k) as i64))
            .collect();
        Tensor::from_slice(&at, [at.len()], device)
    }

    fn norm(&self) -> FftNorm {
        if self.normalized {
            FftNorm::Ortho
        } else {
            FftNorm::Backward
        }
    }
}

/// `x` (rows of samples) reflected at both ends by `p` samples.
fn reflect_pad(x: &Tensor, p: usize) -> Result<Tensor> {
    let n = x.dims()[1] as i64;
    let p = p as i64;
    let left = x.narrow(1, 1, p)?.flip([1])?;
    let right = x.narrow(1, n - 1 - p, p)?.flip([1])?;
    Tensor::cat(&[&left, x, &right], 1)
}

impl Tensor {
    /// `torch.stft(x, n_fft, ..., return_complex=True)` of a real signal
    /// (`[samples]` or `[batch, samples]`): a complex
    /// `[(batch,) frequencies, frames]` spectrum.
    #[track_caller]
    pub fn stft(&self, window: Option<&Tensor>, options: &Stft) -> Result<Tensor> {
        let o = options;
        o.check("stft", self, window)?;
        let fail = |reason: String| Err(Error::shape(o.call("stft", self), reason));
        if self.dtype().is_complex() || !self.dtype().is_float() {
            return fail("takes a real float signal".into());
        }
        let batched = match self.rank() {
            1 => false,
            2 => true,
            _ => return fail("takes a 1-D or 2-D signal".into()),
        };
        let mut x = if batched {
            self.clone()
        } else {
            self.reshape([1, -1])?
        };
        if o.center {
            let p = o.n_fft / 2;
            x = if !o.reflect {
                x.pad(&[p as i64, p as i64], 0.0)?
            } else if p < x.dims()[1] {
                reflect_pad(&x, p)?
            } else {
                return fail(format!(
                    "reflect padding of {p} needs more than {p} samples per row"
                ));
            };
        }
        let samples = x.dims()[1];
        if samples < o.n_fft {
            return fail(format!(
                "a frame of {} samples is longer than the (padded) signal of {samples}",
                o.n_fft
            ));
        }
        let frames = 1 + (samples - o.n_fft) / o.hop_length;
        let rows = x.dims()[0] as i64;
        let at = o.positions(frames, self.device())?;
        let framed = x
            .index_select(1, &at)?
            .reshape([rows, frames as i64, o.n_fft as i64])?;
        let w = o.full_window(window, self.dtype(), self.device())?;
        let framed = (&framed * &w)?;
        let spectrum = if o.onesided {
            framed.rfft(None, -1, o.norm())?
        } else {
            framed.fft(None, -1, o.norm())?
        };
        let spectrum = spectrum.transpose(1, 2)?;
        if batched {
            Ok(spectrum)
        } else {
            spectrum.squeeze([0])
        }
    }

    /// `torch.istft(spec, n_fft, ..., length)`: the real signal whose
    /// [`stft`](Tensor::stft) is `self` (`[(batch,) frequencies, frames]`,
    /// complex), `length` samples long when given.
    #[track_caller]
    pub fn istft(
        &self,
        window: Option<&Tensor>,
        options: &Stft,
        length: Option<usize>,
    ) -> Result<Tensor> {
        let o = options;
        o.check("istft", self, window)?;
        let fail = |reason: String| Err(Error::shape(o.call("istft", self), reason));
        if !self.dtype().is_complex() {
            return fail("takes a complex spectrum".into());
        }
        let batched = match self.rank() {
            2 => false,
            3 => true,
            _ => return fail("takes a 2-D or 3-D spectrum".into()),
        };
        let spec = if batched {
            self.clone()
        } else {
            self.unsqueeze(0)?
        };
        let bins = if o.onesided { o.n_fft / 2 + 1 } else { o.n_fft };
        let (rows, got, frames) = (spec.dims()[0], spec.dims()[1], spec.dims()[2]);
        if got != bins {
            return fail(format!("expects {bins} frequencies, got {got}"));
        }
        let spec = spec.transpose(1, 2)?;
        let framed = if o.onesided {
            spec.irfft(Some(o.n_fft), -1, o.norm())?
        } else {
            spec.ifft(None, -1, o.norm())?.real()?
        };
        let dtype = framed.dtype();
        let device = self.device();
        let w = o.full_window(window, dtype, device)?;
        let framed = (&framed * &w)?;
        // Overlap-add the frames, and the squared window the same way.
        let samples = o.n_fft + o.hop_length * (frames.max(1) - 1);
        let at = o.positions(frames, device)?;
        let flat = framed.reshape([rows as i64, (frames * o.n_fft) as i64])?;
        let y = Tensor::zeros([rows, samples], dtype, device)?.index_add(1, &at, &flat)?;
        let w2 = (&w * &w)?.reshape([1, o.n_fft as i64])?;
        let w2 = w2.broadcast_to(&[frames, o.n_fft])?.reshape([-1])?;
        let envelope = Tensor::zeros([samples], dtype, device)?.index_add(0, &at, &w2)?;
        let start = if o.center { o.n_fft / 2 } else { 0 };
        let end = match length {
            Some(n) => start + n,
            None if o.center => samples - o.n_fft / 2,
            None => samples,
        };
        let kept = end.min(samples).saturating_sub(start);
        let y = y.narrow(1, start as i64, kept as i64)?;
        let envelope = envelope.narrow(0, start as i64, kept as i64)?;
        let lowest = if kept == 0 {
            1.0
        } else {
            envelope.abs()?.min([0], false)?.item()?
        };
        if lowest < 1e-11 {
            return fail(format!(
                "the window overlap-adds to {lowest:e} somewhere (it must not vanish: the NOLA condition)"
            ));
        }
        let mut y = (&y / &envelope)?;
        if end > samples {
            y = y.pad(&[0, (end - samples.max(start)) as i64], 0.0)?;
        }
        if batched { Ok(y) } else { y.squeeze([0]) }
    }
}
