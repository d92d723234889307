"""The native (C++) aten kernels against PyTorch's CPU: type promotion with
tensors, numbers and 0-dim CPU tensors, broadcasting, ``alpha``, PyTorch's
errors, autograd through them, and no Python kernel behind them."""

import itertools

import pytest
import torch

from conftest import assert_close
from torch_tpu_rs.aten import REGISTERED

NATIVE = [f"{op}{form}.{overload}" for op in ("add", "sub", "mul", "div") for form in ("", "_") for overload in ("Tensor", "Scalar")]
NATIVE += ["mm", "bmm", "addmm", "baddbmm"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool]
OPS = {
    "add": lambda a, b: torch.add(a, b),
    "add alpha": lambda a, b: torch.add(a, b, alpha=3),
    "sub": lambda a, b: torch.sub(a, b),
    "sub alpha": lambda a, b: torch.sub(a, b, alpha=2),
    "mul": lambda a, b: torch.mul(a, b),
    "div": lambda a, b: torch.div(a, b),
}


def _values(dtype, shape, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    return torch.randint(1, 9, shape, generator=g).to(dtype)


def _close(got, expected):
    """Exact for integers; float32 to a few ulps; half types to PyTorch's
    default tolerance (an ulp of rounding differs between kernels)."""
    if expected.dtype in (torch.bfloat16, torch.float16):
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True)
    else:
        assert_close(got, expected, equal_nan=True)


def _check(name, a, b):
    """tpu equals the CPU, or raises the CPU's exception class where the CPU
    rejects the combination."""
    f = OPS[name]
    on_tpu = lambda v: v.to("tpu") if isinstance(v, torch.Tensor) and v.dim() > 0 else v
    try:
        expected = f(a, b)
    except (RuntimeError, NotImplementedError) as e:
        with pytest.raises(type(e)):
            f(on_tpu(a), on_tpu(b))
        return
    got = f(on_tpu(a), on_tpu(b))
    assert got.device.type == "tpu" and got.dtype == expected.dtype and got.shape == expected.shape, name
    _close(got, expected)


@pytest.mark.parametrize("name", list(OPS))
def test_tensor_pairs_promote_and_broadcast_like_the_cpu(mode, name):
    for da, db in itertools.product(DTYPES, DTYPES):
        _check(name, _values(da, (3, 4), 1), _values(db, (4,), 2))


def test_bool_division_by_false_fused():
    """A broadcast divisor is divided by, not multiplied by its reciprocal
    (which XLA turned into a select giving 0 for False / False)."""
    with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        a = torch.tensor([[True, False, False], [False, False, False]], device="tpu")
        b = torch.tensor([False, False, True], device="tpu")
        got = (a / b).cpu()
    nan, inf = float("nan"), float("inf")
    torch.testing.assert_close(got, torch.tensor([[inf, nan, 0.0], [nan, nan, 0.0]]), equal_nan=True)


@pytest.mark.parametrize("name", list(OPS))
def test_numbers_and_cpu_scalars_promote_like_the_cpu(mode, name):
    for dtype in DTYPES:
        a = _values(dtype, (2, 3), 3)
        for number in (2, -1.5, True, torch.tensor(2.5), torch.tensor(3), torch.tensor(7, dtype=torch.uint8)):
            _check(name, a, number)
        # A 0-dim tensor (on tpu) with a larger one.
        z = _values(dtype, (), 4)
        try:
            expected = OPS[name](z, a)
        except (RuntimeError, NotImplementedError):
            continue
        _close(OPS[name](z.to("tpu"), a.to("tpu")), expected)


