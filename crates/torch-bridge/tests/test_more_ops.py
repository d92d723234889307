"""Scans, rolls, scatters, histograms, distances, sampling and adaptive
pooling on tpu against PyTorch's CPU, including the edge cases (ties, NaN,
empty windows, negative indices) that OpInfo's samples seldom reach."""

import math

import pytest
import torch
from conftest import assert_close


def _grad(fn, x, device):
    t = x.detach().to(device).requires_grad_(True)
    out = fn(t)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device))
    return t.grad.cpu()


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin])
def test_cummax_cummin_ties_nan_and_grad(mode, op):
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, float("nan"), 5.0], [0.0, -1.0, 0.0, 0.0, -2.0, 7.0]])
    got, want = op(x.to("tpu"), 1), op(x, 1)
    assert_close(got.values, want.values, equal_nan=True)
    assert torch.equal(got.indices.cpu(), want.indices)  # the later tie, then the NaN
    ints = torch.tensor([4, 4, 1, 9, 9, 2])
    assert torch.equal(op(ints.to("tpu"), 0).indices.cpu(), op(ints, 0).indices)
    y = torch.randn(3, 5, dtype=torch.float64)
    assert torch.allclose(_grad(lambda t: op(t, 0), y, "tpu"), _grad(lambda t: op(t, 0), y, "cpu"))


def test_logcumsumexp_wide_range_and_grad(mode):
    x = torch.tensor([[-1e3, 0.0, 1e3, float("-inf"), 2.0], [5.0, 5.0, float("inf"), 1.0, -3.0]])
    assert_close(torch.logcumsumexp(x.to("tpu"), 1), torch.logcumsumexp(x, 1), equal_nan=True)
    y = torch.randn(4, 6, dtype=torch.float64) * 20
    assert torch.allclose(_grad(lambda t: torch.logcumsumexp(t, 1), y, "tpu"),
                          _grad(lambda t: torch.logcumsumexp(t, 1), y, "cpu"))


@pytest.mark.parametrize("shifts,dims", [(2, None), (-7, 0), ((1, -2), (0, 1)), ((5, 5), (1, 1))])
def test_roll(mode, shifts, dims):
    x = torch.arange(24.0).reshape(4, 6)
    assert_close(torch.roll(x.to("tpu"), shifts, dims), torch.roll(x, shifts, dims))
    assert torch.equal(_grad(lambda t: torch.roll(t, shifts, dims), x, "tpu"),
                       _grad(lambda t: torch.roll(t, shifts, dims), x, "cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_nextafter_is_exactly_one_step(dtype):
    x = torch.tensor([0.0, 1.0, -1.0, 2.0, float("inf"), 1e-30, float("nan")], dtype=dtype)
    y = torch.tensor([1.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype=dtype)
    assert torch.equal(torch.nextafter(x.to("tpu"), y.to("tpu")).cpu().nan_to_num(7), torch.nextafter(x, y).nan_to_num(7))


def test_masked_scatter_and_put(mode):
    x = torch.zeros(3, 4)
    mask = torch.tensor([True, False, True, True])
    src = torch.arange(1.0, 13.0)
    assert_close(x.to("tpu").masked_scatter(mask.to("tpu"), src.to("tpu")), x.masked_scatter(mask, src))
    index = torch.tensor([0, -1, 5, 5])
    values = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for accumulate in (False, True):
        got = x.to("tpu").put_(index.to("tpu"), values.to("tpu"), accumulate=accumulate)
        want = x.clone().put_(index, values, accumulate=accumulate)
        if accumulate:
            assert_close(got, want)
        else:  # a repeated index takes one of its writes
            assert got.cpu()[0, 0] == 1 and got.cpu()[2, 3] == 2 and got.cpu()[1, 1] in (3, 4)


def test_histc(mode):
    x = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.5, 3.0, -1.0, 7.0])
    assert_close(torch.histc(x.to("tpu"), bins=4, min=0, max=3), torch.histc(x, bins=4, min=0, max=3))
    assert_close(torch.histc(x.to("tpu"), bins=5), torch.histc(x, bins=5))


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, float("inf")])
def test_cdist_pdist_values_and_grads(p):
    a = torch.randn(2, 4, 3, dtype=torch.float64)
    b = torch.randn(2, 5, 3, dtype=torch.float64)
    assert_close(torch.cdist(a.to("tpu"), b.to("tpu"), p=p), torch.cdist(a, b, p=p), atol=1e-9, rtol=1e-9)
    if p != 0.0:
        assert torch.allclose(_grad(lambda t: torch.cdist(t, b.to(t.device), p=p), a, "tpu"),
                              _grad(lambda t: torch.cdist(t, b.to(t.device), p=p), a, "cpu"))
        r = torch.randn(5, 3, dtype=torch.float64)
        assert torch.allclose(_grad(lambda t: torch.pdist(t, p=p), r, "tpu"), _grad(lambda t: torch.pdist(t, p=p), r, "cpu"))


