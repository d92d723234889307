"""How aten kernels for the ``tpu`` device are registered.

Each kernel is written once, in its functional form; the in-place
(``add_``) and ``out=`` (``add.out``) forms are derived from it: they run the
functional kernel and write the result into the destination tensor (a
functional write: the destination's storage is rebound, so every alias sees
it). Ops without a kernel reach :func:`fallback`, which tries PyTorch's own
decomposition into ops that have one, then an opt-in CPU fallback, and
otherwise raises ``NotImplementedError`` naming the op.
"""

import collections
import inspect
import os
import threading
import warnings

import torch
from torch._C import DispatchKey, DispatchKeySet

from .. import _C

aten = torch.ops.aten
KEY = "PrivateUse1"

_lib = torch.library.Library("aten", "IMPL")
_fallback_lib = torch.library.Library("_", "IMPL")

#: overload name ("add.Tensor") -> how it is implemented: "kernel",
#: "inplace", "out", "rebind" (PyTorch's CPU kernel binds a storage), or
#: "native" (a C++ kernel).
REGISTERED: dict[str, str] = {}

_CPU = DispatchKeySet(DispatchKey.CPU)


def _overload(name):
    packet, _, overload = name.partition(".")
    return getattr(getattr(aten, packet), overload or "default")


#: With ``TORCH_TPU_COUNT_KERNELS=1`` (read at import), the aten calls that
#: reached a Python kernel, by overload name (the fallback's by
#: ``"fallback:" + op``): what still runs Python per op. Calls a Python
#: kernel makes itself are part of it and not counted again; native kernels
#: never count here.
PYTHON_KERNEL_CALLS = collections.Counter()
_COUNTING = os.environ.get("TORCH_TPU_COUNT_KERNELS") == "1"
_inside = threading.local()


def _count(name, fn, *args, **kwargs):
    depth = getattr(_inside, "depth", 0)
    if depth == 0:
        PYTHON_KERNEL_CALLS[name] += 1
    _inside.depth = depth + 1
    try:
        return fn(*args, **kwargs)
    finally:
        _inside.depth = depth


def _counted(name, fn):
    if not _COUNTING:
        return fn
    return lambda *args, **kwargs: _count(name, fn, *args, **kwargs)


def _is_complex(value):
    if isinstance(value, torch.Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):
        return any(isinstance(t, torch.Tensor) and t.is_complex() for t in value)
    return False


def _real_only(name, fn):
    """``fn``, refusing complex tensors: a kernel written for real numbers
    would read them as their real parts."""

    def k(*args, **kwargs):
        if any(_is_complex(a) for a in args) or any(_is_complex(a) for a in kwargs.values()):
            raise NotImplementedError(f"aten.{name} on tpu: complex tensors are not supported yet")
        return fn(*args, **kwargs)

    return k


def _register(name, fn, how, complex=False):
    if not complex:
        fn = _real_only(name, fn)
    if name.endswith(".default"):
        name = name[: -len(".default")]
    if name in REGISTERED:
        return
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, KEY):
        # The C++ layer (crates/torch-bridge/native/) implements it.
        REGISTERED[name] = "native"
        return
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "CompositeImplicitAutograd"):
        # PyTorch decomposes it (and differentiates the parts) before a
        # backend kernel could run; a kernel here would bypass autograd.
        return
    _lib.impl(name, _counted(name, fn), KEY)
    REGISTERED[name] = how


def _derived(functional):
    """The in-place and out= overloads matching ``functional``'s arguments."""
    op = _overload(functional)
    packet_name, _, overload = functional.partition(".")
    overload = "" if overload == "default" else overload
    args = [a.name for a in op._schema.arguments]
    found = []
    inplace = getattr(aten, packet_name + "_", None)
    if inplace is not None and (overload or "default") in inplace.overloads():
        name = f"{packet_name}_.{overload}" if overload else packet_name + "_"
        found.append((name, None))
    packet = getattr(aten, packet_name)
    for name in packet.overloads():
        schema = getattr(packet, name)._schema
        outs = [a.name for a in schema.arguments if a.is_out]
        if outs and [a.name for a in schema.arguments if not a.is_out] == args:
            found.append((f"{packet_name}.{name}", outs))
    return found