INPLACE = {
    "add_": lambda a, b: a.add_(b),
    "add_ alpha": lambda a, b: a.add_(b, alpha=2),
    "sub_": lambda a, b: a.sub_(b),
    "mul_": lambda a, b: a.mul_(b),
    "div_": lambda a, b: a.div_(b),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_in_place_forms_write_self_like_the_cpu(mode, name):
    """Through views too; a result that cannot be cast to self's dtype, or a
    broadcast that would grow self, raises as on the CPU."""
    f = INPLACE[name]
    for da, db in itertools.product(DTYPES, DTYPES):
        for other in (_values(db, (4,), 2), 3, 0.5, torch.tensor(2)):
            a = _values(da, (3, 4), 1)
            t = a.to("tpu")
            b = other.to(db) if isinstance(other, torch.Tensor) and other.dim() == 0 else other
            tb = b.to("tpu") if isinstance(b, torch.Tensor) and b.dim() > 0 else b
            try:
                f(a, b)
            except (RuntimeError, NotImplementedError) as e:
                with pytest.raises(type(e)):
                    f(t, tb)
                continue
            assert f(t, tb) is t
            _close(t, a)
    # A row view and a transposed view write through to the base.
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu")
    f(t[1], torch.full((4,), 2.0, device="tpu"))
    f(t.t()[2], 3.0)
    f(x[1], torch.full((4,), 2.0))
    f(x.t()[2], 3.0)
    _close(t, x)
    with pytest.raises(RuntimeError, match=r"output with shape \[4\] doesn't match the broadcast shape \[3, 4\]"):
        f(torch.ones(4, device="tpu"), torch.ones(3, 4, device="tpu"))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a single memory location"):
        f(torch.ones(1, device="tpu").expand(3), torch.ones(3, device="tpu"))


def test_in_place_casting_and_autograd_rules(mode):
    i = torch.ones(3, dtype=torch.int64, device="tpu")
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        i.add_(0.5)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        i.div_(2)
    leaf = torch.ones(3, device="tpu", requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place operation"):
        leaf.mul_(2)
    w = torch.randn(3, requires_grad=True)
    tw = w.detach().to("tpu").requires_grad_()
    y, ty = w * 1, tw * 1
    y.mul_(w).add_(1, alpha=2)
    ty.mul_(tw).add_(1, alpha=2)
    y.sum().backward()
    ty.sum().backward()
    assert_close(tw.grad, w.grad)
    # Saved for backward and then written: autograd's version check fires.
    z = tw.exp()
    z.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matrix_products_equal_the_cpu(mode, dtype):
    g = torch.Generator().manual_seed(5)
    r = lambda *shape: torch.randn(*shape, generator=g).to(dtype)
    a, b, bias, row = r(5, 7), r(7, 3), r(5, 3), r(3)
    x, y, bbias = r(4, 5, 7), r(4, 7, 3), r(4, 5, 3)
    nan_bias = torch.full((5, 3), float("nan")).to(dtype)
    cases = {
        "mm": lambda t: torch.mm(t(a), t(b)),
        "bmm": lambda t: torch.bmm(t(x), t(y)),
        "addmm": lambda t: torch.addmm(t(bias), t(a), t(b)),
        "addmm row bias, alpha, beta": lambda t: torch.addmm(t(row), t(a), t(b), beta=0.5, alpha=-2),
        "addmm beta 0 ignores nan": lambda t: torch.addmm(t(nan_bias), t(a), t(b), beta=0),
        "baddbmm": lambda t: torch.baddbmm(t(bbias), t(x), t(y), alpha=3),
        "linear": lambda t: torch.nn.functional.linear(t(a), t(b.t()), t(row)),
        "matmul 3d @ 2d": lambda t: t(x) @ t(b),
    }
    to_tpu = lambda v: v.to("tpu")
    for name, f in cases.items():
        expected = f(lambda v: v)
        got = f(to_tpu)
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        _close(got, expected)


def test_matrix_product_errors_name_op_shapes_and_device():
    a = torch.ones(2, 3, device="tpu")
    with pytest.raises(RuntimeError, match=r"op `mm` on tpu:0: mat1 and mat2 shapes cannot be multiplied \(2x3 and 2x3\)"):
        torch.mm(a, a)
    with pytest.raises(RuntimeError, match="op `mm` on tpu:0: self must be a matrix, got 1-D tensor"):
        torch.mm(a[0], a)
    with pytest.raises(RuntimeError, match=r"op `bmm` on tpu:0: expected size for first two dimensions of batch2 tensor to be: \[1, 3\]"):
        torch.bmm(a[None], a[None])
    with pytest.raises(RuntimeError, match="op `mm` on tpu:0: expected both operands to have the same dtype, but got: Float != Double"):
        torch.mm(a, a.t().double())
    with pytest.raises(RuntimeError, match="op `addmm` on tpu:0: The expanded size|op `addmm` on tpu:0: The size of tensor"):
        torch.addmm(torch.ones(2, device="tpu"), a.t(), a)


def test_errors_are_pytorchs(mode):
    x = torch.ones(4, 6, device="tpu")
    with pytest.raises(RuntimeError, match=r"op `add` on tpu:0: The size of tensor a \(6\) must match the size of tensor b \(5\)"):
        x + torch.ones(4, 5, device="tpu")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!"):
        x * torch.ones(4, 6)
    with pytest.raises(RuntimeError, match="found at least two devices, tpu:0 and tpu:1"):
        x - torch.ones(4, 6, device="tpu:1")
    b = torch.ones(3, dtype=torch.bool, device="tpu")
    with pytest.raises(NotImplementedError, match="Subtraction, the `-` operator, with two bool tensors"):
        b - b
    with pytest.raises(RuntimeError, match="Boolean alpha only supported for Boolean results"):
        torch.add(x, x, alpha=True)


def test_autograd_runs_through_native_kernels(mode):
    a = torch.randn(4, 5, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    ta, tb = (a.detach().to("tpu").requires_grad_(), b.detach().to("tpu").requires_grad_())
    loss = ((a * b + a) / (b + 3) - 2 * a).sum()
    tpu_loss = ((ta * tb + ta) / (tb + 3) - 2 * ta).sum()
    loss.backward()
    tpu_loss.backward()
    assert_close(tpu_loss, loss)
    assert_close(ta.grad, a.grad)
    assert_close(tb.grad, b.grad)


def test_results_are_ordinary_tpu_tensors(mode):
    """Python kernels, views, in-place writes and copies all take a tensor a
    native kernel made."""
    x = torch.arange(12.0).reshape(3, 4)
    t = x.to("tpu") + 1
    t[1].mul_(10)
    t.t()[0].add_(0.5)
    x = x + 1
    x[1].mul_(10)
    x.t()[0].add_(0.5)
    assert_close(t, x)
    assert_close(t.exp().sum(0), x.exp().sum(0))
    assert t.untyped_storage().nbytes() == 48 and t.untyped_storage().device == torch.device("tpu", 0)
    del t
    torch.tpu.synchronize()


def test_no_python_kernel_is_registered_for_native_ops():
    for name in NATIVE:
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"), name
        assert REGISTERED.get(name) == "native", name
    # Their out= forms still come from the functional kernels.
    assert REGISTERED["add.out"] == "out" and REGISTERED["mul.out"] == "out"
