"""Matrix products, convolutions, normalisation, pooling, losses, dropout
and attention. Backward kernels run the tpu-rs op's own backward rule
(``_C.vjp``), so forward and backward agree by construction."""

import math

import torch

from .. import _C
from .elementwise import run
from .registry import _TYPE_NAMES, above_autograd_while, aten, kernel, raw


# ---- Matrix products. ----


def _resolved(t):
    """``t``'s values, made real when it is a lazy conjugation (PyTorch
    hands the products such views as they are)."""
    return run("conj", [t.conj()]) if t.is_conj() else t


@kernel("mm", "bmm", complex=True)
def mm(self, other):
    if self.dtype != other.dtype:
        raise RuntimeError(f"expected both operands to have the same dtype, but got: {self.dtype} != {other.dtype}")
    return run("matmul", [_resolved(self), _resolved(other)], None, torch.result_type(self, other))


@kernel("mv", "dot", complex=True)
def mv(self, other):
    return mm(self, other)


@kernel("vdot", complex=True)
def vdot(self, other):
    """``conj(self) . other``."""
    return mm(run("conj", [_resolved(self)]) if self.is_complex() else self, other)


def _scaled(x, factor):
    return x if factor == 1 else run("mul", [x, factor], None, x.dtype)


@kernel("addmm", "baddbmm", "addmv", complex=True)
def addmm(self, mat1, mat2, *, beta=1, alpha=1):
    product = _scaled(mm(mat1, mat2), alpha)
    if beta == 0:
        return product
    return run("add", [_scaled(_resolved(self), beta), product], None, product.dtype)


@kernel("addbmm", complex=True)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    product = _scaled(run("sum", [mm(batch1, batch2)], {"dims": [0]}), alpha)
    if beta == 0:
        return product
    return run("add", [_scaled(_resolved(self), beta), product], None, product.dtype)


@kernel("_cdist_forward")
def _cdist_forward(x1, x2, p, compute_mode=None):
    d = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (d != 0).sum(-1).to(x1.dtype)
    if p == float("inf"):
        return d.amax(-1) if d.shape[-1] else d.sum(-1)
    if p == 1:
        return d.sum(-1)
    if p == 2:
        return d.square().sum(-1).sqrt()
    return d.pow(p).sum(-1).pow(1.0 / p)


