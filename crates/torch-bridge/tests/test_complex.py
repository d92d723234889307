"""Complex tensors and torch.fft on tpu against PyTorch's CPU: transforms,
views that alias (``z.real``, ``view_as_real``, ``view_as_complex``), lazy
conjugation, gradients, a Llama-style rotary embedding trained in every
eager mode, ``stft`` -> magnitude -> ``istft``, complex math and Python
complex numbers. Ops not written for
complex numbers must refuse them, never read them as their real parts."""

import pytest
import torch

import torch_tpu_rs  # noqa: F401

from conftest import assert_close

MODES = ["strict", "debug", "defer_and_fuse"]


def pair(*shape, dtype=torch.complex64):
    x = torch.randn(*shape, dtype=dtype)
    return x, x.to("tpu")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_values_round_trip_and_combine(mode, dtype):
    z, t = pair(3, 4, dtype=dtype)
    w, u = pair(4, dtype=dtype)
    assert t.dtype == dtype
    assert_close(t, z)
    assert_close(t + u, z + w)
    assert_close(t * u - t / (u + 3), z * w - z / (w + 3))
    assert_close(-t, -z)
    assert_close(t.abs(), z.abs())
    assert_close(t.angle(), z.angle())
    assert_close(t.conj(), z.conj())
    assert_close(t.real, z.real)
    assert_close(t.imag, z.imag)
    assert_close(torch.polar(t.abs(), t.angle()), torch.polar(z.abs(), z.angle()))
    assert_close(torch.complex(t.real, t.imag), z)
    assert_close(t.sgn(), z.sgn())
    assert_close(torch.cat([t, t.conj()]), torch.cat([z, z.conj()]))
    assert_close(t[1:, ::2], z[1:, ::2])
    assert_close(t.to(torch.float64), z.to(torch.float64))
    assert_close(t.real.to(dtype), z.real.to(dtype))
    assert_close(t.sum(), z.sum())
    assert_close(t.sum(0, keepdim=True), z.sum(0, keepdim=True))
    assert_close(t @ t.mT, z @ z.mT)
    assert_close(t.mH @ t, z.mH @ z)
    assert_close(torch.bmm(t[None], t.mH[None]), torch.bmm(z[None], z.mH[None]))


def test_views_alias_their_complex_storage():
    z, t = pair(3, 4)
    for x in (z, t):
        x.real.add_(1.5)
        x.imag[0].zero_()
        torch.view_as_real(x)[..., 1, 0] = 7.0
    assert_close(t, z)
    r = torch.randn(5, 6, 2)
    s = r.to("tpu")
    for x in (r, s):
        c = torch.view_as_complex(x)
        c.mul_(2)
        c[0] = 0
    assert_close(s, r)
    assert_close(torch.view_as_complex(s), torch.view_as_complex(r))


@pytest.mark.parametrize(
    "expr",
    [
        "torch.fft.fft(x)",
        "torch.fft.fft(x, n=16, dim=0, norm='ortho')",
        "torch.fft.ifft(torch.fft.fft(x), norm='forward')",
        "torch.fft.rfft(x)",
        "torch.fft.irfft(torch.fft.rfft(x), n=11)",
        "torch.fft.hfft(torch.fft.fft(x)[:, :5])",
        "torch.fft.ihfft(x)",
        "torch.fft.fft2(x)",
        "torch.fft.rfft2(x, norm='ortho')",
        "torch.fft.irfft2(torch.fft.rfft2(x), s=(6, 10))",
        "torch.fft.fftn(x.reshape(2, 3, 2, 5))",
        "torch.fft.rfftn(x.reshape(2, 3, 2, 5), dim=(0, 1, 2, 3))",
        "torch.fft.fftshift(torch.fft.fft(x), dim=1)",
        "torch.fft.ifftshift(x)",
    ],
)
def test_transforms_equal_the_cpu(mode, expr):
    x = torch.randn(6, 10)
    t = x.to("tpu")
    assert_close(eval(expr, {"torch": torch, "x": t}), eval(expr, {"torch": torch, "x": x}), atol=2e-5)


