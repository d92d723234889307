"""Hugging Face ``transformers``: a pipeline keeps a model already on ``tpu``.

``pipeline(task, model=m)`` without ``device`` places the model on the first
accelerator transformers knows by name (CUDA, XPU, NPU, ...) and else moves
it to the CPU, so a model the user put on ``tpu`` would silently run on the
CPU. Here, ``device`` left unset means the model's own ``tpu`` device. The
change is applied when ``transformers.pipelines.base`` is imported (or now,
if it already was); nothing of transformers is imported to do it.
"""

import functools
import importlib.abc
import importlib.util
import inspect
import sys

import torch

_MODULE = "transformers.pipelines.base"


def _keep_tpu_models(module):
    pipeline = module.Pipeline
    init = pipeline.__init__
    if getattr(init, "_keeps_tpu_models", False):
        return
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        model = bound.arguments.get("model")
        placed = getattr(model, "device", None)
        if (
            bound.arguments.get("device") is None
            and getattr(model, "hf_device_map", None) is None
            and isinstance(placed, torch.device)
            and placed.type == "tpu"
        ):
            bound.arguments["device"] = placed
        init(*bound.args, **bound.kwargs)

    __init__._keeps_tpu_models = True
    pipeline.__init__ = __init__


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of one module so that ``then``
    runs on the module once it has executed, then leaves ``sys.meta_path``."""

    def __init__(self, name, then):
        self._name = name
        self._then = then

    def find_spec(self, fullname, path, target=None):
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_then(module):
            exec_module(module)
            self._then(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)

        spec.loader.exec_module = exec_and_then
        return spec


def install():
    module = sys.modules.get(_MODULE)
    if module is not None:
        _keep_tpu_models(module)
    else:
        sys.meta_path.insert(0, _AfterImport(_MODULE, _keep_tpu_models))
