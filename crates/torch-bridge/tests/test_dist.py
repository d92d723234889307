"""``torch.distributed`` on ``tpu_dist``: jobs of 2 and 3 ranks on localhost
(``dist_worker.py``, started with torchrun's variables), each rank on the
XLA CPU plugin's device of its own process."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("dist_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(scenario, world, timeout=60.0, **env):
    port = free_port()
    procs = []
    for rank in range(world):
        variables = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            TPU_DIST_TEST_TIMEOUT=str(timeout),
            **env,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(WORKER), scenario],
                env=variables,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def finish(procs, limit=240):
    """Waits for every rank (killing all after ``limit`` s); returns their
    outputs, failing with them when any rank exited non-zero."""
    deadline = time.monotonic() + limit
    outputs, failed = [], []
    for rank, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            failed.append(rank)
        if p.returncode != 0:
            failed.append(rank)
        outputs.append(out)
    report = "\n".join(f"--- rank {r} (exit {p.returncode})\n{o[-4000:]}" for r, (p, o) in enumerate(zip(procs, outputs)))
    assert not failed, f"ranks {sorted(set(failed))} failed\n{report}"
    return outputs


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_on_tpu_tensors(world):
    finish(start("collectives", world))


def test_every_collective_under_defer_and_fuse():
    finish(start("collectives", 2, TORCH_TPU_DEFER_AND_FUSE="1"))


def test_cpu_tensors_through_tpu_dist():
    finish(start("collectives", 2, TPU_DIST_TEST_DEVICE="cpu"))


def test_gloo_for_cpu_and_tpu_dist_for_tpu():
    finish(start("mixed", 2))


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_ddp_on_2_ranks_equals_one_process_on_the_full_batch(mode):
    outputs = finish(start("ddp", 2, TPU_DIST_TEST_MODE=mode))
    for rank, out in enumerate(outputs):
        assert f"rank {rank}: all-reduce overlapped backward in" in out, out
        assert "no_sync accumulation equal" in out, out


@pytest.mark.parametrize("reshard", [True, False])
@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_fsdp2_on_2_ranks_equals_one_process_on_the_full_batch(mode, reshard):
    outputs = finish(start("fsdp2", 2, TPU_DIST_TEST_MODE=mode, TPU_DIST_TEST_RESHARD=str(int(reshard))))
    for rank, out in enumerate(outputs):
        assert f"rank {rank}: 5 steps equal" in out, out


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_fsdp2_bf16_mixed_precision_on_2_ranks_equals_gloo_on_the_cpu(mode):
    outputs = finish(start("fsdp2_bf16", 2, TPU_DIST_TEST_MODE=mode))
    for rank, out in enumerate(outputs):
        assert f"rank {rank}: 5 bf16 steps within bf16 tolerance of gloo on cpu" in out, out


def test_dtensor_column_and_row_parallel_linear_on_2_ranks():
    finish(start("dtensor", 2))


def test_a_dead_rank_fails_the_others_within_twice_the_timeout():
    timeout = 5.0
    begin = time.monotonic()
    outputs = finish(start("dead", 3, timeout=timeout))
    for out in outputs[:2]:
        assert "failed after" in out, out
    # Joining, then the timeout, well inside what a hang would take.
    assert time.monotonic() - begin < 60
