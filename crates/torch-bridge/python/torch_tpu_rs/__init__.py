"""torch_tpu_rs: a ``tpu`` device for PyTorch, driven through PJRT by tpu-rs.

``import torch`` loads it (through the ``torch.backends`` entry point;
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off, then
``import torch_tpu_rs`` does it). After that, ``cuda`` -> ``tpu``::

    model = model.to("tpu")
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        loss = model(x.to("tpu")).sum()
        loss.backward()
"""

import atexit

from . import _C
from ._backend import register
from ._C import RecompileWarning, TpuError, TpuIndexError, TpuNotImplementedError

__all__ = [
    "RecompileWarning",
    "TpuError",
    "TpuIndexError",
    "TpuNotImplementedError",
    "metrics",
    "op_names",
]

register()
# A trace TPU_RS_PROFILE started is completed when the interpreter exits.
atexit.register(_C.profile_stop)


def _autoload():
    """The ``torch.backends`` entry point: importing this package is enough."""


def metrics():
    """Runtime counters (see :func:`torch.tpu.metrics`)."""
    return dict(_C.metrics())


def op_names():
    """Every op in the tpu-rs registry."""
    return list(_C.op_names())
