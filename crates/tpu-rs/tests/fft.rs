//! Complex tensors and `torch.fft`'s transforms against PyTorch CPU: every
//! transform with its `n`, `dim` and `norm`, gradients through them, `stft`
//! and `istft`, and a Llama-style rotary embedding written with `polar` and
//! `view_as_complex` trained under every eager mode.

mod torch;

use tpu_rs::nn::{Init, ParamStore};
use tpu_rs::optim::{Optimizer, Sgd};
use tpu_rs::prelude::*;
use tpu_rs::{Complex, Result, Stft};

const ROWS: usize = 3;
const COLS: usize = 10;

/// A real signal with no symmetry, the same on both sides.
fn signal() -> Vec<f32> {
    (0..ROWS * COLS)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
        .collect()
}

/// One of our transforms of `x`.
type Ours = fn(&Tensor) -> Result<Tensor>;

/// The transforms compared: PyTorch's expression over `x`, and ours.
fn cases() -> Vec<(&'static str, Ours)> {
    use FftNorm::*;
    vec![
        ("torch.fft.fft(x)", |x| x.fft(None, -1, Backward)),
        ("torch.fft.fft(x, n=16, norm='ortho')", |x| {
            x.fft(Some(16), -1, Ortho)
        }),
        ("torch.fft.ifft(x, n=2, dim=0, norm='forward')", |x| {
            x.ifft(Some(2), 0, Forward)
        }),
        ("torch.fft.rfft(x)", |x| x.rfft(None, -1, Backward)),
        ("torch.fft.rfft(x, n=7, norm='forward')", |x| {
            x.rfft(Some(7), -1, Forward)
        }),
        ("torch.fft.irfft(torch.fft.rfft(x))", |x| {
            x.rfft(None, -1, Backward)?.irfft(None, -1, Backward)
        }),
        (
            "torch.fft.irfft(torch.fft.rfft(x), n=9, norm='ortho')",
            |x| x.rfft(None, -1, Backward)?.irfft(Some(9), -1, Ortho),
        ),
        ("torch.fft.hfft(torch.fft.fft(x)[:, :4])", |x| {
            x.fft(None, -1, Backward)?
                .narrow(1, 0, 4)?
                .hfft(None, -1, Backward)
        }),
        ("torch.fft.ihfft(x, norm='ortho')", |x| {
            x.ihfft(None, -1, Ortho)
        }),
        ("torch.fft.fftn(x)", |x| x.fftn(None, None, Backward)),
        ("torch.fft.ifftn(x, s=[4, 6], norm='ortho')", |x| {
            x.ifftn(Some(&[4, 6]), None, Ortho)
        }),
        ("torch.fft.rfftn(x, s=[2, 8])", |x| {
            x.rfftn(Some(&[2, 8]), None, Backward)
        }),
        ("torch.fft.rfft2(x, dim=(1, 0))", |x| {
            x.rfftn(None, Some(&[1, 0]), Backward)
        }),
        ("torch.fft.irfftn(torch.fft.rfftn(x), s=[3, 10])", |x| {
            x.rfftn(None, None, Backward)?
                .irfftn(Some(&[3, 10]), None, Backward)
        }),
        ("torch.fft.fftshift(x)", |x| x.fftshift(())),
        ("torch.fft.ifftshift(x, dim=1)", |x| x.ifftshift([1])),
        ("torch.fft.fftfreq(9, 0.5)", |_| {
            Tensor::fftfreq(9, 0.5, DType::F32, Device::Tpu(0))
        }),
        ("torch.fft.rfftfreq(10)", |_| {
            Tensor::rfftfreq(10, 1.0, DType::F32, Device::Tpu(0))
        }),
        ("torch.polar(x.abs(), x).angle()", |x| {
            Tensor::polar(&x.abs()?, x)?.angle()
        }),
        ("torch.view_as_complex(x.reshape(3, 5, 2)).abs()", |x| {
            x.reshape([3, 5, 2])?.view_as_complex()?.abs()
        }),
    ]
}

/// The values of a result as f64s, a complex value as its two parts.
fn flat(t: &Tensor) -> Result<Vec<f64>> {
    if t.dtype().is_complex() {
        t.view_as_real()?.to_f64_vec()
    } else {
        t.to_f64_vec()
    }
}

/// A JSON list of numbers.
fn values_of(json: &serde_json::Value) -> Vec<f64> {
    json.as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect()
}

