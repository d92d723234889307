"""The symmetric-indefinite factorization ``A = L D Lᵀ`` with Bunch-Kaufman
pivoting, and solves with it, in LAPACK's compact form (``sytrf`` /
``sytrs`` with the lower triangle) so the factors and pivots equal the
CPU's. Each elimination step reads a column or two to the host to choose
its pivot (the choice depends on the values); the arithmetic runs on the
device."""

import math

import torch

from .linalg import _float, _square
from .registry import kernel

#: Bunch-Kaufman's threshold for taking a 1x1 pivot: (1 + √17) / 8.
_ALPHA = (1 + math.sqrt(17)) / 8


def _lower(t):
    """A symmetric matrix from the lower triangle of ``t`` (the half LAPACK
    computes; the other half would round differently)."""
    low = torch.tril(t)
    return low + torch.tril(t, -1).mT


def _swap(t, i, j, dims=(0,)):
    """``t`` with entries ``i`` and ``j`` exchanged along each of ``dims``
    (rows; rows and columns with ``dims=(0, 1)``)."""
    if i == j:
        return t
    order = list(range(t.shape[dims[0]]))
    order[i], order[j] = j, i
    index = torch.tensor(order, device=t.device)
    for d in dims:
        t = t.index_select(d, index)
    return t


