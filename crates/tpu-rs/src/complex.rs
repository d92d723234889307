//! Complex tensors: building them from parts and taking them apart.
//! Tensors here are values, so `view_as_real` and `view_as_complex` give
//! new tensors rather than views that alias.

use tpu_core::op::Attrs;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

impl Tensor {
    /// The complex tensor `re + i im` (both f32, giving c64, or both f64,
    /// giving c128; shapes broadcast).
    #[track_caller]
    pub fn complex(re: &Tensor, im: &Tensor) -> Result<Tensor> {
        Tensor::apply1("complex", &[re, im], Attrs::new())
    }

    /// The complex tensor `abs * e^{i angle}`.
    #[track_caller]
    pub fn polar(abs: &Tensor, angle: &Tensor) -> Result<Tensor> {
        Tensor::apply1("polar", &[abs, angle], Attrs::new())
    }

    /// The real parts (a real tensor itself).
    #[track_caller]
    pub fn real(&self) -> Result<Tensor> {
        if !self.dtype().is_complex() {
            return Ok(self.clone());
        }
        Tensor::apply1("real", &[self], Attrs::new())
    }

    /// The imaginary parts of a complex tensor.
    #[track_caller]
    pub fn imag(&self) -> Result<Tensor> {
        Tensor::apply1("imag", &[self], Attrs::new())
    }

    /// The complex conjugate (a real tensor itself).
    #[track_caller]
    pub fn conj(&self) -> Result<Tensor> {
        if !self.dtype().is_complex() {
            return Ok(self.clone());
        }
        Tensor::apply1("conj", &[self], Attrs::new())
    }

    /// The phase `atan2(im, re)` of each element (of a real tensor: 0, or
    /// π for negative values).
    #[track_caller]
    pub fn angle(&self) -> Result<Tensor> {
        if self.dtype().is_complex() {
            return Tensor::apply1("angle", &[self], Attrs::new());
        }
        let zero = self.zeros_like()?;
        zero.atan2(self)
    }

    /// A complex tensor as its parts along a new last dim of size 2.
    #[track_caller]
    pub fn view_as_real(&self) -> Result<Tensor> {
        if !self.dtype().is_complex() {
            return Err(Error::shape(
                "view_as_real",
                format!("takes a complex tensor, got {}", self.ty()),
            ));
        }
        Tensor::stack(&[&self.real()?, &self.imag()?], -1)
    }

    /// The inverse of [`Tensor::view_as_real`]: a last dim of size 2 (f32
    /// or f64) read as (real, imaginary) pairs.
    #[track_caller]
    pub fn view_as_complex(&self) -> Result<Tensor> {
        if self.dims().last() != Some(&2) {
            return Err(Error::shape(
                "view_as_complex",
                format!("takes a last dim of size 2, got {}", self.ty()),
            ));
        }
        let re = self.narrow(-1, 0, 1)?.squeeze([-1])?;
        let im = self.narrow(-1, 1, 1)?.squeeze([-1])?;
        Tensor::complex(&re, &im)
    }
}