def test_multinomial_follows_the_weights():
    w = torch.tensor([[0.0, 1.0, 3.0, 0.0], [2.0, 0.0, 0.0, 2.0]])
    draws = torch.multinomial(w.to("tpu"), 4000, replacement=True).cpu()
    assert draws.shape == (2, 4000)
    share = (draws[0] == 2).double().mean().item()
    assert abs(share - 0.75) < 0.04 and set(draws[0].tolist()) <= {1, 2} and set(draws[1].tolist()) <= {0, 3}
    rows = torch.multinomial(w.to("tpu"), 2).cpu()
    assert sorted(rows[0].tolist()) == [1, 2] and sorted(rows[1].tolist()) == [0, 3]
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(w.to("tpu"), 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp_is_exact_and_angle(mode, dtype):
    # Normal numbers only: the device flushes subnormals to zero.
    x = torch.tensor([0.0, 1.0, -3.5, 1.5e-38, 6.0e37, float("inf"), float("nan"), -0.25, 2.0**-100, 3.0e38])
    x = torch.cat([x, torch.randn(64) * 10.0 ** torch.randint(-30, 30, (64,))]).to(dtype)
    m, e = torch.frexp(x.to("tpu"))
    want_m, want_e = torch.frexp(x)
    assert torch.equal(m.cpu().nan_to_num(9), want_m.nan_to_num(9))
    finite = torch.isfinite(x)
    assert torch.equal(e.cpu()[finite], want_e[finite])
    got = torch.angle(x.to("tpu")).cpu()
    assert torch.equal(got.nan_to_num(9), torch.angle(x).nan_to_num(9))


@pytest.mark.parametrize("size,out", [((2, 3, 7), (3,)), ((1, 2, 5, 7), (3, 4)), ((1, 1, 4, 5, 6), (2, 3, 4))])
def test_adaptive_pooling_values_indices_and_grads(size, out):
    x = torch.randn(size, dtype=torch.float64)
    d = len(out)
    avg = getattr(torch.nn.functional, f"adaptive_avg_pool{d}d")
    mx = getattr(torch.nn.functional, f"adaptive_max_pool{d}d")
    assert_close(avg(x.to("tpu"), out), avg(x, out), atol=1e-12, rtol=1e-12)
    got, got_i = mx(x.to("tpu"), out, return_indices=True)
    want, want_i = mx(x, out, return_indices=True)
    assert_close(got, want)
    assert torch.equal(got_i.cpu(), want_i)
    for f in (avg, mx):
        assert torch.allclose(_grad(lambda t: f(t, out), x, "tpu"), _grad(lambda t: f(t, out), x, "cpu"))


def test_flash_attention_for_cpu_entry_point():
    q, k, v = (torch.randn(2, 3, 4, 8) for _ in range(3))
    got = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.to("tpu"), k.to("tpu"), v.to("tpu"), is_causal=True)
    want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=True)
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])
    assert math.isfinite(got[1].cpu().sum().item())