def _first_max(values):
    """The index and value of the first largest entry (BLAS's ``idamax``)."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best, values[best]


def _factor(a):
    """One matrix's ``(LD, pivots, info)``: LAPACK ``sytf2``'s lower form."""
    n = a.shape[0]
    t = _lower(a)
    columns, pivots, info, k = [], [0] * n, 0, 0
    while k < n:
        magnitudes = t[:, 0].abs().tolist()
        absakk = magnitudes[0]
        imax, colmax = (_first_max(magnitudes[1:]) if n - k > 1 else (-1, 0.0))
        imax += 1
        step, pivot = 1, 0
        singular = max(absakk, colmax) == 0 or math.isnan(absakk)
        if singular:
            # No pivot and no elimination: LAPACK notes the step and goes on.
            info = info or k + 1
        elif absakk < _ALPHA * colmax:
            row = t[:, imax].abs().tolist()
            rowmax = max(v for j, v in enumerate(row) if j != imax)
            if absakk >= _ALPHA * colmax * (colmax / rowmax):
                pass
            elif row[imax] >= _ALPHA * rowmax:
                pivot = imax
            else:
                pivot, step = imax, 2
        t = _swap(t, step - 1, pivot, dims=(0, 1))
        if step == 1:
            pivots[k] = k + pivot + 1
            if singular:
                columns.append(t[:, 0])
                t = t[1:, 1:]
            else:
                inv = 1 / t[0, 0]
                v = t[1:, 0]
                columns.append(torch.cat([t[:1, 0], v * inv]))
                t = _lower(t[1:, 1:] - torch.outer(v, v * inv))
        else:
            pivots[k] = pivots[k + 1] = -(k + pivot + 1)
            d21 = t[1, 0]
            d11, d22 = t[1, 1] / d21, t[0, 0] / d21
            scale = (1 / (d11 * d22 - 1)) / d21
            wk = scale * (d11 * t[2:, 0] - t[2:, 1])
            wkp1 = scale * (d22 * t[2:, 1] - t[2:, 0])
            columns.append(torch.cat([t[:2, 0], wk]))
            columns.append(torch.cat([t[1:2, 1], wkp1]))
            t = _lower(t[2:, 2:] - torch.outer(t[2:, 0], wk) - torch.outer(t[2:, 1], wkp1))
        k += step
    ld = torch.zeros((n, n), dtype=a.dtype, device=a.device)
    if columns:
        ld = torch.stack([torch.cat([torch.zeros(j, dtype=a.dtype, device=a.device), c]) for j, c in enumerate(columns)], 1)
    return ld, pivots, info


@kernel("linalg_ldl_factor_ex")
def linalg_ldl_factor_ex(self, hermitian=False, check_errors=False):
    _square(self, "linalg.ldl_factor_ex")
    _float(self, "linalg.ldl_factor_ex")
    batch, n = self.shape[:-2], self.shape[-1]
    flat = self.reshape(batch.numel(), n, n)
    results = [_factor(flat[i]) for i in range(flat.shape[0])]
    ld = torch.stack([r[0] for r in results]) if results else torch.zeros_like(flat)
    pivots = torch.tensor([r[1] for r in results], dtype=torch.int32).reshape(batch + (n,)).to(self.device)
    info = torch.tensor([r[2] for r in results], dtype=torch.int32).reshape(batch).to(self.device)
    if check_errors and bool((info != 0).any()):
        raise torch.linalg.LinAlgError(f"linalg.ldl_factor_ex: the factorization could not be completed (info = {info.tolist()}) (tpu)")
    return ld.reshape(self.shape), pivots, info


def _solve(ld, pivots, b):
    """One system's solution from its compact factors (LAPACK ``sytrs``,
    lower): ``L D`` forwards, then ``Lᵀ`` backwards, applying the
    interchanges as they were made."""
    n = ld.shape[0]
    k = 0
    while k < n:
        if pivots[k] > 0:
            b = _swap(b, k, pivots[k] - 1)
            below = b[k + 1:] - torch.outer(ld[k + 1:, k], b[k])
            b = torch.cat([b[:k], (b[k] / ld[k, k]).unsqueeze(0), below])
            k += 1
        else:
            b = _swap(b, k + 1, -pivots[k] - 1)
            below = b[k + 2:] - torch.outer(ld[k + 2:, k], b[k]) - torch.outer(ld[k + 2:, k + 1], b[k + 1])
            d21 = ld[k + 1, k]
            d11, d22 = ld[k, k] / d21, ld[k + 1, k + 1] / d21
            denom = d11 * d22 - 1
            b1, b2 = b[k] / d21, b[k + 1] / d21
            pair = torch.stack([(d22 * b1 - b2) / denom, (d11 * b2 - b1) / denom])
            b = torch.cat([b[:k], pair, below])
            k += 2
    k = n - 1
    while k >= 0:
        if pivots[k] > 0:
            row = b[k] - ld[k + 1:, k] @ b[k + 1:]
            b = _swap(torch.cat([b[:k], row.unsqueeze(0), b[k + 1:]]), k, pivots[k] - 1)
            k -= 1
        else:
            rows = torch.stack([b[k - 1] - ld[k + 1:, k - 1] @ b[k + 1:], b[k] - ld[k + 1:, k] @ b[k + 1:]])
            b = _swap(torch.cat([b[:k - 1], rows, b[k + 1:]]), k, -pivots[k] - 1)
            k -= 2
    return b


@kernel("linalg_ldl_solve")
def linalg_ldl_solve(LD, pivots, B, *, hermitian=False):
    _square(LD, "linalg.ldl_solve")
    n = LD.shape[-1]
    if B.shape[-2] != n:
        raise RuntimeError(f"linalg.ldl_solve: B has {B.shape[-2]} rows, the factors are {n}x{n} (tpu)")
    batch = torch.broadcast_shapes(LD.shape[:-2], pivots.shape[:-1], B.shape[:-2])
    count = batch.numel()
    ld = LD.expand(batch + (n, n)).reshape(count, n, n)
    piv = pivots.expand(batch + (n,)).reshape(count, n).tolist()
    b = B.to(LD.dtype).expand(batch + B.shape[-2:]).reshape((count,) + B.shape[-2:])
    solved = [_solve(ld[i], piv[i], b[i]) for i in range(b.shape[0])]
    out = torch.stack(solved) if solved else b.clone()
    return out.reshape(batch + B.shape[-2:])
