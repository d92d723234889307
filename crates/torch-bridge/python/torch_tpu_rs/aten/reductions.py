"""Reductions, softmax and scans."""

import math

import torch

from .. import _C
from .elementwise import run
from .registry import aten, kernel


def _dims(dim, ndim):
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        return [dim]
    dims = list(dim)
    # PyTorch reads an empty dim list as "all dims" for sum and mean.
    return dims if dims else list(range(ndim))


def _reduce(op, x, dim, keepdim, dtype=None):
    if dtype is not None and x.dtype != dtype:
        x = run("cast", [x], {"dtype": dtype})
    return run(op, [x], {"dims": _dims(dim, x.ndim), "keepdim": keepdim})


@kernel("sum.dim_IntList")
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce("sum", self, dim, keepdim, dtype)


@kernel("sum.default")
def sum_all(self, *, dtype=None):
    return _reduce("sum", self, None, False, dtype)


@kernel("mean.dim", complex=True)
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce("mean", self, dim, keepdim, dtype)


@kernel("mean.default", complex=True)
def mean_all(self, *, dtype=None):
    return _reduce("mean", self, None, False, dtype)


@kernel("prod.dim_int", complex=True)
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce("prod", self, dim, keepdim, dtype)


@kernel("prod.default", complex=True)
def prod_all(self, *, dtype=None):
    return _reduce("prod", self, None, False, dtype)


@kernel("amax")
def amax(self, dim=(), keepdim=False):
    return _reduce("max", self, dim, keepdim)


@kernel("amin")
def amin(self, dim=(), keepdim=False):
    return _reduce("min", self, dim, keepdim)


@kernel("max.default")
def max_all(self):
    return _reduce("max", self, None, False)


@kernel("min.default")
def min_all(self):
    return _reduce("min", self, None, False)


def _extreme_dim(op, arg):
    def k(self, dim, keepdim=False):
        values = _reduce(op, self, dim, keepdim)
        indices = run(arg, [self], {"dim": dim, "keepdim": keepdim})
        return values, indices

    return k


kernel("max.dim")(_extreme_dim("max", "argmax"))
kernel("min.dim")(_extreme_dim("min", "argmin"))


def _arg(op):
    def k(self, dim=None, keepdim=False):
        attrs = {"keepdim": keepdim}
        if dim is not None:
            attrs["dim"] = dim
        return run(op, [self], attrs)

    return k


kernel("argmax")(_arg("argmax"))
kernel("argmin")(_arg("argmin"))


def _moment(op):
    def k(self, dim=None, *, correction=None, keepdim=False):
        attrs = {"dims": _dims(dim, self.ndim), "keepdim": keepdim}
        attrs["correction"] = 1.0 if correction is None else float(correction)
        if self.is_complex():
            # The variance of complex values is the sum of their parts'.
            parts = [run(part, [self]) for part in ("real", "imag")]
            var = run("add", [run("var", [p], attrs) for p in parts])
            return var if op == "var" else run("sqrt", [var])
        return run(op, [self], attrs)

    return k


kernel("var.correction", complex=True)(_moment("var"))
kernel("std.correction", complex=True)(_moment("std"))


@kernel("logsumexp")
def logsumexp(self, dim, keepdim=False):
    return run("logsumexp", [self], {"dims": _dims(dim, self.ndim), "keepdim": keepdim})


def _logic(op):
    def k(self, dim=None, keepdim=False):
        return run(op, [self], {"dims": _dims(dim, self.ndim), "keepdim": keepdim})

    return k


kernel("all.default", "all.dim", "all.dims")(_logic("all"))
kernel("any.default", "any.dim", "any.dims")(_logic("any"))


def _softmax_kernel(op):
    def k(self, dim, half_to_float):
        out = run(op, [self], {"dim": dim})
        if half_to_float and out.dtype in (torch.float16, torch.bfloat16):
            out = run("cast", [out], {"dtype": torch.float32})
        return out

    return k


