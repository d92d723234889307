"""Registers ``tpu`` with PyTorch as the PrivateUse1 backend."""

import os

import torch

from . import _C, _compile, _transformers, tpu


def _reduce_ex(original):
    # torch.save writes storages byte for byte; a tpu storage's bytes live
    # on the device, so tpu tensors pickle as their CPU copy and come back
    # on tpu (as XLA tensors do).
    def __reduce_ex__(self, protocol):
        if self.device.type == "tpu" and type(self) in (torch.Tensor, torch.nn.Parameter):
            rebuilt = (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad)
            if type(self) is torch.nn.Parameter:
                return (_rebuild_parameter, rebuilt)
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor, rebuilt)
        return original(self, protocol)

    return __reduce_ex__


def _rebuild_parameter(data, dtype, device, requires_grad):
    return torch.nn.Parameter(data.to(dtype=dtype, device=device), requires_grad)


def _deepcopy(original):
    def __deepcopy__(self, memo):
        if self.device.type != "tpu" or id(self) in memo:
            return original(self, memo)
        copy = self.detach().clone()
        if type(self) is torch.nn.Parameter:
            copy = torch.nn.Parameter(copy, self.requires_grad)
        else:
            copy.requires_grad_(self.requires_grad)
        memo[id(self)] = copy
        return copy

    return __deepcopy__


_registered = False


def _use_local_rank():
    """Under torchrun (``LOCAL_RANK`` set), ``tpu`` means ``tpu:LOCAL_RANK``
    in every thread that has not chosen a device, when the plugin has that
    many devices in this process; else ``tpu:0``, as without torchrun."""
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is None or not local_rank.isdigit():
        return
    if 0 < int(local_rank) < tpu.device_count():
        _C.set_default_device(int(local_rank))


def register():
    global _registered
    if _registered:
        return
    _registered = True
    # The device guard and hooks are C++ (registered when _C loads).
    torch.utils.rename_privateuse1_backend("tpu")
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("tpu", tpu)
    # Autocast on tpu computes in bfloat16 unless told otherwise (PyTorch's
    # default for a new backend is float16). PyTorch keeps this per thread:
    # it holds on the thread that imports torch; elsewhere pass `dtype=`.
    torch.set_autocast_dtype("tpu", torch.bfloat16)
    torch.Tensor.__reduce_ex__ = _reduce_ex(torch.Tensor.__reduce_ex__)
    torch.nn.Parameter.__reduce_ex__ = _reduce_ex(torch.nn.Parameter.__reduce_ex__)
    torch.Tensor.__deepcopy__ = _deepcopy(torch.Tensor.__deepcopy__)
    torch.nn.Parameter.__deepcopy__ = _deepcopy(torch.nn.Parameter.__deepcopy__)
    _transformers.install()
    _compile.route_inductor()
    _use_local_rank()
    from . import aten  # noqa: F401  (registers the kernels)

    if torch.distributed.is_available():
        from . import _dist

        _dist.register()
