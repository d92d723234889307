"""Random fills from the device generator (``torch.manual_seed`` seeds it)."""

import torch

from .. import _C
from .registry import kernel, raw


def _no_generator(op, generator):
    if generator is not None:
        raise NotImplementedError(
            f"aten::{op} with an explicit generator is not implemented for the tpu device; "
            "seed with torch.manual_seed"
        )


@raw("uniform_", complex=True)
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    _no_generator("uniform_", generator)
    if self.is_complex():
        # Both parts uniform over [from, to), as on the CPU.
        uniform_(torch.view_as_real(self), from_, to)
        return self
    _C.fill_random("uniform", self, {"low": float(from_), "high": float(to)})
    return self


@raw("normal_", complex=True)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    _no_generator("normal_", generator)
    if self.is_complex():
        # Each part normal with half the variance, as on the CPU.
        normal_(torch.view_as_real(self), mean, std / 2 ** 0.5)
        return self
    _C.fill_random("normal", self, {"mean": float(mean), "std": float(std)})
    return self


@raw("bernoulli_.float")
def bernoulli_(self, p=0.5, *, generator=None):
    _no_generator("bernoulli_", generator)
    _C.fill_random("bernoulli", self, {"p": float(p)})
    return self


@raw("random_.from")
def random_from_(self, from_, to=None, *, generator=None):
    _no_generator("random_", generator)
    if to is None:
        raise NotImplementedError("aten::random_ without an upper bound is not implemented for the tpu device")
    # floor(uniform[from, to)) is uniform over the integers in [from, to).
    u = torch.empty(self.shape, dtype=torch.float64, device=self.device)
    _C.fill_random("uniform", u, {"low": float(from_), "high": float(to)})
    self.copy_(torch.floor(u))
    return self


@raw("random_.to")
def random_to_(self, to, *, generator=None):
    return random_from_(self, 0, to, generator=generator)


@raw("bernoulli_.Tensor")
def bernoulli_tensor_(self, p, *, generator=None):
    _no_generator("bernoulli_", generator)
    u = torch.empty(self.shape, dtype=torch.float32, device=self.device)
    _C.fill_random("uniform", u, {"low": 0.0, "high": 1.0})
    self.copy_(u < p.to(self.device))
    return self


@kernel("multinomial")
def multinomial(self, num_samples, replacement=False, *, generator=None):
    """Rows of ``self`` are unnormalised weights. With replacement: inverse
    CDF sampling (``searchsorted`` of uniforms in the running sum); without:
    the Gumbel top-k trick, which draws exactly as successive sampling
    without replacement does."""
    _no_generator("multinomial", generator)
    if self.ndim not in (1, 2) or not self.is_floating_point():
        raise RuntimeError(f"multinomial: expected a 1-d or 2-d float tensor of weights, got {self.dtype} {list(self.shape)} (tpu)")
    w = self if self.ndim == 2 else self.unsqueeze(0)
    if not replacement and num_samples > w.shape[-1]:
        raise RuntimeError(f"multinomial: cannot draw {num_samples} samples from {w.shape[-1]} categories without replacement (tpu)")
    w = w.to(torch.float32)
    if _C.eager_mode() == "debug":
        # Like index bounds, the weights are read back only under Debug.
        host = _C.to_cpu(w)
        if not bool(torch.isfinite(host).all()) or bool((host < 0).any()):
            raise RuntimeError("multinomial: weights must be finite and non-negative (tpu)")
        positive = (host > 0).sum(-1)
        if bool((positive == 0).any()) or (not replacement and bool((positive < num_samples).any())):
            raise RuntimeError(f"multinomial: a row has fewer categories of positive weight than the {num_samples} samples asked for (tpu)")
    if replacement:
        cdf = torch.cumsum(w, -1)
        u = torch.empty((w.shape[0], num_samples), dtype=torch.float32, device=self.device)
        _C.fill_random("uniform", u, {"low": 0.0, "high": 1.0})
        draws = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp(max=w.shape[-1] - 1)
    else:
        u = torch.empty(w.shape, dtype=torch.float32, device=self.device)
        _C.fill_random("uniform", u, {"low": 1e-12, "high": 1.0})
        keys = torch.where(w > 0, torch.log(w) - torch.log(-torch.log(u)), float("-inf"))
        draws = torch.topk(keys, num_samples, dim=-1).indices
    return draws if self.ndim == 2 else draws.squeeze(0)


@kernel("rrelu_with_noise")
def rrelu_with_noise(self, noise, lower=1.0 / 8, upper=1.0 / 3, training=False, generator=None):
    """Training draws each negative input's slope from U(lower, upper) and
    records it in ``noise`` (1 for the others); evaluation uses the mean."""
    _no_generator("rrelu_with_noise", generator)
    if not training:
        return torch.where(self >= 0, self, self * ((lower + upper) / 2))
    slope = torch.empty(self.shape, dtype=self.dtype, device=self.device)
    _C.fill_random("uniform", slope, {"low": float(lower), "high": float(upper)})
    slope = torch.where(self >= 0, torch.ones_like(slope), slope)
    _C.copy_into(noise, slope)
    return self * slope


@raw("randperm.generator_out")
def randperm_out(n, *, generator=None, out):
    """A uniform permutation: the order of ``n`` random 48-bit keys (two
    24-bit draws, so ties are vanishingly rare and every device has the
    integer sort it needs)."""
    _no_generator("randperm", generator)
    draws = torch.empty((2, n), dtype=torch.float32, device=out.device)
    _C.fill_random("uniform", draws, {"low": 0.0, "high": 1.0})
    bits = torch.floor(draws * 2.0**24).to(torch.int64)
    keys = bits[0] * 2**24 + bits[1]
    out.resize_(n)
    _C.copy_into(out, torch.argsort(keys).to(out.dtype))
    return out