kernel("_softmax")(_softmax_kernel("softmax"))
kernel("_log_softmax")(_softmax_kernel("log_softmax"))


@kernel("_safe_softmax")
def _safe_softmax(self, dim, dtype=None):
    # softmax, with rows that are entirely -inf giving 0 instead of NaN.
    x = self if dtype is None else run("cast", [self], {"dtype": dtype})
    out = run("softmax", [x], {"dim": dim})
    masked = run("all", [run("eq", [x, float("-inf")], None, x.dtype)], {"dims": [dim], "keepdim": True})
    return _C.run("where", [masked, 0.0, out], None, out.dtype, 1)[0]


@kernel("_softmax_backward_data")
def _softmax_backward_data(grad_output, output, dim, input_dtype):
    # g * y - y * sum(g * y)
    gy = run("mul", [grad_output, output])
    s = run("sum", [gy], {"dims": [dim], "keepdim": True})
    out = run("sub", [gy, run("mul", [output, s])])
    return out if out.dtype == input_dtype else run("cast", [out], {"dtype": input_dtype})


@kernel("_log_softmax_backward_data")
def _log_softmax_backward_data(grad_output, output, dim, input_dtype):
    # g - exp(y) * sum(g)
    s = run("sum", [grad_output], {"dims": [dim], "keepdim": True})
    out = run("sub", [grad_output, run("mul", [run("exp", [output]), s])])
    return out if out.dtype == input_dtype else run("cast", [out], {"dtype": input_dtype})


@kernel("cummax")
def cummax(self, dim):
    return tuple(_C.run("cummax", [self], {"dim": dim}))


@kernel("cummin")
def cummin(self, dim):
    return tuple(_C.run("cummin", [self], {"dim": dim}))


@kernel("_logcumsumexp")
def logcumsumexp(self, dim):
    return run("logcumsumexp", [self], {"dim": dim})


@kernel("bincount")
def bincount(self, weights=None, minlength=0):
    """How often each value ``0..max`` occurs (``weights`` summed instead
    when given: float32 stays float32, other weights sum in float64, as on
    the CPU). The length is read from the data."""
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype == torch.bool:
        if self.dtype.is_floating_point:
            raise NotImplementedError(f'"bincount" not implemented for {self.dtype} on the tpu device')
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    length = minlength
    if self.numel():
        low, high = (int(v) for v in torch.aminmax(self))
        if low < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(length, high + 1)
    if weights is None:
        dtype, values = torch.int64, torch.ones(self.shape, dtype=torch.int64, device=self.device)
    else:
        dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
        values = weights.to(dtype)
    return torch.zeros(length, dtype=dtype, device=self.device).index_add(0, self, values)


@kernel("histc")
def histc(self, bins=100, min=0, max=0):
    """Equal-width bins over ``[min, max]`` (the data's range when both are
    0); values outside are ignored, ``max`` itself falls in the last bin."""
    if bins <= 0:
        raise RuntimeError(f"histc: bins must be > 0, got {bins} (tpu)")
    lo, hi = float(min), float(max)
    if lo == hi and self.numel():
        lo, hi = float(self.min()), float(self.max())
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    if lo > hi or not (math.isfinite(lo) and math.isfinite(hi)):
        raise RuntimeError(f"histc: range [{lo}, {hi}] is not finite and increasing (tpu)")
    x = self.reshape(-1)
    inside = (x >= lo) & (x <= hi)
    b = ((x - lo) * (bins / (hi - lo))).floor().to(torch.int64).clamp(0, bins - 1)
    counts = torch.zeros(bins, dtype=self.dtype, device=self.device)
    return counts.index_add(0, b, inside.to(self.dtype))


