"""torch.tpu: device queries, eager modes (scopes and the TorchTPU
environment variables), metrics, memory, autocast and torch.compile."""

import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch_tpu_rs
from conftest import assert_close


def test_device_queries():
    assert torch.tpu.is_available()
    assert torch.tpu.device_count() >= 1
    assert torch.tpu.get_device_name() == "tpu-rs tpu:0 on cpu (XLA CPU PJRT plugin)"
    assert torch.tpu.get_device_name("tpu:1") == "tpu-rs tpu:1 on cpu (XLA CPU PJRT plugin)"
    props = torch.tpu.get_device_properties(0)
    assert "via PJRT plugin" in props.description
    assert torch.device("tpu").type == "tpu"


def other_thread_ran_during(call):
    """How often a Python thread probing every millisecond ran while `call`
    did (past the interpreter's switch interval it runs only if `call`
    released the GIL), and how long `call` took."""
    stamps, stop = [], threading.Event()

    def probe():
        while not stop.is_set():
            stamps.append(time.monotonic())
            time.sleep(0.001)

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        time.sleep(0.01)
        start = time.monotonic()
        call()
        end = time.monotonic()
    finally:
        stop.set()
        thread.join(timeout=30)
    return sum(start + 0.02 < t < end - 0.001 for t in stamps), end - start


@pytest.mark.parametrize("wait", ["synchronize", "cpu"])
def test_waiting_for_the_device_lets_other_python_threads_run(mode, wait):
    # About 140 GFLOP: most of a second or more on 2 cores, so the probe
    # has a long window even on a loaded machine.
    x = torch.randn(2048, 2048, device="tpu") / 45

    def work():
        y = x
        for _ in range(8):
            y = y @ x
        return y

    work().cpu()  # compiled once, outside the measurement
    y = work()
    ran, took = other_thread_ran_during(torch.tpu.synchronize if wait == "synchronize" else y.cpu)
    assert took > 0.2, f"the wait took only {took:.3f} s: nothing to measure"
    assert ran, f"no other thread ran during a {took:.3f} s wait"


def test_an_op_through_a_python_kernel_lets_other_python_threads_run():
    # Debug runs an op to completion in its call: one 137-GFLOP matmul
    # through the Python kernels' entry (`_C.run`) holds the caller long
    # enough to see whether the GIL was released around the dispatch (held,
    # the probe runs at most once, as the call starts).
    from torch_tpu_rs import _C

    x = torch.randn(4096, 4096, device="tpu") / 64
    with torch.tpu.set_eager_mode("debug"):
        _C.run("matmul", [x, x])  # compiled outside the measurement
        ran, took = other_thread_ran_during(lambda: _C.run("matmul", [x, x]))
    assert took > 0.1, f"the op took only {took:.3f} s: nothing to measure"
    assert ran >= 5, f"another thread ran {ran} times during a {took:.3f} s op"


def test_eager_mode_scope_restores():
    assert torch.tpu.eager_mode() == torch.tpu.EagerMode.STRICT
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        assert torch.tpu.eager_mode() == torch.tpu.EagerMode.DEFER_AND_FUSE
        with torch.tpu.set_eager_mode("debug"):
            assert torch.tpu.eager_mode() == torch.tpu.EagerMode.DEBUG
        assert torch.tpu.eager_mode() == torch.tpu.EagerMode.DEFER_AND_FUSE
    assert torch.tpu.eager_mode() == torch.tpu.EagerMode.STRICT
    with pytest.raises(ValueError):
        torch.tpu.set_eager_mode("eventually")


@pytest.mark.parametrize(
    "env, expected",
    [({}, "strict"), ({"TORCH_TPU_LAUNCH_BLOCKING": "1"}, "debug"), ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "defer_and_fuse")],
)
def test_environment_selects_the_mode(env, expected):
    code = "import torch; print(torch.tpu.eager_mode().value)"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected


def test_backend_autoload_can_be_turned_off():
    code = "import torch; print(hasattr(torch, 'tpu'))"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_RECORDED_RUN = """
import json, torch
x = torch.linspace(-1, 1, 777, device="tpu").reshape(7, 111)
print(json.dumps([((x * 3).tanh() + x).sum().item(), torch.tpu.metrics()]))
"""


