"""The native kernels written in Rust (``src/native_ops``), run through the
boxed C++ kernel, against PyTorch's CPU: values, dtypes and shapes, the
in-place forms, PyTorch's exception classes, autograd through the backward
kernels, and host copies both ways."""

import pytest
import torch

import torch_tpu_rs
from conftest import assert_close
from torch_tpu_rs.aten import REGISTERED


def _values(dtype, shape, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g) * 2
        return (x.abs() + 0.1 if positive else x).to(dtype)
    return torch.randint(1 if positive else -4, 9, shape, generator=g).to(dtype)


def _tpu(v):
    if isinstance(v, torch.Tensor) and v.dim() > 0:
        return v.to("tpu")
    if isinstance(v, (list, tuple)):
        return type(v)(_tpu(x) for x in v)
    return v


def _same(got, expected, half_atol=1e-5):
    if isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e, half_atol)
        return
    if not isinstance(expected, torch.Tensor):
        assert got == expected
        return
    assert got.device.type == "tpu", got.device
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, expected.dtype, got.shape, expected.shape)
    if expected.dtype in (torch.bfloat16, torch.float16):
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True, atol=half_atol, rtol=1.6e-2)
    else:
        assert_close(got, expected, equal_nan=True)


def _check(f, *args, half_atol=1e-5):
    """``f`` on tpu equals ``f`` on the CPU, or raises the CPU's class
    (half types to PyTorch's default tolerance, or ``half_atol``)."""
    try:
        expected = f(*args)
    except (RuntimeError, NotImplementedError) as e:
        with pytest.raises(type(e)):
            f(*_tpu(args))
        return
    _same(f(*_tpu(args)), expected, half_atol)


def test_every_native_op_is_a_real_aten_overload_without_a_python_kernel():
    names = torch_tpu_rs._C.native_op_names()
    assert len(names) > 100
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        assert op._schema is not None
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"), name
        # Registered in C++ (never skipped as an op autograd decomposes),
        # so no Python kernel took its place.
        assert REGISTERED.get(name, "native") == "native", name


UNARY = ["exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "reciprocal", "log1p", "expm1", "neg", "abs", "relu", "silu", "isnan", "isinf", "logical_not", "bitwise_not"]


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_unary_ops_and_their_in_place_forms(name, dtype):
    x = _values(dtype, (3, 5), positive=name in ("log", "sqrt", "rsqrt"))
    fn = getattr(torch, name, None) or getattr(torch.nn.functional, name)
    _check(fn, x)
    inplace = getattr(torch.Tensor, name + "_", None)
    if inplace is not None:
        _check(lambda t: inplace(t.clone()), x)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -0.5, -1, -2, 1.7, -3, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_pow_by_a_number(exponent, dtype):
    x = _values(dtype, (4, 3), positive=True)
    _check(lambda t: t**exponent, x)
    _check(lambda t: t.clone().pow_(exponent), x)


BINARY = {
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "maximum": torch.maximum, "minimum": torch.minimum,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "rsub": lambda a, b: torch.rsub(a, b, alpha=2) if isinstance(a, torch.Tensor) and a.dtype != torch.bool else torch.rsub(a, b),
}
PAIRS = [
    (torch.float32, torch.int64), (torch.int64, torch.int32), (torch.bfloat16, torch.float32),
    (torch.bool, torch.bool), (torch.uint8, torch.int8),
]


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("dtypes", PAIRS, ids=str)
def test_binary_ops_promote_and_broadcast_as_pytorch(name, dtypes):
    a, b = _values(dtypes[0], (3, 4)), _values(dtypes[1], (4,), seed=1)
    f = BINARY[name]
    _check(f, a, b)
    _check(f, a, _values(dtypes[1], (), seed=2))  # a 0-dim CPU tensor
    number = 2 if not dtypes[1].is_floating_point else 1.5
    if name not in ("maximum", "minimum", "logical_and", "logical_or", "logical_xor"):
        _check(f, a, number)
    inplace = getattr(torch.Tensor, name + "_", None)
    if inplace is not None and name != "rsub":
        _check(lambda x, y: inplace(x.clone(), y), a, b)


@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32), (torch.int64, torch.float16)], ids=str)
def test_where_and_masked_fill(dtypes):
    cond = _values(torch.bool, (3, 4))
    a, b = _values(dtypes[0], (3, 4)), _values(dtypes[1], (4,), seed=1)
    _check(torch.where, cond, a, b)
    _check(lambda c, x: torch.where(c, x, 0.5), cond, a)
    _check(lambda c, y: torch.where(c, 2, y), cond, b)
    _check(lambda c: torch.where(c, 1.0, 0.0), cond)
    _check(lambda x, c: x.masked_fill(c, -7), a, cond)
    _check(lambda x, c: x.clone().masked_fill_(c, torch.tensor(3.5)), a, cond)
    _check(lambda x, c: x.masked_fill(c[0], 1), a, cond)
    # PyTorch's errors: a mask that is not bool, a value with dims.
    _check(lambda x: x.masked_fill(x, 1.0), a)
    _check(lambda x, c: x.masked_fill(c, x[0]), a, cond)


