"""Tensors themselves: allocation, copies between devices, views, resizing
and reading single values."""

import math

import torch

from .. import _C, tpu
from .registry import above_autograd, raw, rebind

# Views (view, as_strided, ...) are C++ kernels: native/views.cc; empty,
# empty_strided, clone, _to_copy, copy_, fill_, zero_ and
# _local_scalar_dense are native kernels in src/native_ops/tensors.rs
# (copy_ below serves _copy_from).

# Binding a storage: the CPU kernel does it without resizing, and tpu
# storages keep the byte size they were made with.
rebind(
    "set_.source_Tensor",
    "set_.source_Storage",
    "set_.source_Storage_storage_offset",
)
# A complex tensor's parts and the reverse: the same storage read in the
# other dtype (crates/torch-bridge/src/storage.rs, `read_as`).
rebind("view_as_real", "view_as_complex")


def _index(device):
    index = None if device is None else torch.device(device).index
    return tpu.current_device() if index is None else index


@raw("_efficientzerotensor", complex=True)
def efficient_zero_tensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    """The zeros autograd uses for gradients known to vanish (a plain
    tensor of zeros here)."""
    return torch.zeros(size, dtype=dtype if dtype is not None else torch.get_default_dtype(), device=device)


@raw("resize_", complex=True)
def resize_(self, size, *, memory_format=None):
    size = list(size)
    if list(self.shape) == size:
        return self
    if math.prod(size) == self.numel() and self.is_contiguous():
        # Same elements, new shape: keep the data.
        return self.set_(self.view(size))
    # As PyTorch: the elements of the storage from the offset on keep their
    # order in the new shape, and the ones past the end are new.
    fresh = _C.empty(size, self.dtype, _index(self.device))
    stored = self.untyped_storage().nbytes() // self.element_size() - self.storage_offset()
    kept = min(math.prod(size), stored)
    if kept > 0:
        fresh.view(-1)[:kept].copy_(self.as_strided((kept,), (1,), self.storage_offset()))
    return self.set_(fresh)


@raw("copy_")
def copy_(self, src, non_blocking=False):
    if self.device.type == "tpu":
        _C.copy_into(self, src)
    else:
        # tpu -> cpu: download, then let the CPU copy cast and broadcast.
        self.copy_(_C.to_cpu(src))
    return self


@raw("_copy_from")
def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


@raw("_copy_from_and_resize")
def _copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


# `module.to("tpu")` swaps each parameter's data in place (`param.data =`)
# only when PyTorch deems the two tensors' kinds compatible, and its list
# of such backends does not name PrivateUse1; without this, every parameter
# becomes a new object and weights tied between modules come apart. Dense
# CPU and tpu tensors share one TensorImpl kind.
@above_autograd("_has_compatible_shallow_copy_type")
def _has_compatible_shallow_copy_type(self, from_):
    return self.layout == torch.strided and from_.layout == torch.strided
