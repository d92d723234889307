"""Linear algebra built on the device's ``cholesky`` and
``triangular_solve`` ops. Backward passes come from PyTorch's own formulas,
which reduce to these kernels and matrix products."""

import torch

from .. import _C
from .elementwise import run
from .registry import kernel


def _square(A, what):
    if A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"{what}: expected a batch of square matrices, got shape {list(A.shape)} (tpu)")


def _float(A, what):
    if A.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise RuntimeError(f"{what}: expected a floating point tensor, got {A.dtype} (tpu)")


def _batched(a, b):
    """``a`` and ``b`` with their batch dims broadcast to one shape."""
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(batch + a.shape[-2:]), b.expand(batch + b.shape[-2:])


def _solve(a, b, *, lower, left=True, transpose=False, unit=False):
    a, b = _batched(a, b)
    dtype = torch.promote_types(a.dtype, b.dtype)
    attrs = {"lower": lower, "left": left, "transpose_a": transpose, "unit_diagonal": unit}
    return run("triangular_solve", [a.to(dtype).contiguous(), b.to(dtype).contiguous()], attrs)


def _from_lower(a):
    """The symmetric matrix PyTorch factorizes: ``a``'s lower triangle,
    mirrored (the upper triangle is never read)."""
    return torch.tril(a) + torch.tril(a, -1).mT


def _failed_order(a):
    """Per matrix, the order of the first leading minor that is not
    positive definite (0 where the whole matrix is): one factorization of
    each leading block, run only once a factorization has failed."""
    n = a.shape[-1]
    info = torch.zeros(a.shape[:-2], dtype=torch.int32, device=a.device)
    for k in range(n, 0, -1):
        bad = torch.isnan(run("cholesky", [a[..., :k, :k].contiguous()])[..., 0, 0])
        info = torch.where(bad, k, info)
    return info


@kernel("linalg_cholesky_ex")
def linalg_cholesky_ex(self, *, upper=False, check_errors=False):
    _square(self, "linalg.cholesky")
    a = _from_lower(self)
    if self.shape[-1] == 0:
        return self.clone(), torch.zeros(self.shape[:-2], dtype=torch.int32, device=self.device)
    factor = run("cholesky", [a.contiguous()])
    failed = torch.isnan(factor[..., 0, 0]) & ~torch.isnan(a).flatten(-2).any(-1)
    info = _failed_order(a) if bool(failed.any()) else torch.zeros(self.shape[:-2], dtype=torch.int32, device=self.device)
    if check_errors and bool((info > 0).any()):
        k = int(info.flatten()[(info.flatten() > 0).nonzero()[0, 0]])
        raise torch.linalg.LinAlgError(f"linalg.cholesky: the leading minor of order {k} is not positive-definite (tpu)")
    return (factor.mT if upper else factor).contiguous(), info


@kernel("linalg_solve_triangular")
def linalg_solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    return _solve(self, B, lower=not upper, left=left, unit=unitriangular)


@kernel("triangular_solve")
def triangular_solve(self, A, upper=True, transpose=False, unitriangular=False):
    x = _solve(A, self, lower=not upper, transpose=transpose, unit=unitriangular)
    return x, A.clone()


@kernel("_cholesky_solve_helper")
def cholesky_solve_helper(self, A, upper):
    """``A Aᵀ x = b`` for lower ``A`` (``Aᵀ A`` for upper): two solves."""
    y = _solve(A, self, lower=not upper, transpose=upper)
    return _solve(A, y, lower=not upper, transpose=not upper)


@kernel("cholesky_inverse")
def cholesky_inverse(self, upper=False):
    n = self.shape[-1]
    eye = torch.eye(n, dtype=self.dtype, device=self.device).expand(self.shape)
    return cholesky_solve_helper(eye, self, upper)