@kernel("_cdist_backward")
def _cdist_backward(grad, x1, x2, p, cdist):
    """The gradient for ``x1``: each distance's derivative along the
    difference ``x1_i - x2_j`` (zero where the distance is zero)."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    dist = cdist.unsqueeze(-1)
    g = grad.unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        part = diff.sign()
    elif p == float("inf"):
        part = diff.sign() * (diff.abs() == dist)
    else:
        safe = torch.where(dist == 0, torch.ones_like(dist), dist)
        part = diff.sign() * diff.abs().pow(p - 1) / safe.pow(p - 1)
        part = torch.where((dist == 0) | (diff == 0), torch.zeros_like(part), part)
    return (g * part).sum(-2)


@kernel("_pdist_forward")
def _pdist_forward(self, p=2):
    """Distances between rows ``i < j``, row-major: the strict upper
    triangle of ``cdist(x, x)``."""
    n = self.shape[0]
    i, j = torch.triu_indices(n, n, 1)
    return _cdist_forward(self, self, p)[i.to(self.device), j.to(self.device)]


@kernel("_pdist_backward")
def _pdist_backward(grad, self, p, pdist):
    # Each pair's gradient in a symmetric matrix: row i then collects the
    # derivative of every distance that involves x_i.
    n = self.shape[0]
    i, j = (t.to(self.device) for t in torch.triu_indices(n, n, 1))
    full = torch.zeros((n, n), dtype=grad.dtype, device=self.device)
    full = full.index_put((i, j), grad).index_put((j, i), grad)
    dist = torch.zeros((n, n), dtype=grad.dtype, device=self.device)
    dist = dist.index_put((i, j), pdist).index_put((j, i), pdist)
    return _cdist_backward(full, self, self, p, dist)


# ---- Convolutions. ----


def _plain_conv(weight, transposed):
    """The conv1d or conv2d op for a plain convolution, else None."""
    if transposed or weight.ndim - 2 not in (1, 2):
        return None
    return "conv1d" if weight.ndim == 3 else "conv2d"


def _conv_attrs(stride, padding, dilation, groups):
    return {
        "stride": list(stride),
        "padding": list(padding),
        "dilation": list(dilation),
        "groups": int(groups),
    }


def _general_kernel(weight, groups):
    """A transposed convolution's ``(in, out / groups, k...)`` weight as the
    ``(out, in / groups, k...)`` kernel of the equivalent convolution over the
    stride-dilated input: groups regrouped, spatial dims flipped."""
    cin, cout_g, *k = weight.shape
    w = weight.reshape(groups, cin // groups, cout_g, *k).transpose(1, 2)
    return w.reshape(groups * cout_g, cin // groups, *k).flip(list(range(2, weight.ndim)))


def _general_weight_grad(grad, weight, groups):
    """The gradient for a transposed convolution's weight, from the
    gradient for its :func:`_general_kernel`."""
    cin, cout_g, *k = weight.shape
    g = grad.flip(list(range(2, weight.ndim))).reshape(groups, cout_g, cin // groups, *k)
    return g.transpose(1, 2).reshape(weight.shape)


def _general_conv(weight, stride, padding, dilation, transposed, output_padding, groups):
    """The kernel and attributes of the general ``convolution`` op: any
    number of spatial dims, and transposed convolutions as convolutions of
    the input dilated by the stride."""
    n = weight.ndim - 2
    if not transposed:
        pads = [p for p in padding for _ in range(2)]
        return weight, {
            "window_strides": list(stride), "padding": pads, "lhs_dilation": [1] * n,
            "rhs_dilation": list(dilation), "feature_group_count": int(groups),
        }
    pads = []
    for i in range(n):
        low = dilation[i] * (weight.shape[2 + i] - 1) - padding[i]
        pads += [low, low + output_padding[i]]
    return _general_kernel(weight, groups), {
        "window_strides": [1] * n, "padding": pads, "lhs_dilation": list(stride),
        "rhs_dilation": list(dilation), "feature_group_count": int(groups),
    }


@kernel("convolution")
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    op = _plain_conv(weight, transposed)
    if op is not None:
        inputs = [input, weight] + ([bias] if bias is not None else [])
        return run(op, inputs, _conv_attrs(stride, padding, dilation, groups))
    kernel_, attrs = _general_conv(weight, stride, padding, dilation, transposed, output_padding, groups)
    # f16 and bf16 accumulate in f32, as PyTorch's CPU kernels do.
    wide = _accumulator(input.dtype)
    out = run("convolution", [input.to(wide), kernel_.to(wide)], attrs)
    if bias is not None:
        out = out + bias.to(wide).reshape(1, -1, *[1] * (weight.ndim - 2))
    return out.to(input.dtype)


def _accumulator(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@kernel("convolution_backward")
def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask,
):
    op = _plain_conv(weight, transposed)
    if op is not None:
        grads = _C.vjp(op, [input, weight], [grad_output], _conv_attrs(stride, padding, dilation, groups))
    else:
        kernel_, attrs = _general_conv(weight, stride, padding, dilation, transposed, output_padding, groups)
        wide = _accumulator(input.dtype)
        grads = _C.vjp("convolution", [input.to(wide), kernel_.to(wide)], [grad_output.to(wide)], attrs)
        if transposed:
            grads = [grads[0], _general_weight_grad(grads[1], weight, groups)]
        grads = [g.to(input.dtype) for g in grads]
    grad_input = grads[0] if output_mask[0] else None
    grad_weight = grads[1] if output_mask[1] else None
    grad_bias = None
    if output_mask[2]:
        dims = [0] + list(range(2, grad_output.ndim))
        grad_bias = run("sum", [grad_output], {"dims": dims, "keepdim": False})
    return grad_input, grad_weight, grad_bias


# ---- Normalisation. ----


def _norm_stats(x, dims, eps):
    mean = run("mean", [x], {"dims": dims, "keepdim": True})
    var = run("var", [x], {"dims": dims, "keepdim": True, "correction": 0.0})
    rstd = run("rsqrt", [run("add", [var, float(eps)], None, var.dtype)])
    return mean, rstd


@kernel("native_layer_norm")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    k = len(normalized_shape)
    if k > input.ndim or list(input.shape[input.ndim - k:]) != list(normalized_shape):
        raise RuntimeError(
            f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
            f"[*, {', '.join(map(str, normalized_shape))}], but got input of size{list(input.shape)}"
        )
    inputs, attrs = _layer_norm_args(input, weight, bias, k, eps)
    out = run("layer_norm", inputs, attrs)
    dims = list(range(input.ndim - k, input.ndim))
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    mean, rstd = _norm_stats(_as(input, compute), dims, eps)
    return out, mean, rstd


@kernel("native_group_norm")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    # The layer-norm op over each group's values, whose centring keeps a
    # large mean with a small spread accurate (PyTorch's decomposition
    # subtracts a mean rounded to the input dtype).
    if group <= 0 or C % group != 0:
        raise RuntimeError(
            f"Expected number of channels in input to be divisible by num_groups, but got input of shape "
            f"{list(input.shape)} and num_groups={group}"
        )
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    grouped = run("reshape", [_as(input, compute)], {"shape": [N, group, C // group * HxW]})
    normed = run("layer_norm", [grouped], {"normalized_dims": 1, "eps": float(eps)})
    out = run("reshape", [normed], {"shape": list(input.shape)})
    per_channel = [1, C] + [1] * (input.ndim - 2)
    if weight is not None:
        out = run("mul", [out, run("reshape", [_as(weight, compute)], {"shape": per_channel})])
    if bias is not None:
        out = run("add", [out, run("reshape", [_as(bias, compute)], {"shape": per_channel})])
    mean, rstd = _norm_stats(grouped, [2], eps)
    flat = lambda t: _as(run("reshape", [t], {"shape": [N, group]}), input.dtype)
    return _as(out, input.dtype), flat(mean), flat(rstd)


def _layer_norm_args(input, weight, bias, k, eps):
    if weight is None and bias is not None:
        weight = run("full", [], {"shape": list(bias.shape), "dtype": bias.dtype, "value": 1.0})
    inputs = [input] + [t for t in (weight, bias) if t is not None]
    return inputs, {"normalized_dims": k, "eps": float(eps)}


@kernel("native_layer_norm_backward")
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    # With xhat = (x - mean) * rstd and gy = g * weight:
    # dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)) over the
    # normalised dims; dweight = sum(g * xhat), dbias = sum(g) over the rest.
    k = len(normalized_shape)
    norm_dims = list(range(input.ndim - k, input.ndim))
    batch_dims = list(range(input.ndim - k))
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    x, g = _as(input, compute), _as(grad_out, compute)
    xhat = run("mul", [run("sub", [x, _as(mean, compute)]), _as(rstd, compute)])
    gy = g if weight is None else run("mul", [g, _as(weight, compute)])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        m1 = run("mean", [gy], {"dims": norm_dims, "keepdim": True})
        m2 = run("mean", [run("mul", [gy, xhat])], {"dims": norm_dims, "keepdim": True})
        inner = run("sub", [run("sub", [gy, m1]), run("mul", [xhat, m2])])
        grad_input = _as(run("mul", [inner, _as(rstd, compute)]), input.dtype)
    if output_mask[1] and weight is not None:
        gw = run("sum", [run("mul", [g, xhat])], {"dims": batch_dims, "keepdim": False})
        grad_weight = _as(gw, weight.dtype)
    if output_mask[2] and bias is not None:
        grad_bias = _as(run("sum", [g], {"dims": batch_dims, "keepdim": False}), bias.dtype)
    return grad_input, grad_weight, grad_bias


def _as(x, dtype):
    return x if x.dtype == dtype else run("cast", [x], {"dtype": dtype})


def _batch_norm_train_stats(input, eps):
    dims = [0] + list(range(2, input.ndim))
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    x = _as(input, compute)
    mean = run("mean", [x], {"dims": dims, "keepdim": False})
    var = run("var", [x], {"dims": dims, "keepdim": False, "correction": 0.0})
    return mean, run("rsqrt", [run("add", [var, float(eps)])])


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    c = input.shape[1]
    ones = lambda: run("full", [], {"shape": [c], "dtype": input.dtype, "value": 1.0})
    zeros = lambda: run("full", [], {"shape": [c], "dtype": input.dtype, "value": 0.0})
    has_stats = running_mean is not None and running_var is not None
    rm = running_mean if has_stats else zeros()
    rv = running_var if has_stats else ones()
    inputs = [input, weight if weight is not None else ones(), bias if bias is not None else zeros(), rm, rv]
    out, new_mean, new_var = _C.run(
        "batch_norm", inputs, {"training": bool(training), "momentum": float(momentum), "eps": float(eps)}
    )
    if training and has_stats:
        running_mean.copy_(new_mean)
        running_var.copy_(new_var)
    if training:
        save_mean, save_invstd = _batch_norm_train_stats(input, eps)
    else:
        # As on CPU and CUDA: evaluation saves no statistics (the backward
        # reads the running ones).
        compute = torch.float64 if input.dtype == torch.float64 else torch.float32
        save_mean = torch.empty(0, dtype=compute, device=input.device)
        save_invstd = torch.empty(0, dtype=compute, device=input.device)
    return out, save_mean, save_invstd


@kernel("native_batch_norm", "_native_batch_norm_legit")
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@kernel("_native_batch_norm_legit.no_stats")
def native_batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)


@kernel("_native_batch_norm_legit_no_training")
def native_batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)


@kernel("native_batch_norm_backward")
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask,
):
    # Per channel, over dims (0, 2, ...): with xhat = (x - mean) * invstd and
    # gy = g * weight, training gives
    # dx = invstd * (gy - mean(gy) - xhat * mean(gy * xhat)), evaluation
    # dx = gy * invstd (the statistics are constants).
    dims = [0] + list(range(2, input.ndim))
    shape = [1, input.shape[1]] + [1] * (input.ndim - 2)
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    per_channel = lambda t: run("reshape", [_as(t, compute)], {"shape": shape})
    if not train:
        save_mean = running_mean
        save_invstd = run("rsqrt", [run("add", [_as(running_var, compute), float(eps)])])
    x, g = _as(input, compute), _as(grad_out, compute)
    invstd = per_channel(save_invstd)
    xhat = run("mul", [run("sub", [x, per_channel(save_mean)]), invstd])
    gy = g if weight is None else run("mul", [g, per_channel(weight)])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            m1 = run("mean", [gy], {"dims": dims, "keepdim": True})
            m2 = run("mean", [run("mul", [gy, xhat])], {"dims": dims, "keepdim": True})
            gy = run("sub", [run("sub", [gy, m1]), run("mul", [xhat, m2])])
        grad_input = _as(run("mul", [gy, invstd]), input.dtype)
    if output_mask[1] and weight is not None:
        grad_weight = _as(run("sum", [run("mul", [g, xhat])], {"dims": dims, "keepdim": False}), weight.dtype)
    if output_mask[2]:
        grad_bias = _as(run("sum", [g], {"dims": dims, "keepdim": False}), input.dtype)
    return grad_input, grad_weight, grad_bias


# ---- Pooling. ----


def _per_dim(v, n):
    """An ``n``-d pooling argument as ``n`` values (PyTorch takes one or ``n``)."""
    return [v] * n if isinstance(v, int) else list(v) * (n // len(v))


def _pair(v):
    return _per_dim(v, 2)


def _ceil_extra(size, k, s, p, d):
    """Bottom or right padding, beyond ``p``, that makes floor-mode pooling
    give ``ceil_mode``'s output size (PyTorch drops a last window that would
    start in the right padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + p:
        out -= 1
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + 2 * p))


