//! `fft`: the discrete Fourier transform over a tensor's trailing one to
//! three dims, as `stablehlo.fft` computes it. `kind` picks the transform:
//! `fft` and `ifft` (complex to complex), `rfft` (real to the half spectrum)
//! and `irfft` (half spectrum to real); `lengths` are the signal lengths.
//! Forward transforms are unscaled and inverse ones scaled by `1/N`, as in
//! NumPy; the facade handles `n`, `dim` and `norm` around this op.

use ndarray::{ArrayD, Axis, Slice};
#[cfg(feature = "conformance")]
use tpu_core::Shape;
use tpu_core::host::{HostTensor, Tolerance};
use tpu_core::op::{Arity, Attrs, OpResult, Tape, Torch, Var, VjpArgs};
#[cfg(feature = "conformance")]
use tpu_core::op::{Gen, Sample};
use tpu_core::stablehlo::{TensorType, i64_array};
use tpu_core::{Complex, DType, invalid, op_def};

use crate::support::*;

/// The four transforms `stablehlo.fft` computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fft,
    Ifft,
    Rfft,
    Irfft,
}

impl Kind {
    fn parse(attrs: &Attrs) -> OpResult<Kind> {
        Ok(match attrs.str_or("kind", "fft")? {
            "fft" => Kind::Fft,
            "ifft" => Kind::Ifft,
            "rfft" => Kind::Rfft,
            "irfft" => Kind::Irfft,
            other => {
                return Err(invalid!(
                    "kind must be fft, ifft, rfft or irfft, got {other:?}"
                ));
            }
        })
    }

    fn keyword(self) -> &'static str {
        match self {
            Kind::Fft => "FFT",
            Kind::Ifft => "IFFT",
            Kind::Rfft => "RFFT",
            Kind::Irfft => "IRFFT",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Fft => "fft",
            Kind::Ifft => "ifft",
            Kind::Rfft => "rfft",
            Kind::Irfft => "irfft",
        }
    }
}

/// The transform, its signal lengths and the output type, checked.
fn plan(inputs: &[TensorType], attrs: &Attrs) -> OpResult<(Kind, Vec<usize>, TensorType)> {
    let x = inputs.first().ok_or("missing input")?;
    let kind = Kind::parse(attrs)?;
    let lengths = attrs.ints("lengths")?;
    let rank = x.shape.rank();
    if lengths.is_empty() || lengths.len() > 3 || lengths.len() > rank {
        return Err(invalid!(
            "lengths {lengths:?} must name 1 to 3 trailing dims of a rank-{rank} input"
        ));
    }
    if let Some(bad) = lengths.iter().find(|&&n| n < 1) {
        return Err(invalid!("signal length {bad} must be at least 1"));
    }
    let lengths: Vec<usize> = lengths.iter().map(|&n| n as usize).collect();
    let lead = rank - lengths.len();
    let last = lengths[lengths.len() - 1];
    let mut expected = lengths.clone();
    let (accepted, dtype) = match kind {
        Kind::Fft | Kind::Ifft => (COMPLEX, x.dtype),
        Kind::Rfft => (
            &[DType::F32, DType::F64][..],
            x.dtype.complex_of().unwrap_or(x.dtype),
        ),
        Kind::Irfft => {
            expected[lengths.len() - 1] = last / 2 + 1;
            (COMPLEX, x.dtype.real_part())
        }
    };
    require_dtype(x.dtype, accepted, "input")?;
    if x.shape.dims()[lead..] != expected[..] {
        return Err(invalid!(
            "{} of lengths {lengths:?} takes trailing dims {expected:?}, got {}",
            kind.name(),
            x.shape
        ));
    }
    let mut out = x.shape.dims().to_vec();
    out[rank - 1] = match kind {
        Kind::Rfft => last / 2 + 1,
        Kind::Irfft => last,
        _ => out[rank - 1],
    };
    Ok((kind, lengths, TensorType::new(dtype, out)))
}

/// The DFT of each lane of `a` along `axis`, of length `n` (`inverse`:
/// with the conjugate kernel and scaled by `1/n`).
fn dft_along(a: &ArrayD<Complex<f64>>, axis: usize, inverse: bool) -> ArrayD<Complex<f64>> {
    let n = a.shape()[axis];
    let sign = if inverse { 1.0 } else { -1.0 };
    // Twiddles by exact index arithmetic: `e^{±2πi (jk mod n)/n}`.
    let twiddle: Vec<Complex<f64>> = (0..n.max(1))
        .map(|m| Complex::from_polar(1.0, sign * std::f64::consts::TAU * m as f64 / n as f64))
        .collect();
    let mut out = a.clone();
    for (lane, mut dest) in a
        .lanes(Axis(axis))
        .into_iter()
        .zip(out.lanes_mut(Axis(axis)))
    {
        for k in 0..n {
            let mut s = Complex::new(0.0, 0.0);
            for (j, &v) in lane.iter().enumerate() {
                s += v * twiddle[(j * k) % n];
            }
            dest[k] = if inverse { s / n as f64 } else { s };
        }
    }
    out
}

