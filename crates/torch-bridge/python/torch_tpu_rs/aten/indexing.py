"""Indexing, gathering, scattering, joining and sorting. Ops whose output
shape depends on values (``nonzero``, boolean masks) read the values on the
host, as every eager backend must."""

import math

import torch

from .. import _C
from .elementwise import run
from .registry import kernel, raw


def _i64(x):
    return x if x.dtype == torch.int64 else run("cast", [x], {"dtype": torch.int64})


def _check_bounds(op, index, size, dim, negative=False):
    """Under Debug, an index outside the dimension raises ``IndexError``
    naming the op, the index and the size. Strict and DeferAndFuse run
    asynchronously, as CUDA does, and do not read indices back: there an
    out-of-range gather reads the nearest valid position and an
    out-of-range scatter writes nothing."""
    if index.numel() == 0 or _C.eager_mode() != "debug":
        return
    host = _C.to_cpu(index)
    lo, hi = int(host.min()), int(host.max())
    low = -size if negative else 0
    bad = lo if lo < low else hi if hi >= size else None
    if bad is not None:
        raise IndexError(f"aten::{op}: index {bad} is out of bounds for dimension {dim} with size {size} (tpu)")


def _check_along(op, self, dim, index):
    """:func:`_check_bounds` for an ``index`` into ``self`` along ``dim``."""
    _check_bounds(op, index, self.shape[dim] if self.ndim else 1, dim)


@kernel("index_select", complex=True)
def index_select(self, dim, index):
    _check_along("index_select", self, dim, index)
    return run("index_select", [self, index], {"dim": dim})


@kernel("gather", complex=True)
def gather(self, dim, index, *, sparse_grad=False):
    _check_along("gather", self, dim, index)
    return run("gather", [self, index], {"dim": dim})


@kernel("scatter.src", complex=True)
def scatter_src(self, dim, index, src):
    _check_along("scatter", self, dim, index)
    return run("scatter", [self, index, src], {"dim": dim})


@kernel("scatter.value")
def scatter_value(self, dim, index, value):
    src = run("full", [], {"shape": list(index.shape), "dtype": self.dtype, "value": float(value)})
    return scatter_src(self, dim, index, src)


@kernel("scatter_reduce.two")
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    _check_along("scatter_reduce", self, dim, index)
    base = self
    if not include_self:
        # Clear the positions written to: with 0 or 1 for sums and products,
        # and for extrema with one of the values written there.
        if reduce in ("amax", "amin"):
            base = scatter_src(self, dim, index, src)
        else:
            base = scatter_value(self, dim, index, 1 if reduce == "prod" else 0)
    out = run("scatter_reduce", [base, index, src], {"dim": dim, "reduce": "sum" if reduce == "mean" else reduce})
    if reduce != "mean":
        return out
    # The mean over what landed at each position (and the value there).
    count = torch.ones_like(self) if include_self else torch.zeros_like(self)
    count = scatter_add(count, dim, index, torch.ones(index.shape, dtype=self.dtype, device=self.device))
    count = torch.clamp(count, min=1)
    if self.dtype.is_floating_point:
        return out / count
    return torch.div(out, count, rounding_mode="floor")


@kernel("scatter.reduce")
def scatter_reduce_keyword(self, dim, index, src, *, reduce):
    return scatter_reduce(self, dim, index, src, {"add": "sum", "multiply": "prod"}[reduce])


@kernel("scatter.value_reduce")
def scatter_value_reduce(self, dim, index, value, *, reduce):
    src = torch.full(index.shape, value, dtype=self.dtype, device=self.device)
    return scatter_reduce_keyword(self, dim, index, src, reduce=reduce)


@kernel("index_reduce")
def index_reduce(self, dim, index, source, reduce, *, include_self=True):
    # As a scatter: the 1-D index along dim, broadcast over source's shape.
    dim = dim % max(1, self.dim())
    shape = [1] * source.dim()
    if source.dim():
        shape[dim] = -1
    spread = index.reshape(shape).expand(source.shape) if source.dim() else index.reshape(())
    return scatter_reduce(self, dim, spread, source, reduce, include_self=include_self)


@kernel("scatter_add", complex=True)
def scatter_add(self, dim, index, src):
    _check_along("scatter_add", self, dim, index)
    return run("scatter_add", [self, index, src], {"dim": dim})