def _max_pool_attrs(kernel_size, stride, padding, dilation):
    kernel_size = _pair(kernel_size)
    # An empty stride means the kernel size.
    stride = _pair(stride) if stride else kernel_size
    return {"kernel_size": kernel_size, "stride": stride, "padding": _pair(padding), "dilation": _pair(dilation)}


def _max_pool_input(x, attrs, ceil_mode):
    """``x``, extended at the bottom and right with the lowest value when
    ``ceil_mode`` needs windows there."""
    if not ceil_mode:
        return x
    (kh, kw), (sh, sw) = attrs["kernel_size"], attrs["stride"]
    (ph, pw), (dh, dw) = attrs["padding"], attrs["dilation"]
    eh = _ceil_extra(x.shape[-2], kh, sh, ph, dh)
    ew = _ceil_extra(x.shape[-1], kw, sw, pw, dw)
    if eh == ew == 0:
        return x
    low = float("-inf") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    return torch.nn.functional.pad(x, (0, ew, 0, eh), value=low)


@kernel("max_pool2d_with_indices")
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    attrs = _max_pool_attrs(kernel_size, stride, padding, dilation)
    x = _max_pool_input(self, attrs, ceil_mode)
    out = run("max_pool2d", [x], attrs)
    return out, _max_pool_indices(x, out, attrs, self.shape[-1])