/// The full spectrum of length `n` along `axis` from its first `n/2 + 1`
/// bins, each later bin the conjugate of its mirror (a real signal's).
fn hermitian(a: &ArrayD<Complex<f64>>, axis: usize, n: usize) -> ArrayD<Complex<f64>> {
    let mut shape = a.shape().to_vec();
    shape[axis] = n;
    let mut out = ArrayD::zeros(shape);
    for (lane, mut dest) in a
        .lanes(Axis(axis))
        .into_iter()
        .zip(out.lanes_mut(Axis(axis)))
    {
        for k in 0..n {
            dest[k] = if k < lane.len() {
                lane[k]
            } else {
                lane[n - k].conj()
            };
        }
    }
    out
}

fn fft_ref(x: &[HostTensor], attrs: &Attrs) -> OpResult<Vec<HostTensor>> {
    let x = one(x)?;
    let (kind, lengths, out) = plan(&[x.ty()], attrs)?;
    let rank = x.dims().len();
    let dims: Vec<usize> = (rank - lengths.len()..rank).collect();
    let mut a = x.to_complex();
    let values = match kind {
        Kind::Fft | Kind::Ifft => {
            for &d in &dims {
                a = dft_along(&a, d, kind == Kind::Ifft);
            }
            HostTensor::complex(out.dtype, a)
        }
        Kind::Rfft => {
            for &d in &dims {
                a = dft_along(&a, d, false);
            }
            let half = out.shape.dims()[rank - 1];
            let kept = a
                .slice_axis(Axis(rank - 1), Slice::from(0..half))
                .to_owned();
            HostTensor::complex(out.dtype, kept)
        }
        Kind::Irfft => {
            for &d in &dims[..dims.len() - 1] {
                a = dft_along(&a, d, true);
            }
            let full = hermitian(&a, rank - 1, lengths[lengths.len() - 1]);
            let signal = dft_along(&full, rank - 1, true);
            HostTensor::float(out.dtype, signal.mapv(|v| v.re))
        }
    };
    Ok(vec![values])
}

fn fft_call(t: &mut dyn Tape, x: Var, kind: &str, lengths: &[usize]) -> OpResult<Var> {
    let lengths: Vec<i64> = lengths.iter().map(|&n| n as i64).collect();
    let attrs = Attrs::new().with("kind", kind).with("lengths", lengths);
    t.call1("fft", &[x], attrs)
}

/// The adjoint of each transform under the real inner product, where a
/// forward DFT's adjoint is `N` times the inverse one: `fft` gives
/// `N ifft(g)`, `ifft` gives `fft(g) / N`; `rfft` pads the half spectrum's
/// cotangent with zeros and takes the real part of `N ifft`; `irfft` is
/// `rfft(g) / N` with the bins that stand for two (a bin and its mirror)
/// doubled, as PyTorch's backward does.
fn fft_vjp(t: &mut dyn Tape, a: &VjpArgs<'_>) -> OpResult<Vec<Option<Var>>> {
    let input = t.ty(a.inputs[0])?;
    let (kind, lengths, _) = plan(std::slice::from_ref(&input), a.attrs)?;
    let total: usize = lengths.iter().product();
    let n = total as f64;
    let g = a.grads[0];
    let last = input.shape.rank() - 1;
    let grad = match kind {
        Kind::Fft => {
            let x = fft_call(t, g, "ifft", &lengths)?;
            t.scale(x, n)?
        }
        Kind::Ifft => {
            let x = fft_call(t, g, "fft", &lengths)?;
            t.scale(x, 1.0 / n)?
        }
        Kind::Rfft => {
            let half = t.ty(g)?.shape.dims()[last];
            let missing = lengths[lengths.len() - 1] - half;
            let padded = t.call1(
                "pad",
                &[g],
                Attrs::new().with("pad", vec![0, missing as i64]),
            )?;
            let x = fft_call(t, padded, "ifft", &lengths)?;
            let x = t.scale(x, n)?;
            let x = t.call1("real", &[x], Attrs::new())?;
            t.cast(x, input.dtype)?
        }
        Kind::Irfft => {
            let x = fft_call(t, g, "rfft", &lengths)?;
            let x = t.scale(x, 1.0 / n)?;
            let bins = input.shape.dims()[last];
            let mirrored = lengths[lengths.len() - 1] - bins;
            if mirrored == 0 {
                x
            } else {
                let part = |t: &mut dyn Tape, start: usize, length: usize| {
                    let attrs = Attrs::new()
                        .with("dim", last as i64)
                        .with("start", start as i64)
                        .with("length", length as i64);
                    t.call1("narrow", &[x], attrs)
                };
                let dc = part(t, 0, 1)?;
                let middle = part(t, 1, mirrored)?;
                let middle = t.scale(middle, 2.0)?;
                let rest = part(t, 1 + mirrored, bins - 1 - mirrored)?;
                let attrs = Attrs::new().with("dim", last as i64);
                t.call1("concat", &[dc, middle, rest], attrs)?
            }
        }
    };
    Ok(vec![Some(grad)])
}

