"""Storages that match their tensors, exact integer ranges, device and index
errors, batch norm and attention against the CPU, and device memory that
stays flat over training."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close


def test_storages_hold_their_bytes_at_distinct_addresses():
    a, b = torch.randn(3, 4).to("tpu"), torch.randn(3, 4).to("tpu")
    assert a.untyped_storage().nbytes() == 48
    assert a.data_ptr() != b.data_ptr()
    assert a[1:].data_ptr() == a.data_ptr() + 16
    assert a.t().data_ptr() == a.data_ptr()


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.bfloat16, torch.float64])
def test_results_are_released_with_their_last_tensor(dtype, mode):
    # A result's storage reaches torch through DLPack; its views share it.
    x = torch.ones(4, 3, dtype=dtype, device="tpu")

    def make():
        computed = [(x.float() + i).to(dtype) for i in range(50)]
        return computed + [r[1:] for r in computed]

    make()  # the shared device scalars (`+ i`) stay cached
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    results = make()
    torch.tpu.synchronize()
    assert len({r.data_ptr() for r in results[:50]}) == 50
    assert all(r.untyped_storage().nbytes() == x.untyped_storage().nbytes() for r in results)
    assert all(r.dtype == dtype and r.device == x.device for r in results)
    assert torch.tpu.memory_allocated() > before
    del results
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, v, q: x @ v,
        lambda x, v, q: v.__rmatmul__(x),
        lambda x, v, q: torch.quantile(q, 0.3),
        lambda x, v, q: torch.rot90(x),
        lambda x, v, q: x.clone().t_(),
        lambda x, v, q: x[:, :, None, None].contiguous(),
        lambda x, v, q: x.clone().unsqueeze_(0).squeeze_(0),
        lambda x, v, q: F.bilinear(x[:2, :3], x[:2], torch.ones(5, 3, 3, dtype=x.dtype, device=x.device)),
    ],
)
def test_results_fit_their_storage(fn, mode):
    x, v, q = torch.randn(5, 3), torch.randn(3), torch.randn(10)
    want = fn(x.clone(), v, q)
    got = fn(x.to("tpu"), v.to("tpu"), q.to("tpu"))
    assert_close(got, want)


def test_integer_arange_is_exact_past_2_pow_53():
    start = 2**62
    got = torch.arange(start, start + 3, device="tpu")
    assert got.cpu().tolist() == [start, start + 1, start + 2]
    assert torch.arange(start + 10, start, -4, device="tpu").cpu().tolist() == [start + 10, start + 6, start + 2]


def test_a_device_index_past_the_plugin_raises():
    count = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match=f"tpu:{count + 3} does not exist.*{count} tpu device"):
        torch.zeros(2, device=f"tpu:{count + 3}")


def test_an_allocation_past_what_a_storage_holds_is_out_of_memory():
    # As CUDA's: torch.OutOfMemoryError, naming the device and the bytes.
    with pytest.raises(torch.OutOfMemoryError, match=r"tpu:0 out of memory: tried to allocate 3\.64 TiB \(4000000000000 bytes\)"):
        torch.empty(10**12, device="tpu")
    assert_close(torch.ones(2, device="tpu") + 1, torch.full((2,), 2.0))


def test_device_memory_running_out_is_out_of_memory(mode):
    # 256 GiB: more than the host (or any TPU chip) holds; the plugin
    # reports ResourceExhausted when the program runs.
    with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory.*274877906944 bytes"):
        torch.zeros(2**36, device="tpu").sum().item()
    assert_close((torch.ones(3, device="tpu") * 2).sum(), torch.tensor(6.0))


def test_storage_resize_keeps_the_elements_both_sizes_hold(mode):
    # What FSDP does to a parameter's storage: free it to nothing, regrow it,
    # write into it. The address stays, as CUDA's caching allocator's may not.
    x = torch.arange(12.0, device="tpu")
    storage = x.untyped_storage()
    address = storage.data_ptr()
    storage.resize_(8 * 4)
    assert storage.nbytes() == 32 and x.untyped_storage().nbytes() == 32
    view = torch.empty(0, device="tpu").set_(storage, 0, (8,))
    assert torch.equal(view.cpu(), torch.arange(8.0))
    storage.resize_(16 * 4)
    grown = torch.empty(0, device="tpu").set_(storage, 0, (16,))
    assert torch.equal(grown[:8].cpu(), torch.arange(8.0))
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    storage.resize_(0)
    del view, grown
    torch.tpu.synchronize()
    assert storage.nbytes() == 0 and torch.tpu.memory_allocated() < before
    storage.resize_(6 * 4)
    regrown = torch.empty(0, device="tpu").set_(storage, 0, (6,))
    regrown.copy_(torch.arange(6.0) * 2)
    assert storage.data_ptr() == address
    assert x.untyped_storage().nbytes() == 24
    assert torch.equal(regrown.cpu(), torch.arange(6.0) * 2)
    with pytest.raises(RuntimeError, match="cannot resize a f32 tpu storage to 3 bytes"):
        storage.resize_(3)


BAD_CALLS = {
    "dim out of range": (lambda x: x.sum(5), r"op `sum` on tpu:0 with inputs \(f32\[2, 3\]\): dimension 5 is out of range"),
    "shape mismatch": (lambda x: torch.dot(x[0], x[1, :2]), "op `matmul` .* cannot be multiplied"),
    "dtype not implemented": (lambda x: x.int().softmax(0), r"op `softmax` .*i32\[2, 3\].*needs a float dtype"),
    "float bits": (lambda x: x.bitwise_and(x), "op `bitwise_and` .*got f32"),
}


@pytest.mark.parametrize("case", BAD_CALLS)
def test_op_errors_are_the_exception_class_the_cpu_raises(mode, case):
    """The exception names the op, shapes and device, and is an instance of
    the class PyTorch CPU raises for the same call (IndexError for a
    dimension out of range, NotImplementedError for a dtype an op does not
    implement, RuntimeError for the rest)."""
    call, message = BAD_CALLS[case]
    x = torch.randn(2, 3)
    with pytest.raises(Exception) as on_cpu:
        call(x)
    with pytest.raises(type(on_cpu.value), match=message):
        call(x.to("tpu"))
    assert_close(x.to("tpu").sum(1), x.sum(1))  # the device still computes


#: Calls PyTorch CPU refuses, each with what tpu's message must say.
REJECTED = {
    "mm of two dtypes": (lambda x: torch.mm(x, x.t().int()), r"op `mm` on tpu:0: .*same dtype.*Float != Int"),
    "layer_norm over another shape": (lambda x: F.layer_norm(x, (4,)), r"normalized_shape=\[4\].*\[2, 3\]"),
    "arange against its step": (
        lambda x: torch.arange(0, 5, -1, device=x.device), r"upper bound and lower bound inconsistent with step sign"
    ),
    "arange with step 0": (lambda x: torch.arange(0, 5, 0, device=x.device), r"step must be nonzero"),
    "a negative size": (lambda x: torch.full((2, -3), 1.0, device=x.device), r"negative dimension -3"),
    "empty with a negative size": (lambda x: torch.empty(-1, device=x.device), r"negative dimension -1"),
    "a float result into an int tensor": (lambda x: x.int().div_(2), r"Float can't be cast to the desired output type Int"),
    "a float result into out=": (
        lambda x: torch.mul(x, x, out=torch.empty(2, 3, dtype=torch.int64, device=x.device)),
        r"Float can't be cast to the desired output type Long",
    ),
    "a negative integer power": (lambda x: x.long() ** -1, r"negative integer powers"),
    "nll_loss weights of another class count": (
        lambda x: F.nll_loss(x, torch.tensor([0, 1], device=x.device), weight=torch.ones(5, device=x.device)),
        r"weight tensor should be defined either for all 3 classes",
    ),
    "amax over an empty dim": (lambda x: x[:0].amax(0), r"empty.*dimension 0 of \[0, 3\]"),
    "argmax of an empty tensor": (lambda x: x[:0].argmax(), r"argmax of an empty tensor"),
    "index_select with a 2-d index": (
        lambda x: x.index_select(0, torch.zeros(1, 1, dtype=torch.long, device=x.device)), r"1-D.*\[1, 1\]"
    ),
    "mode over a dim out of range": (lambda x: x.mode(4), r"Dimension out of range.*got 4"),
    "a mask of another shape": (
        lambda x: x[torch.ones(3, dtype=torch.bool, device=x.device)], r"shape of the mask \[3\] at index 0"
    ),
    "clamp without bounds": (lambda x: torch.clamp(x), r"At least one of 'min' or 'max'"),
    "an unknown rounding mode": (lambda x: torch.div(x, x, rounding_mode="round"), r"rounding_mode.*'round'"),
    "integer remainder by 0": (lambda x: x.long() % 0, r"ZeroDivisionError"),
    "integer floor division by 0": (lambda x: x.long() // 0, r"ZeroDivisionError"),
    "take with float positions": (lambda x: x.take(x), r"Expected a long tensor for index"),
    "the norm of integers": (lambda x: x.long().norm(), r"Expected a floating point or complex tensor"),
    "kthvalue past the dim": (lambda x: x.kthvalue(5, 1), r"out of range for dimension 1"),
}


@pytest.mark.parametrize("case", REJECTED)
def test_calls_the_cpu_rejects_are_rejected_with_its_exception_class(mode, case):
    """Never a silent result: what PyTorch CPU refuses, tpu refuses with an
    instance of the same class and a message saying what is wrong (a
    missing kernel's `NotImplementedError` is a `RuntimeError` too, and
    does not pass for one), and the tensor is left as it was."""
    call, message = REJECTED[case]
    x = torch.randn(2, 3)
    with pytest.raises(Exception) as on_cpu:
        call(x.clone())
    on_tpu = x.to("tpu")
    with pytest.raises(type(on_cpu.value), match=message) as raised:
        call(on_tpu)
    assert isinstance(raised.value, NotImplementedError) == isinstance(on_cpu.value, NotImplementedError)
    assert_close(on_tpu, x)


def test_the_median_of_nothing_is_nan(mode):
    empty = torch.empty(0)
    assert torch.isnan(empty.to("tpu").median().cpu()) and torch.isnan(empty.median())
    assert torch.isnan(empty.to("tpu").nanmedian().cpu())


def test_float_index_tensors_are_an_index_error(mode):
    x = torch.randn(2, 3)
    with pytest.raises(IndexError, match="must be long, int, byte or bool"):
        x[torch.tensor([0.5])]
    with pytest.raises(IndexError, match="must be long, int, byte or bool"):
        x.to("tpu")[torch.tensor([0.5]).to("tpu")]
    with pytest.raises(IndexError, match="must be long, int, byte or bool"):
        x.to("tpu")[torch.tensor([1.0])] = 0.0


def test_debug_raises_index_error_for_out_of_range_indices():
    x = torch.randn(4, 3).to("tpu")
    with torch.tpu.set_eager_mode("debug"):
        with pytest.raises(IndexError, match="index 100 is out of bounds for dimension 0 with size 4"):
            x[torch.tensor([100]).to("tpu")]
        with pytest.raises(IndexError, match="index_select: index 4"):
            torch.index_select(x, 0, torch.tensor([4]).to("tpu"))
        with pytest.raises(IndexError, match="gather"):
            torch.gather(x, 1, torch.tensor([[3]]).to("tpu"))
        ones = torch.ones(1, 3).to("tpu")
        with pytest.raises(IndexError, match="scatter: index 5 is out of bounds for dimension 0 with size 4"):
            x.clone().scatter_(0, torch.tensor([[5, 0, 0]]).to("tpu"), ones)
        with pytest.raises(IndexError, match="index_add: index 7 is out of bounds for dimension 0 with size 4"):
            x.clone().index_add_(0, torch.tensor([7]).to("tpu"), ones)
        for accumulate in (False, True):
            with pytest.raises(IndexError, match="index_put: index 9 is out of bounds for dimension 0 with size 4"):
                x.clone().index_put_((torch.tensor([9]).to("tpu"),), ones[0], accumulate=accumulate)
        assert_close(x[torch.tensor([-1]).to("tpu")], x.cpu()[[-1]])


def test_index_put_impl_accumulates():
    z, idx, vals = torch.zeros(5), torch.tensor([0, 1, 1, 3]), torch.randn(4)
    want = torch.ops.aten._index_put_impl_(z.clone(), [idx], vals, True, False)
    got = torch.ops.aten._index_put_impl_(z.to("tpu"), [idx.to("tpu")], vals.to("tpu"), True, False)
    assert_close(got, want)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
def test_native_batch_norm_equals_cpu(training, affine):
    x = torch.randn(4, 3, 5, 5)
    w, b = (torch.randn(3), torch.randn(3)) if affine else (None, None)
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    t = lambda a: None if a is None else a.to("tpu")
    trm, trv = rm.to("tpu"), rv.to("tpu")
    want = torch.native_batch_norm(x, w, b, rm, rv, training, 0.1, 1e-5)
    got = torch.native_batch_norm(t(x), t(w), t(b), trm, trv, training, 0.1, 1e-5)
    for g, c in zip(got, want):
        assert_close(g, c)
    assert_close(trm, rm)
    assert_close(trv, rv)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"is_causal": True},
        {"scale": 0.3},
        {"mask": "bool"},
        {"mask": "float"},
    ],
)
def test_scaled_dot_product_attention_equals_cpu(kwargs, mode):
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    kwargs = dict(kwargs)
    mask = kwargs.pop("mask", None)
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(2, 1, 6, 6) > 0.3
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(2, 1, 6, 6)
    tpu_kwargs = {k_: (a.to("tpu") if isinstance(a, torch.Tensor) else a) for k_, a in kwargs.items()}
    want = F.scaled_dot_product_attention(q, k, v, **kwargs)
    got = F.scaled_dot_product_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), **tpu_kwargs)
    assert_close(got, want)


def test_multi_head_attention_equals_cpu(mode):
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    want = mha(x, x, x)[0]
    tpu = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    tpu.load_state_dict(mha.state_dict())
    tpu = tpu.to("tpu")
    tx = x.to("tpu")
    assert_close(tpu(tx, tx, tx)[0], want)


def test_as_strided_on_partial_views(mode):
    base = torch.randn(20)
    want = base[2:].as_strided((3, 2), (2, 3), 1)
    got = base.to("tpu")[2:].as_strided((3, 2), (2, 3), 1)
    assert_close(got, want)


def test_device_memory_is_flat_over_training(mode):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)]
    model = torch.nn.Sequential(*layers).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32).to("tpu"), torch.randint(0, 10, (16,)).to("tpu")
    allocated = {}
    for step in range(1, 201):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step in (50, 200):
            loss.item()
            allocated[step] = torch.tpu.memory_allocated()
    assert allocated[200] == allocated[50], allocated
