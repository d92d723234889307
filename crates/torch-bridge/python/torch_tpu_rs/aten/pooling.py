"""3-D average pooling and fractional max pooling, built from the 2-D
pooling kernels and strided slices the device already has."""

import itertools

import torch

from .indexing import row_major_strides
from .nn import _per_dim, avg_pool2d, avg_pool2d_backward
from .registry import kernel


def _avg3d_args(kernel_size, stride, padding):
    k = _per_dim(kernel_size, 3)
    return k, _per_dim(stride, 3) if stride else k, _per_dim(padding, 3)


# Average pooling is separable: each window's sum is a sum over depth of
# sums over height and width, and PyTorch's divisor (the window's size in
# the padded input, or its count of real elements) is a product of one
# factor per dim. So a 3-D average is a 2-D average over (H, W) followed by
# a 1-D average over D, each with the same ceil_mode and padding rule; a
# divisor_override divides the plain sums once at the end.


@kernel("avg_pool3d")
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    (kd, kh, kw), (sd, sh, sw), (pd, ph, pw) = _avg3d_args(kernel_size, stride, padding)
    *lead, d, h, w = self.shape
    sums = 1 if divisor_override is not None else None
    planes = avg_pool2d(self.reshape(-1, d, h, w), [kh, kw], [sh, sw], [ph, pw], ceil_mode, count_include_pad, sums)
    oh, ow = planes.shape[-2:]
    depth = planes.reshape(-1, 1, d, oh * ow)
    out = avg_pool2d(depth, [kd, 1], [sd, 1], [pd, 0], ceil_mode, count_include_pad, sums)
    out = out.reshape(*lead, out.shape[-2], oh, ow)
    return out if divisor_override is None else out / divisor_override


@kernel("avg_pool3d_backward")
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """The two stages of the forward, transposed in reverse order (each is
    linear, so the intermediate's values do not matter, only its shape)."""
    (kd, kh, kw), (sd, sh, sw), (pd, ph, pw) = _avg3d_args(kernel_size, stride, padding)
    *lead, d, h, w = self.shape
    od, oh, ow = grad_output.shape[-3:]
    sums = 1 if divisor_override is not None else None
    grad = grad_output if divisor_override is None else grad_output / divisor_override
    depth = torch.zeros((grad.numel() // (od * oh * ow), 1, d, oh * ow), dtype=self.dtype, device=self.device)
    grad = avg_pool2d_backward(grad.reshape(-1, 1, od, oh * ow), depth, [kd, 1], [sd, 1], [pd, 0],
                               ceil_mode, count_include_pad, sums)
    planes = self.reshape(-1, d, h, w)
    grad = avg_pool2d_backward(grad.reshape(-1, d, oh, ow), planes, [kh, kw], [sh, sw], [ph, pw],
                               ceil_mode, count_include_pad, sums)
    return grad.reshape(self.shape)


# ---- Fractional max pooling. ----


def _fractional_starts(sample, size, pool, out):
    """PyTorch's pseudo-random window starts along one dim, for every
    (batch, plane): ``floor((i + u) * alpha) - floor(u * alpha)`` with
    ``alpha = (size - pool) / (out - 1)``, and the last window flush with
    the end. ``sample`` is ``u`` per (batch, plane)."""
    i = torch.arange(out, device=sample.device, dtype=sample.dtype)
    if out == 1:
        return torch.full(sample.shape + (1,), size - pool, dtype=torch.int64, device=sample.device)
    alpha = (size - pool) / (out - 1)
    u = sample.unsqueeze(-1)
    starts = (torch.floor((i + u) * alpha) - torch.floor(u * alpha)).to(torch.int64)
    last = torch.full_like(starts[..., -1:], size - pool)
    return torch.cat([starts[..., :-1], last], -1)


def _fractional_max_pool(self, kernel_size, output_size, random_samples):
    """Each output cell is the maximum of its window and where it is (the
    flat index in the input plane: the first maximum in row-major order,
    or the last NaN, as PyTorch's kernels): one gather per kernel offset,
    compared with the best so far."""
    dims = len(kernel_size)
    batched = self.dim() == dims + 2
    x = self if batched else self.unsqueeze(0)
    n, c, *sizes = x.shape
    for size, k, o in zip(sizes, kernel_size, output_size):
        if o + k - 1 > size:
            raise RuntimeError(
                f"fractional_max_pool{dims}d(): pool size {k} and output size {o} are too large "
                f"for input size {size} (tpu)")
    samples = random_samples.to(x.dtype if x.dtype == torch.float64 else torch.float32)
    # PyTorch's 2-D samples are (w, h); its 3-D ones (t, h, w).
    order = [1, 0] if dims == 2 else [0, 1, 2]
    starts = [_fractional_starts(samples[:n, :, order[d]], sizes[d], kernel_size[d], output_size[d])
              for d in range(dims)]
    flat = x.reshape(n, c, -1)
    strides = row_major_strides(sizes)
    best = where = None
    for offset in itertools.product(*(range(k) for k in kernel_size)):
        index = torch.zeros((n, c) + tuple(output_size), dtype=torch.int64, device=x.device)
        for d in range(dims):
            shape = [n, c] + [1] * dims
            shape[2 + d] = output_size[d]
            index = index + ((starts[d] + offset[d]) * strides[d]).reshape(shape)
        value = flat.gather(2, index.reshape(n, c, -1)).reshape(index.shape)
        if best is None:
            best, where = value, index
            continue
        take = (value > best) | value.isnan()
        best = torch.where(take, value, best)
        where = torch.where(take, index, where)
    if not batched:
        best, where = best.squeeze(0), where.squeeze(0)
    return best, where


@kernel("fractional_max_pool2d", "fractional_max_pool3d")
def fractional_max_pool(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, list(kernel_size), list(output_size), random_samples)


@kernel("fractional_max_pool2d_backward", "fractional_max_pool3d_backward")
def fractional_max_pool_backward(grad_output, self, kernel_size, output_size, indices):
    spatial = len(kernel_size)
    lead = self.shape[: self.dim() - spatial]
    plane = self.shape[self.dim() - spatial:].numel()
    grad = torch.zeros(lead + (plane,), dtype=grad_output.dtype, device=grad_output.device)
    grad = grad.scatter_add(-1, indices.reshape(lead + (-1,)), grad_output.reshape(lead + (-1,)))
    return grad.reshape(self.shape)