def _max_pool_indices(x, out, attrs, width):
    """Where each window's maximum is, as ``h * width + w`` in the input
    plane (the first in row-major window order, as PyTorch's kernels): one
    strided slice of the padded input per kernel offset, compared with the
    best so far."""
    (kh, kw), (sh, sw) = attrs["kernel_size"], attrs["stride"]
    (ph, pw), (dh, dw) = attrs["padding"], attrs["dilation"]
    oh, ow = out.shape[-2:]
    padded = torch.nn.functional.pad(x, (pw, pw, ph, ph), value=float("-inf"))
    rows = torch.arange(oh, device=x.device) * sh - ph
    cols = torch.arange(ow, device=x.device) * sw - pw
    best = indices = None
    for i in range(kh):
        for j in range(kw):
            window = padded[..., i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
            position = (rows + i * dh)[:, None] * width + (cols + j * dw)[None, :]
            if best is None:
                best, indices = window, position.expand(window.shape)
                continue
            take = window > best
            best = torch.where(take, window, best)
            indices = torch.where(take, position, indices)
    return indices.contiguous()


@kernel("max_pool2d_with_indices_backward")
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices):
    attrs = _max_pool_attrs(kernel_size, stride, padding, dilation)
    x = _max_pool_input(self, attrs, ceil_mode)
    grad = _C.vjp("max_pool2d", [x], [grad_output], attrs)[0]
    if x is self:
        return grad
    return grad[..., : self.shape[-2], : self.shape[-1]].contiguous()


def _avg_attrs(kernel_size, stride, padding, count_include_pad):
    kernel_size = _pair(kernel_size)
    return {
        "kernel_size": kernel_size,
        "stride": _pair(stride) if stride else kernel_size,
        "padding": _pair(padding),
        "count_include_pad": bool(count_include_pad),
    }


def _avg_pool_sums(self, attrs, ceil_mode, count_include_pad, divisor_override):
    """For ``ceil_mode`` and ``divisor_override``: the input padded
    explicitly (zeros, plus the ceil-mode overflow), the plain pooling
    attributes over it, and the divisor per window, so that
    ``avg_pool2d(padded, plain) / divisor`` is PyTorch's result."""
    (kh, kw), (sh, sw), (ph, pw) = attrs["kernel_size"], attrs["stride"], attrs["padding"]
    h, w = self.shape[-2:]
    eh = _ceil_extra(h, kh, sh, ph, 1) if ceil_mode else 0
    ew = _ceil_extra(w, kw, sw, pw, 1) if ceil_mode else 0
    pad = torch.nn.functional.pad
    padded = pad(self, (pw, pw + ew, ph, ph + eh))
    plain = {"kernel_size": [kh, kw], "stride": [sh, sw], "padding": [0, 0], "count_include_pad": True}
    if divisor_override is not None:
        return padded, plain, float(divisor_override) / (kh * kw)
    # The share of each window that counts: the input, the explicit padding
    # when count_include_pad, never the ceil-mode overflow.
    ones = torch.ones((1, h, w), dtype=self.dtype, device=self.device)
    counted = pad(ones, (pw, pw, ph, ph), value=1.0 if count_include_pad else 0.0)
    counted = pad(counted, (0, ew, 0, eh))
    return padded, plain, run("avg_pool2d", [counted], plain)


