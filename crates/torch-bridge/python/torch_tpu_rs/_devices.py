"""Empty torch tensors on ``tpu:n``, whose storage the bridge then binds.

torch's helper for Python backends (``torch._C._acc.create_empty_tensor``)
makes them on ``tpu:0`` only, and a tensor's storage cannot move to
another device. A tensor imported through DLPack can sit on any device
(DLPack's ``kDLExtDev`` is torch's PrivateUse1, here ``tpu``): one empty
import per device and dtype, made once, and each new tensor is a detached
alias of it.
"""

import ctypes
import functools

import torch

_EXT_DEV = 12  # DLDeviceType::kDLExtDev

# DLPack type codes (int 0, uint 1, float 2, bfloat 4, bool 6) and bits.
_TYPES = {
    torch.bool: (6, 8),
    torch.int8: (0, 8),
    torch.int16: (0, 16),
    torch.int32: (0, 32),
    torch.int64: (0, 64),
    torch.uint8: (1, 8),
    torch.uint32: (1, 32),
    torch.float16: (2, 16),
    torch.bfloat16: (4, 16),
    torch.float32: (2, 32),
    torch.float64: (2, 64),
}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

_capsule = ctypes.pythonapi.PyCapsule_New
_capsule.restype = ctypes.py_object
_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@functools.cache
def _import(index, dtype):
    code, bits = _TYPES[dtype]
    shape = (ctypes.c_int64 * 1)(0)
    # No memory and no deleter: the import lives as long as the process.
    managed = _Managed(_Tensor(None, _Device(_EXT_DEV, index), 1, _DType(code, bits, 1), shape, None, 0), None, _Deleter())
    tensor = torch.utils.dlpack.from_dlpack(_capsule(ctypes.addressof(managed), b"dltensor", None))
    # The structures first: a tuple releases its items last to first, so
    # the tensor (which reads them when freed) goes before them.
    return (managed, shape), tensor


def empty_tensor(index, dtype):
    """A new tensor of no elements on ``tpu:index``."""
    return _import(index, dtype)[1].detach()
