"""Several devices in one process: ``tpu:n`` tensors, ``set_device`` and
copies between devices (the XLA CPU plugin makes 4 by default;
``TPU_RS_CPU_DEVICES`` sets how many)."""

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
    with pytest.raises(RuntimeError, match=f"device index {count} is out of range"):
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
    with pytest.raises(RuntimeError, match="different devices"):
        a + b