def _spd(*batch, n=4):
    m = torch.randn(*batch, n, n, dtype=torch.float64)
    return m @ m.mT + n * torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_values_grads_and_errors(upper):
    a = _spd(2, 3)
    assert_close(torch.linalg.cholesky(a.to("tpu"), upper=upper), torch.linalg.cholesky(a, upper=upper), atol=1e-10, rtol=1e-10)
    assert torch.allclose(_grad(lambda t: torch.linalg.cholesky(t, upper=upper), a, "tpu"),
                          _grad(lambda t: torch.linalg.cholesky(t, upper=upper), a, "cpu"))
    bad = a.clone()
    bad[1, 2, 2, 2] = -50.0  # the leading minor of order 3 of matrix (1, 2) fails
    _, info = torch.linalg.cholesky_ex(bad.to("tpu"))
    assert torch.equal(info.cpu(), torch.linalg.cholesky_ex(bad)[1])
    with pytest.raises(torch.linalg.LinAlgError, match="order 3"):
        torch.linalg.cholesky(bad.to("tpu"))


@pytest.mark.parametrize("upper,left,unit", [(False, True, False), (True, False, False), (True, True, True)])
def test_solve_triangular_broadcasts_and_differentiates(upper, left, unit):
    a = torch.randn(2, 1, 4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
    b = torch.randn(3, 4, 2, dtype=torch.float64) if left else torch.randn(3, 2, 4, dtype=torch.float64)
    f = lambda t, bb: torch.linalg.solve_triangular(t, bb, upper=upper, left=left, unitriangular=unit)  # noqa: E731
    assert_close(f(a.to("tpu"), b.to("tpu")), f(a, b), atol=1e-10, rtol=1e-10)
    assert torch.allclose(_grad(lambda t: f(t, b.to(t.device)), a, "tpu"), _grad(lambda t: f(t, b.to(t.device)), a, "cpu"))
    l = torch.linalg.cholesky(_spd(n=3))
    rhs = torch.randn(3, 2, dtype=torch.float64)
    assert_close(torch.cholesky_solve(rhs.to("tpu"), l.to("tpu")), torch.cholesky_solve(rhs, l), atol=1e-10, rtol=1e-10)
    assert_close(torch.cholesky_inverse(l.to("tpu")), torch.cholesky_inverse(l), atol=1e-10, rtol=1e-10)


def test_unique_and_nonzero_static(mode):
    x = torch.tensor([[3, 1, 3], [2, 1, 7]])
    got = torch.unique(x.to("tpu"), return_inverse=True, return_counts=True)
    for g, w in zip(got, torch.unique(x, return_inverse=True, return_counts=True)):
        assert torch.equal(g.cpu(), w)
    y = torch.tensor([1, 1, 2, 2, 2, 1, 5])
    for g, w in zip(torch.unique_consecutive(y.to("tpu"), return_inverse=True, return_counts=True),
                    torch.unique_consecutive(y, return_inverse=True, return_counts=True)):
        assert torch.equal(g.cpu(), w)
    m = torch.tensor([[0, 1], [1, 1]])
    for size in (1, 3, 5):
        assert torch.equal(torch.nonzero_static(m.to("tpu"), size=size).cpu(), torch.nonzero_static(m, size=size))


def test_histogram_with_edges_weights_and_density():
    x = torch.tensor([0.0, 0.5, 1.0, 1.0, 2.5, 3.0, -1.0, 7.0])
    w = torch.arange(8.0)
    edges = torch.tensor([0.0, 1.0, 2.5, 3.0])
    for kw in ({}, {"weight": w}, {"density": True}):
        kwt = {k: v.to("tpu") if torch.is_tensor(v) else v for k, v in kw.items()}
        for bins, bins_t in ((4, 4), (edges, edges.to("tpu"))):
            got = torch.histogram(x.to("tpu"), bins_t, **kwt)
            want = torch.histogram(x, bins, **kw)
            assert_close(got.hist, want.hist)
            assert_close(got.bin_edges, want.bin_edges)


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce_values_and_grads(reduce, initial):
    data = torch.tensor([[1.0, 0.0, 3.0, 3.0, 0.0, 0.0, 5.0], [2.0, -1.0, 4.0, 0.5, 0.0, 6.0, 1.5]], dtype=torch.float64).T
    lengths = torch.tensor([0, 2, 2, 3])
    f = lambda t, lens: torch.segment_reduce(t, reduce, lengths=lens, axis=0, initial=initial)  # noqa: E731
    assert_close(f(data.to("tpu"), lengths.to("tpu")), f(data, lengths), equal_nan=True)
    if reduce != "prod" or initial is None:
        assert torch.allclose(_grad(lambda t: f(t, lengths.to(t.device)), data, "tpu"),
                              _grad(lambda t: f(t, lengths.to(t.device)), data, "cpu"), equal_nan=True)


def test_mode_picks_the_smallest_most_frequent_and_its_last_index(mode):
    x = torch.tensor([[3, 1, 3, 1, 2], [5, 5, 4, 4, 0], [7, 7, 7, 1, 1]])
    for dim, keepdim in ((1, False), (0, True)):
        got, want = torch.mode(x.to("tpu"), dim, keepdim), torch.mode(x, dim, keepdim)
        assert torch.equal(got.values.cpu(), want.values) and torch.equal(got.indices.cpu(), want.indices)


def test_hurwitz_zeta_and_its_domain_edges():
    x = torch.tensor([2.0, 2.0, 2.0, 1.0, 0.5, 3.0, 2.5, 4.0, 7.0, 1.5, 40.0])
    q = torch.tensor([1.0, 0.0, -1.0, 1.0, 1.0, -1.5, -1.5, 0.5, 30.0, 0.001, 0.01])
    assert_close(torch.special.zeta(x.to("tpu"), q.to("tpu")), torch.special.zeta(x, q), equal_nan=True)


@pytest.mark.parametrize("mode_", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag(mode_, include_last_offset):
    weight = torch.randn(10, 3)
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0])
    offsets = torch.tensor([0, 4, 4, 6, 9]) if include_last_offset else torch.tensor([0, 4, 4, 6])
    kw = {"mode": mode_, "include_last_offset": include_last_offset, "padding_idx": 2}
    got = torch.nn.functional.embedding_bag(indices.to("tpu"), weight.to("tpu"), offsets.to("tpu"), **kw)
    assert_close(got, torch.nn.functional.embedding_bag(indices, weight, offsets, **kw))
    if mode_ == "sum":
        psw = torch.rand(9)
        got = torch.nn.functional.embedding_bag(indices.to("tpu"), weight.to("tpu"), offsets.to("tpu"),
                                                per_sample_weights=psw.to("tpu"), mode="sum")
        assert_close(got, torch.nn.functional.embedding_bag(indices, weight, offsets, per_sample_weights=psw, mode="sum"))


