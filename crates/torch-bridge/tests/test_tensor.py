"""Tensor basics on the tpu device: moving, creating, printing, views,
in-place writes, indexing, out= forms, dtypes, errors and save/load."""

import io
import warnings

import pytest
import torch
from conftest import assert_close


def test_device_and_round_trip(mode):
    x = torch.randn(3, 4)
    t = x.to("tpu")
    assert t.device == torch.device("tpu:0")
    assert t.is_floating_point() and t.shape == (3, 4)
    assert torch.equal(t.cpu(), x)
    assert torch.equal(x.tpu().cpu(), x)
    assert torch.accelerator.current_accelerator().type == "tpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8])
def test_dtypes_round_trip(dtype):
    x = (torch.randn(5, 3) * 10).to(dtype)
    assert torch.equal(x.to("tpu").cpu(), x)


def test_factories(mode):
    assert_close(torch.zeros(2, 3, device="tpu"), torch.zeros(2, 3))
    assert_close(torch.ones(4, dtype=torch.int64, device="tpu"), torch.ones(4, dtype=torch.int64))
    assert_close(torch.full((2, 2), 7.5, device="tpu"), torch.full((2, 2), 7.5))
    assert_close(torch.arange(2, 11, 3, device="tpu"), torch.arange(2, 11, 3))
    assert_close(torch.eye(3, device="tpu"), torch.eye(3))
    assert torch.empty(5, device="tpu").shape == (5,)


def test_item_and_printing():
    t = torch.tensor([[1.5, -2.0], [3.0, 4.25]]).to("tpu")
    assert t.sum().item() == pytest.approx(6.75)
    text = repr(t)
    assert "device='tpu:0'" in text and "4.2500" in text
    assert str(torch.tensor(3).to("tpu")) == "tensor(3, device='tpu:0')"


