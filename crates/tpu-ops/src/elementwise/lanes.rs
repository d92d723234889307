//! [`Lanes`]: elementwise arithmetic on device values of one shape and
//! dtype, for the special functions whose lowerings are long formulas
//! (series, quadratures, continued fractions).

use tpu_core::DType;
use tpu_core::stablehlo::{Builder, Compare, Value};

/// A builder and the dtype and shape every value it makes has.
pub(super) struct Lanes<'b> {
    pub b: &'b mut Builder,
    pub dtype: DType,
    pub dims: Vec<usize>,
}

impl<'b> Lanes<'b> {
    /// `x` converted to its float dtype (f32 for f16 and bf16, which these
    /// formulas would round away), with the lanes to compute on it and the
    /// dtype to convert the result back to.
    pub fn for_input(b: &'b mut Builder, x: &Value) -> (Lanes<'b>, Value, DType) {
        let out = crate::support::to_float(x.dtype());
        let dtype = match out {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        };
        let x = b.convert(x, dtype);
        let dims = x.dims().to_vec();
        (Lanes { b, dtype, dims }, x, out)
    }

    /// A constant filled with `v`.
    pub fn c(&mut self, v: f64) -> Value {
        self.b.constant(self.dtype, self.dims.as_slice(), v)
    }

    /// A binary StableHLO op.
    pub fn bin(&mut self, op: &str, a: &Value, b: &Value) -> Value {
        self.b.binary(op, a, b)
    }

    /// A unary StableHLO (or CHLO) op.
    pub fn un(&mut self, op: &str, a: &Value) -> Value {
        self.b.unary(op, a)
    }

    /// `a + b`.
    pub fn add(&mut self, a: &Value, b: &Value) -> Value {
        self.bin("stablehlo.add", a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: &Value, b: &Value) -> Value {
        self.bin("stablehlo.multiply", a, b)
    }

    /// `a * v` for a constant `v`.
    pub fn scale(&mut self, a: &Value, v: f64) -> Value {
        let c = self.c(v);
        self.mul(a, &c)
    }

    /// `a <dir> v ? yes : no`, elementwise.
    pub fn select_if(&mut self, dir: Compare, a: &Value, v: f64, yes: &Value, no: &Value) -> Value {
        let c = self.c(v);
        let p = self.b.compare(dir, a, &c);
        self.b.select(&p, yes, no)
    }

    /// `Σ c_k x^k` by Horner's rule.
    pub fn polynomial(&mut self, x: &Value, c: &[f64]) -> Value {
        let mut acc = self.c(0.0);
        for &ck in c.iter().rev() {
            let t = self.mul(&acc, x);
            let ck = self.c(ck);
            acc = self.add(&t, &ck);
        }
        acc
    }

    /// `Σ c_k x^{-k}` by Horner's rule.
    pub fn series_in_inverse(&mut self, x: &Value, c: &[f64]) -> Value {
        let one = self.c(1.0);
        let inv = self.bin("stablehlo.divide", &one, x);
        let mut acc = self.c(0.0);
        for &ck in c.iter().rev() {
            let t = self.mul(&acc, &inv);
            let ck = self.c(ck);
            acc = self.add(&t, &ck);
        }
        acc
    }
}