#: PyTorch's names of dtypes in its error messages.
_TYPE_NAMES = {
    torch.float64: "Double", torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
    torch.uint8: "Byte", torch.bool: "Bool",
}


def _check_cast(result, dst):
    """PyTorch's rule for in-place and out= results: a float result does
    not go into an integer tensor, nor a number into a bool one."""
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, dst.dtype):
        name = lambda d: _TYPE_NAMES.get(d, str(d))
        raise RuntimeError(f"result type {name(result.dtype)} can't be cast to the desired output type {name(dst.dtype)}")


def _store(dst, value, computed):
    if computed:
        _check_cast(value, dst)
    if dst.shape != value.shape:
        # out= tensors may come with the wrong shape: PyTorch resizes them.
        dst.resize_(value.shape)
    _C.copy_into(dst, value)
    return dst


def _inplace(fn):
    def kernel(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        _check_cast(result, self)
        _C.copy_into(self, result)
        return self

    return kernel


def _out(fn, out_names):
    def kernel(*args, **kwargs):
        outs = [kwargs.pop(k) for k in out_names]
        result = fn(*args, **kwargs)
        # Results computed from tensors obey the cast rule; creation ops
        # (linspace.out, full.out) make values in the out tensor's dtype.
        computed = any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values()))
        if len(outs) == 1:
            return _store(outs[0], result, computed)
        return tuple(_store(o, r, computed) for o, r in zip(outs, result))

    return kernel


def kernel(*names, derive=True, complex=False):
    """Registers a functional kernel for ``names`` (and their in-place and
    out= forms, unless ``derive`` is false). Only a kernel written for
    complex tensors too (``complex``) is handed them; the rest refuse them."""

    def register(fn):
        for name in names:
            _register(name, fn, "kernel", complex)
            if not derive:
                continue
            for derived, out_names in _derived(name):
                if out_names is None:
                    _register(derived, _inplace(fn), "inplace", complex)
                else:
                    _register(derived, _out(fn, out_names), "out", complex)
        return fn

    return register


def raw(*names, complex=False):
    """Registers ``fn`` for ``names`` exactly as written (in-place ops that
    are not derived from a functional kernel, creation ops); ``complex`` as
    for :func:`kernel`."""

    def register(fn):
        for name in names:
            _register(name, fn, "kernel", complex)
        return fn

    return register


def above_autograd(name):
    """Registers ``fn`` for ``name`` at the autograd key of the ``tpu``
    device: it runs before PyTorch's autograd (or its composite
    decomposition) would, and decides itself what to hand on."""

    def register(fn):
        _lib.impl(name, _counted(name, _real_only(name, fn)), "AutogradPrivateUse1")
        return fn

    return register


def above_autograd_while(name, fn, on, lib):
    """Registers ``fn`` as :func:`above_autograd` does while ``on`` holds,
    in a library of its own (``lib``, ``None`` while unregistered), which it
    returns: with it off, PyTorch's own kernel runs with no Python on its
    path."""
    if on and lib is None:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl(name, _counted(name, _real_only(name, fn)), "AutogradPrivateUse1")
    elif not on and lib is not None:
        lib._destroy()
        lib = None
    return lib


def _redispatching(names, keys):
    """Registers ``names`` as the same op run under ``keys`` instead."""
    for name in names:
        op = _overload(name)

        def kernel(*args, _op=op, **kwargs):
            return _op.redispatch(keys, *args, **kwargs)

        _register(name, kernel, "rebind", complex=True)


def rebind(*names):
    """Registers ops that bind a tensor to a storage: PyTorch's CPU kernels
    set the storage, sizes and strides and touch no data."""
    _redispatching(names, _CPU)


# ---- Ops without a kernel. ----

_decompositions = None
_warned: set[str] = set()
_decomposing = threading.local()


def _decomposition(op):
    """PyTorch's decomposition of ``op`` into other aten ops. Some lower to
    prims that come back to ``op`` itself; :func:`fallback` does not
    decompose an op inside its own decomposition."""
    global _decompositions
    if _decompositions is None:
        from torch._decomp import decomposition_table

        _decompositions = decomposition_table
    return _decompositions.get(op)


