//! Comparing a result against its reference within a tolerance.

use super::{HostData, HostTensor};
use crate::DType;

/// How far a result may be from its reference: `|a - e| <= atol + rtol * |e|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

impl Tolerance {
    /// Exact equality.
    pub const EXACT: Tolerance = Tolerance {
        atol: 0.0,
        rtol: 0.0,
    };

    /// A tolerance from its parts.
    pub const fn new(atol: f64, rtol: f64) -> Tolerance {
        Tolerance { atol, rtol }
    }

    /// The default for `dtype`: a few ulps for floats, exact for integers.
    pub fn for_dtype(dtype: DType) -> Tolerance {
        match dtype {
            DType::F64 | DType::C128 => Tolerance::new(1e-12, 1e-12),
            DType::F32 | DType::C64 => Tolerance::new(1e-5, 1e-5),
            DType::F16 => Tolerance::new(1e-3, 2e-3),
            DType::BF16 => Tolerance::new(1e-2, 1.6e-2),
            _ => Tolerance::EXACT,
        }
    }

    /// Scales both parts by `factor`.
    pub fn scaled(self, factor: f64) -> Tolerance {
        Tolerance::new(self.atol * factor, self.rtol * factor)
    }
}

/// Checks `actual` against `expected`: same dtype and shape, NaN where NaN,
/// infinities equal, everything else within `tol`. The error names the worst
/// element.
pub fn assert_close(
    actual: &HostTensor,
    expected: &HostTensor,
    tol: Tolerance,
) -> Result<(), String> {
    if actual.dtype() != expected.dtype() || actual.dims() != expected.dims() {
        return Err(format!("got {}, expected {}", actual.ty(), expected.ty()));
    }
    match (actual.data(), expected.data()) {
        (HostData::Int(a), HostData::Int(e)) => {
            match a.iter().zip(e.iter()).position(|(x, y)| x != y) {
                None => Ok(()),
                Some(i) => Err(format!(
                    "element {i}: got {}, expected {}",
                    a.iter().nth(i).copied().unwrap_or_default(),
                    e.iter().nth(i).copied().unwrap_or_default()
                )),
            }
        }
        (HostData::Float(a), HostData::Float(e)) => {
            let mut worst: Option<(usize, f64, f64, f64)> = None;
            for (i, (&x, &y)) in a.iter().zip(e.iter()).enumerate() {
                let ok = if y.is_nan() {
                    x.is_nan()
                } else if y.is_infinite() {
                    x == y
                } else {
                    (x - y).abs() <= tol.atol + tol.rtol * y.abs()
                };
                if !ok {
                    let err = if x.is_nan() {
                        f64::INFINITY
                    } else {
                        (x - y).abs()
                    };
                    if worst.is_none_or(|w| err > w.3) {
                        worst = Some((i, x, y, err));
                    }
                }
            }
            match worst {
                None => Ok(()),
                Some((i, x, y, err)) => Err(format!(
                    "element {i}: got {x}, expected {y} (error {err:e}, tolerance atol {:e} rtol {:e})",
                    tol.atol, tol.rtol
                )),
            }
        }
        (HostData::Complex(a), HostData::Complex(e)) => {
            // Each part on its own, as PyTorch's `assert_close` compares
            // complex tensors.
            let parts = |z: &ndarray::ArrayD<num_complex::Complex<f64>>, re: bool| {
                HostTensor::float(
                    actual.dtype().real_part(),
                    z.mapv(|v| if re { v.re } else { v.im }),
                )
            };
            assert_close(&parts(a, true), &parts(e, true), tol)
                .map_err(|m| format!("real part: {m}"))?;
            assert_close(&parts(a, false), &parts(e, false), tol)
                .map_err(|m| format!("imaginary part: {m}"))
        }
        _ => Err("float, integer and complex data do not compare".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_inf_and_tolerance() {
        let e = HostTensor::from_f64(DType::F32, [4], vec![1.0, f64::NAN, f64::INFINITY, -2.0])
            .unwrap();
        let a = HostTensor::from_f64(
            DType::F32,
            [4],
            vec![1.000001, f64::NAN, f64::INFINITY, -2.0],
        )
        .unwrap();
        assert!(assert_close(&a, &e, Tolerance::for_dtype(DType::F32)).is_ok());
        let far = HostTensor::from_f64(DType::F32, [4], vec![1.1, f64::NAN, f64::INFINITY, -2.0])
            .unwrap();
        let err = assert_close(&far, &e, Tolerance::for_dtype(DType::F32)).unwrap_err();
        assert!(err.contains("element 0"), "{err}");
        let nan =
            HostTensor::from_f64(DType::F32, [4], vec![1.0, 0.0, f64::INFINITY, -2.0]).unwrap();
        assert!(assert_close(&nan, &e, Tolerance::new(1.0, 1.0)).is_err());
    }

    #[test]
    fn dtypes_round_and_wrap() {
        let t = HostTensor::from_i64(DType::U8, [2], vec![256, -1]).unwrap();
        assert_eq!(t.to_i64().into_raw_vec_and_offset().0, vec![0, 255]);
        let f = HostTensor::from_f64(DType::BF16, [1], vec![1.0 + 1.0 / 512.0]).unwrap();
        assert_eq!(f.to_f64()[[0]], 1.0);
        let back = HostTensor::from_buffer(&f.to_buffer());
        assert_eq!(back, f);
        let cast = HostTensor::from_f64(DType::F32, [3], vec![-1.7, 0.0, 2.9])
            .unwrap()
            .cast(DType::I32);
        assert_eq!(cast.to_i64().into_raw_vec_and_offset().0, vec![-1, 0, 2]);
        assert_eq!(
            HostTensor::from_f64(DType::F32, [2], vec![0.0, 0.5])
                .unwrap()
                .cast(DType::Bool)
                .to_i64()
                .into_raw_vec_and_offset()
                .0,
            vec![0, 1]
        );
    }
}