def test_multinomial_rejects_bad_weights_under_debug():
    with torch.tpu.set_eager_mode("debug"):
        for w in (torch.tensor([0.0, 0.0]), torch.tensor([1.0, -1.0]), torch.tensor([1.0, float("nan")])):
            with pytest.raises(RuntimeError, match="multinomial"):
                torch.multinomial(w.to("tpu"), 1, replacement=True)
        with pytest.raises(RuntimeError, match="fewer categories"):
            torch.multinomial(torch.tensor([1.0, 0.0, 2.0]).to("tpu"), 3)


@pytest.mark.parametrize("fn", [
    lambda t: torch.nn.functional.hardshrink(t, 0.5),
    lambda t: torch.nn.functional.softshrink(t, 0.5),
    lambda t: torch.logit(t.sigmoid() * 1.2 - 0.1),
    lambda t: torch.logit(t.sigmoid(), eps=0.2),
    lambda t: torch.nn.functional.pad(t, (3, -1, 2, 0), mode="replicate"),
    lambda t: torch.nn.functional.pad(t, (2, 1, 1, 2), mode="reflect"),
], ids=["hardshrink", "softshrink", "logit", "logit_eps", "replicate", "reflect"])
def test_backward_kernels_match_the_cpu(mode, fn):
    x = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    got, want = _grad(fn, x, "tpu"), _grad(fn, x, "cpu")
    assert torch.allclose(got, want, equal_nan=True)


