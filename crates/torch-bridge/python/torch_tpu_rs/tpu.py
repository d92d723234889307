"""``torch.tpu``: the device module, as ``torch.cuda`` is for CUDA."""

import contextlib
import enum
import os
import re
from dataclasses import dataclass

import torch

from . import _C

__all__ = [
    "EagerMode",
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_stream",
    "device",
    "device_count",
    "empty_cache",
    "eager_mode",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "is_available",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "metrics",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_eager_mode",
    "set_rng_state",
    "set_rng_state_all",
    "set_shape_buckets",
    "set_stream",
    "shape_buckets",
    "stream",
    "synchronize",
]


class EagerMode(enum.Enum):
    """How ops on tpu tensors run."""

    #: One compiled op at a time, asynchronous.
    STRICT = "strict"
    #: Strict, blocking on every op (``TORCH_TPU_LAUNCH_BLOCKING=1``).
    DEBUG = "debug"
    #: Ops are recorded and compiled as fused graphs when a value is needed
    #: (``TORCH_TPU_DEFER_AND_FUSE=1``).
    DEFER_AND_FUSE = "defer_and_fuse"


def is_available():
    """True when a PJRT plugin loads and has at least one device."""
    return _C.device_count() > 0


def is_initialized():
    return True


# Read by torch.utils.checkpoint, which saves and restores a device's random
# state only when its module says it is initialized (the plugin loads on
# import, so it always is).
_initialized = True


def _is_in_bad_fork():
    return False


def device_count():
    """Number of tpu devices (0 when no plugin loads)."""
    return _C.device_count()


def current_device():
    """The index of the device ``tpu`` (no index) means in this thread."""
    return _C.current_device()


def set_device(device):
    """Makes ``tpu`` (no index) mean ``tpu:device`` in this thread."""
    if isinstance(device, str):
        device = torch.device(device)
    index = device.index if isinstance(device, torch.device) else int(device)
    if index is None:
        return
    count = device_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"tpu:{index}: invalid device ordinal; the plugin has {count} device(s)"
            " (TPU_RS_CPU_DEVICES sets how many the XLA CPU plugin makes)"
        )
    _C.set_device(index)


class device(contextlib.ContextDecorator):
    """Within it, ``tpu`` means ``tpu:index`` (as ``torch.cuda.device``)."""

    def __init__(self, index):
        self._index = _index(index)

    def __enter__(self):
        self._previous = current_device()
        set_device(self._index)
        return self

    def __exit__(self, *exc):
        set_device(self._previous)
        return False


def _tpu(device):
    """``device`` (None, an index, a string or a ``torch.device``) as a tpu
    ``torch.device`` with its index."""
    return torch.device("tpu", _index(device))


def Stream(device=None, priority=0):
    """A ``torch.Stream`` on a tpu device (as ``torch.cuda.Stream``). A
    device runs its work in the order it is issued, on one queue, and every
    stream is that queue: work issued on one stream runs after work issued
    earlier on any other, so ``wait_stream`` and ``wait_event`` always hold.
    Code that overlaps work with side streams (FSDP2's all-gather and
    reduce-scatter streams) runs correctly, without the overlap."""
    return torch.Stream(_tpu(device), priority=priority)


def current_stream(device=None):
    """The stream work on ``device`` is issued to (see :func:`Stream`)."""
    return torch.accelerator.current_stream(_tpu(device))


def default_stream(device=None):
    """The device's default stream: its one queue (see :func:`Stream`)."""
    return torch.Stream(_tpu(device))


def set_stream(stream):
    """Makes ``stream`` the current stream of its device."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class stream(contextlib.AbstractContextManager):
    """Within it, ``stream`` is the current stream of its device (as
    ``torch.cuda.stream``; ``None`` changes nothing)."""

    def __init__(self, stream):
        self._stream = stream

    def __enter__(self):
        if self._stream is not None:
            self._previous = torch.accelerator.current_stream(self._stream.device)
            torch.accelerator.set_stream(self._stream)
        return self._stream

    def __exit__(self, *exc):
        if self._stream is not None:
            torch.accelerator.set_stream(self._previous)
        return False


def Event(enable_timing=False, blocking=False, interprocess=False):
    """A ``torch.Event`` on the current tpu device (as ``torch.cuda.Event``):
    ``record``, ``synchronize``, ``query`` and, with ``enable_timing``,
    ``elapsed_time``."""
    return torch.Event(
        _tpu(None),
        enable_timing=enable_timing,
        blocking=blocking,
        interprocess=interprocess,
    )


def synchronize(device=None):
    """Waits for every pending op (and runs deferred graphs)."""
    _C.synchronize()


_U64 = 0xFFFF_FFFF_FFFF_FFFF


def manual_seed(seed):
    """Seeds the current device's generator (as ``torch.cuda.manual_seed``)."""
    _C.manual_seed(current_device(), int(seed) & _U64)


