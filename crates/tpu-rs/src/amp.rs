//! Mixed precision: an autocast scope that runs the matrix products in a
//! half type while weights, reductions and normalisations stay in f32, and
//! a gradient scaler that keeps small f16 gradients from flushing to zero.
//!
//! Inside [`autocast`], every op a [`Tensor`] method issues is sorted as
//! PyTorch's autocast sorts them: matrix products (`matmul`, `dot_general`,
//! the convolutions, `scaled_dot_product_attention`) cast their f32 inputs to
//! the half type; softmax, normalisations, losses, reductions and
//! exponentials cast half inputs up to f32; any other op given floats of
//! different widths computes in the widest. Casts are ops like any other,
//! so gradients flow back through them to f32 parameters in f32.

use std::cell::Cell;

use tpu_core::DType;

use crate::error::{Error, Result};
use crate::nn::Parameter;
use crate::optim::Optimizer;
use crate::tensor::Tensor;

thread_local! {
    /// The half type of the innermost autocast scope on this thread.
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Ops that run in the autocast type.
const LOWER: &[&str] = &[
    "matmul",
    "dot_general",
    "convolution",
    "conv1d",
    "conv2d",
    "scaled_dot_product_attention",
];

/// Ops that run in f32 under autocast: their results need the range or
/// the precision.
const FLOAT32: &[&str] = &[
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "batch_norm",
    "cross_entropy",
    "nll_loss",
    "sum",
    "mean",
    "var",
    "std",
    "prod",
    "cumsum",
    "logsumexp",
    "exp",
    "log",
    "pow",
    "norm",
];

/// Runs `f` with the matrix products in `dtype` (`bf16` or `f16`) on this
/// thread; scopes nest, the innermost wins.
pub fn autocast<R>(dtype: DType, f: impl FnOnce() -> R) -> Result<R> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::shape(
            "autocast",
            format!("runs matrix products in bf16 or f16, not {dtype}"),
        ));
    }
    // Restored on unwinding too.
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.set(self.0);
        }
    }
    let _restore = Restore(AUTOCAST.replace(Some(dtype)));
    Ok(f())
}

/// The autocast type in force on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.get()
}

/// `inputs` cast as autocast wants them for `op`, or `None` when they stay
/// as they are (no scope, or nothing to cast).
pub(crate) fn cast_inputs(op: &str, inputs: &[&Tensor]) -> Result<Option<Vec<Tensor>>> {
    let Some(half) = AUTOCAST.get().filter(|_| op != "cast") else {
        return Ok(None);
    };
    let floats = || inputs.iter().map(|t| t.dtype()).filter(|d| d.is_float());
    let (target, wants): (DType, &dyn Fn(DType) -> bool) = if LOWER.contains(&op) {
        // f64 stays f64, as PyTorch's autocast leaves it.
        (half, &|d| d != DType::F64 && d != half)
    } else if FLOAT32.contains(&op) {
        (DType::F32, &|d| d.size_in_bytes() == 2)
    } else {
        match floats().reduce(wider) {
            Some(widest) => (widest, &move |d| d != widest),
            None => return Ok(None),
        }
    };
    if !floats().any(wants) {
        return Ok(None);
    }
    // Each cast is an op too, which autocast leaves alone.
    inputs
        .iter()
        .map(|t| {
            if t.dtype().is_float() && wants(t.dtype()) {
                t.to_dtype(target)
            } else {
                Ok((*t).clone())
            }
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The float type that holds both: the wider one, f32 for bf16 with f16.
fn wider(a: DType, b: DType) -> DType {
    match (a.size_in_bytes(), b.size_in_bytes()) {
        (x, y) if x > y => a,
        (x, y) if y > x => b,
        _ if a == b => a,
        _ => DType::F32,
    }
}

/// Scales the loss so that f16 gradients keep their small values, and
/// unscales the gradients before the optimizer steps; a step whose
/// gradients overflowed is skipped and the scale halved, and after
/// `growth_interval` steps without overflow the scale doubles (PyTorch's
/// `GradScaler`, with its defaults).
#[derive(Clone, Debug)]
pub struct GradScaler {
    scale: f64,
    growth_factor: f64,
    backoff_factor: f64,
    growth_interval: usize,
    good_steps: usize,
}

impl Default for GradScaler {
    fn default() -> GradScaler {
        GradScaler::new(65536.0, 2000)
    }
}

impl GradScaler {
    /// A scaler starting at `scale`, doubling after `growth_interval` steps
    /// without overflow.
    pub fn new(scale: f64, growth_interval: usize) -> GradScaler {
        GradScaler {
            scale,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval,
            good_steps: 0,
        }
    }

    /// The current scale.
    pub fn scale_factor(&self) -> f64 {
        self.scale
    }

    /// `loss * scale`, to call `backward` on.
    #[track_caller]
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        loss * self.scale
    }

    /// Unscales the gradients of `params` and steps `optimizer` unless one
    /// of them holds an infinity or a NaN; then updates the scale. Returns
    /// whether the optimizer stepped. Reads one number from the device.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer, params: &[Parameter]) -> Result<bool> {
        let finite = crate::autograd::no_grad(|| -> Result<bool> {
            // Zero times every gradient entry, summed: 0 when all are
            // finite, NaN when any is an infinity or a NaN.
            let mut probe: Option<Tensor> = None;
            for p in params {
                let t = p.get();
                let Some(g) = t.grad() else { continue };
                let g = (&g * (1.0 / self.scale))?;
                let zeros = (&g * 0.0)?.to_dtype(DType::F32)?.sum_all()?;
                probe = Some(match probe {
                    Some(b) => (&b + &zeros)?,
                    None => zeros,
                });
                t.set_grad(g);
            }
            Ok(match probe {
                Some(b) => b.item()?.is_finite(),
                None => true,
            })
        })?;
        if finite {
            optimizer.step()?;
            self.good_steps += 1;
            if self.good_steps == self.growth_interval {
                self.scale *= self.growth_factor;
                self.good_steps = 0;
            }
        } else {
            self.scale *= self.backoff_factor;
            self.good_steps = 0;
        }
        Ok(finite)
    }
}