@kernel("avg_pool2d")
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    attrs = _avg_attrs(kernel_size, stride, padding, count_include_pad)
    if not ceil_mode and divisor_override is None:
        return run("avg_pool2d", [self], attrs)
    padded, plain, divisor = _avg_pool_sums(self, attrs, ceil_mode, count_include_pad, divisor_override)
    return run("avg_pool2d", [padded], plain) / divisor


@kernel("avg_pool2d_backward")
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    attrs = _avg_attrs(kernel_size, stride, padding, count_include_pad)
    if not ceil_mode and divisor_override is None:
        return _C.vjp("avg_pool2d", [self], [grad_output], attrs)[0]
    padded, plain, divisor = _avg_pool_sums(self, attrs, ceil_mode, count_include_pad, divisor_override)
    grad = _C.vjp("avg_pool2d", [padded], [grad_output / divisor], plain)[0]
    (ph, pw), (h, w) = attrs["padding"], self.shape[-2:]
    return grad[..., ph : ph + h, pw : pw + w].contiguous()


# ---- Embeddings and losses. ----


@kernel("_embedding_bag_forward_only", "_embedding_bag")
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Bag ``b`` sums (mode 0), averages (1) or takes the maximum (2) of the
    rows ``weight[indices[offsets[b]:offsets[b + 1]]]``, skipping
    ``padding_idx``; an empty bag is zeros. Returns the bags, each index's
    bag, each bag's size and, for the maximum, the row each value came
    from."""
    n, dim = indices.numel(), weight.shape[1]
    bags = offsets.numel() - (1 if include_last_offset else 0)
    indices = indices.reshape(-1)
    bag = (torch.searchsorted(offsets[:bags].contiguous(), torch.arange(n, device=weight.device), right=True) - 1).clamp(min=0)
    if include_last_offset and bags:
        inside = torch.arange(n, device=weight.device) < offsets[bags]
    else:
        inside = torch.ones(n, dtype=torch.bool, device=weight.device)
    keep = inside if padding_idx is None or padding_idx < 0 else inside & (indices != padding_idx)
    rows = weight[indices]
    size = torch.zeros(bags, dtype=torch.int64, device=weight.device).index_add(0, bag, keep.to(torch.int64))
    if mode == 2:
        wide = bag.unsqueeze(1).expand(n, dim)
        masked = torch.where(keep.unsqueeze(1), rows, float("-inf"))
        out = torch.full((bags, dim), float("-inf"), dtype=weight.dtype, device=weight.device)
        out = out.scatter_reduce(0, wide, masked, "amax", include_self=True)
        hit = keep.unsqueeze(1) & (masked == out[bag])
        where = torch.where(hit, torch.arange(n, device=weight.device).unsqueeze(1), -1)
        first = torch.full((bags, dim), -1, dtype=torch.int64, device=weight.device)
        first = first.scatter_reduce(0, wide, where, "amax", include_self=True)
        max_indices = torch.where(first >= 0, indices[first.clamp(min=0)], 0)
        out = torch.where(size.unsqueeze(1) > 0, out, torch.zeros_like(out))
        return out, bag, size, max_indices
    scale = keep.to(weight.dtype).unsqueeze(1)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.reshape(-1, 1).to(weight.dtype)
    out = torch.zeros((bags, dim), dtype=weight.dtype, device=weight.device).index_add(0, bag, rows * scale)
    if mode == 1:
        out = out / size.clamp(min=1).unsqueeze(1).to(weight.dtype)
    return out, bag, size, torch.zeros(bags, dtype=torch.int64, device=weight.device)


@kernel("_embedding_bag_dense_backward")
def _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                  scale_grad_by_freq, mode, per_sample_weights, padding_idx=-1):
    """Each index's row gets its bag's gradient: scaled by its sample
    weight (sum) or divided by the bag's size (mean); for the maximum, each
    bag's gradient goes to the row its value came from. ``padding_idx``
    rows get nothing; with ``scale_grad_by_freq`` a row's share is divided
    by how often its index occurs."""
    dim = grad.shape[1]
    indices = indices.reshape(-1)
    out = torch.zeros((num_weights, dim), dtype=grad.dtype, device=grad.device)
    if mode == 2:
        filled = (bag_size > 0).unsqueeze(1).to(grad.dtype)
        return out.scatter_add(0, maximum_indices.clamp(min=0), grad * filled)
    keep = torch.ones(indices.shape, dtype=torch.bool, device=grad.device)
    if padding_idx is not None and padding_idx >= 0:
        keep = indices != padding_idx
    scale = keep.to(grad.dtype)
    if mode == 1:
        scale = scale / bag_size[offset2bag].clamp(min=1).to(grad.dtype)
    elif per_sample_weights is not None:
        scale = scale * per_sample_weights.reshape(-1).to(grad.dtype)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=grad.dtype, device=grad.device).index_add(0, indices, keep.to(grad.dtype))
        scale = scale / counts[indices].clamp(min=1)
    return out.index_add(0, indices, grad[offset2bag] * scale.unsqueeze(1))


@kernel("_embedding_bag_backward")
def _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
                            scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1):
    if sparse:
        raise NotImplementedError("aten::_embedding_bag_backward with sparse=True is not implemented for the tpu device")
    return _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                         scale_grad_by_freq, mode, per_sample_weights, padding_idx)


@kernel("_embedding_bag_per_sample_weights_backward")
def _embedding_bag_per_sample_weights_backward(grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    """Each sample weight's gradient: its bag's gradient dotted with its
    row (sum mode only, as on the CPU); 0 for ``padding_idx``."""
    if mode != 0:
        raise RuntimeError("embedding_bag_backward: per_sample_weights only supported for mode='sum' (tpu)")
    indices = indices.reshape(-1)
    dots = (grad[offset2bag] * weight[indices]).sum(1)
    if padding_idx is not None and padding_idx >= 0:
        dots = torch.where(indices == padding_idx, 0, dots)
    return dots


@kernel("embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise NotImplementedError(
            "aten::embedding_dense_backward with scale_grad_by_freq=True is not implemented for the tpu device"
        )
    d = grad_output.shape[-1]
    flat_idx = run("reshape", [indices], {"shape": [indices.numel()]})
    rows = run("reshape", [grad_output], {"shape": [indices.numel(), d]})
    if padding_idx >= 0:
        keep = run("ne", [flat_idx, padding_idx], None, flat_idx.dtype)
        keep = run("reshape", [run("cast", [keep], {"dtype": rows.dtype})], {"shape": [indices.numel(), 1]})
        rows = run("mul", [rows, keep])
    zeros = run("full", [], {"shape": [num_weights, d], "dtype": grad_output.dtype, "value": 0.0})
    return run("index_add", [zeros, flat_idx, rows], {"dim": 0})


def _margin_terms(self, target, p, margin, weight):
    """Multi-margin loss over classes: each wrong class ``j``'s term
    ``z = margin - x[y] + x[j]`` where positive, and the rows, classes and
    flat targets; checked as on the CPU."""
    x = self.reshape(-1, self.shape[-1] if self.dim() else 1)
    n, c = x.shape
    if target.dim() > 1 or target.numel() != n:
        raise RuntimeError(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of input samples "
            f"(batch size). Expected target size [{n}], but got {list(target.shape)} (tpu)"
        )
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {_TYPE_NAMES.get(target.dtype, target.dtype)} (tpu)")
    if weight is not None and (weight.dim() != 1 or weight.numel() != c):
        raise RuntimeError(f"inconsistent weight size, expected {c} but got {list(weight.shape)} (tpu)")
    t = target.reshape(-1)
    z = margin - x.gather(1, t.unsqueeze(1)) + x
    wrong = torch.arange(c, device=x.device) != t.unsqueeze(1)
    return torch.where((z > 0) & wrong, z, 0), n, c, t


@kernel("multi_margin_loss")
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=1):
    z, n, c, t = _margin_terms(self, target, p, margin, weight)
    terms = z if p == 1 else z * z
    if weight is not None:
        terms = terms * weight[t].unsqueeze(1).to(terms.dtype)
    loss = terms.sum(1) / c
    if reduction == 0:
        return loss.reshape(target.shape)
    return loss.mean() if reduction == 1 else loss.sum()


@kernel("multi_margin_loss_backward")
def multi_margin_loss_backward(grad_output, self, target, p, margin, weight=None, reduction=1):
    """Each wrong class with a positive term ``z`` gets ``p * z**(p - 1) /
    C`` (times the target's weight); the target class gets minus their
    sum."""
    z, n, c, t = _margin_terms(self, target, p, margin, weight)
    g = (2 * z if p == 2 else (z > 0).to(z.dtype)) / c
    if weight is not None:
        g = g * weight[t].unsqueeze(1).to(g.dtype)
    g = g - torch.nn.functional.one_hot(t, c).to(g.dtype) * g.sum(1, keepdim=True)
    if reduction == 0:
        g = g * grad_output.reshape(-1, 1)
    else:
        g = g * (grad_output / n if reduction == 1 else grad_output)
    return g.reshape(self.shape)


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_args(reduction, ignore_index):
    return {"reduction": _REDUCTIONS[int(reduction)], "ignore_index": int(ignore_index)}


def _class_weights(self, target, weight, ignore_index):
    """The class dim, the targets with ignored ones at class 0, and each
    target's weight (0 where ignored)."""
    dim = 1 if self.dim() >= 2 else 0
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    w = weight.index_select(0, safe.flatten()).reshape(target.shape)
    return dim, safe, w * keep.to(w.dtype)


@kernel("nll_loss_forward", "nll_loss2d_forward")
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    if weight is None:
        out = run("nll_loss", [self, target], _nll_args(reduction, ignore_index))
        counted = run("ne", [target, ignore_index], None, target.dtype)
        total = run("sum", [run("cast", [counted], {"dtype": self.dtype})], {"dims": list(range(target.ndim)), "keepdim": False})
        return out, total
    classes = self.shape[1] if self.ndim > 1 else self.shape[0]
    if weight.numel() != classes:
        raise RuntimeError(
            f"weight tensor should be defined either for all {classes} classes or no classes "
            f"but got weight tensor of shape: {list(weight.shape)}"
        )
    dim, safe, w = _class_weights(self, target, weight, ignore_index)
    losses = -self.gather(dim, safe.unsqueeze(dim)).squeeze(dim) * w
    total = w.sum()
    reduction = _REDUCTIONS[int(reduction)]
    if reduction == "none":
        return losses, total
    return (losses.sum() if reduction == "sum" else losses.sum() / total), total


@kernel("nll_loss_backward", "nll_loss2d_backward")
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    if weight is None:
        return _C.vjp("nll_loss", [self, target], [grad_output], _nll_args(reduction, ignore_index))[0]
    dim, safe, w = _class_weights(self, target, weight, ignore_index)
    g = grad_output / total_weight if _REDUCTIONS[int(reduction)] == "mean" else grad_output
    picked = (-w * g).unsqueeze(dim)
    return torch.zeros_like(self).scatter_add(dim, safe.unsqueeze(dim), picked)


# ---- Dropout. ----


@kernel("native_dropout")
def native_dropout(input, p, train):
    if not train or p == 0:
        return input.clone(), run("full", [], {"shape": list(input.shape), "dtype": torch.bool, "value": 1.0})
    mask = torch.empty(input.shape, dtype=torch.bool, device=input.device)
    _C.fill_random("bernoulli", mask, {"p": 1.0 - float(p)})
    scale = 1.0 / (1.0 - p) if p < 1 else 0.0
    return run("mul", [run("mul", [input, mask], None, input.dtype), scale], None, input.dtype), mask


@kernel("native_dropout_backward")
def native_dropout_backward(grad_output, mask, scale):
    return run("mul", [run("mul", [grad_output, mask], None, grad_output.dtype), scale], None, grad_output.dtype)


# ---- Attention: PyTorch's math path, in ops the device has. ----


@kernel("_fused_sdp_choice", derive=False)
def _fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    return 0  # SDPBackend.math


def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """``F.scaled_dot_product_attention``: PyTorch's own (its math path, in
    ops the device has), except for inference over a key and value held
    padded to a shape bucket (a grown KV cache), which runs over the whole
    bucket with the padding masked out, so every length in a bucket runs
    the same programs."""
    padded = None
    if _over_padded_keys(query, key, value, attn_mask, dropout_p, enable_gqa):
        padded = _C.padded_keys(key, value)
    if padded is None:
        return aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    length = key.shape[-2]
    key, value, held = padded
    capacity = key.shape[-2]
    if attn_mask is not None and attn_mask.shape[-1] == length and length != 1:
        attn_mask = torch.nn.functional.pad(attn_mask, (0, capacity - length))
    if key.shape[-3] != query.shape[-3]:
        # Grouped-query attention: each key and value head serves a group.
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, -3), value.repeat_interleave(groups, -3)
    keep = torch.arange(capacity, device=key.device) < held
    if attn_mask is None:
        mask = keep
    elif attn_mask.dtype == torch.bool:
        mask = attn_mask & keep
    else:
        mask = attn_mask.masked_fill(~keep, float("-inf"))
    if is_causal:
        # Top-left aligned over the keys held, as PyTorch's causal mask.
        causal = torch.ones(query.shape[-2], capacity, dtype=torch.bool, device=key.device).tril()
        mask = mask & causal if mask.dtype == torch.bool else mask.masked_fill(~causal, float("-inf"))
    # One program over the whole bucket (a row that every mask empties
    # gives zeros, as PyTorch's math path does).
    attrs = {}
    if scale is not None:
        attrs["scale"] = float(scale)
    return _C.run("scaled_dot_product_attention", [query, key, value, mask], attrs)[0]