def _histogram(x, edges, weight, density):
    """Counts (or ``weight`` sums) between increasing ``edges``: a value
    equal to an edge falls in the bin it opens, the last edge in the last
    bin; values outside are dropped."""
    bins = edges.shape[0] - 1
    flat = x.reshape(-1)
    b = (torch.searchsorted(edges, flat, right=True) - 1).clamp(0, bins - 1)
    inside = (flat >= edges[0]) & (flat <= edges[-1])
    w = inside.to(x.dtype) if weight is None else torch.where(inside, weight.reshape(-1), 0).to(x.dtype)
    hist = torch.zeros(bins, dtype=x.dtype, device=x.device).index_add(0, b, w)
    if density:
        hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return hist, edges


@kernel("histogram.bin_ct")
def histogram(self, bins=100, *, range=None, weight=None, density=False):
    lo, hi = (float(self.min()), float(self.max())) if range is None and self.numel() else (range or (0.0, 0.0))
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    edges = torch.linspace(lo, hi, bins + 1, dtype=self.dtype, device=self.device)
    return _histogram(self, edges, weight, density)


@kernel("histogram.bins_tensor")
def histogram_edges(self, bins, *, weight=None, density=False):
    return _histogram(self, bins.to(self.dtype), weight, density)


def _histogramdd_edges(self, bins, range):
    """Each dim's ``bins + 1`` evenly spaced edges over ``range`` or the
    data's extent in that dim (``[0, 1]`` for no data; a single value
    widens by a half on each side)."""
    dims = self.shape[-1]
    points = self.reshape(-1, dims)
    if range is not None:
        lo, hi = list(range[0::2]), list(range[1::2])
    elif points.shape[0]:
        lo, hi = points.amin(0).tolist(), points.amax(0).tolist()
    else:
        lo, hi = [0.0] * dims, [1.0] * dims
    edges = []
    for d, n in enumerate(bins):
        a, b = lo[d], hi[d]
        if not (math.isfinite(a) and math.isfinite(b)) or a > b:
            raise RuntimeError(f"histogramdd: dim {d}'s range [{a}, {b}] is not finite and increasing (tpu)")
        if a == b:
            a, b = a - 0.5, b + 0.5
        edges.append(torch.linspace(a, b, n + 1, dtype=self.dtype, device=self.device))
    return edges


@kernel("_histogramdd_bin_edges")
def _histogramdd_bin_edges(self, bins, *, range=None, weight=None, density=False):
    return _histogramdd_edges(self, bins, range)


@kernel("_histogramdd_from_bin_cts")
def _histogramdd_from_bin_cts(self, bins, *, range=None, weight=None, density=False):
    return _histogramdd_from_bin_tensors(self, _histogramdd_edges(self, bins, range), weight=weight, density=density)


@kernel("_histogramdd_from_bin_tensors")
def _histogramdd_from_bin_tensors(self, bins, *, weight=None, density=False):
    """The points (the last dim holds each point's coordinates) counted, or
    their ``weight`` summed, per cell of the grid the ``bins`` edges make;
    in each dim as in ``histogram``."""
    dims = self.shape[-1]
    points = self.reshape(-1, dims)
    inside = torch.ones(points.shape[0], dtype=torch.bool, device=self.device)
    cell = torch.zeros(points.shape[0], dtype=torch.int64, device=self.device)
    for d, edges in enumerate(bins):
        n = edges.shape[0] - 1
        column = points[:, d].contiguous()
        cell = cell * n + (torch.searchsorted(edges, column, right=True) - 1).clamp(0, n - 1)
        inside = inside & (column >= edges[0]) & (column <= edges[-1])
    w = inside.to(self.dtype) if weight is None else torch.where(inside, weight.reshape(-1), 0).to(self.dtype)
    shape = [edges.shape[0] - 1 for edges in bins]
    hist = torch.zeros(math.prod(shape), dtype=self.dtype, device=self.device).index_add(0, cell, w).reshape(shape)
    if density:
        hist = hist / hist.sum()
        for d, edges in enumerate(bins):
            width = [1] * dims
            width[d] = shape[d]
            hist = hist / (edges[1:] - edges[:-1]).reshape(width)
    return hist


