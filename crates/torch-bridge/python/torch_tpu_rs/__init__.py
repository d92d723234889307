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
from importlib import metadata


def _autoload():
    """The ``torch.backends`` entry point: importing this package is enough.
    (Defined before torch is imported: importing this package first makes
    torch's autoload look for it in the half-initialised package.)"""


import torch  # noqa: E402


def _check_torch_version():
    """The C++ layer is built against one torch minor version, the one the
    wheel pins: under another, loading it would fail on a symbol, or worse."""
    try:
        requires = metadata.requires("torch-tpu-rs") or []
    except metadata.PackageNotFoundError:
        return
    for requirement in requires:
        if requirement.startswith("torch=="):
            built = requirement.removeprefix("torch==").removesuffix(".*")
            running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
            if running != built:
                raise ImportError(
                    f"torch_tpu_rs was built for torch {built}, but torch {torch.__version__}"
                    f" is installed: install torch=={built}.* or a torch_tpu_rs built for {running}"
                )


_check_torch_version()

from . import _C  # noqa: E402  (after the version check)
from ._backend import register  # noqa: E402
from ._C import RecompileWarning, TpuError, TpuIndexError, TpuNotImplementedError  # noqa: E402

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
# Calls still waiting for their compiles launch first (exit handlers run
# last registered first): no compile thread is inside the plugin at exit.
atexit.register(_C.launch_queued)


def metrics():
    """Runtime counters (see :func:`torch.tpu.metrics`)."""
    return dict(_C.metrics())


def op_names():
    """Every op in the tpu-rs registry."""
    return list(_C.op_names())