def test_gradients_through_transforms_equal_the_cpu(mode):
    x = torch.randn(4, 12, dtype=torch.float64, requires_grad=True)
    t = x.detach().to("tpu").requires_grad_()
    for a in (x, t):
        s = torch.fft.rfft(a, norm="ortho")
        loss = (s * torch.fft.fft(a)[:, :7].conj()).abs().sum() + torch.fft.irfft(s, n=12).pow(2).sum()
        loss = loss + torch.view_as_real(torch.fft.fft2(a)).pow(2).mean()
        loss = loss + (s @ s.mH).abs().sum()
        loss.backward()
    assert_close(t.grad, x.grad, atol=1e-9, rtol=1e-9)


def rotary(x, angles):
    """Llama's rotary embedding, as its reference code writes it."""
    freqs = torch.polar(torch.ones_like(angles), angles)
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs).flatten(-2).type_as(x)


def rotary_losses(device):
    torch.manual_seed(3)
    seq, width = 8, 16
    proj = torch.nn.Linear(width, width).to(device)
    opt = torch.optim.SGD(proj.parameters(), lr=0.1)
    x = torch.randn(2, seq, width).to(device)
    target = torch.randn(2, seq, width).to(device)
    inv = 1.0 / (10000 ** (torch.arange(0, width, 2).float() / width))
    angles = torch.outer(torch.arange(seq).float(), inv).to(device)
    losses = []
    for _ in range(20):
        loss = (rotary(proj(x), angles) - target).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("eager", MODES)
def test_a_rotary_embedding_trains_as_on_the_cpu(eager):
    expected = rotary_losses("cpu")
    assert expected[-1] < 0.9 * expected[0]
    with torch.tpu.set_eager_mode(eager):
        got = rotary_losses("tpu")
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=0)


