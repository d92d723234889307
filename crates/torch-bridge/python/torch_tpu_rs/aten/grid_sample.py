"""Grid sampling (``F.grid_sample``) in 2-D and 3-D: each output point
reads the input at the corners around its source position, weighted, with
PyTorch's padding rules; the backward scatters the gradient back to those
corners and differentiates the weights for the grid."""

import itertools

import torch

from .indexing import row_major_strides
from .registry import kernel

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _reflect(x, low2, high2):
    """``x`` reflected into ``[low2 / 2, high2 / 2]`` (the bounds doubled,
    as PyTorch passes them), and the derivative of that map (±1)."""
    if low2 == high2:
        return torch.zeros_like(x), torch.zeros_like(x)
    low, span = low2 / 2, (high2 - low2) / 2
    shifted = x - low
    sign = torch.where(shifted < 0, -1.0, 1.0).to(x.dtype)
    shifted = shifted.abs()
    flips = torch.floor(shifted / span)
    extra = shifted - flips * span
    even = torch.remainder(flips, 2) == 0
    return torch.where(even, extra + low, span - extra + low), torch.where(even, sign, -sign)


def _clip(x, size):
    """``x`` clamped to ``[0, size - 1]``, and the derivative (0 where
    clamped, as PyTorch sets it)."""
    inside = (x > 0) & (x < size - 1)
    return x.clamp(0, size - 1), inside.to(x.dtype)


def _source_index(coord, size, padding, align_corners):
    """A normalised grid coordinate in ``[-1, 1]`` as a pixel position with
    the padding mode applied, and its derivative with respect to ``coord``
    (PyTorch's ``grid_sampler_compute_source_index_set_grad``)."""
    if align_corners:
        scale = (size - 1) / 2
        x = (coord + 1) * scale
    else:
        scale = size / 2
        x = ((coord + 1) * size - 1) / 2
    slope = torch.full_like(coord, scale)
    if padding == "border":
        x, d = _clip(x, size)
        slope = slope * d
    elif padding == "reflection":
        x, d = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        x, c = _clip(x, size)
        slope = slope * d * c
    return x, slope


class _Corners:
    """The corners each output point reads: flat input index, weight, and
    the weight's derivative along each dim's pixel position."""

    def __init__(self, sizes, grid, mode, padding, align_corners):
        dims = len(sizes)
        sources = [_source_index(grid[..., dims - 1 - d], sizes[d], padding, align_corners) for d in range(dims)]
        self.slopes = [slope for _, slope in sources]
        strides = row_major_strides(sizes)
        # Per dim: (position, weight, d weight / d position) for each neighbour.
        per_dim = []
        for x, _ in sources:
            if mode == "nearest":
                per_dim.append([(torch.round(x), torch.ones_like(x), torch.zeros_like(x))])
            else:
                low = torch.floor(x)
                frac = x - low
                per_dim.append([(low, 1 - frac, -torch.ones_like(x)), (low + 1, frac, torch.ones_like(x))])
        self.items = []
        for picked in itertools.product(*per_dim):
            inside = None
            index = 0
            for d, (at, _, _) in enumerate(picked):
                ok = (at >= 0) & (at <= sizes[d] - 1)
                inside = ok if inside is None else inside & ok
                index = index + at.clamp(0, sizes[d] - 1).to(torch.int64) * strides[d]
            mask = inside.to(grid.dtype)
            weight = mask
            for _, w, _ in picked:
                weight = weight * w
            slopes = []
            for d in range(dims):
                s = mask * picked[d][2]
                for e in range(dims):
                    if e != d:
                        s = s * picked[e][1]
                slopes.append(s)
            self.items.append((index, weight, slopes))


def _check(op, input, grid, mode):
    dims = input.dim() - 2
    if grid.dim() != dims + 2 or grid.shape[-1] != dims or grid.shape[0] != input.shape[0]:
        raise RuntimeError(f"{op}: grid of shape {list(grid.shape)} does not match input {list(input.shape)} (tpu)")
    if mode == "bicubic" and dims == 3:
        raise RuntimeError(f"{op}: bicubic interpolation needs 4-D input (tpu)")


@kernel("grid_sampler_3d")
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    mode = _MODES[int(interpolation_mode)]
    _check("grid_sampler_3d", input, grid, mode)
    n, c, *sizes = input.shape
    flat = input.reshape(n, c, -1)
    out = torch.zeros((n, c) + tuple(grid.shape[1:-1]), dtype=input.dtype, device=input.device)
    for index, weight, _ in _Corners(sizes, grid, mode, _PADDING[int(padding_mode)], align_corners).items:
        values = flat.gather(2, index.reshape(n, 1, -1).expand(n, c, -1)).reshape(out.shape)
        out = out + values * weight.unsqueeze(1)
    return out


@kernel("grid_sampler_2d_backward", "grid_sampler_3d_backward")
def grid_sampler_backward(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    mode = _MODES[int(interpolation_mode)]
    if mode == "bicubic":
        raise NotImplementedError("grid_sampler_2d_backward with bicubic interpolation is not implemented for the tpu device")
    _check("grid_sampler_backward", input, grid, mode)
    n, c, *sizes = input.shape
    corners = _Corners(sizes, grid, mode, _PADDING[int(padding_mode)], align_corners)
    flat = input.reshape(n, c, -1)
    grad = grad_output.reshape(n, c, -1)
    grad_input = torch.zeros_like(flat)
    per_dim = [torch.zeros(grid.shape[:-1], dtype=grid.dtype, device=grid.device) for _ in sizes]
    for index, weight, slopes in corners.items:
        spread = index.reshape(n, 1, -1).expand(n, c, -1)
        grad_input = grad_input.scatter_add(2, spread, grad * weight.reshape(n, 1, -1))
        if mode == "bilinear":
            # Σ_c grad · value: how the output moves with this corner's weight.
            pull = (grad * flat.gather(2, spread)).sum(1).reshape(grid.shape[:-1])
            per_dim = [acc + pull * s for acc, s in zip(per_dim, slopes)]
    # The grid's last dim lists coordinates innermost dim first.
    grad_grid = torch.stack([per_dim[d] * corners.slopes[d] for d in reversed(range(len(sizes)))], -1)
    grad_input = grad_input.reshape(input.shape) if output_mask[0] else None
    return grad_input, grad_grid