@pytest.mark.parametrize("kwargs,dims", [
    ({"size": 11, "mode": "nearest"}, 1), ({"scale_factor": 0.6, "mode": "nearest-exact"}, 1),
    ({"size": 9, "mode": "linear", "align_corners": True}, 1),
    ({"size": (7, 3), "mode": "bilinear"}, 2), ({"scale_factor": 1.7, "mode": "bicubic", "align_corners": False}, 2),
    ({"size": (3, 5), "mode": "nearest"}, 2), ({"size": (4, 3, 6), "mode": "trilinear"}, 3),
    ({"scale_factor": (0.5, 2.0, 1.5), "mode": "nearest"}, 3),
], ids=["nearest1d", "nearest_exact", "linear", "bilinear", "bicubic", "nearest2d", "trilinear", "nearest3d"])
def test_interpolation_gradients_match_the_cpu(mode, kwargs, dims):
    x = torch.randn((2, 3) + (5, 4, 6)[:dims], dtype=torch.float64)
    fn = lambda t: torch.nn.functional.interpolate(t, **kwargs)  # noqa: E731
    assert torch.allclose(_grad(fn, x, "tpu"), _grad(fn, x, "cpu"))


@pytest.mark.parametrize("op", [torch.igamma, torch.igammac])
def test_incomplete_gamma_regimes_edges_and_grad(op):
    # Both sides of x = a + 1, large shapes near their mean, and the edges.
    a = torch.tensor([0.3, 2.0, 2.0, 7.5, 500.0, 500.0, 0.0, 0.0, 1.0, math.inf, -1.0, float("nan"), 3.0])
    x = torch.tensor([0.1, 2.9, 3.1, 30.0, 480.0, 530.0, 1.0, 0.0, 0.0, 5.0, 1.0, 1.0, math.inf])
    assert_close(op(a.to("tpu"), x.to("tpu")), op(a, x), atol=1e-6, rtol=1e-4, equal_nan=True)
    a64, x64 = torch.rand(200, dtype=torch.float64) * 40 + 0.01, torch.rand(200, dtype=torch.float64) * 50
    assert_close(op(a64.to("tpu"), x64.to("tpu")), op(a64, x64), atol=1e-12, rtol=1e-8)
    # PyTorch differentiates x only.
    grad = _grad(lambda t: op(a64[:5].to(t.device), t), x64[:5] + 0.5, "tpu")
    assert torch.allclose(grad, _grad(lambda t: op(a64[:5], t), x64[:5] + 0.5, "cpu"))


@pytest.mark.parametrize("kwargs", [
    dict(bins=[3, 4]),
    dict(bins=[2, 5], range=[-1.0, 1.0, 0.0, 2.0], density=True),   # points outside are dropped
    dict(bins=[4, 2], weight=True),
])
def test_histogramdd(kwargs):
    x = torch.randn(50, 2)
    x[0] = torch.tensor([1.0, 2.0])  # lands on edges of the given range
    if kwargs.get("weight"):
        kwargs = dict(kwargs, weight=torch.rand(50))
    got = torch.histogramdd(x.to("tpu"), **{k: v.to("tpu") if torch.is_tensor(v) else v for k, v in kwargs.items()})
    want = torch.histogramdd(x, **kwargs)
    assert_close(got.hist, want.hist, atol=1e-5, rtol=1e-5)
    for g, w in zip(got.bin_edges, want.bin_edges):
        assert_close(g, w)
    # Given edges, a single value in a dim, and no points at all.
    edges = [torch.tensor([-2.0, 0.0, 0.5, 3.0]), torch.tensor([-1.0, 1.0])]
    assert_close(torch.histogramdd(x.to("tpu"), bins=[e.to("tpu") for e in edges]).hist, torch.histogramdd(x, bins=edges).hist)
    flat = torch.tensor([[1.0, 2.0], [1.0, 3.0]])
    assert_close(torch.histogramdd(flat.to("tpu"), bins=[2, 2]).hist, torch.histogramdd(flat, bins=[2, 2]).hist)
    assert_close(torch.histogramdd(torch.empty(0, 2, device="tpu"), bins=[2, 3]).bin_edges[1],
                 torch.histogramdd(torch.empty(0, 2), bins=[2, 3]).bin_edges[1])


NAN_ROWS = torch.tensor([[1.5, float("nan"), 0.5, -2.0], [2.0, 3.0, -1.0, 0.0]])

PROPAGATES_NAN = {
    "max": lambda x: x.max(),
    "amax": lambda x: x.amax(1),
    "min over a dim": lambda x: x.min(1).values,
    "amin": lambda x: x.amin(),
    "aminmax": lambda x: torch.stack(torch.aminmax(x, dim=1)),
    "max_pool1d": lambda x: torch.nn.functional.max_pool1d(x.unsqueeze(0), 2),
    "max_pool2d": lambda x: torch.nn.functional.max_pool2d(x.reshape(1, 1, 2, 4), 2),
    "softmax": lambda x: x.softmax(1),
    "logsumexp": lambda x: x.logsumexp(1),
}


