"""Orthogonal factorizations on the device's ``geqrf``,
``householder_product``, ``qr`` and ``eigh`` ops (XLA's QR and Jacobi
eigensolver), and the SVD built on ``eigh``. Backward passes come from
PyTorch's own formulas over these kernels."""

import math

import torch

from .. import _C
from .linalg import _float, _solve, _square
from .registry import kernel


@kernel("_linalg_eigh")
def linalg_eigh(A, UPLO="L", compute_v=True):
    _square(A, "linalg.eigh")
    _float(A, "linalg.eigh")
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"linalg.eigh: UPLO must be 'L' or 'U', got {UPLO!r} (tpu)")
    # The upper triangle of A is the lower triangle of its transpose.
    lower = A if UPLO == "L" else A.mT
    w, v = _C.run("eigh", [lower.contiguous()], None)
    if not compute_v:
        v = _empty(A)
    return w, v


@kernel("geqrf")
def geqrf(self):
    _float(self, "geqrf")
    if self.ndim < 2:
        raise RuntimeError(f"geqrf: expected a tensor with 2 or more dimensions, got shape {list(self.shape)} (tpu)")
    a, tau = _C.run("geqrf", [self.contiguous()], None)
    return a, tau


def _reflectors(A, tau, cols):
    """``H₀ … H_{k-1}``'s first ``cols`` columns from LAPACK's compact form:
    ``A``'s first ``k`` columns, zero-padded to ``cols``."""
    k = tau.shape[-1]
    a = A[..., :k]
    if cols > k:
        a = torch.nn.functional.pad(a, (0, cols - k))
    batch = torch.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
    a = a.expand(batch + a.shape[-2:]).contiguous()
    tau = tau.to(a.dtype).expand(batch + tau.shape[-1:]).contiguous()
    return _C.run("householder_product", [a, tau], None)[0]


@kernel("linalg_householder_product")
def linalg_householder_product(input, tau):
    _float(input, "linalg.householder_product")
    m, n = input.shape[-2:]
    if m < n or tau.shape[-1] > n:
        raise RuntimeError(
            "linalg.householder_product: expected rows >= columns >= tau's size, got "
            f"{list(input.shape)} and tau {list(tau.shape)} (tpu)"
        )
    return _reflectors(input, tau, n)


@kernel("ormqr")
def ormqr(self, input2, input3, left=True, transpose=False):
    """``Q C``, ``Qᵀ C``, ``C Q`` or ``C Qᵀ`` with ``Q`` the full product
    of the reflectors in ``self`` and ``input2``."""
    _float(self, "ormqr")
    rows = self.shape[-2]
    q = _reflectors(self, input2, rows)
    if transpose:
        q = q.mT
    return q @ input3 if left else input3 @ q


@kernel("linalg_qr")
def linalg_qr(A, mode="reduced"):
    _float(A, "linalg.qr")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.qr: expected a tensor with 2 or more dimensions, got shape {list(A.shape)} (tpu)")
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r} (tpu)")
    q, r = _C.run("qr", [A.contiguous()], {"mode": "complete" if mode == "complete" else "reduced"})
    if mode == "r":
        q = _empty(A)
    return q, r


@kernel("_linalg_svd")
def linalg_svd(A, full_matrices=False, compute_uv=True, driver=None):
    """The SVD from the symmetric eigendecomposition of ``[[0, A], [Aᵀ, 0]]``,
    whose eigenvalues are ``±σ`` (and ``|m - n|`` zeros) with eigenvectors
    ``[u; ±v] / √2``: backward stable like LAPACK's, unlike ``AᵀA``'s."""
    _float(A, "linalg.svd")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.svd: expected a tensor with 2 or more dimensions, got shape {list(A.shape)} (tpu)")
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    if k == 0 or A.numel() == 0:
        return _empty_svd(A, full_matrices, compute_uv)
    zeros_m = torch.zeros(batch + (m, m), dtype=A.dtype, device=A.device)
    zeros_n = torch.zeros(batch + (n, n), dtype=A.dtype, device=A.device)
    h = torch.cat([torch.cat([zeros_m, A], -1), torch.cat([A.mT, zeros_n], -1)], -2)
    w, v = _C.run("eigh", [h.contiguous()], None)
    # The k largest eigenvalues, descending, are the singular values.
    s = w[..., m + n - k:].flip(-1)
    if not compute_uv:
        return _empty(A), s, _empty(A)
    top = v[..., m + n - k:].flip(-1) * math.sqrt(2.0)
    u, vh = top[..., :m, :], top[..., m:, :].mT
    if full_matrices:
        u = _complete(u)
        vh = _complete(vh.mT).mT
    return u.contiguous(), s, vh.contiguous()


def _empty(like):
    """A fresh empty tensor (a kernel's outputs must not alias each other)."""
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _complete(u):
    """``u`` (orthonormal columns) extended to a square orthogonal matrix by
    the trailing columns of its complete QR."""
    m, k = u.shape[-2:]
    if m == k:
        return u
    q, _ = _C.run("qr", [u.contiguous()], {"mode": "complete"})
    return torch.cat([u, q[..., k:]], -1)