def _over_padded_keys(query, key, value, attn_mask, dropout_p, enable_gqa):
    """Whether an attention call may take the padded path: inference, no
    dropout, and inputs PyTorch's checks would pass (anything else goes to
    PyTorch's own path, which reports it)."""
    tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
    if dropout_p != 0.0 or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return False
    return (
        query.dim() == key.dim() == value.dim() >= 3
        and query.dtype == key.dtype == value.dtype
        and query.is_floating_point()
        and query.shape[:-3] == key.shape[:-3] == value.shape[:-3]
        and key.shape[-3] == value.shape[-3]
        and (query.shape[-3] == key.shape[-3] or (enable_gqa and query.shape[-3] % key.shape[-3] == 0))
        and query.shape[-1] == key.shape[-1]
        and (attn_mask is None or (attn_mask.dtype in (torch.bool, query.dtype) and attn_mask.shape[-1] in (1, key.shape[-2])))
    )



@kernel("_scaled_dot_product_flash_attention_for_cpu")
def _sdpa_flash_for_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    """PyTorch's CPU flash-attention entry point: the attention output and
    the row-wise log-sum-exp of the scaled, masked scores."""
    if dropout_p != 0.0:
        raise NotImplementedError("_scaled_dot_product_flash_attention_for_cpu with dropout is not implemented for the tpu device")
    return _attention(query, key, value, attn_mask, is_causal, scale)


