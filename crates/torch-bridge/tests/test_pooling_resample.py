"""3-D average pooling, fractional max pooling, anti-aliased resizing, 3-D
grid sampling and randperm on tpu against PyTorch's CPU: every padding and
rounding rule, and gradients in float64."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close


def _value_and_grad(fn, x, device):
    t = x.detach().to(device).requires_grad_(True)
    out = fn(t)
    first = out[0] if isinstance(out, tuple) else out
    cotangent = torch.linspace(-1, 1, first.numel(), dtype=x.dtype).reshape(first.shape).to(device)
    (grad,) = torch.autograd.grad(first, t, cotangent)
    return out, grad


def _check(fn, x, atol=1e-10):
    got, got_grad = _value_and_grad(fn, x, "tpu")
    want, want_grad = _value_and_grad(fn, x, "cpu")
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        if w.dtype.is_floating_point:
            assert_close(g, w, atol=atol, rtol=1e-8, equal_nan=True)
        else:
            assert torch.equal(g.cpu(), w)
    assert_close(got_grad, want_grad, atol=atol, rtol=1e-8)


@pytest.mark.parametrize("shape,kernel,stride,padding,ceil_mode,count_include_pad,divisor", [
    ((2, 3, 7, 8, 9), 3, 2, 1, False, True, None),
    ((3, 7, 8, 9), (2, 3, 2), (1, 2, 3), (1, 1, 0), True, False, None),  # unbatched, ceil
    ((1, 2, 5, 5, 5), 2, None, 0, True, True, 3),                          # divisor_override
    ((1, 1, 6, 7, 5), (3, 2, 4), (2, 2, 1), (1, 1, 2), True, False, None),
])
def test_avg_pool3d(shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor):
    x = torch.randn(shape, dtype=torch.float64)
    _check(lambda t: F.avg_pool3d(t, kernel, stride, padding, ceil_mode, count_include_pad, divisor), x)


@pytest.mark.parametrize("dims,shape,kernel,output_size", [
    (2, (2, 3, 9, 9), 3, (4, 5)),
    (2, (3, 9, 8), (2, 3), (5, 4)),        # unbatched
    (2, (1, 1, 4, 4), 2, (3, 3)),          # overlapping windows
    (3, (2, 2, 7, 8, 9), (2, 3, 2), (3, 4, 5)),
    (3, (2, 7, 8, 9), 2, (4, 4, 4)),
])
def test_fractional_max_pool_with_given_samples(dims, shape, kernel, output_size):
    """With the random samples given, the windows are PyTorch's exactly:
    values, indices and the gradient routed through them."""
    x = torch.randn(shape, dtype=torch.float64)
    batch = shape[0] if len(shape) == dims + 2 else 1
    samples = torch.rand(batch, shape[-dims - 1], dims, dtype=torch.float64)
    pool = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d

    def fn(t):
        return pool(t, kernel, output_size=output_size, return_indices=True, _random_samples=samples.to(t.device))

    _check(fn, x)


def test_fractional_max_pool_nan_and_random_samples():
    x = torch.randn(1, 2, 9, 9)
    x[0, 0, 4, 4] = float("nan")
    samples = torch.rand(1, 2, 2)
    got = F.fractional_max_pool2d(x.to("tpu"), 3, output_size=3, return_indices=True, _random_samples=samples.to("tpu"))
    want = F.fractional_max_pool2d(x, 3, output_size=3, return_indices=True, _random_samples=samples)
    assert_close(got[0], want[0], equal_nan=True)
    assert torch.equal(got[1].cpu(), want[1])
    # Drawn on the device: each output is the maximum of a 3x3 window.
    out, idx = F.fractional_max_pool2d(x.to("tpu"), 3, output_ratio=(0.5, 0.5), return_indices=True)
    assert out.shape == (1, 2, 4, 4)
    flat = x.reshape(1, 2, -1)
    assert_close(out, flat.gather(2, idx.cpu().reshape(1, 2, -1)).reshape(out.shape), equal_nan=True)


def test_fractional_max_pool_rejects_oversized_windows():
    with pytest.raises(RuntimeError, match="fractional_max_pool2d"):
        F.fractional_max_pool2d(torch.randn(1, 1, 4, 4, device="tpu"), 3, output_size=3,
                                _random_samples=torch.rand(1, 1, 2, device="tpu"))


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("shape,kwargs", [
    ((2, 3, 9, 11), dict(size=(4, 5))),                     # shrinking: the filter widens
    ((1, 2, 7, 6), dict(size=(14, 3))),                     # growing one dim, shrinking the other
    ((1, 1, 10, 10), dict(scale_factor=0.3)),
    ((2, 2, 5, 8), dict(size=(3, 20), align_corners=True)),
    ((1, 1, 4, 4), dict(scale_factor=(2.5, 0.7))),
])
def test_antialiased_interpolate(mode, shape, kwargs):
    x = torch.randn(shape, dtype=torch.float64)
    _check(lambda t: F.interpolate(t, mode=mode, antialias=True, **kwargs), x)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_and_grads(dims, mode, padding_mode, align_corners):
    """Values and both gradients; points inside, outside and far outside
    (several reflections)."""
    x = torch.randn((2, 3) + (4, 5, 6)[:dims], dtype=torch.float64)
    grid = torch.rand((2,) + (3, 4, 5)[:dims] + (dims,), dtype=torch.float64) * 2.6 - 1.3
    grid[0, 0, 0] = 3.7

    def run(device):
        xs = x.to(device).requires_grad_(True)
        gs = grid.to(device).requires_grad_(True)
        out = F.grid_sample(xs, gs, mode=mode, padding_mode=padding_mode, align_corners=align_corners)
        cotangent = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(device)
        return (out, *torch.autograd.grad(out, (xs, gs), cotangent))

    for got, want in zip(run("tpu"), run("cpu")):
        assert_close(got, want, atol=1e-10, rtol=1e-8)


def test_randperm_is_a_permutation():
    for n in (0, 1, 7, 1000):
        p = torch.randperm(n, device="tpu")
        assert p.device.type == "tpu" and p.dtype == torch.int64
        assert torch.equal(p.cpu().sort().values, torch.arange(n))
    draws = torch.stack([torch.randperm(5, device="tpu").cpu() for _ in range(200)])
    # Each value lands in each position about 40 times of 200.
    counts = torch.stack([(draws == v).sum(0) for v in range(5)])
    assert counts.min() > 15 and counts.max() < 70


def test_cpu_index_tensors_index_tpu_tensors():
    x = torch.randn(4, 5)
    mask = torch.rand(4, 5) > 0.5
    values = torch.randn(int(mask.sum()))
    assert_close(x.to("tpu").index_put((mask,), values.to("tpu")), x.index_put((mask,), values))
    rows = torch.tensor([0, 3, 3])
    assert_close(x.to("tpu").index_put((rows,), torch.ones(3, 5, device="tpu"), accumulate=True),
                 x.index_put((rows,), torch.ones(3, 5), accumulate=True))
