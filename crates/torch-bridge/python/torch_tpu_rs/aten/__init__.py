"""The aten kernels of the ``tpu`` device. Importing registers them."""

from . import adaptive, autocast, elementwise, indexing, linalg, nn, random, reductions, tensors  # noqa: F401
from .registry import REGISTERED, cpu_fallback_enabled  # noqa: F401
