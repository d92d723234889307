"""The ``torch.compile`` backend ``"tpu_rs"``: AOTAutograd traces the forward
and backward aten graphs, and each graph runs under DeferAndFuse, so it is
recorded and compiled as one fused program (cached by its structure)::

    model = torch.compile(model, backend="tpu_rs")

The first run of a graph for given input layouts also records the tpu-rs
calls its aten kernels make; later runs on inputs laid out the same replay
them from Rust as one block, without going through PyTorch's dispatcher and
the Python kernels op by op. An inference graph keeps its writes into its
inputs (a static KV cache's update) inside the graph, so the replay makes
them too, instead of PyTorch copying each result back after the run. A run
that reads values back, draws random numbers or runs a backward rule of the
bridge's is not recorded, and runs as the first did.

It is also registered as ``"tpu"``, the name Hugging Face's ``generate``
compiles a tpu model's decode step with when it uses a static KV cache, and
plain ``torch.compile(model)`` (Inductor, the default) hands graphs over tpu
tensors to it: Inductor has no code generator for this device.
"""

import contextlib

import torch

from . import _C


@contextlib.contextmanager
def _deferred():
    previous = _C.eager_mode()
    if previous == "defer_and_fuse":
        yield
        # The graph's program starts now, while the caller goes on.
        _C.flush()
        return
    _C.set_eager_mode("defer_and_fuse")
    try:
        yield
    finally:
        # Switching back runs the recorded graph as one program.
        _C.set_eager_mode(previous)


def _layouts(args):
    """The inputs' layouts, or None when one is not a tpu tensor."""
    key = []
    for a in args:
        if not isinstance(a, torch.Tensor) or a.device.type != "tpu":
            return None
        key.append((a.dtype, a.device, tuple(a.shape), a.stride(), a.storage_offset()))
    return tuple(key)


# Recorded runs kept per graph, one per input layout seen.
_MAX_REPLAYS = 8


def _fused(graph_module, example_inputs):
    from torch._functorch.aot_autograd import make_boxed_func

    replays = []
    unreplayable = set()

    def run(*args):
        with _deferred():
            for replay in replays:
                out = replay.run(list(args))
                if out is not None:
                    return out
            key = _layouts(args)
            if key is None or key in unreplayable or len(replays) >= _MAX_REPLAYS:
                return graph_module(*args)
            _C.record_start(list(args))
            try:
                out = graph_module(*args)
            except BaseException:
                _C.record_stop(None)
                raise
            tensors = isinstance(out, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in out)
            replay = _C.record_stop(list(out) if tensors else None)
            if replay is None:
                unreplayable.add(key)
            else:
                replays.append(replay)
            return out

    return make_boxed_func(run)


def tpu_rs(graph_module, example_inputs, **kwargs):
    """A dynamo backend: fused tpu programs for the forward and backward
    graphs."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=_fused, bw_compiler=_fused, keep_inference_input_mutations=True)(
        graph_module, example_inputs, **kwargs
    )


def _on_tpu(graph_module, example_inputs):
    tensors = [*example_inputs, *graph_module.parameters(), *graph_module.buffers()]
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in tensors)


def route_inductor():
    """Makes the default backend (``torch.compile(model)``, Inductor)
    compile graphs over tpu tensors with :func:`tpu_rs`; other graphs still
    go to Inductor. Inductor's mode and options do not apply to them."""
    wrapper = torch._TorchCompileInductorWrapper
    inductor = wrapper.__call__
    if getattr(inductor, "_routes_tpu", False):
        return

    def __call__(self, model_, inputs_, **kwargs):
        if _on_tpu(model_, inputs_):
            return tpu_rs(model_, inputs_)
        return inductor(self, model_, inputs_, **kwargs)

    __call__._routes_tpu = True
    wrapper.__call__ = __call__