def test_stft_magnitude_and_istft_equal_the_cpu(mode):
    t = torch.arange(4000) / 8000.0
    signal = torch.sin(2 * torch.pi * 440 * t) + 0.3 * torch.sin(2 * torch.pi * 1250 * t) + 0.05 * torch.randn(4000)
    results = []
    for device in ("cpu", "tpu"):
        s = signal.to(device)
        window = torch.hann_window(256, device=device)
        spec = torch.stft(s, 256, hop_length=64, window=window, return_complex=True)
        back = torch.istft(spec, 256, hop_length=64, window=window, length=4000)
        results.append((spec.abs(), back))
    (mag_cpu, back_cpu), (mag_tpu, back_tpu) = results
    assert_close(mag_tpu, mag_cpu, atol=1e-4, rtol=1e-5)
    assert_close(back_tpu, back_cpu, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(back_cpu, signal, atol=1e-5, rtol=1e-5)


MATH = ["exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tan", "tanh",
        "sigmoid", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "sgn"]


@pytest.mark.parametrize("name", MATH)
def test_complex_math_and_its_gradients_equal_the_cpu(mode, name):
    # Both parts in (0.2, 0.9): off every branch cut of these functions.
    z = torch.complex(torch.rand(3, 5) * 0.7 + 0.2, torch.rand(3, 5) * 0.7 + 0.2).requires_grad_()
    t = z.detach().to("tpu").requires_grad_()
    f = getattr(torch, name)
    out_cpu, out_tpu = f(z), f(t)
    assert out_tpu.dtype == torch.complex64
    assert_close(out_tpu, out_cpu, atol=1e-5, rtol=1e-5)
    g = torch.randn(3, 5, dtype=torch.complex64)
    (grad_cpu,) = torch.autograd.grad(out_cpu, z, g)
    (grad_tpu,) = torch.autograd.grad(out_tpu, t, g.to("tpu"))
    assert_close(grad_tpu, grad_cpu, atol=1e-5, rtol=1e-5)


def test_the_sign_of_real_numbers_has_zero_gradients_as_on_the_cpu(mode):
    x = torch.randn(5, requires_grad=True)
    t = x.detach().to("tpu").requires_grad_()
    torch.sgn(t).sum().backward()
    torch.sgn(x).sum().backward()
    assert_close(t.grad, x.grad)


def test_means_and_python_complex_numbers_equal_the_cpu(mode):
    z, t = pair(4, 6)
    x, y = pair(4, 6, dtype=torch.float32)
    assert_close(t.mean(), z.mean())
    assert_close(t.mean(1, keepdim=True), z.mean(1, keepdim=True))
    for f in (lambda a, b: a * 1j, lambda a, b: b * (0.5 - 2j), lambda a, b: a + 2j - b,
              lambda a, b: torch.exp(1j * b), lambda a, b: (a / (1 + 1j)).to(torch.complex128),
              lambda a, b: a ** 2 + a ** 3, lambda a, b: a ** 0.5 - a ** -1, lambda a, b: a ** (b.abs() + 1)):
        got, want = f(t, y), f(z, x)
        assert got.dtype == want.dtype
        assert_close(got, want)


REDUCTIONS = [
    lambda z: z.prod(), lambda z: z.prod(1, keepdim=True), lambda z: z.cumsum(1), lambda z: z.var(0),
    lambda z: z.std(), lambda z: torch.linalg.vector_norm(z, dim=1), lambda z: torch.vdot(z[0], z[1]),
    lambda z: torch.dot(z[0], z[1].conj()), lambda z: z @ z[0], lambda z: z.tril(-1) + z.triu(1),
    lambda z: torch.where(z.abs() > 1, z, 1j), lambda z: z == z[0], lambda z: z.flip(0)[[2, 0]],
    lambda z: torch.logical_and(z * (z.real > 0), 1j * (z.imag > 0)), lambda z: (z * (z.real > 0)).any(1),
    lambda z: torch.logical_not(z * (z.imag > 0)), lambda z: torch.atan(z),
    lambda z: torch.addcmul(z, z[0], z[1], value=0.5 - 1j), lambda z: torch.addcdiv(z, z[0], z[1] + 4, value=2),
]


@pytest.mark.parametrize("f", REDUCTIONS)
def test_complex_reductions_and_products_equal_the_cpu(mode, f):
    z = torch.randn(4, 4, dtype=torch.complex64)
    assert_close(f(z.to("tpu")), f(z), atol=1e-5, rtol=1e-5)


def test_complex_scalars_and_random_complex_tensors():
    z, t = pair(3)
    assert t[1].item() == z[1].item()
    assert not torch.isnan(t).any().item()
    n = torch.randn(200_000, dtype=torch.complex64, device="tpu")
    # Each part normal with variance 1/2, as on the CPU.
    assert abs(n.real.var().item() - 0.5) < 0.01 and abs(n.imag.var().item() - 0.5) < 0.01
    u = torch.empty(100_000, dtype=torch.complex64, device="tpu").uniform_(2, 3)
    assert 2 <= u.real.min().item() and u.imag.max().item() < 3


@pytest.mark.parametrize(
    "op",
    [
        lambda z: z.sum(dtype=torch.float32),
        lambda z: z < z,
        lambda z: torch.logsumexp(z, 0),
        lambda z: torch.lerp(z, z, 0.5),
        lambda z: torch.linalg.qr(z),
        lambda z: torch.linalg.svd(z),
    ],
)
def test_ops_not_written_for_complex_numbers_refuse_them(op):
    z = torch.randn(1, 1, dtype=torch.complex64).to("tpu")
    with pytest.raises((NotImplementedError, RuntimeError), match="[Cc]omplex|c64"):
        out = op(z)
        if isinstance(out, torch.Tensor):
            out.cpu()