def cpu_fallback_enabled():
    return os.environ.get("TORCH_TPU_CPU_FALLBACK", "0") == "1"


def _to_cpu(x, copies):
    """``x`` with every tpu tensor replaced by a CPU copy; ``copies`` maps
    each tpu tensor's id to its copy, so a tensor passed twice is one copy."""
    if isinstance(x, torch.Tensor) and x.device.type == "tpu":
        if id(x) not in copies:
            copies[id(x)] = (x, x.cpu())
        return copies[id(x)][1]
    if isinstance(x, dict):
        return {k: _to_cpu(v, copies) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v, copies) for v in x)
    return x


def _written_tensors(value):
    """The tensors of a written argument: one tensor, or a tensor list."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _cpu_fallback(op, args, kwargs):
    name = str(op)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"{name} has no tpu kernel; running it on the CPU (TORCH_TPU_CPU_FALLBACK=1)",
            stacklevel=3,
        )
    copies = {}
    cpu_args, cpu_kwargs = _to_cpu(args, copies), _to_cpu(kwargs, copies)
    result = op(*cpu_args, **cpu_kwargs)
    # Every argument the schema marks written (in-place self, out=, tensor
    # lists such as a fused optimizer's state) is written back to its tpu
    # tensor, and a result that is one of them is returned as that tensor.
    tpu_of = {id(cpu): t for t, cpu in copies.values()}
    written = {}
    for i, schema_arg in enumerate(op._schema.arguments):
        if schema_arg.alias_info is None or not schema_arg.alias_info.is_write:
            continue
        cpu_arg = cpu_args[i] if i < len(cpu_args) else cpu_kwargs.get(schema_arg.name)
        for cpu_tensor in _written_tensors(cpu_arg):
            target = tpu_of.get(id(cpu_tensor))
            if target is None or id(cpu_tensor) in written:
                continue
            if target.shape != cpu_tensor.shape:
                target.resize_(cpu_tensor.shape)
            _C.copy_into(target, cpu_tensor)
            written[id(cpu_tensor)] = target
    return _results_on_tpu(result, written)


def _results_on_tpu(result, written):
    """``result`` with written arguments as their tpu tensors and every
    other CPU tensor copied to tpu."""
    if isinstance(result, torch.Tensor):
        if id(result) in written:
            return written[id(result)]
        return result.to("tpu") if result.device.type == "cpu" else result
    if isinstance(result, (list, tuple)):
        return type(result)(_results_on_tpu(r, written) for r in result)
    return result


class _Circular(Exception):
    """A decomposition came back to the op it decomposes."""


def _takes(fn, names):
    """True when ``fn`` has parameters called ``names`` (a decomposition of
    an out= form that writes the out= tensors itself)."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in parameters for n in names)


def fallback(op, *args, **kwargs):
    if _COUNTING and not getattr(_inside, "counting_fallback", False):
        _inside.counting_fallback = True
        try:
            return _count("fallback:" + str(op), fallback, op, *args, **kwargs)
        finally:
            _inside.counting_fallback = False
    active = getattr(_decomposing, "ops", None)
    if active is None:
        active = _decomposing.ops = set()
    if op in active:
        raise _Circular(op)
    decomposition = _decomposition(op)
    if decomposition is not None:
        out_names = [a.name for a in op._schema.arguments if a.is_out and a.name in kwargs]
        if out_names and not _takes(decomposition, out_names):
            # An out= form's decomposition that only computes the value: it
            # is written here, as the derived out= kernels do.
            decomposition = _out(decomposition, out_names)
        active.add(op)
        try:
            result = decomposition(*args, **kwargs)
            if result is not NotImplemented:
                return result
        except _Circular:
            pass
        finally:
            active.discard(op)
    if cpu_fallback_enabled():
        return _cpu_fallback(op, args, kwargs)
    raise NotImplementedError(
        f"{op} is not implemented for the tpu device (torch_tpu_rs); "
        "set TORCH_TPU_CPU_FALLBACK=1 to run unsupported ops on the CPU"
    )


_fallback_lib.fallback(fallback, KEY)