/// A JSON shape.
fn dims_of(json: &serde_json::Value) -> Vec<usize> {
    values_of(json).iter().map(|&d| d as usize).collect()
}

fn assert_close(what: &str, ours: &[f64], theirs: &[f64], tol: f64) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (a - b).abs() <= tol * (1.0 + b.abs()),
            "{what}: element {i} is {a}, PyTorch {b}"
        );
    }
}

#[test]
fn transforms_equal_pytorch() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    let x = Tensor::from_slice(&signal(), [ROWS, COLS], Device::Tpu(0))?;
    let exprs: Vec<&str> = cases().iter().map(|(e, _)| *e).collect();
    let script = format!(
        "import json, torch\n\
         x = torch.tensor({:?}, dtype=torch.float32).reshape({ROWS}, {COLS})\n\
         out = []\n\
         for e in {:?}:\n    \
             y = eval(e)\n    \
             y = torch.view_as_real(y.resolve_conj()) if y.is_complex() else y\n    \
             out.append([list(y.shape), y.flatten().tolist()])\n\
         print(json.dumps(out))",
        signal(),
        exprs
    );
    let theirs = torch::run_json(&python, &script);
    for ((expr, ours), theirs) in cases().iter().zip(theirs.as_array().expect("a list")) {
        let y = ours(&x)?;
        let mut shape: Vec<usize> = y.dims().to_vec();
        if y.dtype().is_complex() {
            shape.push(2);
        }
        assert_eq!(shape, dims_of(&theirs[0]), "{expr}: shape");
        assert_close(expr, &flat(&y)?, &values_of(&theirs[1]), 1e-5);
    }
    Ok(())
}

#[test]
fn gradients_through_transforms_equal_pytorch() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    // f64 values, so both sides read the same numbers from the script.
    let values: Vec<f64> = signal().iter().map(|&v| f64::from(v)).collect();
    let x = Tensor::from_slice(&values, [ROWS, COLS], Device::Tpu(0))?.with_requires_grad(true);
    // A loss through rfft, an n-D transform, complex products and parts.
    let spectrum = x.rfft(Some(12), -1, FftNorm::Ortho)?;
    let twisted = (&spectrum * &spectrum.conj()?.fftn(None, None, FftNorm::Forward)?)?;
    let loss = (twisted.real()?.sum_all()? + twisted.imag()?.abs()?.sum_all()?)?;
    let gram = spectrum.matmul(&spectrum.conj()?.transpose(0, 1)?)?;
    let loss = (loss + gram.abs()?.sum_all()?)?;
    let back = x.irfft(None, 1, FftNorm::Backward)?;
    let loss = (loss + back.mul(&back)?.sum_all()?)?;
    loss.backward()?;
    let ours = x.grad().expect("a gradient").to_f64_vec()?;
    let script = format!(
        "import json, torch\n\
         x = torch.tensor({:?}, dtype=torch.float64).reshape({ROWS}, {COLS}).requires_grad_()\n\
         s = torch.fft.rfft(x, n=12, norm='ortho')\n\
         t = s * torch.fft.fftn(s.conj(), norm='forward')\n\
         g = s @ s.conj().T\n\
         b = torch.fft.irfft(x, dim=1)\n\
         loss = t.real.sum() + t.imag.abs().sum() + g.abs().sum() + (b * b).sum()\n\
         loss.backward()\n\
         print(json.dumps(x.grad.flatten().tolist()))",
        values
    );
    let theirs: Vec<f64> = torch::run_json(&python, &script)
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_f64().expect("a number"))
        .collect();
    assert_close("d loss / d x", &ours, &theirs, 1e-10);
    Ok(())
}