@pytest.mark.parametrize("case", PROPAGATES_NAN)
def test_reductions_propagate_nan_like_the_cpu(mode, case):
    fn = PROPAGATES_NAN[case]
    assert_close(fn(NAN_ROWS.to("tpu")), fn(NAN_ROWS), equal_nan=True)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.clamp(min=0.5),
        lambda x: x.clamp(0.5, 2.5),
        lambda x: x.clamp(-3, 5),
        lambda x: x.half().clamp(max=0.5),
        lambda x: x.floor(),
        lambda x: x.ceil(),
        lambda x: x.round(),
        lambda x: x.int().trunc(),
    ],
)
def test_integer_rounding_and_clamping_keep_pytorchs_dtype(mode, fn):
    x = torch.tensor([[7, -7, 3], [-3, 0, 100]])
    assert_close(fn(x.to("tpu")), fn(x))


@pytest.mark.parametrize("fn", [torch.sign, torch.sgn])
def test_sign_of_nan_and_negative_zero_is_pytorchs(mode, fn):
    x = torch.tensor([1.5, float("nan"), -0.0, 0.0, -2.0, float("inf")])
    got = fn(x.to("tpu"))
    assert_close(got, fn(x))
    assert torch.equal(got.cpu().signbit(), fn(x).signbit())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ord", [2, 1, 3, float("inf"), 0])
def test_half_precision_norms_sum_in_float32(mode, dtype, ord):
    x = torch.tensor([300.0, 400.0, -100.0], dtype=dtype)  # 300**2 overflows float16
    assert_close(torch.linalg.vector_norm(x.to("tpu"), ord), torch.linalg.vector_norm(x, ord))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool])
def test_bitwise_not_of_every_integer_dtype(mode, dtype):
    x = torch.tensor([0, 1, 5, 127], dtype=dtype)
    assert_close(~x.to("tpu"), ~x)


INTEGER_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def _integer_pairs(dtype):
    """Values from the dtype's edges against small divisors (not min / -1,
    which traps on the CPU)."""
    info = torch.iinfo(dtype)
    values = torch.tensor([info.min, info.min + 1, -7, -1, 0, 1, 7, 99, 2**53 + 1, info.max - 1, info.max])
    values = values.clamp(info.min, info.max).to(dtype).unique()
    divisors = torch.tensor([-3, -2, -1, 1, 2, 3, 7]).clamp(info.min, info.max).to(dtype).unique()
    divisors = divisors[divisors != 0]
    x, y = values.repeat_interleave(len(divisors)), divisors.repeat(len(values))
    keep = ~((x == info.min) & (y == -1)) if info.min < 0 else torch.ones_like(x, dtype=torch.bool)
    return x[keep], y[keep]