def _segment_lengths(lengths, offsets):
    if lengths is not None:
        return lengths
    if offsets is None:
        raise RuntimeError("segment_reduce: needs lengths or offsets (tpu)")
    return offsets[..., 1:] - offsets[..., :-1]


def _segment_index(data, lengths, axis):
    """Each element's segment, shaped like ``data``; elements past the last
    segment get the spare segment ``len(lengths)``."""
    n = data.shape[axis]
    ends = torch.cumsum(lengths.to(torch.int64), -1)
    positions = torch.arange(n, device=data.device).expand(lengths.shape[:-1] + (n,)).contiguous()
    segment = torch.searchsorted(ends, positions, right=True)
    return segment.reshape(segment.shape + (1,) * (data.ndim - axis - 1)).expand(data.shape)


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}
_SEGMENT_SCATTER = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "amax", "min": "amin"}


@kernel("segment_reduce")
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Reduces consecutive runs of ``lengths[..., k]`` elements along
    ``axis`` (``lengths`` has ``data``'s leading dims before ``axis``).
    Every segment starts from ``initial`` when given (so a mean is
    ``(initial + sum) / length``); an empty one is ``initial``, else the
    reduction's identity (NaN for a mean)."""
    if reduce not in _SEGMENT_IDENTITY:
        raise RuntimeError(f"segment_reduce: unknown reduction {reduce!r} (tpu)")
    if indices is not None:
        raise NotImplementedError("aten::segment_reduce with indices is not implemented for the tpu device")
    lengths = _segment_lengths(lengths, offsets)
    axis = axis % data.ndim
    segments, trail = lengths.shape[-1], data.ndim - axis - 1
    index = _segment_index(data, lengths, axis)
    start = _SEGMENT_IDENTITY[reduce] if initial is None else float(initial)
    shape = list(data.shape)
    shape[axis] = segments + 1
    out = torch.full(shape, start, dtype=data.dtype, device=data.device)
    out = out.scatter_reduce(axis, index, data, _SEGMENT_SCATTER[reduce], include_self=True).narrow(axis, 0, segments)
    if reduce == "mean":
        count = lengths.reshape(lengths.shape + (1,) * trail).to(data.dtype)
        empty = float("nan") if initial is None else float(initial)
        out = torch.where(count > 0, out / count.clamp(min=1), empty)
    return out


@kernel("_segment_reduce_backward")
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    """Each element's share of its segment's gradient: all of it (sum), a
    1/length part (mean), an equal part among the elements that equal the
    extreme (max, min), or the product of the segment's others (prod)."""
    lengths = _segment_lengths(lengths, offsets)
    axis = axis % data.ndim
    index = _segment_index(data, lengths, axis)
    pad = [0, 0] * (data.ndim - axis - 1) + [0, 1]

    def per_element(t):  # a per-segment tensor, read at each element's segment
        return torch.nn.functional.pad(t, pad).gather(axis, index)

    g = per_element(grad)
    if reduce == "sum":
        return g
    if reduce == "mean":
        count = lengths.reshape(lengths.shape + (1,) * (data.ndim - axis - 1)).to(grad.dtype)
        return per_element(grad / count.clamp(min=1).expand(grad.shape))
    if reduce in ("max", "min"):
        hit = (data == per_element(output)).to(grad.dtype)
        shape = list(data.shape)
        shape[axis] = lengths.shape[-1] + 1
        ties = torch.zeros(shape, dtype=grad.dtype, device=data.device).scatter_add(axis, index, hit)
        return g * hit / ties.gather(axis, index).clamp(min=1)
    if reduce == "prod":
        shape = list(data.shape)
        shape[axis] = lengths.shape[-1] + 1
        zero = data == 0
        zeros = torch.zeros(shape, dtype=grad.dtype, device=data.device).scatter_add(axis, index, zero.to(grad.dtype))
        start = 1.0 if initial is None else float(initial)
        nonzero = torch.full(shape, start, dtype=data.dtype, device=data.device)
        nonzero = nonzero.scatter_reduce(axis, index, torch.where(zero, torch.ones_like(data), data), "prod")
        zeros, nonzero = zeros.gather(axis, index), nonzero.gather(axis, index)
        others = torch.where(zeros == 0, nonzero / torch.where(zero, torch.ones_like(data), data),
                             torch.where(zero & (zeros == 1), nonzero, torch.zeros_like(data)))
        return g * others
    raise RuntimeError(f"segment_reduce: unknown reduction {reduce!r} (tpu)")


@kernel("mode")
def mode(self, dim=-1, keepdim=False):
    """The most frequent value along ``dim`` (the smallest among equally
    frequent ones) and the index of its last occurrence, as on the CPU."""
    if self.ndim == 0:
        return self.clone(), torch.zeros((), dtype=torch.int64, device=self.device)
    if not -self.ndim <= dim < self.ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-self.ndim}, {self.ndim - 1}], but got {dim})")
    d = dim % self.ndim
    if self.shape[d] == 0:
        raise IndexError(f"mode: dimension {dim} of the input is empty (tpu)")
    x = self.movedim(d, -1)
    n = x.shape[-1]
    values, order = torch.sort(x, dim=-1, stable=True)
    start = torch.ones(values.shape, dtype=torch.bool, device=self.device)
    start[..., 1:] = values[..., 1:] != values[..., :-1]
    run = torch.cumsum(start.to(torch.int64), -1) - 1
    counts = torch.zeros(run.shape, dtype=torch.int64, device=self.device).scatter_add(-1, run, torch.ones_like(run))
    count = counts.gather(-1, run)
    # Most frequent, then the earliest run, then the run's last element.
    where = torch.arange(n, device=self.device)
    key = (count * (n + 1) + (n - run)) * (n + 1) + where
    best = key.argmax(-1, keepdim=True)
    value, index = values.gather(-1, best), order.gather(-1, best)
    if not keepdim:
        return value.squeeze(-1), index.squeeze(-1)
    return value.movedim(-1, d), index.movedim(-1, d)


