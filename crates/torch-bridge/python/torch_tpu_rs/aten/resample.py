"""Anti-aliased resizing and 3-D grid sampling, as weight matrices and
gathers on the device."""

import torch

from .nn import _upsample_backward
from .registry import kernel

# ---- Anti-aliased resizing (``interpolate(..., antialias=True)``). ----


def _triangle(x):
    x = abs(x)
    return 1.0 - x if x < 1.0 else 0.0


def _keys_cubic(x, a=-0.5):
    x = abs(x)
    if x < 1.0:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _source_scale(n_in, n_out, align_corners, scale):
    """PyTorch's input pixels per output pixel (``area_pixel_compute_scale``)."""
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    return 1.0 / scale if scale is not None and scale > 0 else n_in / n_out


def _antialias_weights(n_in, n_out, align_corners, scale, filter_fn, support):
    """The ``[n_out, n_in]`` matrix of one dim's resize: each output pixel
    averages the input pixels under the filter, stretched by the scale when
    shrinking (Pillow's method, which PyTorch follows), normalised to sum 1."""
    scale = _source_scale(n_in, n_out, align_corners, scale)
    stretch = max(scale, 1.0)
    reach = support * stretch
    weights = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - reach + 0.5), 0)
        hi = min(int(center + reach + 0.5), n_in)
        row = [filter_fn((j - center + 0.5) / stretch) for j in range(lo, hi)]
        total = sum(row)
        if hi > lo:
            weights[i, lo:hi] = torch.tensor(row, dtype=torch.float64) / (total if total != 0 else 1.0)
    return weights


def _antialias(filter_fn, support):
    def resize(input, output_size, align_corners, scales_h=None, scales_w=None):
        h, w = input.shape[-2:]
        oh, ow = output_size
        rows = _antialias_weights(h, oh, align_corners, scales_h, filter_fn, support)
        cols = _antialias_weights(w, ow, align_corners, scales_w, filter_fn, support)
        rows, cols = (m.to(device=input.device, dtype=input.dtype) for m in (rows, cols))
        return torch.matmul(torch.matmul(rows, input), cols.mT).contiguous()

    return resize


for _name, _filter, _support in (("_upsample_bilinear2d_aa", _triangle, 1.0), ("_upsample_bicubic2d_aa", _keys_cubic, 2.0)):
    kernel(_name)(_antialias(_filter, _support))
    kernel(f"{_name}_backward")(_upsample_backward(getattr(torch.ops.aten, _name).default))


# ---- Grid sampling. ----

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _reflect(x, low2, high2):
    """Reflects ``x`` into ``[low2 / 2, high2 / 2]`` (the bounds doubled, as
    PyTorch passes them)."""
    if low2 == high2:
        return torch.zeros_like(x)
    low, span = low2 / 2, (high2 - low2) / 2
    x = (x - low).abs()
    flips = torch.floor(x / span)
    extra = x - flips * span
    return torch.where(torch.remainder(flips, 2) == 0, extra + low, span - extra + low)


def _source_index(coord, size, padding, align_corners):
    """A normalised grid coordinate in ``[-1, 1]`` as a pixel position, with
    the padding mode applied (PyTorch's ``grid_sampler_compute_source_index``)."""
    if align_corners:
        x = (coord + 1) / 2 * (size - 1)
    else:
        x = ((coord + 1) * size - 1) / 2
    if padding == "border":
        x = x.clamp(0, size - 1)
    elif padding == "reflection":
        x = _reflect(x, 0, 2 * (size - 1)) if align_corners else _reflect(x, -1, 2 * size - 1)
        x = x.clamp(0, size - 1)
    return x


def _grid_sample(input, grid, mode, padding, align_corners):
    """Samples ``input`` ``[N, C, *spatial]`` at ``grid`` ``[N, *out, dims]``
    (coordinates innermost-dim first): each output point sums the input at
    the corners around it, weighted, with corners outside the input as zeros."""
    n, c, *sizes = input.shape
    dims = len(sizes)
    out = grid.shape[1:-1]
    points = [_source_index(grid[..., dims - 1 - d], sizes[d], padding, align_corners) for d in range(dims)]
    flat = input.reshape(n, c, -1)
    strides = [1] * dims
    for d in range(dims - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    if mode == "nearest":
        corners = [[(torch.round(p), None)] for p in points]
    else:
        corners = []
        for p in points:
            low = torch.floor(p)
            corners.append([(low, 1 - (p - low)), (low + 1, p - low)])
    result = torch.zeros((n, c) + tuple(out), dtype=input.dtype, device=input.device)
    for choice in torch.cartesian_prod(*[torch.arange(len(k)) for k in corners]).reshape(-1, dims).tolist():
        index = torch.zeros((n,) + tuple(out), dtype=torch.int64, device=input.device)
        weight = torch.ones((n,) + tuple(out), dtype=input.dtype, device=input.device)
        inside = torch.ones((n,) + tuple(out), dtype=torch.bool, device=input.device)
        for d, pick in enumerate(choice):
            at, w = corners[d][pick]
            inside = inside & (at >= 0) & (at <= sizes[d] - 1)
            index = index + at.clamp(0, sizes[d] - 1).to(torch.int64) * strides[d]
            if w is not None:
                weight = weight * w
        weight = torch.where(inside, weight, 0)
        values = flat.gather(2, index.reshape(n, 1, -1).expand(n, c, -1)).reshape(result.shape)
        result = result + values * weight.unsqueeze(1)
    return result


@kernel("grid_sampler_3d")
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    mode = _MODES[int(interpolation_mode)]
    if mode == "bicubic":
        raise RuntimeError("grid_sampler_3d: bicubic interpolation is only defined for 4-D input (tpu)")
    return _grid_sample(input, grid, mode, _PADDING[int(padding_mode)], align_corners)