@kernel("index_add", complex=True)
def index_add(self, dim, index, source, *, alpha=1):
    _check_along("index_add", self, dim, index)
    if alpha != 1:
        source = run("mul", [source, alpha], None, source.dtype)
    return run("index_add", [self, index, source], {"dim": dim})


@kernel("cat")
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors)[:1]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    # With shape buckets on, a join may go into a padded storage.
    joined = _C.concat(tensors, dim, dtype)
    return run("concat", tensors, {"dim": dim}, dtype) if joined is None else joined


@kernel("repeat_interleave.Tensor")
def repeat_interleave(repeats, *, output_size=None):
    """The indices ``i`` repeated ``repeats[i]`` times: the counts are read
    on the host, since they decide the result's length."""
    counts = _C.to_cpu(repeats)
    return torch.repeat_interleave(counts, output_size=output_size).to(repeats.device)


@kernel("stack", complex=True)
def stack(tensors, dim=0):
    return run("stack", list(tensors), {"dim": dim})


@kernel("flip", complex=True)
def flip(self, dims):
    return run("flip", [self], {"dims": list(dims)})


@kernel("roll", complex=True)
def roll(self, shifts, dims=()):
    return run("roll", [self], {"shifts": list(shifts), "dims": list(dims)})


@kernel("tril")
def tril(self, diagonal=0):
    return run("tril", [self], {"diagonal": diagonal})


@kernel("triu", complex=True)
def triu(self, diagonal=0):
    return run("triu", [self], {"diagonal": diagonal})


@kernel("sort")
def sort(self, dim=-1, descending=False):
    return tuple(_C.run("sort", [self], {"dim": dim, "descending": descending}))


@kernel("sort.stable")
def sort_stable(self, *, stable=None, dim=-1, descending=False):
    return tuple(_C.run("sort", [self], {"dim": dim, "descending": descending, "stable": bool(stable)}))


@kernel("topk")
def topk(self, k, dim=-1, largest=True, sorted=True):
    return tuple(_C.run("topk", [self], {"k": k, "dim": dim, "largest": largest, "sorted": sorted}))


# ---- Order statistics, by a stable sort (NaN sorts last). ----


def _order_statistic(values, indices, k, dim, keepdim):
    """Element ``k`` (a tensor of positions, one per lane) along ``dim`` of
    sorted ``values`` and the matching ``indices``."""
    k = k.unsqueeze(dim)
    v, i = values.gather(dim, k), indices.gather(dim, k)
    return (v, i) if keepdim else (v.squeeze(dim), i.squeeze(dim))


def _lanes(self, dim):
    """``self`` with at least one dim, and ``dim`` made non-negative."""
    x = self.reshape(1) if self.dim() == 0 else self
    return x, dim % x.dim()


def _restore(self, pair, keepdim):
    """For a 0-d input, 0-d results."""
    if self.dim() == 0:
        return tuple(t.reshape(()) for t in pair)
    return pair


@kernel("kthvalue")
def kthvalue(self, k, dim=-1, keepdim=False):
    x, d = _lanes(self, dim)
    if not 1 <= k <= x.shape[d]:
        raise RuntimeError(f"kthvalue: k = {k} is out of range for dimension {dim} of size {x.shape[d]}")
    values, indices = sort_stable(x, stable=True, dim=d)
    lane = list(x.shape)
    lane[d] = 1
    position = torch.full(lane, k - 1, dtype=torch.int64, device=x.device).squeeze(d)
    return _restore(self, _order_statistic(values, indices, position, d, keepdim), keepdim)