def _empty_svd(A, full_matrices, compute_uv):
    m, n = A.shape[-2:]
    k = min(m, n)
    batch = A.shape[:-2]
    s = torch.zeros(batch + (k,), dtype=A.dtype, device=A.device)
    if not compute_uv:
        return _empty(A), s, _empty(A)

    def eye(rows, cols):
        return torch.eye(rows, cols, dtype=A.dtype, device=A.device).expand(batch + (rows, cols)).contiguous()

    if full_matrices:
        return eye(m, m), s, eye(n, n)
    return eye(m, k), s, eye(k, n)


@kernel("linalg_lstsq")
def linalg_lstsq(self, b, rcond=None, *, driver=None):
    """Least squares through QR, for full-rank ``A``: ``R⁻¹ Qᵀ B`` when tall,
    the minimum-norm ``Q R⁻ᵀ B`` (from ``Aᵀ = Q R``) when wide. The extra
    outputs follow the driver, as on the CPU."""
    _float(self, "linalg.lstsq")
    driver = driver or "gelsy"
    if driver not in ("gels", "gelsy", "gelsd", "gelss"):
        raise RuntimeError(f"linalg.lstsq: driver must be one of gels, gelsy, gelsd, gelss, got {driver!r} (tpu)")
    vector = b.ndim == self.ndim - 1
    B = b.unsqueeze(-1) if vector else b
    if self.ndim < 2 or B.shape[-2] != self.shape[-2]:
        raise RuntimeError(
            f"linalg.lstsq: A {list(self.shape)} and B {list(b.shape)} must have the same number of rows (tpu)"
        )
    batch = torch.broadcast_shapes(self.shape[:-2], B.shape[:-2])
    A = self.expand(batch + self.shape[-2:])
    B = B.to(A.dtype).expand(batch + B.shape[-2:])
    m, n = A.shape[-2:]
    if m >= n:
        q, r = _C.run("qr", [A.contiguous()], {"mode": "reduced"})
        x = _solve(r, q.mT @ B, lower=False)
    else:
        q, r = _C.run("qr", [A.mT.contiguous()], {"mode": "reduced"})
        x = q @ _solve(r, B, lower=False, transpose=True)
    residuals = ((A @ x - B) ** 2).sum(-2) if m > n and driver != "gelsy" else _empty(A)
    tol = rcond if rcond is not None and rcond > 0 else torch.finfo(A.dtype).eps * max(m, n)
    singular = driver in ("gelsd", "gelss")
    values = linalg_svd(A, False, False)[1] if singular else _empty(A)
    if driver == "gels":
        rank = torch.empty(0, dtype=torch.int64, device=A.device)
    else:
        scale = values if singular else r.diagonal(dim1=-2, dim2=-1).abs()
        rank = (scale > tol * scale.amax(-1, keepdim=True)).sum(-1)
    return (x.squeeze(-1) if vector else x), residuals, rank, values


@kernel("linalg_matrix_sqrth")
def linalg_matrix_sqrth(A):
    """``V diag(√w) Vᵀ`` from the eigendecomposition of symmetric ``A``."""
    _square(A, "linalg.matrix_sqrth")
    _float(A, "linalg.matrix_sqrth")
    w, v = _C.run("eigh", [A.contiguous()], None)
    return (v * w.sqrt().unsqueeze(-2)) @ v.mT


@kernel("linalg_polar")
def linalg_polar(A):
    """``A = U P`` with ``U`` orthonormal and ``P`` symmetric positive
    semi-definite, from the SVD ``A = W S Vᵀ``: ``U = W Vᵀ``, ``P = V S Vᵀ``."""
    _float(A, "linalg.polar")
    if A.ndim < 2 or A.shape[-2] < A.shape[-1]:
        raise RuntimeError(f"linalg.polar: expected a batch of matrices with rows >= columns, got shape {list(A.shape)} (tpu)")
    w, s, vh = linalg_svd(A, False, True)
    return w @ vh, (vh.mT * s.unsqueeze(-2)) @ vh


#: Taylor terms of the matrix exponential once the matrix is scaled down.
_EXP_TERMS = 18
#: Norms up to which 18 terms leave a truncation error (``r¹⁹ / 19!``) below
#: the dtype's rounding: 3e-8 for f32, 4e-17 for f64.
_EXP_RADIUS = {torch.float32: 3.0, torch.float64: 1.05}


@kernel("linalg_matrix_exp")
def linalg_matrix_exp(A):
    """Scaling and squaring: ``exp(A) = exp(A / 2ˢ)^(2ˢ)`` with the fewest
    halvings that bring the batch's largest 1-norm within the radius where
    the degree-18 Taylor series (Horner's rule) is exact to the dtype's
    precision (each squaring doubles the error). Reading ``s`` is one host
    sync per call."""
    _square(A, "linalg.matrix_exp")
    _float(A, "linalg.matrix_exp")
    n = A.shape[-1]
    if A.numel() == 0:
        return A.clone()
    norm = float(A.abs().sum(-2).amax())
    if not math.isfinite(norm):
        return torch.full_like(A, float("nan"))
    radius = _EXP_RADIUS.get(A.dtype, 1.0)
    s = max(0, math.ceil(math.log2(norm / radius))) if norm > 0 else 0
    x = A / 2.0**s
    eye = torch.eye(n, dtype=A.dtype, device=A.device).expand(A.shape)
    e = eye
    for k in range(_EXP_TERMS, 0, -1):
        e = eye + (x @ e) / k
    for _ in range(s):
        e = e @ e
    return e
