"""LU with partial pivoting on the device's ``lu_factor`` op (LAPACK's
pivots, so PyTorch's too), and what PyTorch builds on it: unpacking,
solves, inverses and determinants. Backward passes come from PyTorch's own
formulas over these kernels."""

import torch

from .. import _C
from .linalg import _float, _solve, _square
from .registry import kernel


def _factor(A, what):
    if A.ndim < 2:
        raise RuntimeError(f"{what}: expected a tensor with 2 or more dimensions, got shape {list(A.shape)} (tpu)")
    _float(A, what)
    lu, pivots = _C.run("lu_factor", [A.contiguous()], None)
    return lu, pivots


def _info(lu):
    """LAPACK's ``info``: the 1-based index of the first zero on ``U``'s
    diagonal, 0 where there is none."""
    diagonal = lu.diagonal(dim1=-2, dim2=-1)
    k = diagonal.shape[-1]
    steps = torch.arange(1, k + 1, device=lu.device, dtype=torch.int32)
    first = torch.where(diagonal == 0, steps, k + 1).amin(-1) if k else torch.zeros(lu.shape[:-2], dtype=torch.int32, device=lu.device)
    return torch.where(first > k, 0, first).to(torch.int32)


def _raise_if_singular(info, what):
    if bool((info > 0).any()):
        k = int(info.flatten()[(info.flatten() > 0).nonzero()[0, 0]])
        raise torch.linalg.LinAlgError(
            f"{what}: the diagonal element {k} is zero, the matrix is singular (tpu)"
        )


def _permutation_matrix(pivots, rows, dtype):
    """``P`` with ``A = P L U`` for LAPACK's ``pivots``."""
    perm = _C.run("lu_pivots_to_permutation", [pivots.to(torch.int32).contiguous()], {"rows": rows})[0]
    ids = torch.arange(rows, device=pivots.device)
    # (Pᵀ)[i, j] = [j == perm[i]].
    return (perm.unsqueeze(-1) == ids).to(dtype).mT


@kernel("linalg_lu_factor_ex")
def linalg_lu_factor_ex(A, *, pivot=True, check_errors=False):
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the tpu device")
    lu, pivots = _factor(A, "linalg.lu_factor")
    info = _info(lu)
    if check_errors:
        _raise_if_singular(info, "linalg.lu_factor")
    return lu, pivots, info


@kernel("lu_unpack")
def lu_unpack(LU_data, LU_pivots, unpack_data=True, unpack_pivots=True):
    m, n = LU_data.shape[-2:]
    k = min(m, n)
    empty = LU_data.new_empty(0)
    if unpack_data:
        eye = torch.eye(m, k, dtype=LU_data.dtype, device=LU_data.device)
        lower = torch.tril(LU_data[..., :, :k], -1) + eye
        upper = torch.triu(LU_data[..., :k, :])
    else:
        lower, upper = empty, LU_data.new_empty(0)
    p = _permutation_matrix(LU_pivots, m, LU_data.dtype) if unpack_pivots else LU_data.new_empty(0)
    return p, lower, upper


@kernel("linalg_lu")
def linalg_lu(A, *, pivot=True):
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the tpu device")
    lu, pivots = _factor(A, "linalg.lu")
    return lu_unpack(lu, pivots)


@kernel("linalg_lu_solve")
def linalg_lu_solve(LU, pivots, B, *, left=True, adjoint=False):
    """``A X = B`` (``Aᵀ`` when ``adjoint``; ``X A`` when not ``left``) for
    ``A = P L U``."""
    _square(LU, "linalg.lu_solve")
    if not left:
        return linalg_lu_solve(LU, pivots, B.mT, left=True, adjoint=not adjoint).mT
    n = LU.shape[-1]
    if B.shape[-2] != n:
        raise RuntimeError(f"linalg.lu_solve: LU {list(LU.shape)} and B {list(B.shape)} have different numbers of rows (tpu)")
    batch = torch.broadcast_shapes(LU.shape[:-2], B.shape[:-2])
    LU = LU.expand(batch + LU.shape[-2:])
    B = B.to(LU.dtype).expand(batch + B.shape[-2:])
    pivots = pivots.expand(batch + pivots.shape[-1:])
    p = _permutation_matrix(pivots, n, LU.dtype)
    if adjoint:
        # Uᵀ Lᵀ Pᵀ X = B.
        z = _solve(LU, B, lower=False, transpose=True)
        w = _solve(LU, z, lower=True, transpose=True, unit=True)
        return p @ w
    y = _solve(LU, p.mT @ B, lower=True, unit=True)
    return _solve(LU, y, lower=False)


def _factor_for_det(A, what):
    """The factorization PyTorch's det and slogdet return for their
    backward formulas: of ``Aᵀ`` when ``A`` is contiguous (as the CPU
    does, to avoid a copy), which those formulas then assume."""
    return _factor(A.mT if A.is_contiguous() else A, what)


def _perm_sign(pivots):
    k = pivots.shape[-1]
    steps = torch.arange(1, k + 1, device=pivots.device, dtype=pivots.dtype)
    swaps = (pivots != steps).sum(-1)
    return 1 - 2 * torch.remainder(swaps, 2)


@kernel("_linalg_det")
def linalg_det(A):
    _square(A, "linalg.det")
    lu, pivots = _factor_for_det(A, "linalg.det")
    det = lu.diagonal(dim1=-2, dim2=-1).prod(-1) * _perm_sign(pivots).to(A.dtype)
    return det, lu, pivots


@kernel("_linalg_slogdet")
def linalg_slogdet(A):
    _square(A, "linalg.slogdet")
    lu, pivots = _factor_for_det(A, "linalg.slogdet")
    diagonal = lu.diagonal(dim1=-2, dim2=-1)
    sign = torch.sign(diagonal).prod(-1) * _perm_sign(pivots).to(A.dtype)
    logabsdet = diagonal.abs().log().sum(-1)
    return sign, logabsdet, lu, pivots


@kernel("linalg_inv_ex")
def linalg_inv_ex(A, *, check_errors=False):
    _square(A, "linalg.inv")
    lu, pivots = _factor(A, "linalg.inv")
    info = _info(lu)
    if check_errors:
        _raise_if_singular(info, "linalg.inv")
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device).expand(A.shape)
    return linalg_lu_solve(lu, pivots, eye), info


@kernel("_linalg_solve_ex")
def linalg_solve_ex(A, B, *, left=True, check_errors=False):
    _square(A, "linalg.solve")
    # B is a batch of vectors when it has one dim fewer than A (or is 1-D),
    # as PyTorch decides it.
    vector = B.ndim == 1 or (left and B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    lu, pivots = _factor(A, "linalg.solve")
    info = _info(lu)
    if check_errors:
        _raise_if_singular(info, "linalg.solve")
    rhs = B.unsqueeze(-1) if vector else B
    x = linalg_lu_solve(lu, pivots, rhs.to(A.dtype), left=left)
    return (x.squeeze(-1) if vector else x), lu, pivots, info