@kernel("linalg_vector_norm", complex=True)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    if self.is_complex():
        # The norm of complex values is that of their magnitudes.
        if dtype is not None and not dtype.is_complex:
            raise RuntimeError(f"linalg.vector_norm: dtype should be complex for a complex input, got {dtype}")
        x = self if dtype is None else run("cast", [self], {"dtype": dtype})
        return linalg_vector_norm(run("abs", [x]), ord, dim, keepdim)
    if not self.is_floating_point():
        raise NotImplementedError(f"linalg.vector_norm: Expected a floating point or complex tensor as input. Got {self.dtype}")
    x = self if dtype is None else run("cast", [self], {"dtype": dtype})
    if x.dtype in (torch.float16, torch.bfloat16) and ord not in (0, float("inf"), float("-inf")):
        # Powers of half-precision values overflow (300**2 > 65504): sum them
        # in float32 as PyTorch does, and round the norm once.
        norm = linalg_vector_norm(run("cast", [x], {"dtype": torch.float32}), ord, dim, keepdim)
        return run("cast", [norm], {"dtype": x.dtype})
    a = run("abs", [x])
    dims = {"dims": _dims(dim, x.ndim), "keepdim": keepdim}
    if ord == float("inf"):
        return run("max", [a], dims)
    if ord == float("-inf"):
        return run("min", [a], dims)
    if ord == 0:
        return run("sum", [run("cast", [run("ne", [x, 0.0], None, x.dtype)], {"dtype": x.dtype})], dims)
    if ord == 1:
        return run("sum", [a], dims)
    if ord == 2:
        return run("sqrt", [run("sum", [run("mul", [a, a])], dims)])
    return run("pow", [run("sum", [run("pow", [a, float(ord)], None, x.dtype)], dims), 1.0 / ord], None, x.dtype)