def manual_seed_all(seed):
    """Seeds every device's generator (``torch.manual_seed`` calls it)."""
    _C.manual_seed_all(int(seed) & _U64)


def seed():
    """Seeds the current device's generator with a random number."""
    import random

    manual_seed(random.getrandbits(63))


def seed_all():
    """Seeds every device's generator with one random number."""
    import random

    manual_seed_all(random.getrandbits(63))


def initial_seed():
    """The seed the current device's generator started from."""
    return _C.initial_seed(current_device())


def get_rng_state(device="tpu"):
    """``device``'s generator state (seed, keys drawn) as an int64 CPU tensor."""
    seed, counter = _C.rng_state(_index(device))
    as_signed = lambda v: v - (1 << 64) if v >= 1 << 63 else v
    return torch.tensor([as_signed(seed), as_signed(counter)], dtype=torch.int64)


def set_rng_state(state, device="tpu"):
    """Restores ``device``'s generator from :func:`get_rng_state`."""
    values = state.tolist() if isinstance(state, torch.Tensor) else list(state)
    if len(values) != 2:
        raise ValueError(f"a tpu generator state has 2 values (seed, keys drawn), got {len(values)}")
    seed, counter = (int(v) & _U64 for v in values)
    _C.set_rng_state(_index(device), seed, counter)


def get_rng_state_all():
    """Every device's generator state, in device order."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states):
    """Restores every device's generator from :func:`get_rng_state_all`."""
    for i, state in enumerate(states):
        set_rng_state(state, i)


def get_device_name(device=None):
    """The device kind as the platform names it and which device it is
    (``TPU v5 lite (tpu:1)``); on the XLA CPU plugin, what it is:
    ``tpu-rs tpu:1 on cpu (XLA CPU PJRT plugin)``. Under ``torchrun`` the
    default is this process's device, ``tpu:LOCAL_RANK``."""
    index = _index(device)
    name = _C.device_name(index)
    if _C.platform() == "cpu":
        return f"tpu-rs tpu:{index} on {name} (XLA CPU PJRT plugin)"
    return f"{name} (tpu:{index})"


def get_device_capability(device=None):
    """``(major, minor)`` as ``torch.cuda.get_device_capability``: a TPU's
    generation (``TPU v5 lite`` is ``(5, 0)``); ``(0, 0)`` on other platforms,
    which have no such number (the XLA CPU plugin)."""
    return _capability(_C.device_name(_index(device)))


def _capability(kind):
    match = re.match(r"TPU\s*v?(\d+)", kind)
    return (int(match.group(1)), 0) if match else (0, 0)


@dataclass(frozen=True)
class DeviceProperties:
    """What the runtime reports about one device."""

    name: str
    platform: str
    description: str
    total_memory: int


def get_device_properties(device=None):
    index = _index(device)
    try:
        total_memory = mem_get_info(index)[1]
    except NotImplementedError:
        total_memory = 0
    return DeviceProperties(
        name=_C.device_name(index),
        platform=_C.platform(),
        description=_C.describe(index),
        total_memory=total_memory,
    )


def memory_stats(device=None):
    """Device memory counters under CUDA's names (``allocated_bytes.all.current``,
    ``allocation.all.peak``, ...): the bytes and buffers tpu values hold on the
    device. Nothing is cached, so reserved, active and requested bytes equal
    allocated bytes."""
    return torch.accelerator.memory_stats(_index(device))


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def memory_summary(device=None, abbreviated=False):
    """A readable table of :func:`memory_stats` (as
    ``torch.cuda.memory_summary``): bytes and buffers held now, at the peak,
    and allocated and freed in all. ``abbreviated`` is accepted for
    compatibility; the table is short either way."""
    index = _index(device)
    stats = memory_stats(index)
    rows = [
        ("Allocated memory", "allocated_bytes.all", _size),
        ("Reserved memory", "reserved_bytes.all", _size),
        ("Allocations", "allocation.all", str),
    ]
    head = f"{'Metric':<20}{'Cur Usage':>14}{'Peak Usage':>14}{'Tot Alloc':>14}{'Tot Freed':>14}"
    lines = [f"tpu:{index} memory summary ({get_device_name(index)}); nothing is cached", head, "-" * len(head)]
    for name, key, fmt in rows:
        cells = (fmt(stats.get(f"{key}.{field}", 0)) for field in ("current", "peak", "allocated", "freed"))
        lines.append(f"{name:<20}" + "".join(f"{c:>14}" for c in cells))
    return "\n".join(lines) + "\n"


def memory_allocated(device=None):
    """Bytes held in tpu buffers on the device now."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None):
    """The most bytes held at once since start or the last reset."""
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None):
    """Bytes reserved on the device: what is allocated (nothing is cached)."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None):
    """The most bytes reserved at once since start or the last reset."""
    return torch.accelerator.max_memory_reserved(_index(device))


