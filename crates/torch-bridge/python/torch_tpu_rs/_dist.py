"""``tpu_dist``: the ``torch.distributed`` backend for ``tpu`` tensors.

``init_process_group("tpu_dist")`` (or ``"cpu:gloo,tpu:tpu_dist"``) under
torchrun makes a tpu-dist process group: the ranks meet in a store of its
own, served by rank 0 and found through torch's store, and every collective
crosses processes over Gloo with the timeout given to
``init_process_group``. Collectives run in the order they are called, on
one worker thread per group, and the work they return completes when
theirs has: DDP's gradient all-reduce of one bucket runs while backward
computes the next. A collective that cannot finish (a dead rank) raises
from ``wait()`` within the timeout, naming itself and the missing ranks.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend, ReduceOp, Work

from . import _C

NAME = "tpu_dist"

_REDUCTIONS = {
    ReduceOp.SUM: "sum",
    ReduceOp.AVG: "avg",
    ReduceOp.PRODUCT: "product",
    ReduceOp.MIN: "min",
    ReduceOp.MAX: "max",
}


def _reduction(op):
    kind = op.op if hasattr(op, "op") else op
    if kind not in _REDUCTIONS:
        raise NotImplementedError(
            f"{NAME}: the reduction {kind} is not implemented (SUM, AVG, PRODUCT, MIN and MAX are)"
        )
    return _REDUCTIONS[kind]


class _Queued(Work):
    """The work of a collective queued on its group's worker thread: done
    when the collective has run; ``wait`` raises its error, or an error
    naming it when it has not finished by its deadline."""

    def __init__(self, name, result, deadline):
        super().__init__()
        self._name, self._result, self._deadline = name, result, deadline
        self._future = torch.futures.Future()
        self._finished = threading.Event()
        self._error = None

    def _finish(self, error):
        self._error = error
        self._finished.set()
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)

    def wait(self, timeout=None):
        if not self._finished.wait(self._deadline):
            raise RuntimeError(f"{NAME}: {self._name} did not finish within {self._deadline:.0f} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._finished.is_set()

    def is_success(self):
        return self._finished.is_set() and self._error is None

    def exception(self):
        return self._error

    def get_future(self):
        return self._future


def _master_host(store):
    """The host torch's store is served from (where rank 0 runs)."""
    while store is not None:
        host = getattr(store, "host", None)
        if host:
            return host
        store = getattr(store, "underlying_store", None)
    return os.environ.get("MASTER_ADDR", "127.0.0.1")


