"""Several devices in one process: ``tpu:n`` tensors, ``set_device`` and
copies between devices (the XLA CPU plugin makes 4 by default;
``TPU_RS_CPU_DEVICES`` sets how many)."""

import copy
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import assert_close


@pytest.fixture(autouse=True)
def back_to_tpu0():
    yield
    torch.tpu.set_device(0)


def test_every_plugin_device_takes_tensors():
    count = torch.tpu.device_count()
    assert count >= 2, "the CPU plugin shows at least 2 devices"
    for index in range(count):
        x = torch.arange(6.0, device=f"tpu:{index}").reshape(2, 3)
        assert x.device == torch.device("tpu", index)
        y = x * 2 + 1
        assert y.device == x.device
        assert_close(y, torch.arange(6.0).reshape(2, 3) * 2 + 1)
    with pytest.raises(RuntimeError, match=f"tpu:{count} does not exist.*{count} tpu device"):
        torch.empty(1, device=f"tpu:{count}")


def test_set_device_makes_tpu_mean_that_device():
    torch.tpu.set_device(1)
    assert torch.tpu.current_device() == 1
    assert torch.ones(2, device="tpu").device == torch.device("tpu", 1)
    assert torch.ones(2).to("tpu").device == torch.device("tpu", 1)
    assert torch.nn.Linear(2, 2).to("tpu").weight.device == torch.device("tpu", 1)
    with torch.tpu.device(0):
        assert torch.zeros(1, device="tpu").device == torch.device("tpu", 0)
    assert torch.tpu.current_device() == 1
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.tpu.set_device(torch.tpu.device_count())
    torch.accelerator.set_device_index(2)
    assert torch.tpu.current_device() == 2 and torch.ones(1, device="tpu").device == torch.device("tpu", 2)


def test_copies_between_devices():
    cpu = torch.randn(3, 4)
    a = cpu.to("tpu:0")
    b = a.to("tpu:1")
    assert b.device == torch.device("tpu", 1)
    assert_close(b, cpu)
    c = torch.empty(3, 4, dtype=torch.bfloat16, device="tpu:1")
    c.copy_(a)  # across devices and dtypes
    assert_close(c, cpu.bfloat16(), atol=0, rtol=0)
    assert_close((b + b).to("tpu:0"), cpu + cpu)


def test_ops_on_two_devices_are_a_clear_error():
    a, b = torch.ones(2, device="tpu:0"), torch.ones(2, device="tpu:1")
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, tpu:0 and tpu:1"):
        a + b
    with pytest.raises(RuntimeError, match="different devices"):
        a.atan2(b)  # through a Python kernel


@pytest.mark.parametrize("index", [1, 2])
def test_backward_on_another_device_equals_the_cpu(index):
    # torch's autograd engine runs a device's backward on the worker its
    # device guard reports; the guard is C++ and reports every device.
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    tpu = copy.deepcopy(cpu).to(f"tpu:{index}")
    x = torch.randn(5, 4)
    cpu(x).pow(2).sum().backward()
    tpu(x.to(f"tpu:{index}")).pow(2).sum().backward()
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        assert q.grad.device == torch.device("tpu", index)
        assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
    # The engine's worker left this thread's current device alone.
    assert torch.tpu.current_device() == 0


def test_a_model_on_tpu2_trains_like_the_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    tpu = copy.deepcopy(cpu).to("tpu:2")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, tpu)]
    x, target = torch.randn(32, 8), torch.randint(0, 4, (32,))
    for _ in range(5):
        losses = []
        for model, opt, device in ((cpu, opts[0], "cpu"), (tpu, opts[1], "tpu:2")):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), target.to(device))
            loss.backward()
            opt.step()
            losses.append(loss)
        assert losses[1].device == torch.device("tpu", 2)
        assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    for p, q in zip(cpu.parameters(), tpu.parameters()):
        assert q.device == torch.device("tpu", 2)
        assert_close(q, p, rtol=1e-5, atol=1e-6)
    assert torch.tpu.current_device() == 0


def test_a_replica_per_device_with_tpu_dist_all_reduce_equals_one_device():
    """Data parallelism by hand in one process: a thread per device, each a
    rank of a tpu_dist group with a replica on its device and a quarter of
    the batch, averaging gradients with all_reduce, against one model on
    tpu:0 on the whole batch."""
    import datetime

    from torch.distributed import AllreduceOptions, HashStore, ReduceOp
    from torch_tpu_rs._dist import TpuDistBackend

    world = 4
    assert torch.tpu.device_count() >= world
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    batches = [(torch.randn(16, 8), torch.randn(16, 4)) for _ in range(3)]
    alone = copy.deepcopy(base).to("tpu:0")
    opt = torch.optim.SGD(alone.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(alone(x.to("tpu:0")), y.to("tpu:0")).backward()
        opt.step()

    store, results, errors = HashStore(), [None] * world, []
    average = AllreduceOptions()
    average.reduceOp = ReduceOp.AVG

    def replica(rank):
        try:
            torch.tpu.set_device(rank)
            group = TpuDistBackend(store, rank, world, datetime.timedelta(seconds=60))
            model = copy.deepcopy(base).to("tpu")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            part = slice(rank * 4, rank * 4 + 4)
            for x, y in batches:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x[part].to("tpu")), y[part].to("tpu")).backward()
                group.allreduce([p.grad for p in model.parameters()], average).wait()
                opt.step()
            results[rank] = [p.detach() for p in model.parameters()]
        except BaseException as e:
            errors.append((rank, e))

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for rank, params in enumerate(results):
        for p, q in zip(alone.parameters(), params):
            assert q.device == torch.device("tpu", rank)
            assert_close(q, p.cpu(), rtol=1e-5, atol=1e-6)


