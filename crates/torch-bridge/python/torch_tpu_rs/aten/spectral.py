"""Complex numbers and ``torch.fft`` on the device.

``torch.fft``'s functions trim or pad the signal and then call the three
``_fft_*`` kernels here, which run the device's ``fft`` op over at most
three trailing dims at a time. PyTorch's ``normalization`` codes: 0 leaves
the transform unscaled, 1 scales it by ``1/sqrt(n)``, 2 by ``1/n``. The
device's inverse transforms scale by ``1/n`` themselves, undone here.
Backward passes come from PyTorch's own formulas over these kernels.
"""

import math

import torch

from .elementwise import run
from .registry import kernel


def _scaled(x, factor):
    return x if factor == 1.0 else run("mul", [x, factor], None, x.dtype)


def _normalized(x, n, normalization, inverse):
    """``x``, a transform of ``n`` points the device computed, scaled as
    ``normalization`` asks."""
    factor = {0: 1.0, 1: 1.0 / math.sqrt(n), 2: 1.0 / n}[normalization]
    return _scaled(x, factor * n if inverse else factor)


def _along(x, dims, kind, lengths):
    """The device's ``kind`` transform of ``x`` over ``dims`` (at most
    three), moved last for it and back after."""
    rank = x.dim()
    order = [d for d in range(rank) if d not in dims] + list(dims)
    moved = order != list(range(rank))
    y = x.permute(order) if moved else x
    y = run("fft", [y.contiguous()], {"kind": kind, "lengths": list(lengths)})
    if not moved:
        return y
    back = [0] * rank
    for i, d in enumerate(order):
        back[d] = i
    return y.permute(back)


def _dims(x, dim):
    return [d % x.dim() for d in dim]


def _complex_dtype(dtype):
    return torch.complex128 if dtype in (torch.float64, torch.complex128) else torch.complex64


def _c2c(x, dims, inverse):
    kind = "ifft" if inverse else "fft"
    for i in range(0, len(dims), 3):
        chunk = dims[i:i + 3]
        x = _along(x, chunk, kind, [x.shape[d] for d in chunk])
    return x


@kernel("_fft_c2c", derive=False, complex=True)
def fft_c2c(self, dim, normalization, forward):
    dims = _dims(self, dim)
    if not dims:
        return self.clone()
    n = math.prod(self.shape[d] for d in dims)
    return _normalized(_c2c(self, dims, not forward), n, normalization, not forward)


@kernel("_fft_r2c", derive=False, complex=True)
def fft_r2c(self, dim, normalization, onesided):
    dims = _dims(self, dim)
    n = math.prod(self.shape[d] for d in dims)
    if not onesided:
        # The full spectrum: a complex transform of the real signal.
        x = self.to(_complex_dtype(self.dtype))
        return _normalized(_c2c(x, dims, False), n, normalization, False)
    last = dims[-3:]
    x = _along(self, last, "rfft", [self.shape[d] for d in last])
    return _normalized(_c2c(x, dims[:-3], False), n, normalization, False)


@kernel("_fft_c2r", derive=False, complex=True)
def fft_c2r(self, dim, normalization, last_dim_size):
    dims = _dims(self, dim)
    lengths = [self.shape[d] for d in dims[:-1]] + [last_dim_size]
    expected = last_dim_size // 2 + 1
    if self.shape[dims[-1]] != expected:
        raise RuntimeError(f"_fft_c2r on tpu: a signal of {last_dim_size} points takes "
                           f"{expected} bins along dim {dims[-1]}, got {tuple(self.shape)}")
    x = _c2c(self, dims[:-3], True)
    last = dims[-3:]
    x = _along(x, last, "irfft", lengths[-len(last):])
    return _normalized(x, math.prod(lengths), normalization, True)


@kernel("_conj_physical", complex=True)
def conj_physical(self):
    if not self.is_complex():
        return self.clone()
    if self.is_conj():
        # The values a lazy conjugation stands for are its storage's.
        return self.conj().clone()
    return run("conj", [self])


@kernel("polar", complex=True)
def polar(abs, angle):
    return run("polar", [abs, angle])


@kernel("complex", complex=True)
def complex_(real, imag):
    return run("complex", [real, imag])
