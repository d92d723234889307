"""Random fills from the device generator (``torch.manual_seed`` seeds it)."""

import torch

from .. import _C
from .registry import raw


def _no_generator(op, generator):
    if generator is not None:
        raise NotImplementedError(
            f"aten::{op} with an explicit generator is not implemented for the tpu device; "
            "seed with torch.manual_seed"
        )


@raw("uniform_")
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    _no_generator("uniform_", generator)
    _C.fill_random("uniform", self, {"low": float(from_), "high": float(to)})
    return self


@raw("normal_")
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    _no_generator("normal_", generator)
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
