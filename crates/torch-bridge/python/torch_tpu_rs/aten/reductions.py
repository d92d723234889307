"""Reductions, softmax and scans."""

import math

import torch

from .. import _C
from .elementwise import run
from .registry import kernel


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


@kernel("mean.dim")
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce("mean", self, dim, keepdim, dtype)


@kernel("mean.default")
def mean_all(self, *, dtype=None):
    return _reduce("mean", self, None, False, dtype)


@kernel("prod.dim_int")
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    return _reduce("prod", self, dim, keepdim, dtype)


@kernel("prod.default")
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
        return run(op, [self], attrs)

    return k


kernel("var.correction")(_moment("var"))
kernel("std.correction")(_moment("std"))


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


@kernel("cumsum")
def cumsum(self, dim, *, dtype=None):
    x = self if dtype is None else run("cast", [self], {"dtype": dtype})
    if dtype is None and not (x.dtype.is_floating_point):
        x = run("cast", [x], {"dtype": torch.int64})
    return run("cumsum", [x], {"dim": dim})


@kernel("cummax")
def cummax(self, dim):
    return tuple(_C.run("cummax", [self], {"dim": dim}))


@kernel("cummin")
def cummin(self, dim):
    return tuple(_C.run("cummin", [self], {"dim": dim}))


@kernel("_logcumsumexp")
def logcumsumexp(self, dim):
    return run("logcumsumexp", [self], {"dim": dim})


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


@kernel("linalg_vector_norm")
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = self if dtype is None else run("cast", [self], {"dtype": dtype})
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