class TpuDistBackend(Backend):
    """A process group whose collectives run on tpu-dist."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        seconds = timeout.total_seconds()
        host = _master_host(store)
        if rank == 0:
            own = _C.DistStore.serve(seconds)
            ip = _C.local_ip_towards(host)
            store.set(f"{NAME}/store", f"{ip}:{own.port}")
        else:
            ip = None
            store.wait([f"{NAME}/store"], timeout)
            own = _C.DistStore.connect(store.get(f"{NAME}/store").decode(), seconds)
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        self._group = _C.DistGroup(own, rank, size, local_rank, ip or host, seconds)
        self._timeout = seconds
        # One thread keeps the ranks' collectives in the order they were
        # called; `_queued` counts those not finished, for deadlines.
        self._worker = ThreadPoolExecutor(1, thread_name_prefix=f"{NAME}-rank{rank}")
        self._queued = 0
        self._lock = threading.Lock()

    def getBackendName(self):
        return NAME

    def _submit(self, name, run, result):
        """Queues ``run`` (a collective over tensors the caller hands over
        until the work completes) and returns its work."""
        # Pending deferred ops start now, in the calling thread's mode.
        _C.flush()
        with self._lock:
            self._queued += 1
            ahead = self._queued
        work = _Queued(name, result, self._timeout * ahead + 30)

        def job():
            try:
                run()
                error = None
            except BaseException as e:  # handed to whoever waits
                error = e
            with self._lock:
                self._queued -= 1
            work._finish(error)

        self._worker.submit(job)
        return work

    # Reductions.

    def allreduce(self, tensors, opts):
        op = _reduction(opts.reduceOp)

        def run():
            for t in tensors:
                self._group.all_reduce(t, op)

        return self._submit("allreduce", run, tensors)

    def allreduce_coalesced(self, tensors, opts):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op = _reduction(opts.reduceOp)

        def run():
            for t in tensors:
                reduced = t.clone()
                self._group.all_reduce(reduced, op)
                if self.rank() == opts.rootRank:
                    t.copy_(reduced)

        return self._submit("reduce", run, tensors)

    def reduce_scatter_single(self, output, input, opts):
        op = _reduction(opts.reduceOp)
        return self._submit("reduce_scatter", lambda: self._group.reduce_scatter(output, input, op), [output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        op = _reduction(opts.reduceOp)

        def run():
            for output, input in zip(outputs, inputs):
                self._group.reduce_scatter(output, input, op)

        return self._submit("reduce_scatter", run, outputs)

    def reduce_scatter(self, outputs, input_lists, opts):
        op = _reduction(opts.reduceOp)

        def run():
            for output, inputs in zip(outputs, input_lists):
                self._group.reduce_scatter(output, torch.stack(list(inputs)), op)

        return self._submit("reduce_scatter", run, outputs)

    # Gathers and scatters.

    def all_gather_single(self, output, input, opts):
        return self._submit("all_gather", lambda: self._group.all_gather(output, input.unsqueeze(0)), [output])

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        def run():
            for output, input in zip(outputs, inputs):
                self._group.all_gather(output, input.unsqueeze(0))

        return self._submit("all_gather", run, outputs)

    def _all_gather(self, outputs, input):
        stacked = input.new_empty((self.size(), *input.shape))
        self._group.all_gather(stacked, input.unsqueeze(0))
        for rank, output in enumerate(outputs):
            output.copy_(stacked[rank])

    def allgather(self, output_lists, inputs, opts):
        def run():
            for outputs, input in zip(output_lists, inputs):
                self._all_gather(outputs, input)

        return self._submit("allgather", run, output_lists)

    def allgather_coalesced(self, output_lists, inputs, opts):
        return self.allgather(output_lists, inputs, opts)

    def gather(self, output_lists, inputs, opts):
        # An all-gather whose result only the root keeps.
        root = self.rank() == opts.rootRank

        def run():
            for i, input in enumerate(inputs):
                self._all_gather(output_lists[i] if root else [], input)

        return self._submit("gather", run, output_lists)

    def scatter(self, outputs, input_lists, opts):
        def run():
            for i, output in enumerate(outputs):
                # Every rank broadcasts the same [size, numel] shape.
                if self.rank() == opts.rootRank:
                    stacked = torch.stack([t.reshape(-1) for t in input_lists[i]])
                else:
                    stacked = output.new_empty((self.size(), output.numel()))
                self._group.broadcast(stacked, opts.rootRank)
                output.copy_(stacked[self.rank()].view(output.shape))

        return self._submit("scatter", run, outputs)

    def broadcast(self, tensors, opts):
        def run():
            for t in tensors:
                self._group.broadcast(t, opts.rootRank)

        return self._submit("broadcast", run, tensors)

    # All-to-all.

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        splits = list(output_splits), list(input_splits)
        return self._submit("all_to_all", lambda: self._group.all_to_all(output, input, *splits), [output])

    def alltoall_base(self, output, input, output_splits, input_splits, opts):
        return self.all_to_all_single(output, input, output_splits, input_splits, opts)

    def alltoall(self, outputs, inputs, opts):
        def run():
            flat_in = torch.cat([t.reshape(-1) for t in inputs])
            flat_out = flat_in.new_empty(sum(t.numel() for t in outputs))
            self._group.all_to_all(
                flat_out, flat_in, [t.numel() for t in outputs], [t.numel() for t in inputs]
            )
            for t, block in zip(outputs, flat_out.split([t.numel() for t in outputs])):
                t.copy_(block.view(t.shape))

        return self._submit("alltoall", run, outputs)

    # Point to point and barriers.

    def send(self, tensors, dst, tag):
        def run():
            for t in tensors:
                self._group.send(t, dst)

        return self._submit("send", run, tensors)

    def recv(self, tensors, src, tag):
        def run():
            for t in tensors:
                self._group.recv(t, src)

        return self._submit("recv", run, tensors)

    def barrier(self, opts):
        return self._submit("barrier", self._group.barrier, [])

    def monitored_barrier(self, opts):
        return self.barrier(opts)


def register():
    """Makes ``tpu_dist`` a ``torch.distributed`` backend for tpu and CPU
    tensors."""
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, TpuDistBackend, devices=["tpu", "cpu"])