#[test]
fn complex_values_round_trip_and_print() -> Result<()> {
    let z = [Complex::new(1.5f32, -2.0), Complex::new(0.0, 0.25)];
    let t = Tensor::from_slice(&z, [2], Device::Tpu(0))?;
    assert_eq!(t.dtype(), DType::C64);
    assert_eq!(t.to_vec::<Complex<f32>>()?, z);
    assert_eq!(
        (&t + &t)?.to_vec::<Complex<f32>>()?[0],
        Complex::new(3.0, -4.0)
    );
    let shown = t.to_string();
    assert!(shown.contains("1.5000-2.0000j"), "{shown}");
    // Complex math, and ops written for real numbers refusing complex
    // numbers by name.
    let e = t.exp()?.to_vec::<Complex<f32>>()?;
    assert!(
        (e[0] - z[0].exp()).norm() < 1e-5 * z[0].exp().norm(),
        "{e:?}"
    );
    assert_eq!(t.eq(&t)?.to_vec::<bool>()?, vec![true, true]);
    let err = t.erf().unwrap_err().to_string();
    assert!(err.contains("erf") && err.contains("c64"), "{err}");
    let err = t.rfft(None, -1, FftNorm::Backward).unwrap_err().to_string();
    assert!(err.contains("real tensor"), "{err}");
    // safetensors holds c64 as PyTorch writes it, and has no c128.
    let path =
        std::env::temp_dir().join(format!("tpu-rs-complex-{}.safetensors", std::process::id()));
    tpu_rs::checkpoint::save_tensors(&[("z".into(), t.clone())], &path)?;
    let back = tpu_rs::checkpoint::load_tensors(&path)?;
    let _ = std::fs::remove_file(&path);
    assert_eq!(back["z"].to_complex()[[1]], Complex::new(0.0, 0.25));
    let wide = t.to_dtype(DType::C128)?;
    assert!(tpu_rs::checkpoint::save_tensors(&[("w".into(), wide)], &path).is_err());
    Ok(())
}

/// Llama's rotary embedding: pairs of features read as complex numbers
/// and turned by `e^{i t f}`.
fn rotary(x: &Tensor, angles: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let turns = Tensor::polar(&angles.ones_like()?, angles)?;
    let pairs = x
        .reshape([dims[0] as i64, dims[1] as i64 / 2, 2])?
        .view_as_complex()?;
    let turned = (&pairs * &turns)?;
    turned
        .view_as_real()?
        .reshape([dims[0] as i64, dims[1] as i64])
}

/// The loss after each of 20 SGD steps of a projection followed by a
/// rotary embedding, on `device`.
fn rotary_losses(device: Device) -> Result<Vec<f64>> {
    let (seq, width) = (6usize, 8usize);
    let data = |k: usize| -> Vec<f32> {
        (0..seq * width)
            .map(|i| (((i + k) * 29 % 17) as f32 - 8.0) / 9.0)
            .collect()
    };
    let x = Tensor::from_slice(&data(0), [seq, width], device)?;
    let target = Tensor::from_slice(&data(5), [seq, width], device)?;
    let w0: Vec<f32> = (0..width * width)
        .map(|i| ((i * 13 % 11) as f32 - 5.0) / 20.0)
        .collect();
    let angles: Vec<f32> = (0..seq * width / 2)
        .map(|i| {
            let (t, f) = (i / (width / 2), i % (width / 2));
            t as f32 * 10000f32.powf(-2.0 * f as f32 / width as f32)
        })
        .collect();
    let angles = Tensor::from_slice(&angles, [seq, width / 2], device)?;
    let store = ParamStore::new(device, DType::F32, 0);
    let param = store.root().param("w", [width, width], Init::Zeros)?;
    param.set(&Tensor::from_slice(&w0, [width, width], device)?);
    let mut opt = Sgd::new(store.parameters(), 0.1, 0.0, 0.0);
    let mut losses = Vec::new();
    for _ in 0..20 {
        let y = rotary(&x.matmul(&param.get())?, &angles)?;
        let d = (&y - &target)?;
        let loss = (&d * &d)?.mean_all()?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        losses.push(loss.item()?);
    }
    Ok(losses)
}

#[test]
fn a_rotary_embedding_trains_as_on_the_cpu_in_every_mode() -> Result<()> {
    let expected = rotary_losses(Device::Cpu)?;
    assert!(expected[19] < 0.9 * expected[0], "it learns: {expected:?}");
    for mode in [EagerMode::Strict, EagerMode::Debug, EagerMode::DeferAndFuse] {
        let losses = with_eager_mode(mode, || rotary_losses(Device::Tpu(0)))?;
        for (step, (a, e)) in losses.iter().zip(&expected).enumerate() {
            assert!(
                (a - e).abs() <= 1e-5 * e.abs(),
                "{mode:?} step {step}: loss {a}, cpu {e}"
            );
        }
    }
    Ok(())
}

/// An audio-like signal: two tones and a chirp, `rows` rows of `n` samples.
fn audio(rows: usize, n: usize) -> Vec<f64> {
    (0..rows * n)
        .map(|i| {
            let (r, t) = ((i / n) as f64, (i % n) as f64 / 100.0);
            (7.0 * t + r).sin() + 0.5 * (31.0 * t).cos() + 0.25 * (2.0 * t * t * (r + 1.0)).sin()
        })
        .collect()
}

