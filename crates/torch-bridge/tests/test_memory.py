"""The tpu allocator as PyTorch's C++ core sees it: storages torch allocates
itself, and per-device memory counters behind ``torch.accelerator`` and
``torch.tpu`` (the calls Hugging Face's ``Trainer`` and CUDA scripts make)."""

import gc

import pytest
import torch

MIB = 1 << 20
# Scalar operands stay cached on the device (a few bytes each).
SCALARS = 64


def _settle():
    gc.collect()
    torch.tpu.synchronize()


def test_untyped_storage_allocated_by_torch_holds_bytes_on_tpu():
    storage = torch.UntypedStorage(16, device="tpu")
    other = torch.UntypedStorage(16, device="tpu")
    assert storage.device == torch.device("tpu", 0) and storage.nbytes() == 16
    assert storage.data_ptr() != other.data_ptr()
    bytes_view = torch.empty(0, dtype=torch.uint8, device="tpu").set_(storage)
    assert torch.equal(bytes_view.cpu(), torch.zeros(16, dtype=torch.uint8))
    bytes_view.copy_(torch.arange(16, dtype=torch.uint8))
    again = torch.empty(0, dtype=torch.uint8, device="tpu").set_(storage)
    assert torch.equal(again.cpu(), torch.arange(16, dtype=torch.uint8))
    assert torch.equal(torch.frombuffer(bytearray(storage.cpu()), dtype=torch.uint8), torch.arange(16, dtype=torch.uint8))


def test_untyped_storage_on_another_device_and_its_errors():
    storage = torch.UntypedStorage(8, device="tpu:1")
    assert storage.device == torch.device("tpu", 1)
    count = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match=f"tpu:{count} does not exist"):
        torch.UntypedStorage(8, device=f"tpu:{count}")
    with pytest.raises(torch.OutOfMemoryError, match=r"tpu:0 out of memory: tried to allocate .*10000000000000 bytes"):
        torch.UntypedStorage(10**13, device="tpu")
    # A float view of untyped bytes is refused by name, never misread.
    floats = torch.empty(0, device="tpu").set_(torch.UntypedStorage(16, device="tpu"), 0, (4,))
    with pytest.raises(NotImplementedError, match="a f32 view of a u8 tpu storage"):
        floats.cpu()


def test_counters_follow_device_values_per_device():
    _settle()
    before = [torch.accelerator.memory_allocated(i) for i in range(2)]
    x = torch.full((256, 1024), 2.0, device="tpu:1")
    _settle()
    assert MIB <= torch.accelerator.memory_allocated(1) - before[1] <= MIB + SCALARS
    assert torch.accelerator.memory_allocated(0) - before[0] < MIB
    assert torch.tpu.memory_allocated(1) == torch.accelerator.memory_allocated(1)
    assert torch.tpu.memory_allocated("tpu:1") == torch.accelerator.memory_allocated(1)
    del x
    _settle()
    assert 0 <= torch.accelerator.memory_allocated(1) - before[1] <= SCALARS


def test_peaks_totals_and_stats_under_cuda_names():
    _settle()
    torch.tpu.set_device(2)
    try:
        torch.tpu.reset_peak_memory_stats()
        torch.tpu.reset_accumulated_memory_stats()
        base = torch.tpu.memory_allocated()
        x = torch.ones(512, 512, device="tpu") + 1  # 1 MiB kept; its input dies
        _settle()
        stats = torch.tpu.memory_stats()
        now = stats["allocated_bytes.all.current"]
        assert base + MIB <= now <= base + MIB + SCALARS
        assert stats["allocated_bytes.all.peak"] >= now
        assert stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"] == now - base
        assert stats["reserved_bytes.all.current"] == now
        assert stats["allocation.all.allocated"] >= 1
        assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated() == now
        assert torch.tpu.memory_reserved() == now
        del x
        _settle()
        assert torch.tpu.max_memory_allocated() >= base + MIB
        assert torch.tpu.memory_allocated() == now - MIB
        torch.tpu.reset_peak_memory_stats()
        assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated() == now - MIB
        torch.tpu.reset_accumulated_memory_stats()
        assert torch.tpu.memory_stats()["allocated_bytes.all.allocated"] == 0
    finally:
        torch.tpu.set_device(0)


def test_empty_cache_and_memory_info():
    torch.accelerator.empty_cache()
    torch.tpu.empty_cache()
    free, total = torch.tpu.mem_get_info()
    assert total == torch.tpu.get_device_properties().total_memory
    assert 0 < free <= total