@pytest.mark.parametrize("dtype", INTEGER_DTYPES)
def test_integer_division_is_exact_at_the_dtypes_edges(mode, dtype):
    """Integer floor and trunc division do not go through floats (which are
    not exact past 2**53)."""
    x, y = _integer_pairs(dtype)
    for rounding_mode in ("floor", "trunc"):
        assert_close(torch.div(x.to("tpu"), y.to("tpu"), rounding_mode=rounding_mode), torch.div(x, y, rounding_mode=rounding_mode))
    assert_close(x.to("tpu") // 3, x // 3)
    assert_close(torch.fmod(x.to("tpu"), y.to("tpu")), torch.fmod(x, y))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_float_floor_trunc_division_and_fmod_equal_the_cpu_bit_for_bit(mode, dtype):
    """Floor division is computed from the exact remainder and trunc
    division truncates the correctly rounded quotient, so no random pair
    lands one off; fmod is exact in every format. Half types compute in
    float32, and their oracle is the CPU on float32 operands: the CPU's own
    vectorized half kernels round intermediates and are off by one on 5-13%
    of these pairs. Operands cover quotients near integers, large ones,
    and tensor and number divisors."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * 40).to(dtype)
    y = (torch.randn(4096, generator=g) * torch.rand(4096, generator=g).pow(3) * 3).to(dtype)
    y = torch.where(y == 0, torch.ones_like(y), y)
    near = (torch.randint(-60, 60, (1024,), generator=g) * y[:1024].double()).to(dtype)
    x = torch.cat([x, near])
    y = torch.cat([y, y[:1024]])
    xt, yt = x.to("tpu"), y.to("tpu")
    wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype

    def cpu_div(a, b, rounding_mode):
        b = b.to(wide) if isinstance(b, torch.Tensor) else b
        return torch.div(a.to(wide), b, rounding_mode=rounding_mode).to(dtype)

    for rounding_mode in ("floor", "trunc"):
        expected = cpu_div(x, y, rounding_mode)
        assert torch.equal(torch.div(xt, yt, rounding_mode=rounding_mode).cpu(), expected), rounding_mode
        assert torch.equal(torch.div(xt, -0.375, rounding_mode=rounding_mode).cpu(), cpu_div(x, -0.375, rounding_mode))
    assert torch.equal((xt // yt).cpu(), cpu_div(x, y, "floor"))
    assert torch.equal(torch.fmod(xt, yt).cpu(), torch.fmod(x, y))
    assert torch.equal(torch.fmod(xt, 0.7).cpu(), torch.fmod(x, 0.7))
    big = torch.tensor([1e10, -3e9, 7.5e7] if dtype != torch.float16 else [6e4, -3e4, 7.5e3], dtype=torch.float32).to(dtype)
    assert torch.equal(torch.fmod(big.to("tpu"), 3.3).cpu(), torch.fmod(big, 3.3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_true_division_by_a_number_or_a_broadcast_row_is_ieee_division(mode, dtype):
    """XLA would multiply by the divisor's reciprocal (off by an ulp for a
    fifth to a half of quotients); the quotient must be the CPU's."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g, dtype=dtype) * 10
    row = torch.rand(256, generator=g, dtype=dtype) + 0.1
    xt = x.to("tpu")
    for s in (0.3, 3.0, 7.0, -10.0):
        assert torch.equal((xt / s).cpu(), x / s), s
        assert torch.equal(xt.clone().div_(s).cpu(), x.clone().div_(s)), s
    assert torch.equal((xt / row.to("tpu")).cpu(), x / row)
    assert torch.equal((xt / torch.tensor(0.3, dtype=dtype)).cpu(), x / torch.tensor(0.3, dtype=dtype))