/// PyTorch's periodic Hann window.
fn hann(n: usize) -> Vec<f64> {
    (0..n)
        .map(|k| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * k as f64 / n as f64).cos())
        .collect()
}

#[test]
fn stft_istft_and_their_gradients_equal_pytorch() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    let (rows, n) = (2, 400);
    let device = Device::Tpu(0);
    let signal = audio(rows, n);
    let x = Tensor::from_slice(&signal, [rows, n], device)?.with_requires_grad(true);
    let w64 = Tensor::from_slice(&hann(64), [64], device)?;
    let w40 = Tensor::from_slice(&hann(40), [40], device)?;
    let framed = Stft::new(64).hop(16);
    let spec = x.stft(Some(&w64), &framed)?;
    let plain = Stft {
        win_length: 40,
        center: false,
        normalized: true,
        onesided: false,
        ..Stft::new(50).hop(10)
    };
    let full = x.narrow(0, 0, 1)?.squeeze([0])?.stft(Some(&w40), &plain)?;
    let zero_padded = Stft {
        reflect: false,
        ..Stft::new(32).hop(8)
    };
    let back = spec.istft(Some(&w64), &framed, Some(n))?;
    let magnitude = x.stft(None, &zero_padded)?.abs()?;
    let loss = (spec.abs()?.sum_all()? + back.mul(&back)?.sum_all()?)?;
    let loss = (loss + magnitude.sum_all()?)?;
    loss.backward()?;
    let script = format!(
        "import json, torch\n\
         x = torch.tensor({signal:?}, dtype=torch.float64).reshape({rows}, {n}).requires_grad_()\n\
         w64 = torch.hann_window(64, dtype=torch.float64)\n\
         w40 = torch.hann_window(40, dtype=torch.float64)\n\
         spec = torch.stft(x, 64, 16, window=w64, return_complex=True)\n\
         full = torch.stft(x[0], 50, 10, 40, window=w40, center=False, normalized=True, onesided=False, return_complex=True)\n\
         back = torch.istft(spec, 64, 16, window=w64, length={n})\n\
         mag = torch.stft(x, 32, 8, pad_mode='constant', return_complex=True).abs()\n\
         loss = spec.abs().sum() + (back * back).sum() + mag.sum()\n\
         loss.backward()\n\
         r = lambda t: torch.view_as_real(t).flatten().tolist() if t.is_complex() else t.flatten().tolist()\n\
         print(json.dumps([[list(t.shape), r(t.detach())] for t in (spec, full, back, mag, x.grad)]))"
    );
    let theirs = torch::run_json(&python, &script);
    let theirs = theirs.as_array().expect("a list");
    let grad = x.grad().expect("a gradient");
    // The gradient of |z| is z / |z|: rounding grows where |z| is small.
    for (what, ours, theirs, tol) in [
        ("stft", &spec, &theirs[0], 1e-10),
        (
            "stft, one-sided off, normalized, uncentred",
            &full,
            &theirs[1],
            1e-10,
        ),
        ("istft", &back, &theirs[2], 1e-10),
        ("|stft| zero-padded", &magnitude, &theirs[3], 1e-10),
        ("d loss / d x", &grad, &theirs[4], 1e-8),
    ] {
        assert_eq!(ours.dims(), &dims_of(&theirs[0])[..], "{what}: shape");
        assert_close(what, &flat(ours)?, &values_of(&theirs[1]), tol);
    }
    // The round trip gives the signal back.
    assert_close("istft(stft(x))", &back.to_f64_vec()?, &signal, 1e-10);
    // Bad arguments are errors naming the call.
    let short = Tensor::from_slice(&[0.5f32; 10], [10], device)?;
    for err in [
        x.stft(Some(&w40), &framed).unwrap_err(),
        short
            .stft(
                None,
                &Stft {
                    center: false,
                    ..Stft::new(64)
                },
            )
            .unwrap_err(),
        short.stft(None, &Stft::new(64)).unwrap_err(),
        short.istft(None, &framed, None).unwrap_err(),
        spec.istft(None, &Stft::new(32), None).unwrap_err(),
    ] {
        let text = err.to_string();
        assert!(text.contains("stft(n_fft="), "{text}");
    }
    Ok(())
}
