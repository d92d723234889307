"""Adaptive pooling over any number of spatial dims. Output cell ``i`` of a
dim of size ``n`` pooled to ``m`` covers ``[floor(i n / m), ceil((i + 1) n /
m))``, as in PyTorch. Averages contract each dim with an averaging matrix;
maxima gather every window (short windows repeat their last position, which
leaves a maximum unchanged) and reduce."""

import torch

from .indexing import row_major_strides
from .nn import _accumulator
from .registry import kernel


def _windows(n, m):
    """Per output cell, its window's start and end along a dim."""
    return [((i * n) // m, -(-((i + 1) * n) // m)) for i in range(m)]


def _averaging(n, m, dtype, device):
    """The ``(m, n)`` matrix whose row ``i`` averages window ``i``."""
    a = torch.zeros((m, n), dtype=torch.float64)
    for i, (lo, hi) in enumerate(_windows(n, m)):
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a.to(device=device, dtype=dtype)


def _contract(x, sizes, transpose):
    """Contracts each of ``x``'s trailing dims ``j`` with its averaging
    matrix (``A`` forward; ``A^T`` maps gradients back to the input)."""
    dtype = _accumulator(x.dtype)
    y = x.to(dtype)
    d = len(sizes)
    for j, (n, m) in enumerate(sizes):
        a = _averaging(n, m, dtype, x.device)
        dim = y.ndim - d + j
        y = torch.matmul(y.movedim(dim, -1), a if transpose else a.T).movedim(-1, dim)
    return y.to(x.dtype)


def _adaptive_avg(self, output_size):
    d = len(output_size)
    sizes = list(zip(self.shape[-d:], output_size))
    return _contract(self, sizes, transpose=False)


@kernel("_adaptive_avg_pool2d", "adaptive_avg_pool2d")
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg(self, list(output_size))


@kernel("_adaptive_avg_pool3d", "adaptive_avg_pool3d")
def adaptive_avg_pool3d(self, output_size):
    return _adaptive_avg(self, list(output_size))


def _avg_backward(grad_output, self, d):
    sizes = list(zip(self.shape[-d:], grad_output.shape[-d:]))
    return _contract(grad_output, sizes, transpose=True)


@kernel("_adaptive_avg_pool2d_backward")
def adaptive_avg_pool2d_backward(grad_output, self):
    return _avg_backward(grad_output, self, 2)


@kernel("_adaptive_avg_pool3d_backward")
def adaptive_avg_pool3d_backward(grad_output, self):
    return _avg_backward(grad_output, self, 3)


def _gather_index(n, m):
    """``(m, k)`` input positions of each window, short windows padded with
    their last position."""
    wins = _windows(n, m)
    k = max(hi - lo for lo, hi in wins)
    return torch.tensor([[min(lo + j, hi - 1) for j in range(k)] for lo, hi in wins], dtype=torch.int64)


def _adaptive_max(self, output_size):
    d = len(output_size)
    spatial = list(self.shape[-d:])
    lead = list(self.shape[:-d])
    if any(n == 0 for n in spatial) and any(m > 0 for m in output_size):
        raise RuntimeError(f"adaptive_max_pool{d}d: input {list(self.shape)} has an empty spatial dim (tpu)")
    index = [_gather_index(n, m) for n, m in zip(spatial, output_size)]
    y = self
    for j, idx in enumerate(index):
        dim = len(lead) + 2 * j
        y = y.index_select(dim, idx.reshape(-1).to(self.device))
        y = y.unflatten(dim, idx.shape)
    # (lead, o1, k1, o2, k2, ...) -> (lead, o1, o2, ..., k1 k2 ...)
    order = list(range(len(lead))) + [len(lead) + 2 * j for j in range(d)] + [len(lead) + 2 * j + 1 for j in range(d)]
    y = y.permute(order).flatten(len(lead) + d)
    values, arg = torch.max(y, -1)
    # The flat input position of every window entry, for the indices.
    strides = row_major_strides(spatial)
    pos = torch.zeros([m for m in output_size] + [idx.shape[1] for idx in index], dtype=torch.int64)
    for j, idx in enumerate(index):
        shape = [1] * (2 * d)
        shape[j], shape[d + j] = idx.shape
        pos = pos + idx.reshape(shape) * strides[j]
    pos = pos.flatten(d).to(self.device).expand(lead + list(output_size) + [-1])
    indices = torch.gather(pos, -1, arg.unsqueeze(-1)).squeeze(-1)
    return values, indices


def _max_backward(grad_output, self, indices, d):
    lead = list(self.shape[:-d])
    flat = torch.zeros(lead + [self.shape[-d:].numel()], dtype=grad_output.dtype, device=self.device)
    flat = flat.scatter_add(-1, indices.flatten(len(lead)), grad_output.flatten(len(lead)))
    return flat.reshape(self.shape)


@kernel("adaptive_max_pool2d")
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max(self, list(output_size))


@kernel("adaptive_max_pool3d")
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, list(output_size))


@kernel("adaptive_max_pool2d_backward")
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _max_backward(grad_output, self, indices, 2)


@kernel("adaptive_max_pool3d_backward")
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _max_backward(grad_output, self, indices, 3)