def reset_peak_memory_stats(device=None):
    """Restarts the device's peaks at the current values."""
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device=None):
    """Zeroes the device's totals of bytes and buffers allocated and freed."""
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def empty_cache():
    """Nothing to release: device memory goes back when its last tensor dies."""
    torch.accelerator.empty_cache()


def mem_get_info(device=None):
    """``(free, total)`` bytes of the device: its plugin's limit less what is
    in use; on the XLA CPU plugin, whose memory is the host's, the host's
    available and total memory. Raises ``NotImplementedError`` for a plugin
    that reports no limit."""
    return torch.accelerator.get_memory_info(_index(device))


def metrics():
    """Runtime counters: ``compiles``, ``cache_hits``, ``executions``,
    ``graphs_cut`` (and ``graphs_cut_by_reason``), ``recompiles`` (and
    ``recompiles_by_reason``: ``input_shape``, ``input_dtype``,
    ``attribute``, ``outputs``), ``host_to_device_bytes``,
    ``device_to_host_bytes``, ``live_bytes``, ``peak_bytes``."""
    return dict(_C.metrics())


def metrics_report(file=None):
    """Prints (to ``file``, default stdout) and returns a report of this
    process: with a recorded trace, the top ops by time and the trace's
    compiles, launches, cuts, recompiles and transfers; and the counters."""
    report = _C.metrics_report()
    print(report, file=file)
    return report


@contextlib.contextmanager
def profile(path):
    """Records a Chrome trace of the block into ``path`` (open it in
    Perfetto or ``chrome://tracing``)::

        with torch.tpu.profile("trace.json"):
            train_step()
    """
    _C.profile_start(os.fspath(path))
    try:
        yield
    finally:
        _C.profile_stop()


def eager_mode():
    """The eager mode in force."""
    return EagerMode(_C.eager_mode())


class _ModeScope(contextlib.AbstractContextManager):
    def __init__(self, previous):
        self._previous = previous

    def __exit__(self, *exc):
        _C.set_eager_mode(self._previous.value)
        return False


def set_eager_mode(mode):
    """Switches the eager mode (pending work runs first). Used as a context
    manager, the previous mode comes back on exit::

        with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
            train_step()
    """
    mode = EagerMode(mode.value if isinstance(mode, EagerMode) else str(mode).lower())
    previous = eager_mode()
    _C.set_eager_mode(mode.value)
    return _ModeScope(previous)


def shape_buckets():
    """The shape bucket sizes in force (empty when bucketing is off)."""
    return _C.shape_buckets()


class _BucketScope(contextlib.AbstractContextManager):
    def __init__(self, previous):
        self._previous = previous

    def __exit__(self, *exc):
        _set_buckets(",".join(map(str, self._previous)) or "off")
        return False


def set_shape_buckets(buckets):
    """Sets shape bucketing: ``"pow2"`` (the default), sizes such as ``[64,
    128, 256]``, or off (``None``). With it on, a ``torch.cat`` that appends to a
    longer tensor keeps its result, when it fits a bucket, padded to the
    bucket, so a sequence grown a step at a time (a KV cache, generated ids)
    builds programs per bucket, not per length; the values are the same. Used as a context manager, the
    previous sizes come back on exit. ``TPU_RS_SHAPE_BUCKETS`` sets them
    for a process (``off`` turns them off)."""
    if buckets is None:
        spec = "off"
    elif isinstance(buckets, str):
        spec = buckets
    else:
        spec = ",".join(str(b) for b in _bucket_sizes(buckets)) or "off"
    previous = _C.shape_buckets()
    _set_buckets(spec)
    return _BucketScope(previous)


def _set_buckets(spec):
    from .aten import nn

    _C.set_shape_buckets(spec)
    nn.route_attention(False)  # until the next padded join


def _bucket_sizes(buckets):
    """The sizes of a bucket list, each a positive int (``0.5``, ``True``
    or ``"64"`` are more likely mistakes than sizes)."""
    try:
        sizes = list(buckets)
    except TypeError:
        raise TypeError(
            f"set_shape_buckets: expected \"pow2\", a list of sizes or None, got {type(buckets).__name__}"
        ) from None
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"set_shape_buckets: shape buckets are int sizes, got {size!r}")
        if size <= 0:
            raise ValueError(f"set_shape_buckets: shape buckets are positive sizes, got {size}")
    return sizes


# Autocast: the dtypes torch.amp.autocast("tpu") accepts.
def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation=True):
    return True


def _index(device):
    """The index of ``device`` (an int, ``"tpu:n"``, a ``torch.device``);
    the current device when it names none."""
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    index = getattr(device, "index", None)
    return current_device() if index is None else index

