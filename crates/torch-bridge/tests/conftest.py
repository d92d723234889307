"""Shared fixtures: every test compares the tpu device against PyTorch's CPU
on identical inputs."""

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


def assert_close(tpu, cpu, atol=1e-5, rtol=1e-4):
    """``tpu`` (a tpu tensor) equals ``cpu`` in dtype, shape and values."""
    assert tpu.device.type == "tpu", tpu.device
    torch.testing.assert_close(tpu.cpu(), cpu, atol=atol, rtol=rtol)