@pytest.mark.parametrize("dtype", INTEGER_DTYPES)
def test_shifts_wrap_fill_and_saturate_like_the_cpu(mode, dtype):
    x, _ = _integer_pairs(dtype)
    bits = torch.iinfo(dtype).bits
    for count in [-1, 0, 1, bits // 2, bits - 1, bits, bits + 3]:
        assert_close(x.to("tpu") << count, x << count)
        assert_close(x.to("tpu") >> count, x >> count)
    counts = torch.arange(0 if dtype == torch.uint8 else -1, bits + 2).to(dtype)
    xs = x.repeat(len(counts))[: len(counts)]
    assert_close(xs.to("tpu") << counts.to("tpu"), xs << counts)
    assert_close(torch.bitwise_right_shift(xs.to("tpu"), counts.to("tpu")), torch.bitwise_right_shift(xs, counts))


def test_integer_division_by_a_power_computed_on_the_device(mode):
    """XLA rewrites a / pow(b, c) as a * pow(b, -c), which is 0 for integers;
    inside one fused program the division must not be rewritten."""
    x = torch.tensor([2**62 + 5, -7, 99, 2**53 + 1, 100, 100])
    n = torch.tensor([1, 1, 2, 2, 3, 0])
    xt, nt = x.to("tpu"), n.to("tpu")
    for rounding_mode in ("floor", "trunc"):
        assert_close(torch.div(xt, 2**nt, rounding_mode=rounding_mode), torch.div(x, 2**n, rounding_mode=rounding_mode))
    assert_close(xt // (2**nt), x // (2**n))


@pytest.mark.parametrize(
    "weights", [None, torch.float32, torch.float64, torch.int64, torch.float16], ids=["counts", "f32", "f64", "i64", "f16"]
)
def test_bincount_matches_cpu(mode, weights):
    """Counts (or weight sums, in the CPU's result dtype) up to the largest
    value or ``minlength``; bad inputs raise the CPU's exception class."""
    x = torch.randint(0, 7, (20,))
    w = None if weights is None else (torch.rand(20) * 4).to(weights)
    for minlength in (0, 12):
        got = torch.bincount(x.to("tpu"), None if w is None else w.to("tpu"), minlength=minlength)
        assert_close(got, torch.bincount(x, w, minlength=minlength))
    empty = torch.tensor([], dtype=torch.int64)
    assert_close(torch.bincount(empty.to("tpu"), minlength=3), torch.bincount(empty, minlength=3))
    for bad in (torch.tensor([-1, 2]), torch.tensor([[1]]), torch.tensor([1.5])):
        with pytest.raises(Exception) as cpu_error:
            torch.bincount(bad)
        with pytest.raises(cpu_error.type):
            torch.bincount(bad.to("tpu"))


@pytest.mark.parametrize("dtypes", [(torch.int64, torch.int64), (torch.int32, torch.int64), (torch.int16, torch.int16)])
def test_gcd_and_lcm_match_cpu(mode, dtypes):
    a = torch.randint(-1000, 1000, (40,), dtype=dtypes[0])
    b = torch.randint(-1000, 1000, (40,), dtype=dtypes[1])
    a[:4], b[:4] = torch.tensor([0, 0, 7, 89]), torch.tensor([0, 5, 0, 144])
    for op in (torch.gcd, torch.lcm):
        assert_close(op(a.to("tpu"), b.to("tpu")), op(a, b))
    big = torch.tensor([2**62 - 57, 2**61 * 3], dtype=torch.int64)
    assert_close(torch.gcd(big.to("tpu"), big.flip(0).to("tpu")), torch.gcd(big, big.flip(0)))
    with pytest.raises(NotImplementedError):
        torch.gcd(torch.ones(2, device="tpu"), torch.ones(2, device="tpu"))


def test_unique_along_a_dim_matches_cpu(mode):
    x = torch.randint(0, 3, (6, 4))
    x[3] = x[1]
    for dim in (0, 1, -1):
        for kwargs in ({}, dict(return_inverse=True, return_counts=True)):
            got, want = torch.unique(x.to("tpu"), dim=dim, **kwargs), torch.unique(x, dim=dim, **kwargs)
            for g, w in zip(got if kwargs else [got], want if kwargs else [want]):
                assert_close(g, w)
        got = torch.unique_consecutive(x.to("tpu"), dim=dim, return_inverse=True, return_counts=True)
        for g, w in zip(got, torch.unique_consecutive(x, dim=dim, return_inverse=True, return_counts=True)):
            assert_close(g, w)


def test_isin_matches_the_cpu_on_shapes_dtypes_nan_and_empty_sets(mode):
    g = torch.Generator().manual_seed(0)
    cases = [
        (torch.randint(0, 10, (3, 4), generator=g), torch.tensor([1, 5, 7])),
        (torch.randint(0, 10, (7,), generator=g), torch.tensor([[2, 3], [4, 9]])),
        (torch.tensor(5), torch.tensor([5, 6])),
        (torch.tensor([1.5, float("nan"), 2.0]), torch.tensor([float("nan"), 2.0])),
        (torch.arange(6).view(2, 3), torch.tensor([], dtype=torch.long)),
        (torch.arange(6), torch.tensor([1.0, 4.0])),
        # Enough pairs that PyTorch's sorting decomposition runs instead.
        (torch.randint(0, 5000, (3000,), generator=g), torch.randint(0, 5000, (2000,), generator=g)),
    ]
    for elements, tests in cases:
        for invert in (False, True):
            want = torch.isin(elements, tests, invert=invert)
            got = torch.isin(elements.to("tpu"), tests.to("tpu"), invert=invert)
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), (elements, tests, invert)
        assert torch.equal(torch.isin(elements.to("tpu"), 2).cpu(), torch.isin(elements, 2))
    with pytest.raises(NotImplementedError, match="isin.*Bool"):
        torch.isin(torch.tensor([True]).to("tpu"), torch.tensor([True]).to("tpu"))