def test_a_recorded_run_warms_another_cache_folder(tmp_path):
    """``TPU_RS_RECORD_PROGRAMS`` records what a run builds;
    ``python -m torch_tpu_rs.warm`` compiles it into another folder, where
    the same run then compiles nothing."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_TPU_")}
    record = tmp_path / "programs.txt"

    def run(folder, **env):
        out = subprocess.run(
            [sys.executable, "-c", _RECORDED_RUN],
            env={**clean, "TPU_RS_CACHE_DIR": str(tmp_path / folder), **env},
            capture_output=True, text=True, check=True, timeout=300,
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    value, first = run("first", TPU_RS_RECORD_PROGRAMS=str(record))
    assert first["compiles"] >= 2 and first["disk_cache_hits"] == 0, first
    warm = subprocess.run(
        [sys.executable, "-m", "torch_tpu_rs.warm", str(record), "--threads", "2"],
        env={**clean, "TPU_RS_CACHE_DIR": str(tmp_path / "warmed")},
        capture_output=True, text=True, timeout=300,
    )
    assert warm.returncode == 0, warm.stderr[-3000:]
    n = first["compiles"]
    assert f"{n} programs: {n} compiled, 0 already cached, 0 failed" in warm.stdout, warm.stdout
    again, warmed = run("warmed")
    assert (warmed["compiles"], warmed["disk_cache_hits"]) == (0, n), warmed
    assert again == value
    bad = subprocess.run(
        [sys.executable, "-m", "torch_tpu_rs.warm", str(tmp_path / "missing.txt")],
        env=clean, capture_output=True, text=True, timeout=300,
    )
    assert bad.returncode != 0 and "missing.txt" in bad.stderr, bad.stderr[-2000:]


def _step(x, w):
    return ((x @ w).tanh() * 2 + 1).sum(-1)


def test_defer_and_fuse_fuses_and_counts():
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    tx, tw = x.to("tpu"), w.to("tpu")
    _step(tx, tw).cpu()  # warm the strict path
    before = torch.tpu.metrics()
    strict = _step(tx, tw).cpu()
    strict_runs = torch.tpu.metrics()["executions"] - before["executions"]
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        before = torch.tpu.metrics()
        fused = _step(tx, tw).cpu()
        after = torch.tpu.metrics()
    torch.testing.assert_close(fused, strict)
    torch.testing.assert_close(fused, _step(x, w), atol=1e-5, rtol=1e-4)
    assert after["executions"] - before["executions"] < strict_runs
    assert after["graphs_cut"] > before["graphs_cut"]
    assert after["graphs_cut_by_reason"]["host_read"] > before["graphs_cut_by_reason"]["host_read"]
    assert set(torch_tpu_rs.metrics()) >= {"compiles", "cache_hits", "graphs_cut", "live_bytes", "peak_bytes"}


def test_memory_counters_follow_tensors():
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    t = torch.randn(256, 256).to("tpu")
    assert torch.tpu.memory_allocated() >= before + 256 * 256 * 4
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated()
    del t
    assert torch.tpu.memory_allocated() < before + 256 * 256 * 4


def test_timing_events_memory_summary_and_repeat_interleave():
    start, end = torch.Event("tpu", enable_timing=True), torch.Event("tpu", enable_timing=True)
    start.record()
    x = torch.ones(256, 256, device="tpu")
    for _ in range(5):
        x = x @ x / 256
    end.record()
    end.synchronize()
    assert 0 < start.elapsed_time(end) < 60_000
    plain = torch.Event("tpu")
    plain.record()
    with pytest.raises(ValueError, match="enable_timing"):
        plain.elapsed_time(end)
    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and "tpu:0" in summary
    counts = torch.tensor([1, 0, 3])
    got = torch.arange(3, device="tpu").repeat_interleave(counts.to("tpu"))
    assert_close(got, torch.arange(3).repeat_interleave(counts))


def test_autocast_defaults_to_bfloat16():
    with torch.autocast("tpu"):
        y = torch.ones(4, 8, device="tpu") @ torch.ones(8, 3, device="tpu")
    assert torch.get_autocast_dtype("tpu") == torch.bfloat16 and y.dtype == torch.bfloat16
    with torch.autocast("tpu", dtype=torch.float16):
        assert (torch.ones(2, 2, device="tpu") @ torch.ones(2, 2, device="tpu")).dtype == torch.float16


def test_autocast_bf16():
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    with torch.amp.autocast("tpu", dtype=torch.bfloat16):
        y = x.to("tpu") @ w.to("tpu")
        s = y.float().softmax(-1)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert_close(y.float(), (x.bfloat16() @ w.bfloat16()).float(), atol=1e-2, rtol=1e-2)


def test_torch_compile_backend():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    expected = model(x)
    expected.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(model.to("tpu"), backend="tpu_rs")
    y = compiled(x.to("tpu"))
    y.sum().backward()
    assert_close(y, expected.detach())
    for p, g in zip(model.parameters(), grads):
        assert_close(p.grad, g)
    assert torch.tpu.eager_mode() == torch.tpu.EagerMode.STRICT


def _without_device(plugin):
    code = (
        "import torch\n"
        "print(torch.tpu.is_available(), torch.tpu.device_count())\n"
        "try:\n"
        "    torch.zeros(2, device='tpu') + 1\n"
        "except RuntimeError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    env = {**os.environ, "TPU_RS_PLUGIN": plugin}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_missing_plugin_is_a_clear_error():
    lines = _without_device("/nonexistent/plugin.so")
    assert lines[0] == "False 0"
    # The first tensor made says why: a RuntimeError, as CUDA's without a GPU.
    assert lines[1].startswith("RuntimeError") and "/nonexistent/plugin.so" in lines[1]


def test_libtpu_without_a_tpu_is_a_clear_error():
    if not any(pathlib.Path.home().joinpath(".cache/tpu-rs/plugins").glob("tpu-*")):
        pytest.skip("libtpu is not installed (cargo xtask test installs it)")
    lines = _without_device("tpu")
    assert lines[0] == "False 0"
    assert lines[1].startswith("RuntimeError") and "no TPU found" in lines[1]
