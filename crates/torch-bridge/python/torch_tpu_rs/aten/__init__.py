"""The aten kernels of the ``tpu`` device. Importing registers them."""

from . import adaptive, autocast, ctc, decomp, elementwise, grid_sample, indexing, ldl, linalg, lu, nn, pooling, random, reductions, resample, spectral, tensors  # noqa: F401
from .registry import PYTHON_KERNEL_CALLS, REGISTERED, cpu_fallback_enabled  # noqa: F401