def _median(self, dim, keepdim, ignore_nan):
    x, d = _lanes(self, dim)
    if x.shape[d] == 0:
        raise IndexError(f"median: dimension {dim} of the input is empty")
    values, indices = sort_stable(x, stable=True, dim=d)
    nan = torch.isnan(x) if x.is_floating_point() else torch.zeros_like(x, dtype=torch.bool)
    nans = nan.sum(d)
    if ignore_nan:
        # The lower median of the values that are not NaN (NaN if all are).
        count = x.shape[d] - nans
        position = torch.clamp((count - 1) // 2, min=0)
    else:
        # Any NaN makes the median NaN, at the first NaN's index (sorted last).
        position = torch.where(nans > 0, x.shape[d] - nans, (x.shape[d] - 1) // 2)
    return _restore(self, _order_statistic(values, indices, position, d, keepdim), keepdim)


@kernel("median.dim")
def median_dim(self, dim, keepdim=False):
    return _median(self, dim, keepdim, ignore_nan=False)


@kernel("nanmedian.dim")
def nanmedian_dim(self, dim, keepdim=False):
    return _median(self, dim, keepdim, ignore_nan=True)


@kernel("median")
def median(self):
    if self.numel() == 0:
        return torch.full((), math.nan, dtype=self.dtype, device=self.device)
    return _median(self.reshape(-1), 0, False, ignore_nan=False)[0]


@kernel("nanmedian")
def nanmedian(self):
    if self.numel() == 0:
        return torch.full((), math.nan, dtype=self.dtype, device=self.device)
    return _median(self.reshape(-1), 0, False, ignore_nan=True)[0]


@kernel("searchsorted.Tensor")
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    right = right or side == "right"
    values = self.reshape(1) if self.dim() == 0 else self
    if sorted_sequence.dim() == 1:
        below = sorted_sequence <= values[..., None] if right else sorted_sequence < values[..., None]
    else:
        boundaries = sorted_sequence[..., None, :]
        below = boundaries <= values[..., :, None] if right else boundaries < values[..., :, None]
    counts = below.sum(-1).reshape(self.shape)
    return counts.to(torch.int32) if out_int32 else counts


@kernel("searchsorted.Scalar")
def searchsorted_scalar(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    value = torch.full((), self, dtype=sorted_sequence.dtype, device=sorted_sequence.device)
    return searchsorted(sorted_sequence, value, out_int32=out_int32, right=right, side=side, sorter=sorter)


def _arange(start, end, step, dtype):
    """The length of ``arange(start, end, step)`` and the tpu-rs op's
    attributes for it in ``dtype``."""
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    if all(isinstance(v, int) for v in (start, end, step)):
        # Integers stay integers: past 2**53 a float would lose them.
        n = max(0, -((start - end) // step))
        return n, {"start": start, "end": end, "step": step, "dtype": dtype}
    n = max(0, math.ceil((end - start) / step))
    return n, {"start": float(start), "end": float(end), "step": float(step), "dtype": dtype}


@raw("arange.start_out")
def arange_out(start, end, step=1, *, out):
    n, attrs = _arange(start, end, step, out.dtype)
    value = run("arange", [], attrs) if n > 0 else None
    if list(out.shape) != [n]:
        out.resize_([n])
    if value is not None:
        _C.copy_into(out, value)
    return out


def row_major_strides(sizes):
    """Each dim's step in the flat, row-major index of a ``sizes`` block."""
    strides = [1] * len(sizes)
    for d in range(len(sizes) - 2, -1, -1):
        strides[d] = strides[d + 1] * sizes[d + 1]
    return strides


# ---- Host-read ops: the output shape depends on the values. ----


@kernel("nonzero", complex=True)
def nonzero(self):
    return torch.nonzero(_C.to_cpu(self)).to(self.device)


@kernel("nonzero_static", complex=True)
def nonzero_static(self, *, size, fill_value=-1):
    """``nonzero``'s first ``size`` rows, padded with ``fill_value``."""
    found = nonzero(self)[:size]
    pad = torch.full((size - found.shape[0], self.ndim), fill_value, dtype=torch.int64, device=self.device)
    return torch.cat([found, pad]) if pad.shape[0] else found


def _runs(values):
    """Where each run of equal neighbours in 1-d ``values`` starts."""
    start = torch.ones(values.shape, dtype=torch.bool, device=values.device)
    if values.numel() > 1:
        start[1:] = values[1:] != values[:-1]
    return start


def _unique_from_runs(values, start, order=None):
    """Distinct values, each element's run (placed back through the sort
    ``order``, when given) and each run's length."""
    uniques = values[start]
    run = torch.cumsum(start.to(torch.int64), 0) - 1
    inverse = run if order is None else torch.empty_like(run).scatter_(0, order, run)
    firsts = start.nonzero().reshape(-1)
    ends = torch.cat([firsts[1:], torch.tensor([values.numel()], device=values.device)])
    return uniques, inverse, ends - firsts


@kernel("_unique2")
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    values, order = torch.sort(self.reshape(-1), stable=True)
    uniques, inverse, counts = _unique_from_runs(values, _runs(values), order)
    return uniques, inverse.reshape(self.shape), counts


@kernel("unique_dim")
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    """Distinct slices along ``dim``: read to the host like ``nonzero`` (how
    many there are is the output's shape)."""
    out = torch.ops.aten.unique_dim(_C.to_cpu(self), dim, sorted, return_inverse, return_counts)
    return tuple(t.to(self.device) for t in out)


@kernel("unique_dim_consecutive")
def unique_dim_consecutive(self, dim, return_inverse=False, return_counts=False):
    out = torch.ops.aten.unique_dim_consecutive(_C.to_cpu(self), dim, return_inverse, return_counts)
    return tuple(t.to(self.device) for t in out)


@kernel("unique_consecutive")
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    if dim is not None and self.ndim > 1:
        return unique_dim_consecutive(self, dim, return_inverse, return_counts)
    flat = self.reshape(-1)
    uniques, inverse, counts = _unique_from_runs(flat, _runs(flat))
    return uniques, inverse.reshape(self.shape), counts


@kernel("masked_select", complex=True)
def masked_select(self, mask):
    return torch.masked_select(_C.to_cpu(self), _C.to_cpu(mask)).to(self.device)


@raw("equal")
def equal(self, other):
    return self.shape == other.shape and bool(run("all", [run("eq", [self, other], None, torch.result_type(self, other))], {"dims": list(range(self.ndim)), "keepdim": False}).item())


# ---- Advanced indexing: x[i, j] with index tensors. ----


def _linear_index(self, indices, op):
    """The indexed dims, and one i64 index into them flattened (row-major),
    broadcast over the index tensors."""
    dims, tensors = [], []
    for d, idx in enumerate(indices):
        if idx is None:
            continue
        if idx.is_floating_point() or idx.is_complex():
            raise IndexError(f"{op}: tensors used as indices must be long, int, byte or bool tensors, got {idx.dtype}")
        # PyTorch takes CPU index tensors for any device's tensor.
        idx = idx.to(self.device)
        if idx.dtype == torch.bool:
            covered = list(self.shape[d:d + idx.ndim])
            if list(idx.shape) != covered:
                raise IndexError(
                    f"The shape of the mask {list(idx.shape)} at index {d} does not match "
                    f"the shape of the indexed tensor {covered} at index {d}"
                )
            # A mask indexes as its nonzero positions (one index per mask dim).
            for k, col in enumerate(nonzero(idx).unbind(1)):
                dims.append(d + k)
                tensors.append(col)
        else:
            _check_bounds(op, idx, self.shape[d], d, negative=True)
            dims.append(d)
            tensors.append(_i64(idx))
    shape = list(torch.broadcast_shapes(*[t.shape for t in tensors]))
    linear = None
    for d, t in zip(dims, tensors):
        size = self.shape[d]
        # Negative indices count from the end.
        t = run("add", [t, run("mul", [run("cast", [run("lt", [t, 0], None, torch.int64)], {"dtype": torch.int64}), size])])
        linear = t if linear is None else run("add", [run("mul", [linear, size]), t])
    linear = run("broadcast_to", [linear], {"shape": shape})
    return dims, run("reshape", [linear], {"shape": [math.prod(shape)]}), shape


def _front(self, dims):
    """``self`` with the indexed ``dims`` moved to the front and merged."""
    rest = [d for d in range(self.ndim) if d not in dims]
    x = self.permute(dims + rest)
    merged = math.prod(self.shape[d] for d in dims)
    return x.reshape([merged] + [self.shape[d] for d in rest]), rest


def _adjacent(dims):
    return dims == list(range(dims[0], dims[0] + len(dims)))


@kernel("take", complex=True)
def take(self, positions):
    if positions.dtype != torch.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {positions.dtype}")
    return index(self.reshape(-1), [positions])


@kernel("index.Tensor", complex=True)
def index(self, indices):
    indices = list(indices) + [None] * (self.ndim - len(indices))
    dims, linear, shape = _linear_index(self, indices, "index")
    x, rest = _front(self, dims)
    out = run("index_select", [x, linear], {"dim": 0})
    out = run("reshape", [out], {"shape": shape + [self.shape[d] for d in rest]})
    if _adjacent(dims) and dims[0] > 0:
        # Adjacent indexed dims keep their place (NumPy's rule).
        k, n = dims[0], len(shape)
        order = list(range(n, n + k)) + list(range(n)) + list(range(n + k, out.ndim))
        out = out.permute(order)
    return out


@kernel("index_put", complex=True)
def index_put(self, indices, values, accumulate=False):
    indices = list(indices) + [None] * (self.ndim - len(indices))
    dims, linear, shape = _linear_index(self, indices, "index_put")
    x, rest = _front(self, dims)
    rest_shape = [self.shape[d] for d in rest]
    if values.is_complex() and not self.is_complex():
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got {self.dtype} "
                           f"for the destination and {values.dtype} for the source.")
    values = values.to(self.dtype)
    if _adjacent(dims) and dims[0] > 0 and values.ndim > len(shape):
        # Values are laid out with the index dims in place; move them first.
        k = dims[0]
        full = [self.shape[d] for d in range(k)] + shape + [self.shape[d] for d in range(k + len(dims), self.ndim)]
        values = values.expand(full)
        n = len(shape)
        values = values.permute(list(range(k, k + n)) + list(range(k)) + list(range(k + n, len(full))))
    values = run("broadcast_to", [values], {"shape": shape + rest_shape})
    rows = run("reshape", [values], {"shape": [linear.shape[0]] + rest_shape})
    if accumulate:
        out = run("index_add", [x, linear, rows], {"dim": 0})
    else:
        idx = run("reshape", [linear], {"shape": [linear.shape[0]] + [1] * len(rest_shape)})
        idx = run("broadcast_to", [idx], {"shape": [linear.shape[0]] + rest_shape})
        out = run("scatter", [x, idx, rows], {"dim": 0})
    # Undo the move to the front.
    out = out.reshape([self.shape[d] for d in dims] + rest_shape)
    order = dims + rest
    inverse = [order.index(d) for d in range(self.ndim)]
    return out.permute(inverse).contiguous()


@raw("put_", complex=True)
def put_(self, index, source, accumulate=False):
    """``index_put`` on the flattened tensor; negative indices count from
    the end."""
    flat = self.reshape(-1)
    index = index.reshape(-1)
    _check_bounds("put_", index, flat.shape[0], 0, negative=True)
    index = torch.where(index < 0, index + flat.shape[0], index)
    out = index_put(flat, [index], source.reshape(-1), accumulate)
    _C.copy_into(self, out.reshape(self.shape))
    return self


@raw("masked_scatter_", complex=True)
def masked_scatter_(self, mask, source):
    """The masked positions, in order, take ``source``'s leading elements:
    the i-th True reads ``source.flatten()[i]``, found by a running count."""
    if source.dtype != self.dtype:
        raise RuntimeError(f"masked_scatter_: expected self and source to have same dtypes but got {self.dtype} and "
                           f"{source.dtype}")
    mask = mask.expand(self.shape).reshape(-1)
    count = torch.cumsum(mask.to(torch.int64), 0) - 1
    src = source.reshape(-1)
    if _C.eager_mode() == "debug" and mask.numel() and int(count[-1]) >= src.shape[0]:
        raise RuntimeError(
            f"masked_scatter_: {int(count[-1]) + 1} masked positions but the source has only {src.shape[0]} elements (tpu)")
    if src.shape[0] == 0:
        return self
    taken = src[count.clamp(0, src.shape[0] - 1)]
    out = torch.where(mask, taken.to(self.dtype), self.reshape(-1))
    _C.copy_into(self, out.reshape(self.shape))
    return self


@raw("_index_put_impl_", complex=True)
def index_put_impl_(self, indices, values, accumulate=False, unsafe=False):
    _C.copy_into(self, index_put(self, indices, values, accumulate))
    return self


# ---- Scatters into views: a copy of the input with a view overwritten. ----


def _scatter_into_view(self, src, select):
    out = self.clone()
    select(out).copy_(src)
    return out


@kernel("slice_scatter", complex=True)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    return _scatter_into_view(self, src, lambda t: torch.ops.aten.slice(t, dim, start, end, step))


@kernel("select_scatter", complex=True)
def select_scatter(self, src, dim, index):
    return _scatter_into_view(self, src, lambda t: t.select(dim, index))


@kernel("diagonal_scatter", complex=True)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    return _scatter_into_view(self, src, lambda t: t.diagonal(offset, dim1, dim2))


@kernel("as_strided_scatter", complex=True)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    return _scatter_into_view(self, src, lambda t: t.as_strided(size, stride, storage_offset))
