"""Anti-aliased resizing (``interpolate(..., antialias=True)``): one weight
matrix per resized dim, applied by matrix products."""

import torch

from .nn import _upsample_backward
from .registry import kernel


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