def _attention(query, key, value, attn_mask, is_causal, scale):
    """Softmax attention and the row-wise log-sum-exp of its scaled, masked
    scores, computed in f32 for f16 and bf16 as the CPU kernel does (the
    log-sum-exp stays f32)."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    dtype = query.dtype
    query, key, value = (t.to(_accumulator(dtype)) for t in (query, key, value))
    s = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        causal = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    lse = torch.logsumexp(s, -1)
    out = torch.matmul(torch.softmax(s, -1), value)
    return out.to(dtype), lse


# ---- Padding. ----


@kernel("replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward")
def replication_pad_backward(grad_output, self, padding):
    """Each output position read input position ``clamp(j - before, 0,
    n - 1)`` along each padded dim (negative padding crops): the gradient
    adds back along those indices, one dim at a time."""
    grad = grad_output
    for i in range(len(padding) // 2):
        dim = self.ndim - 1 - i
        before, n = padding[2 * i], self.shape[dim]
        source = (torch.arange(grad.shape[dim], device=grad.device) - before).clamp(0, n - 1)
        shape = list(grad.shape)
        shape[dim] = n
        grad = torch.zeros(shape, dtype=grad.dtype, device=grad.device).index_add(dim, source, grad)
    return grad


# ---- Interpolation backward. ----


def _upsample_backward(forward):
    """The backward of a separable interpolation from the forward itself:
    along each spatial dim, the forward of the identity (every other dim of
    size 1) is that dim's weight matrix transposed, and the gradient
    contracts with it, one dim at a time."""

    def k(grad_output, output_size, input_size, *args, **kwargs):
        spatial = len(output_size)
        grad = grad_output
        for d in range(spatial):
            n_in = input_size[2 + d]
            shape = [1, n_in] + [1] * spatial
            shape[2 + d] = n_in
            basis = torch.eye(n_in, dtype=grad.dtype, device=grad.device).reshape(shape)
            sizes = [1] * spatial
            sizes[d] = output_size[d]
            weights = forward(basis, sizes, *args, **kwargs).reshape(n_in, output_size[d])
            grad = torch.movedim(torch.movedim(grad, 2 + d, -1) @ weights.mT, -1, 2 + d)
        return grad.contiguous()

    return k


for _name in (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "upsample_bicubic2d", "upsample_trilinear3d",
):
    kernel(f"{_name}_backward")(_upsample_backward(getattr(torch.ops.aten, _name).default))


# ---- Recurrent cells: what nn.LSTM, nn.GRU and their cells run on a
# non-CPU device. The workspace is this module's own: the activated gates
# the backward kernels read. ----


@kernel("_thnn_fused_lstm_cell")
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


@kernel("_thnn_fused_lstm_cell_backward_impl")
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_o = torch.zeros_like(o) if grad_hy is None else grad_hy * tanh_cy * o * (1 - o)
    grad_gates = torch.cat([
        grad_c * g * i * (1 - i),
        grad_c * cx * f * (1 - f),
        grad_c * i * (1 - g * g),
        grad_o,
    ], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@kernel("_thnn_fused_gru_cell")
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


@kernel("_thnn_fused_gru_cell_backward")
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    grad_hx = grad_hy * z
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0), grad_hidden_gates.sum(0)


@raw("embedding_renorm_")
def embedding_renorm_(self, indices, max_norm, norm_type):
    """Rows that ``indices`` looks up whose norm exceeds ``max_norm`` are
    scaled down to it (nn.Embedding's max_norm), in place."""
    rows = torch.unique(indices.reshape(-1))
    weights = self.index_select(0, rows)
    norms = torch.linalg.vector_norm(weights, norm_type, dim=1, keepdim=True)
    scale = torch.where(norms > max_norm, max_norm / (norms + 1e-7), torch.ones_like(norms))
    self.index_copy_(0, rows, weights * scale)
    return self


@kernel("_weight_norm_interface_backward")
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    """w = g * v / |v| (the norm over every dim but ``dim``; over all of
    them for -1): the gradients of ``v`` and ``g``."""
    axes = [d for d in range(saved_v.ndim) if d != dim] if dim != -1 else list(range(saved_v.ndim))
    grad_g = (grad_w * saved_v).sum(axes, keepdim=True) / saved_norms
    grad_v = (saved_g / saved_norms) * (grad_w - saved_v * (grad_g / saved_norms))
    return grad_v, grad_g.reshape(saved_g.shape)


_attention_lib = None


def route_attention(padded_keys_possible):
    """Attention over a padded KV cache needs the kernel above; the bridge
    routes attention to it from the first padded join after the buckets
    were set (and off when they are set again). Otherwise PyTorch's
    composite runs (its math path, chosen by ``_fused_sdp_choice``) with no
    Python on its path."""
    global _attention_lib
    _attention_lib = above_autograd_while(
        "scaled_dot_product_attention", _scaled_dot_product_attention, padded_keys_possible, _attention_lib
    )
