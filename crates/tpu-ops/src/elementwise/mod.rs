//! Elementwise ops: unary math, binary arithmetic with broadcasting and type
//! promotion, comparisons, logic, `where`, `clamp` and `cast`; the inverse
//! trigonometric and hyperbolic functions; the error and gamma families;
//! complex numbers' parts, magnitude and phase.

mod bessel;
mod bessel_jy;
mod binary;
mod compare;
mod complex;
mod gamma;
mod incomplete_gamma;
mod lanes;
mod logic;
mod next_after;
mod normal;
mod polynomial;
mod select;
mod special;
mod trig;
mod unary;