def test_elementwise_and_promotion(mode):
    a, b = torch.randn(3, 4), torch.randn(4)
    i = torch.arange(12).reshape(3, 4)
    ta, tb, ti = a.to("tpu"), b.to("tpu"), i.to("tpu")
    assert_close(ta + tb * 2 - 1, a + b * 2 - 1)
    assert_close(ta / tb, a / b)
    assert_close(ti / 4, i / 4)
    assert_close(ti // 5, i // 5)
    assert_close(ti % 5, i % 5)
    assert_close(ti * 2.5, i * 2.5)
    assert_close(torch.where(ta > 0, ta, tb), torch.where(a > 0, a, b))
    assert_close(ta.exp().log1p().tanh().sigmoid(), a.exp().log1p().tanh().sigmoid())
    assert_close(ta.clamp(-0.5, 0.5), a.clamp(-0.5, 0.5))
    assert_close((ta > tb) & (ta < 1), (a > b) & (a < 1))
    assert_close(ta.pow(2).sqrt(), a.pow(2).sqrt())


def test_reductions(mode):
    x = torch.randn(3, 4, 5)
    t = x.to("tpu")
    assert_close(t.sum(), x.sum())
    assert_close(t.sum((0, 2), keepdim=True), x.sum((0, 2), keepdim=True))
    assert_close(t.mean(-1), x.mean(-1))
    assert_close(t.var(1), x.var(1))
    assert_close(t.std(1, correction=0), x.std(1, correction=0))
    assert_close(t.amax(2), x.amax(2))
    values, indices = t.max(1)
    assert_close(values, x.max(1).values)
    assert_close(indices, x.max(1).indices)
    assert_close(t.argmin(), x.argmin())
    assert_close(t.softmax(-1), x.softmax(-1))
    assert_close(t.log_softmax(0), x.log_softmax(0))
    assert_close(t.logsumexp(1), x.logsumexp(1))
    assert_close(t.cumsum(2), x.cumsum(2))
    assert_close(torch.linalg.vector_norm(t), torch.linalg.vector_norm(x))


def test_views_alias_storage(mode):
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    for f in (lambda v: v.t(), lambda v: v[:, 1:3], lambda v: v[1], lambda v: v.view(2, 6),
              lambda v: v[::2, ::3], lambda v: v.permute(1, 0)[1:], lambda v: v.unsqueeze(0).expand(2, 3, 4)):
        view = f(t)
        assert view.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
        assert_close(view, f(x))


def test_in_place_through_views(mode):
    x = torch.zeros(4, 5)
    t = x.to("tpu")
    for f in (lambda v: v[1:3].add_(2), lambda v: v[:, 0].fill_(7), lambda v: v.t()[1].mul_(3),
              lambda v: v[::2, 1::2].sub_(1), lambda v: v.view(20)[5:9].copy_(torch.arange(4.0))):
        f(x)
        f(t)
        assert_close(t, x)
    alias = t[2]
    t.zero_()
    assert_close(alias, torch.zeros(5))


def test_indexing(mode):
    x = torch.randn(5, 6)
    t = x.to("tpu")
    idx = torch.tensor([4, 0, -1])
    assert_close(t[idx.to("tpu")], x[idx])
    assert_close(t[:, idx.to("tpu")], x[:, idx])
    assert_close(t[t > 0], x[x > 0])
    assert_close(t[idx.to("tpu"), idx.to("tpu")], x[idx, idx])
    assert_close(t.gather(1, torch.tensor([[0, 2]] * 5).to("tpu")), x.gather(1, torch.tensor([[0, 2]] * 5)))
    x[idx] = 1.5
    t[idx.to("tpu")] = 1.5
    assert_close(t, x)
    x[x < 0] = 0.0
    t[t < 0] = 0.0
    assert_close(t, x)
    x.index_put_((torch.tensor([1, 1]),), torch.ones(2, 6), accumulate=True)
    t.index_put_((torch.tensor([1, 1]).to("tpu"),), torch.ones(2, 6).to("tpu"), accumulate=True)
    assert_close(t, x)


def test_joins_and_sorts(mode):
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    ta, tb = a.to("tpu"), b.to("tpu")
    assert_close(torch.cat([ta, tb]), torch.cat([a, b]))
    assert_close(torch.stack([ta, ta], 1), torch.stack([a, a], 1))
    assert_close(torch.sort(tb, 0).values, torch.sort(b, 0).values)
    assert_close(torch.topk(tb.flatten(), 3).values, torch.topk(b.flatten(), 3).values)
    assert_close(tb.flip(0).tril(), b.flip(0).tril())
    assert_close(torch.nn.functional.pad(ta, (1, 2)), torch.nn.functional.pad(a, (1, 2)))


def test_out_forms(mode):
    a, b = torch.randn(3), torch.randn(3)
    out = torch.empty(0, device="tpu")
    torch.add(a.to("tpu"), b.to("tpu"), out=out)
    assert_close(out, a + b)
    big = torch.zeros(2, 3, device="tpu")
    torch.mul(a.to("tpu"), 2, out=big[1])
    expected = torch.zeros(2, 3)
    expected[1] = a * 2
    assert_close(big, expected)


def test_manual_seed_reproduces_random_ops():
    torch.manual_seed(7)
    first = (torch.randn(4, device="tpu").cpu(), torch.rand(4, device="tpu").cpu())
    torch.manual_seed(7)
    second = (torch.randn(4, device="tpu").cpu(), torch.rand(4, device="tpu").cpu())
    assert all(torch.equal(p, q) for p, q in zip(first, second))
    assert not torch.equal(first[0], torch.randn(4, device="tpu").cpu())
    state = torch.tpu.get_rng_state()
    third = torch.randn(4, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(4, device="tpu").cpu(), third)
    u = torch.rand(10000, device="tpu").cpu()
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02


def test_save_and_load_tensors_and_state_dicts():
    model = torch.nn.Linear(3, 2).to("tpu")
    t = torch.randn(4).to("tpu")
    buffer = io.BytesIO()
    torch.save({"t": t, "state": model.state_dict()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded["t"].device.type == "tpu"
    assert torch.equal(loaded["t"].cpu(), t.cpu())
    fresh = torch.nn.Linear(3, 2).to("tpu")
    fresh.load_state_dict(loaded["state"])
    assert torch.equal(fresh.weight.cpu(), model.weight.cpu())


def test_errors_name_the_op_and_shapes():
    a, b = torch.randn(2, 3, device="tpu"), torch.randn(4, 5, device="tpu")
    with pytest.raises(RuntimeError, match=r"op `mm` on tpu:0: mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)"):
        a @ b
    with pytest.raises(RuntimeError, match=r"op `matmul` on tpu:0 with inputs \(f32\[3\], f32\[4\]\)"):
        torch.dot(a[0], b[0, :4])
    with pytest.raises(NotImplementedError, match="airy_ai"):
        torch.special.airy_ai(torch.rand(8, device="tpu"))


def test_mixing_devices_is_an_error_except_for_scalars():
    t = torch.randn(3, 4, device="tpu")
    with pytest.raises(RuntimeError, match="same device.*tpu:0.*cpu"):
        t + torch.randn(3, 4)
    assert_close(t + torch.tensor(2.0), t.cpu() + 2.0)  # a 0-dim CPU tensor is a scalar


def test_cpu_fallback_is_opt_in_and_warns_once(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    x = torch.rand(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = torch.special.airy_ai(x.to("tpu"))
        torch.special.airy_ai(x.to("tpu"))
    assert first.device.type == "tpu"
    torch.testing.assert_close(first.cpu(), torch.special.airy_ai(x))
    assert sum("airy_ai" in str(w.message) for w in caught) == 1


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -0.5, -1, -2, 2.0, 1.5, 0, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_pow_by_a_python_number_matches_cpu(mode, exponent, dtype):
    # Includes zeros, negatives, infinities and NaN, where the exponents
    # computed as products, square roots or reciprocals must agree with the
    # CPU's own special cases.
    x = torch.tensor([0.0, -0.0, 1.5, -2.25, 3.0, float("inf"), float("-inf"), float("nan"), 1e-3, -7.0])
    x = x.to(dtype) if dtype.is_floating_point else torch.arange(-4, 6)
    if not dtype.is_floating_point and isinstance(exponent, int) and exponent < 0:
        with pytest.raises(RuntimeError):
            x.pow(exponent)
        return
    expected = x.pow(exponent)
    got = x.to("tpu").pow(exponent)
    assert got.dtype == expected.dtype
    # Op by op the results are PyTorch's bit for bit; inside a fused program
    # XLA may turn 1 / sqrt(x) into rsqrt(x), one ulp away.
    exact = mode == "strict" or not dtype.is_floating_point
    ulp = 0 if exact else torch.finfo(dtype).eps
    torch.testing.assert_close(got.cpu(), expected, atol=0, rtol=ulp, equal_nan=True)


@pytest.mark.parametrize(
    "make, size",
    [
        (lambda x: x, (5, 6)),
        (lambda x: x, (2, 3)),
        (lambda x: x[1:], (2, 2)),
        (lambda x: x.t(), (3, 3)),
    ],
)
def test_resize_keeps_the_storages_elements(mode, make, size):
    """As on the CPU: the storage's elements from the tensor's offset on fill
    the new shape in order (the elements past the old end are new)."""
    cpu = make(torch.arange(24.0).reshape(4, 6))
    tpu = make(torch.arange(24.0).reshape(4, 6).to("tpu"))
    cpu.resize_(size)
    tpu.resize_(size)
    n = min(cpu.numel(), 24 - cpu.storage_offset())
    assert tpu.shape == cpu.shape
    assert torch.equal(tpu.cpu().flatten()[:n], cpu.flatten()[:n])


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((5,), {}), ((3, 8), {}), ((10, 0, -3), {}), ((0,), {}), ((1, 1), {}), ((2.5,), {}),
        ((0, 1, 0.25), {}), ((5,), {"dtype": torch.float32}), ((0, 5), {"dtype": torch.bfloat16}),
        ((-1.5, 2.25, 0.5), {"dtype": torch.float64}), ((5,), {"dtype": torch.int32}),
    ],
)
def test_arange_gives_the_cpus_values_dtype_and_shape(mode, args, kwargs):
    want = torch.arange(*args, **kwargs)
    got = torch.arange(*args, device="tpu", **kwargs)
    assert (got.dtype, got.shape, got.device.type) == (want.dtype, want.shape, "tpu")
    assert torch.equal(got.cpu(), want)
    on_second = torch.arange(*args, device=f"tpu:{torch.tpu.device_count() - 1}", **kwargs)
    assert torch.equal(on_second.cpu(), want) and on_second.device.index == torch.tpu.device_count() - 1
    for bad, message in (((0, 5, 0), "step must be nonzero"), ((5, 0, 1), "inconsistent with step sign")):
        with pytest.raises(RuntimeError, match=message):
            torch.arange(*bad, device="tpu")


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.linspace(0, 10, 4, dtype=torch.int64, device=d),
        lambda d: torch.logspace(0, 2, 3, dtype=torch.int64, device=d),
        lambda d: torch.full((2,), 2.7, dtype=torch.int32, device=d),
    ],
)
def test_creation_ops_make_integer_dtypes_through_their_out_forms(mode, make):
    assert_close(make("tpu"), make("cpu"))


def test_clone_and_to_keep_values_strides_devices_and_gradients(mode):
    x = torch.randn(3, 4)
    t = x.to("tpu")
    c = t.clone()
    assert c.is_contiguous() and c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
    c.add_(1)
    assert torch.equal(t.cpu(), x) and torch.equal(c.cpu(), x + 1)
    # preserve_format keeps a transpose's strides; contiguous_format does not.
    assert t.t().clone().stride() == x.t().clone().stride()
    assert t.t().clone(memory_format=torch.contiguous_format).is_contiguous()
    assert torch.equal(t.t().clone().cpu(), x.t())
    for dtype in (torch.float64, torch.bfloat16, torch.int32, torch.bool):
        got = (t * 10).to(dtype)
        assert got.dtype == dtype and torch.equal(got.cpu(), (x * 10).to(dtype))
    assert t.t().to(torch.float64).stride() == x.t().to(torch.float64).stride()
    last = torch.tpu.device_count() - 1
    assert t.to(f"tpu:{last}").device.index == last and torch.equal(t.to(f"tpu:{last}").cpu(), x)
    assert t.to("cpu").device.type == "cpu" and torch.equal(t.to("cpu"), x)
    g = t.clone().requires_grad_()
    (g.to(torch.float64).clone() * 2).sum().backward()
    assert torch.equal(g.grad.cpu(), torch.full((3, 4), 2.0))