def test_the_current_device_is_per_thread():
    torch.tpu.set_device(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch.tpu.current_device()))
    worker.start()
    worker.join(timeout=30)
    assert seen == [0]
    assert torch.tpu.current_device() == 1
    assert torch.accelerator.current_device_index() == 1


def test_torch_accelerator_and_events_see_the_tpu():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    assert torch.accelerator.device_count() == torch.tpu.device_count()
    x = torch.randn(64, 64, device="tpu")
    y = x @ x
    event = torch.Event(device="tpu")
    event.record()
    event.synchronize()
    assert event.query()
    torch.accelerator.synchronize()
    assert_close(y, x.cpu() @ x.cpu(), rtol=1e-5, atol=1e-4)
    stream = torch.accelerator.current_stream()
    assert stream.device == torch.device("tpu", 0)
    side = torch.tpu.Stream()
    torch.accelerator.set_stream(side)
    assert torch.accelerator.current_stream() == side
    torch.accelerator.set_stream(stream)


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_events_time_the_device_and_query_does_not_wait(mode):
    """An event marks the work issued before it: ``query`` is False while a
    long program runs and True after; ``elapsed_time`` is the device's time
    between two events, within 2x of the wall time around it."""
    x = torch.randn(1024, 1024, device="tpu") / 32
    with torch.tpu.set_eager_mode(mode):
        warm = x @ x @ x  # compiled before the timed run
        torch.tpu.synchronize()
        start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        y = x
        for _ in range(24):
            y = y @ x
        end.record()
        assert not end.query(), "the event fired before the work it marks could finish"
        end.synchronize()
        wall_ms = (time.perf_counter() - began) * 1e3
        assert end.query() and start.query()
        device_ms = start.elapsed_time(end)
        assert 0 < device_ms <= wall_ms * 1.05 and device_ms >= wall_ms / 2, (device_ms, wall_ms)
        assert torch.tpu.current_stream().query()
    assert_close(warm, (x.cpu() @ x.cpu()) @ x.cpu(), rtol=1e-4, atol=1e-5)
    plain = torch.tpu.Event()
    plain.record()
    with pytest.raises(ValueError, match="enable_timing=True"):  # as torch.cuda.Event
        start.elapsed_time(plain)
    unrecorded = torch.tpu.Event(enable_timing=True)
    with pytest.raises(ValueError, match="must be recorded"):
        unrecorded.elapsed_time(end)


def test_pinned_memory_and_non_blocking_copies_equal_the_cpu():
    x = torch.randn(8, 16)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    assert pinned[2:].is_pinned()  # a view into a pinned block
    y = pinned.to("tpu", non_blocking=True)
    back = torch.empty_like(x).pin_memory()
    back.copy_(y * 2, non_blocking=True)
    torch.tpu.synchronize()
    assert torch.equal(y.cpu(), x)
    assert torch.equal(back, x * 2)


def test_importing_under_another_torch_names_both_versions():
    # The C++ layer is built for one torch minor version; the check runs
    # before it loads.
    code = (
        "import torch; torch.__version__ = '2.99.0'\n"
        "try:\n    import torch_tpu_rs\n"
        "except ImportError as e:\n    print('refused:', e)\n"
    )
    env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    built = torch.__version__.split("+")[0].rsplit(".", 1)[0]
    assert f"refused: torch_tpu_rs was built for torch {built}, but torch 2.99.0 is installed" in out.stdout, out.stderr[-2000:]


def test_streams_are_the_devices_one_queue():
    """Work issued on a side stream and waited for on the current one (as
    FSDP2 does) gives the CPU's values; every stream is the one queue."""
    x = torch.randn(64, 64)
    side = torch.tpu.Stream(priority=-1)
    assert side.device == torch.device("tpu", torch.tpu.current_device())
    main = torch.tpu.current_stream()
    assert main == torch.tpu.default_stream()
    with torch.tpu.stream(side) as entered:
        assert entered is side and torch.tpu.current_stream() == side
        y = x.to("tpu") @ x.to("tpu")
        done = side.record_event()
    assert torch.tpu.current_stream() == main
    main.wait_event(done)
    main.wait_stream(side)
    z = y + 1
    done.synchronize()
    assert done.query()
    side.synchronize()  # every stream is the one queue: z too
    assert side.query() and main.query()
    assert_close(z, x @ x + 1, rtol=1e-5, atol=1e-4)
    with torch.tpu.stream(None):
        assert torch.tpu.current_stream() == main


def test_local_rank_is_the_device_of_every_thread_that_chose_none():
    """Under torchrun: ``tpu`` is ``tpu:LOCAL_RANK`` when the process has
    that many devices, in the importing thread and in new ones; else tpu:0."""
    code = (
        "import threading, torch\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(torch.tpu.current_device()))\n"
        "t.start(); t.join()\n"
        "print(torch.tpu.current_device(), seen[0], torch.ones(1, device='tpu').device)\n"
        "print(torch.tpu.get_device_name())\n"
    )
    for local_rank, expected in (("1", "1 1 tpu:1"), ("2", "0 0 tpu:0")):
        env = {**os.environ, "LOCAL_RANK": local_rank, "TPU_RS_CPU_DEVICES": "2"}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        devices, name = out.stdout.strip().splitlines()[-2:]
        assert devices == expected
        assert name == f"tpu-rs {expected.split()[-1]} on cpu (XLA CPU PJRT plugin)"