@pytest.mark.parametrize("weight", [0.0, 0.3, 0.5, 0.9, 1.0, "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lerp_matches_the_cpu_formula(weight, dtype):
    a, b = _values(dtype, (5, 4)), _values(dtype, (5, 4), seed=1)
    w = torch.rand(5, 4).to(dtype) if weight == "tensor" else weight
    _check(torch.lerp, a, b, w)
    _check(lambda x, y, z: x.clone().lerp_(y, z), a, b, w)
    _check(torch.lerp, a, b.double(), 0.5)  # PyTorch rejects mixed dtypes
    _check(torch.lerp, a.long(), b.long(), 0.5)


@pytest.mark.parametrize("value", [1, 0.5, -2])
@pytest.mark.parametrize("dtypes", [(torch.float32,) * 3, (torch.bfloat16,) * 3, (torch.float32, torch.bfloat16, torch.float32)], ids=str)
def test_addcmul_and_addcdiv(value, dtypes):
    s, t1, t2 = (_values(d, (4, 3), seed=i, positive=True) for i, d in enumerate(dtypes))
    _check(lambda a, b, c: torch.addcmul(a, b, c, value=value), s, t1, t2)
    _check(lambda a, b, c: torch.addcdiv(a, b, c, value=value), s, t1, t2)
    _check(lambda a, b, c: a.clone().addcmul_(b, c, value=value), s, t1, t2)
    _check(lambda a, b, c: a.clone().addcdiv_(b, c, value=value), s, t1, t2)
    ints = _values(torch.int64, (4, 3), positive=True)
    _check(lambda a, b: torch.addcdiv(a, b, b), ints, ints)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_reductions(dtype):
    x = _values(dtype, (3, 4, 5))
    if dtype != torch.bool:
        _check(lambda t: t.sum(), x)
        _check(lambda t: t.sum((0, 2), keepdim=True), x)
        _check(lambda t: t.sum(1, dtype=torch.float64), x)
        _check(lambda t: t.sum(-1), x)
        _check(lambda t: t.mean(1), x)
        _check(lambda t: t.mean(), x)
        _check(lambda t: t.amax((1, 2)), x)
        _check(lambda t: t.amin(0, keepdim=True), x)
        _check(lambda t: t.max(), x)
        _check(lambda t: t.min(), x)
        _check(lambda t: t.argmax(), x)
        _check(lambda t: t.argmax(1, keepdim=True), x)
        _check(lambda t: t.argmin(-1), x)
    _check(lambda t: t.any(), x)
    _check(lambda t: t.all(1), x)
    _check(lambda t: t.any((0, 2), keepdim=True), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_layer_norm_and_activations_through_autograd(dtype):
    x = _values(dtype, (4, 6))
    w, b = _values(dtype, (6,), seed=1), _values(dtype, (6,), seed=2)

    def grads(f, *inputs):
        leaves = [t.detach().requires_grad_(True) for t in inputs]
        out = f(*leaves)
        (out * torch.linspace(-1, 1, out.numel(), device=out.device).reshape(out.shape).to(out.dtype)).sum().backward()
        return [out] + [t.grad for t in leaves]

    F = torch.nn.functional
    for f in (
        lambda t: F.softmax(t, -1), lambda t: F.log_softmax(t, 0), torch.tanh, torch.sigmoid, F.relu,
        F.gelu, lambda t: F.gelu(t, approximate="tanh"), F.silu,
    ):
        _check(lambda t: grads(f, t), x)
    # Layer norm's backward sums over rows in another order than the CPU's:
    # a few bf16 ulps of the largest gradient.
    loose = 1e-2 if dtype == torch.bfloat16 else 1e-5
    _check(lambda t, u, v: grads(lambda a, c, d: F.layer_norm(a, (6,), c, d), t, u, v), x, w, b, half_atol=loose)
    _check(lambda t: grads(lambda a: F.layer_norm(a, (4, 6)), t), x, half_atol=loose)
    _check(lambda t, v: grads(lambda a, d: F.layer_norm(a, (6,), None, d), t, v), x, b, half_atol=loose)
    _check(lambda t: F.layer_norm(t, (5,)), x)  # PyTorch's shape error
    _check(lambda t: F.softmax(t, -1, dtype=torch.float32), x)


def test_embedding_backward_and_cat():
    weight = _values(torch.float32, (10, 4))
    idx = torch.tensor([[1, 3, 3], [0, 9, 1]])

    def embed(w, i, padding_idx=None):
        w = w.detach().requires_grad_(True)
        out = torch.nn.functional.embedding(i, w, padding_idx=padding_idx)
        (out * 2).sum().backward()
        return out, w.grad

    _check(embed, weight, idx)
    _check(lambda w, i: embed(w, i, padding_idx=3), weight, idx)
    a, b = _values(torch.float32, (2, 3)), _values(torch.int64, (2, 5))
    _check(lambda x, y: torch.cat([x, y], 1), a, b)
    _check(lambda x, y: torch.cat([x, y.float()[:, :3]], 0), a, b)
    _check(lambda x: torch.cat([x, torch.empty(0, device=x.device)]), a)
    _check(lambda x, y: torch.cat([x, y]), a, b)  # sizes differ off the dim
    _check(lambda x: torch.index_select(x, 1, torch.tensor([2, 0, 0], device=x.device)), a)


def test_dropout_keeps_the_expected_scale_and_mask():
    x = torch.ones(200, 100, device="tpu")
    out, mask = torch.ops.aten.native_dropout(x, 0.25, True)
    assert mask.dtype == torch.bool and out.shape == x.shape
    kept = mask.float().mean().item()
    assert 0.7 < kept < 0.8
    assert_close(out, (mask.float() / 0.75).cpu())
    same, ones = torch.ops.aten.native_dropout(x, 0.25, False)
    assert_close(same, x.cpu()) and bool(ones.all())
    grad = torch.ops.aten.native_dropout_backward(x * 3, mask, 1 / 0.75)
    assert_close(grad, (mask.float() * 4).cpu())


def test_copies_fills_and_reading_values():
    base = _values(torch.float32, (4, 6))
    t = base.to("tpu")
    # Host to tpu: non-contiguous sources, casts, broadcasts; and back.
    _same(base.t().to("tpu"), base.t())
    _same(base[:, ::2].to("tpu", torch.float64), base[:, ::2].double())
    dst = torch.zeros(4, 6, dtype=torch.bfloat16, device="tpu")
    dst.copy_(base[0])
    _same(dst, base[0].expand(4, 6).bfloat16())
    dst.copy_(t.t().t())
    _same(dst, base.bfloat16())
    host = torch.empty(6, 4, dtype=torch.float64)
    host.copy_(t.t())
    assert torch.equal(host, base.t().double())
    assert torch.equal(t.cpu(), base) and t.cpu().is_contiguous()
    # clone: contiguous, a preserved non-contiguous layout, another format.
    _check(lambda x: x.t().clone(), base)
    _check(lambda x: x.t().contiguous(), base)
    c = t.t().clone()
    assert c.stride() == base.t().clone().stride()
    # fill_ and zero_, with numbers, 0-dim tensors and PyTorch's errors.
    _check(lambda x: x.clone().fill_(2.5), base)
    _check(lambda x: x.long().fill_(2.5), base)
    _check(lambda x: x.clone().fill_(torch.tensor(7)), base)
    _check(lambda x: x.clone().fill_(x[0]), base)
    _check(lambda x: x.clone().zero_(), base)
    # item() on every dtype, and PyTorch's error for several elements.
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8):
        v = _values(dtype, (3,))
        assert v.to("tpu")[1].item() == v[1].item()
    big = torch.tensor([2**62 + 1])
    assert big.to("tpu").item() == 2**62 + 1
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        t.item()


def test_errors_name_the_op_and_device():
    t = torch.ones(3, device="tpu")
    with pytest.raises(RuntimeError, match=r"op `sqrt_` on tpu:0: .*can't be cast"):
        torch.ones(3, dtype=torch.int64, device="tpu").sqrt_()
    with pytest.raises(RuntimeError, match="same device"):
        torch.where(t > 0, t, torch.ones(3))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        t.clone().lerp_(torch.ones(2, 3, device="tpu"), 0.5)
    with pytest.raises(NotImplementedError):
        torch.nn.functional.silu(torch.ones(3, dtype=torch.int64, device="tpu"))


def test_index_select_out_of_range_raises_under_debug():
    previous = torch_tpu_rs._C.eager_mode()
    torch_tpu_rs._C.set_eager_mode("debug")
    try:
        x = torch.ones(3, 2, device="tpu")
        with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
            torch.index_select(x, 0, torch.tensor([0, 5], device="tpu"))
    finally:
        torch_tpu_rs._C.set_eager_mode(previous)


def test_empty_tensors_and_triangles():
    e = torch.empty(2, 3, dtype=torch.int32, device="tpu")
    assert e.shape == (2, 3) and e.dtype == torch.int32 and e.device == torch.device("tpu:0") and e.is_contiguous()
    assert torch.empty(4, device="tpu").dtype == torch.get_default_dtype()
    s = torch.empty_strided((2, 3), (1, 2), device="tpu")
    assert s.stride() == (1, 2) and s.untyped_storage().nbytes() == 6 * 4
    s.copy_(torch.arange(6.0).reshape(2, 3))
    assert torch.equal(s.cpu(), torch.arange(6.0).reshape(2, 3))
    assert torch.zeros(0, 5, device="tpu").cpu().shape == (0, 5)
    with pytest.raises(RuntimeError, match="negative dimension -1"):
        torch.empty(2, -1, device="tpu")
    with pytest.raises(RuntimeError, match="tpu:99 does not exist"):
        torch.empty(2, device="tpu:99")
    x = _values(torch.float32, (4, 5))
    for k in (-1, 0, 2):
        _check(lambda t: torch.tril(t, k), x)
        _check(lambda t: torch.triu(t, k), x)


def test_attention_takes_pytorchs_math_path_with_no_python_kernel():
    """Until a padded join (a grown KV cache) makes the padded-aware kernel
    needed, whatever the buckets."""
    torch.tpu.set_shape_buckets("pow2")  # starts over: no padded join yet
    q, k, v = (_values(torch.float32, (2, 3, 5, 4), seed=i) for i in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask[0] = False  # a row with every key masked: zeros, not NaN
    F = torch.nn.functional
    _check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v)
    _check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, k, v, mask)
    _check(lambda a, b, c, m: torch.ops.aten._safe_softmax(a.masked_fill(~m, float("-inf")), -1), q, k, v, mask)
    routed = lambda: torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::scaled_dot_product_attention", "AutogradPrivateUse1"
    )
    assert routed() is False
    cache = torch.zeros(1, 2, 9, 4, device="tpu")
    cache = torch.cat([cache, torch.ones(1, 2, 1, 4, device="tpu")], -2)  # held padded
    assert routed()
    with torch.tpu.set_shape_buckets(None):
        assert routed() is False


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss_and_its_backward(reduction, weighted):
    logits = _values(torch.float32, (6, 5))
    target = torch.tensor([0, 4, 2, -100, 1, 2])
    weight = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25]) if weighted else None
    images = _values(torch.float32, (2, 5, 3, 3), seed=3)
    pixels = torch.randint(0, 5, (2, 3, 3), generator=torch.Generator().manual_seed(4))

    def loss(x, t, w):
        x = x.detach().requires_grad_(True)
        out = torch.nn.functional.cross_entropy(x, t, weight=w, reduction=reduction, ignore_index=-100)
        (out * torch.linspace(0.5, 1.5, out.numel(), device=out.device).reshape(out.shape)).sum().backward()
        return out, x.grad

    _check(loss, logits, target, weight)
    _check(loss, images, pixels, weight)
    if weighted:
        _check(loss, logits, target, weight[:3])  # PyTorch's error for a short weight


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((5,), {}),
        ((2, 11, 3), {}),
        ((10, -3, -4), {}),
        ((0.5, 2.0, 0.25), {}),
        ((1, 2.5), {}),
        ((3,), {"dtype": torch.float32}),
        ((0, 1, 0.1), {"dtype": torch.float64}),
        ((-2, 7, 2), {"dtype": torch.int32}),
        ((2**53 + 1, 2**53 + 4), {}),  # exact past what a float holds
        ((4, 4), {}),
        ((5, 2), {}),  # inconsistent with the step's sign
        ((0, 3, 0), {}),
        ((0.0, float("inf")), {}),
    ],
)
def test_arange_equals_the_cpu(args, kwargs):
    try:
        expected = torch.arange(*args, **kwargs)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            torch.arange(*args, **kwargs, device="tpu")
        return
    _same(torch.arange(*args, **kwargs, device="tpu"), expected)
    with torch.tpu.device(1):
        on_current = torch.arange(*args, **kwargs, device="tpu")
    assert on_current.device == torch.device("tpu", 1)
    _same(on_current, expected)
    assert torch.arange(*args, **kwargs, device="tpu:2").device == torch.device("tpu", 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize("out_dtype", [None, torch.float64, torch.int16])
def test_cumsum_equals_the_cpu(dtype, out_dtype):
    x = _values(dtype, (3, 5), seed=7)
    for dim in (0, 1, -1):
        _check(lambda t: torch.cumsum(t, dim, dtype=out_dtype), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("pad", [(1, 2), (0, 0, 2, 1), (-1, 2), (1, 1, 1, 1, 1, 1), (1, 2, 3)])
def test_constant_pad_nd_equals_the_cpu(dtype, pad):
    x = _values(dtype, (2, 3, 4), seed=5)
    value = True if dtype == torch.bool else 3
    _check(lambda t: torch.constant_pad_nd(t, pad, value), x)
    _check(lambda t: torch.nn.functional.pad(t, pad), x)


@pytest.mark.parametrize("invert", [False, True])
def test_isin_equals_the_cpu(invert):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (4, 9), generator=g)
    cases = [
        (ids, torch.tensor([3, 7, 49])),
        (ids, torch.tensor([[3.0, 7.5]])),  # promoted to float
        (ids.float() / 2, torch.tensor([1.5, 2])),
        (ids, 7),
        (ids[:0], torch.tensor([1, 2])),
        (ids, torch.tensor([], dtype=torch.int64)),
        # More pairs than one program compares: done a block at a time.
        (torch.randint(0, 3000, (5000,), generator=g), torch.arange(0, 3000, 3)),
    ]
    for elements, tests in cases:
        want = torch.isin(elements, tests, invert=invert)
        other = tests.to("tpu") if isinstance(tests, torch.Tensor) else tests
        got = torch.isin(elements.to("tpu"), other, invert=invert)
        assert got.dtype == torch.bool and torch.equal(got.cpu(), want), (elements.shape, tests)
    with pytest.raises(NotImplementedError, match="isin\\(\\): Bool"):
        torch.isin(torch.ones(2, dtype=torch.bool, device="tpu"), torch.ones(1, dtype=torch.bool, device="tpu"))


def test_lerp_addcmul_addcdiv_equal_the_cpu_bit_for_bit(mode):
    """One program each, so XLA forms the fused multiply-adds PyTorch's CPU
    kernels use (as single-op programs, an ulp off on 10-25% of elements)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    z = torch.rand(1000, generator=g) + 0.5
    cases = {
        "lerp 0.9": lambda x, y, z: x.lerp(y, 0.9),
        "lerp 0.3": lambda x, y, z: x.lerp(y, 0.3),
        "lerp tensor weight": lambda x, y, z: x.lerp(y, z - 0.5),
        "lerp_": lambda x, y, z: x.clone().lerp_(y, 0.1),
        "addcmul": lambda x, y, z: x.addcmul(y, z, value=0.1),
        "addcmul_": lambda x, y, z: x.clone().addcmul_(y, y, value=1 - 0.999),
        "addcdiv": lambda x, y, z: x.addcdiv(y, z, value=-0.01),
    }
    for name, f in cases.items():
        want = f(x, y, z)
        got = f(x.to("tpu"), y.to("tpu"), z.to("tpu")).cpu()
        assert torch.equal(got, want), f"{name}: {(got != want).sum().item()} elements differ"
