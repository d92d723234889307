//! Losses.

use tpu_core::op::Attrs;

use crate::error::Result;
use crate::tensor::Tensor;

/// Mean squared error.
pub fn mse(prediction: &Tensor, target: &Tensor) -> Result<Tensor> {
    let d = (prediction - target)?;
    (&d * &d)?.mean_all()
}

/// Cross entropy of `logits: [N, C]` against class indices `targets: [N]`
/// (mean over targets; PyTorch's `ignore_index = -100`).
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    Tensor::apply1("cross_entropy", &[logits, targets], Attrs::new())
}

/// Cross entropy with label smoothing and an ignored class index.
pub fn cross_entropy_with(
    logits: &Tensor,
    targets: &Tensor,
    ignore_index: i64,
    label_smoothing: f64,
) -> Result<Tensor> {
    let attrs = Attrs::new()
        .with("ignore_index", ignore_index)
        .with("label_smoothing", label_smoothing);
    Tensor::apply1("cross_entropy", &[logits, targets], attrs)
}