/// A transform of random kind over 1 to 3 trailing dims of odd, even and
/// unit lengths, sometimes under a batch dim.
#[cfg(feature = "conformance")]
fn fft_sample(g: &mut Gen) -> Sample {
    let kind = g.pick(&["fft", "ifft", "rfft", "irfft"]);
    let count = 1 + g.below(3);
    let lengths: Vec<usize> = (0..count)
        .map(|_| 1 + g.below(if count == 1 { 12 } else { 6 }))
        .collect();
    let mut dims: Vec<usize> = (0..g.below(2)).map(|_| 1 + g.below(3)).collect();
    dims.extend(&lengths);
    let last = dims.len() - 1;
    let dtype = match kind {
        "rfft" => g.pick(&[DType::F32, DType::F64]),
        _ => g.pick(COMPLEX),
    };
    if kind == "irfft" {
        dims[last] = lengths[count - 1] / 2 + 1;
    }
    let x = g.tensor_in(dtype, &Shape::new(dims), -2.0, 2.0);
    let lengths: Vec<i64> = lengths.iter().map(|&n| n as i64).collect();
    Sample::new(
        vec![x],
        Attrs::new().with("kind", kind).with("lengths", lengths),
    )
}

inventory::submit! {
    op_def! {
        name: "fft",
        arity: Arity::Exactly(1),
        dtypes: &[DType::C64, DType::C128, DType::F32, DType::F64],
        infer: |x, attrs| Ok(vec![plan(x, attrs)?.2]),
        lower: |b, x, attrs| {
            let (kind, lengths, out) = plan(&[x[0].ty().clone()], attrs)?;
            let attrs = format!(
                "fft_type = #stablehlo<fft_type {}>, fft_length = {}",
                kind.keyword(),
                i64_array(lengths.iter().map(|&n| n as i64))
            );
            Ok(vec![b.op1("stablehlo.fft", &[&x[0]], &attrs, out)])
        },
        reference: fft_ref,
        vjp: Some(fft_vjp),
        // A bin sums N products: errors grow with the signal's size.
        tolerance: |d| Tolerance::for_dtype(d).scaled(20.0),
        samples: || (0..16).map(|i| fft_sample(&mut Gen::new(i))).collect(),
        arbitrary: fft_sample,
        torch: Torch::Expr(r#"{"fft": torch.fft.fftn, "ifft": torch.fft.ifftn, "rfft": torch.fft.rfftn, "irfft": torch.fft.irfftn}[a["kind"]](x[0], s=a["lengths"], dim=list(range(-len(a["lengths"]), 0)))"#),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_impulse_has_a_flat_spectrum_and_comes_back() {
        let x = HostTensor::from_f64(DType::F64, [4], vec![1.0, 0.0, 0.0, 0.0]).unwrap();
        let rfft = Attrs::new()
            .with("kind", "rfft")
            .with("lengths", vec![4i64]);
        let spectrum = fft_ref(std::slice::from_ref(&x), &rfft).unwrap().remove(0);
        assert_eq!(spectrum.dims(), &[3]);
        assert!(
            spectrum
                .to_complex()
                .iter()
                .all(|v| (v - Complex::new(1.0, 0.0)).norm() < 1e-15)
        );
        let irfft = Attrs::new()
            .with("kind", "irfft")
            .with("lengths", vec![4i64]);
        let back = fft_ref(&[spectrum], &irfft).unwrap().remove(0);
        tpu_core::host::assert_close(&back, &x, Tolerance::new(1e-15, 0.0)).unwrap();
    }

    #[test]
    fn shapes_that_do_not_fit_the_lengths_are_refused() {
        let attrs = Attrs::new()
            .with("kind", "irfft")
            .with("lengths", vec![8i64]);
        let err = plan(&[TensorType::new(DType::C64, [4])], &attrs).unwrap_err();
        assert!(err.message.contains("trailing dims [5]"), "{}", err.message);
        let attrs = Attrs::new()
            .with("kind", "rfft")
            .with("lengths", vec![4i64]);
        assert!(plan(&[TensorType::new(DType::C64, [4])], &attrs).is_err());
    }
}
