"""``torch.amp.autocast("tpu")``: matrix products and convolutions run in the
autocast dtype (bfloat16 by default); numerically sensitive ops run in
float32; everything else runs in whatever dtype it gets (as PyTorch's CUDA
autocast lists do)."""

import torch
from torch._C import DispatchKey, DispatchKeySet

aten = torch.ops.aten
_KEY = "AutocastPrivateUse1"
_EXCLUDE = DispatchKeySet(DispatchKey.AutocastPrivateUse1)

#: Ops run in the autocast dtype.
LOWER_PRECISION = [
    "mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "conv1d", "conv2d",
    "convolution", "_convolution", "scaled_dot_product_attention",
]
#: Ops run in float32.
FLOAT32 = [
    "softmax.int", "log_softmax.int", "layer_norm", "group_norm", "nll_loss",
    "cross_entropy_loss", "mse_loss", "binary_cross_entropy_with_logits",
    "exp", "log", "pow.Tensor_Scalar", "sum.dim_IntList", "prod", "cumsum",
    "norm.Scalar", "rsqrt", "erfinv", "logsumexp",
]

_lib = torch.library.Library("aten", "IMPL")
_fallthrough = torch.library.Library("_", "IMPL")
_fallthrough.fallback(torch.library.fallthrough_kernel, _KEY)


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == "tpu":
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _register(name, target):
    packet, _, overload = name.partition(".")
    op = getattr(getattr(aten, packet), overload or "default")

    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("tpu") if target is None else target
        args, kwargs = _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)

    _lib.impl(name, kernel, _KEY)


for _name in LOWER_PRECISION:
    _register(_name, None)
for _name in FLOAT32:
    _register(_name, torch.float32)
