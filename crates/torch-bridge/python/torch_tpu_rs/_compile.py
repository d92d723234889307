"""The ``torch.compile`` backend ``"tpu_rs"``: AOTAutograd traces the forward
and backward aten graphs, and each graph runs under DeferAndFuse, so it is
recorded and compiled as one fused program (cached by its structure)::

    model = torch.compile(model, backend="tpu_rs")

It is also registered as ``"tpu"``, the name Hugging Face's ``generate``
compiles a tpu model's decode step with when it uses a static KV cache.
"""

import torch

from . import _C


def _fused(graph_module, example_inputs):
    from torch._functorch.aot_autograd import make_boxed_func

    def run(*args):
        previous = _C.eager_mode()
        if previous == "defer_and_fuse":
            # Already deferring: the graph joins the surrounding work.
            return graph_module(*args)
        _C.set_eager_mode("defer_and_fuse")
        try:
            return graph_module(*args)
        finally:
            # Switching back runs the recorded graph as one program.
            _C.set_eager_mode(previous)

    return make_boxed_func(run)


def tpu_rs(graph_module, example_inputs, **kwargs):
    """A dynamo backend: fused tpu programs for the forward and backward
    graphs."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_fused, bw_compiler=_fused)(graph_module, example_inputs, **kwargs)
