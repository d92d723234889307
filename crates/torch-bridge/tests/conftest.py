"""Shared fixtures: every test compares the tpu device against PyTorch's CPU
on identical inputs."""

import os

import pytest
import torch

MODES = ["strict", "defer_and_fuse"]


@pytest.fixture(params=MODES)
def mode(request):
    """Runs the test under each eager mode."""
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


@pytest.fixture(autouse=True)
def seeded():
    torch.manual_seed(0)


def assert_close(tpu, cpu, atol=1e-5, rtol=1e-4, equal_nan=False):
    """``tpu`` (a tpu tensor) equals ``cpu`` in dtype, shape and values."""
    assert tpu.device.type == "tpu", tpu.device
    torch.testing.assert_close(tpu.cpu(), cpu, atol=atol, rtol=rtol, equal_nan=equal_nan)


def pytest_sessionfinish(session, exitstatus):
    """With ``TORCH_TPU_FAIL_ON_SKIP=1`` (set by ``cargo xtask test``, which
    installs every plugin and package the suite uses) a skipped test fails
    the run: a skip there means something meant to be tested was not."""
    if os.environ.get("TORCH_TPU_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reporter.write_line(f"{len(skipped)} test(s) skipped with TORCH_TPU_FAIL_ON_SKIP=1: failing the run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
