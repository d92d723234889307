"""QR, the symmetric eigendecomposition, the SVD, least squares, LU and
what is built on it (solves, inverses, determinants), and the special
functions, on tpu against PyTorch's CPU: the edge cases OpInfo's samples
seldom reach (wide and tall shapes, batches, singular matrices, the
errors PyTorch raises, the functions' far tails)."""

import math

import pytest
import torch
from conftest import assert_close


def _grad(fn, x, device):
    t = x.detach().to(device).requires_grad_(True)
    out = fn(t)
    outs = out if isinstance(out, tuple) else (out,)
    torch.autograd.backward(outs, [torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape).to(device) for o in outs])
    return t.grad.cpu()


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (4, 1), (0, 3)])
@pytest.mark.parametrize("qr_mode", ["reduced", "complete", "r"])
def test_qr_matches_lapack_signs(mode, shape, qr_mode):
    a = torch.randn(shape)
    q, r = torch.linalg.qr(a.to("tpu"), mode=qr_mode)
    q_cpu, r_cpu = torch.linalg.qr(a, mode=qr_mode)
    assert_close(r, r_cpu, atol=1e-5)
    assert_close(q, q_cpu, atol=1e-5)


def test_geqrf_householder_product_and_ormqr(mode):
    a = torch.randn(2, 5, 3)
    packed, tau = torch.geqrf(a.to("tpu"))
    packed_cpu, tau_cpu = torch.geqrf(a)
    assert_close(packed, packed_cpu, atol=1e-5)
    assert_close(tau, tau_cpu, atol=1e-5)
    assert_close(torch.linalg.householder_product(packed, tau[..., :2]),
                 torch.linalg.householder_product(packed_cpu, tau_cpu[..., :2]), atol=1e-5)
    c = torch.randn(2, 5, 4)
    for left, transpose in [(True, False), (True, True)]:
        assert_close(torch.ormqr(packed, tau, c.to("tpu"), left, transpose),
                     torch.ormqr(packed_cpu, tau_cpu, c, left, transpose), atol=1e-5)
    c = torch.randn(2, 4, 5)
    assert_close(torch.ormqr(packed, tau, c.to("tpu"), False, True),
                 torch.ormqr(packed_cpu, tau_cpu, c, False, True), atol=1e-5)


def test_qr_gradient_wide_and_tall():
    for shape in [(5, 3), (3, 5)]:
        a = torch.randn(shape, dtype=torch.float64)
        assert torch.allclose(_grad(torch.linalg.qr, a, "tpu"), _grad(torch.linalg.qr, a, "cpu"))


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(mode, uplo):
    a = torch.randn(3, 4, 4)
    a = a + a.mT
    noisy = a.clone()
    # The triangle not read holds noise.
    other = torch.triu if uplo == "L" else torch.tril
    noisy = noisy + other(torch.randn(3, 4, 4) * 100, 1 if uplo == "L" else -1)
    w, v = torch.linalg.eigh(noisy.to("tpu"), UPLO=uplo)
    w_cpu, v_cpu = torch.linalg.eigh(a)
    assert_close(w, w_cpu, atol=1e-4)
    # Eigenvectors are defined up to sign.
    assert_close(v.abs(), v_cpu.abs(), atol=1e-4)
    assert_close(torch.linalg.eigvalsh(noisy.to("tpu"), UPLO=uplo), w_cpu, atol=1e-4)


def test_eigh_gradient():
    a = torch.randn(4, 4, dtype=torch.float64)
    a = a + a.mT

    def f(t):
        w, v = torch.linalg.eigh(t)
        return w, v.abs()

    assert torch.allclose(_grad(f, a, "tpu"), _grad(f, a, "cpu"), atol=1e-8)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (1, 6)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_reconstructs_and_matches_the_cpu(mode, shape, full):
    a = torch.randn(shape)
    u, s, vh = torch.linalg.svd(a.to("tpu"), full_matrices=full)
    u_cpu, s_cpu, vh_cpu = torch.linalg.svd(a, full_matrices=full)
    assert (u.shape, s.shape, vh.shape) == (u_cpu.shape, s_cpu.shape, vh_cpu.shape)
    assert_close(s, s_cpu, atol=1e-5)
    k = s.shape[-1]
    assert_close((u[..., :k] * s.unsqueeze(-2)) @ vh[..., :k, :], a, atol=1e-4)
    eye_u = torch.eye(u.shape[-1]).expand(u.shape[:-2] + (u.shape[-1],) * 2)
    assert_close(u.mT @ u, eye_u, atol=1e-5)
    assert_close(torch.linalg.svdvals(a.to("tpu")), s_cpu, atol=1e-5)


def test_pinv_rank_and_polar(mode):
    a = torch.randn(5, 3) @ torch.randn(3, 4)  # rank 3
    assert int(torch.linalg.matrix_rank(a.to("tpu"))) == 3
    assert_close(torch.linalg.pinv(a.to("tpu")), torch.linalg.pinv(a), atol=1e-4)
    b = torch.randn(4, 3)
    u, p = torch.linalg.polar(b.to("tpu"))
    u_cpu, p_cpu = torch.linalg.polar(b)
    assert_close(u, u_cpu, atol=1e-5)
    assert_close(p, p_cpu, atol=1e-5)


@pytest.mark.parametrize("driver", ["gels", "gelsy", "gelsd", "gelss"])
@pytest.mark.parametrize("rows", [6, 3])
def test_lstsq_drivers(mode, driver, rows):
    a, b = torch.randn(2, rows, 4), torch.randn(2, rows, 2)
    got, want = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver=driver), torch.linalg.lstsq(a, b, driver=driver)
    assert_close(got.solution, want.solution, atol=1e-4)
    assert got.residuals.shape == want.residuals.shape and got.rank.shape == want.rank.shape
    if want.residuals.numel():
        assert_close(got.residuals, want.residuals, atol=1e-4)
    if want.rank.numel():
        assert torch.equal(got.rank.cpu(), want.rank)
    assert_close(got.singular_values, want.singular_values, atol=1e-4)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5, 5), (5, 3), (3, 5)])
def test_lu_factor_pivots_and_unpack_match_lapack(mode, shape):
    a = torch.randn(shape)
    lu, piv = torch.linalg.lu_factor(a.to("tpu"))
    lu_cpu, piv_cpu = torch.linalg.lu_factor(a)
    assert torch.equal(piv.cpu(), piv_cpu)
    assert_close(lu, lu_cpu, atol=1e-5)
    p, l, u = torch.linalg.lu(a.to("tpu"))
    for got, want in zip((p, l, u), torch.linalg.lu(a)):
        assert_close(got, want, atol=1e-5)


def test_lu_of_a_singular_matrix_reports_the_zero_pivot(mode):
    a = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    lu, piv, info = torch.linalg.lu_factor_ex(a.to("tpu"))
    lu_cpu, piv_cpu, info_cpu = torch.linalg.lu_factor_ex(a)
    assert torch.equal(piv.cpu(), piv_cpu) and int(info) == int(info_cpu) == 3
    assert_close(lu, lu_cpu)
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.inv(a.to("tpu"))
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        torch.linalg.solve(a.to("tpu"), torch.ones(3, device="tpu"))
    assert float(torch.linalg.det(a.to("tpu"))) == 0.0
    sign, logabs = torch.linalg.slogdet(a.to("tpu"))
    assert float(sign) == 0.0 and logabs.item() == -math.inf


def test_solve_inverse_determinants_and_their_gradients(mode):
    a = torch.randn(3, 4, 4, dtype=torch.float64) + 4 * torch.eye(4, dtype=torch.float64)
    b = torch.randn(3, 4, 2, dtype=torch.float64)
    assert_close(torch.linalg.solve(a.to("tpu"), b.to("tpu")), torch.linalg.solve(a, b), atol=1e-10)
    v = torch.randn(4, dtype=torch.float64)
    assert_close(torch.linalg.solve(a.to("tpu"), v.to("tpu")), torch.linalg.solve(a, v), atol=1e-10)
    assert_close(torch.linalg.solve(a.to("tpu"), b.mT.to("tpu"), left=False), torch.linalg.solve(a, b.mT, left=False), atol=1e-10)
    assert_close(torch.linalg.inv(a.to("tpu")), torch.linalg.inv(a), atol=1e-10)
    assert_close(torch.linalg.det(a.to("tpu")), torch.linalg.det(a), atol=1e-9)
    for fn in (torch.linalg.det, torch.logdet, lambda t: torch.linalg.slogdet(t)[1], torch.linalg.inv):
        assert torch.allclose(_grad(fn, a, "tpu"), _grad(fn, a, "cpu"), atol=1e-8)
    lu, piv = torch.linalg.lu_factor(a)
    for adjoint in (False, True):
        got = torch.linalg.lu_solve(lu.to("tpu"), piv.to("tpu"), b.to("tpu"), adjoint=adjoint)
        assert_close(got, torch.linalg.lu_solve(lu, piv, b, adjoint=adjoint), atol=1e-10)


def test_matrix_exp_and_square_root(mode):
    a = torch.randn(2, 4, 4, dtype=torch.float64)
    assert_close(torch.linalg.matrix_exp(a.to("tpu")), torch.linalg.matrix_exp(a), atol=1e-10, rtol=1e-9)
    spd = a @ a.mT + torch.eye(4, dtype=torch.float64)
    root = torch.linalg.matrix_sqrth(spd.to("tpu"))
    assert_close(root @ root, spd, atol=1e-10)


POLYNOMIALS = [
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_orthogonal_polynomials_every_degree_in_one_call(name):
    fn = getattr(torch.special, name)
    x = torch.linspace(-1.5, 1.5, 13, dtype=torch.float64).unsqueeze(1)
    n = torch.arange(-2.0, 15.0, dtype=torch.float64)  # negative degrees give 0
    assert_close(fn(x.to("tpu"), n.to("tpu")), fn(x, n), atol=1e-9, rtol=1e-9)


SPECIAL = [
    ("i0", (-40.0, 40.0)), ("i0e", (-100.0, 100.0)), ("i1", (-40.0, 40.0)), ("i1e", (-100.0, 100.0)),
    ("modified_bessel_k0", (1e-3, 100.0)), ("modified_bessel_k1", (1e-3, 100.0)),
    ("scaled_modified_bessel_k0", (1e-3, 500.0)), ("scaled_modified_bessel_k1", (1e-3, 500.0)),
    ("bessel_j0", (-60.0, 60.0)), ("bessel_j1", (-60.0, 60.0)), ("bessel_y0", (1e-3, 60.0)),
    ("bessel_y1", (1e-3, 60.0)), ("spherical_bessel_j0", (-30.0, 30.0)), ("erfcx", (-8.0, 1e3)),
    ("log_ndtr", (-30.0, 8.0)), ("ndtri", (1e-6, 1 - 1e-6)),
]


@pytest.mark.parametrize("name,span", SPECIAL)
def test_special_functions_across_their_regimes(mode, name, span):
    fn = getattr(torch.special, name)
    x = torch.linspace(*span, 997)
    # PyTorch's own f32 kernels are the less exact side in places: compare
    # both with the f64 values.
    exact = fn(x.double()).float()
    got = fn(x.to("tpu"))
    assert_close(got, exact, atol=2e-5, rtol=2e-4, equal_nan=True)
    assert_close(fn(x.double().to("tpu")), fn(x.double()), atol=1e-6, rtol=1e-6, equal_nan=True)


def _ldl_cases():
    g = torch.Generator().manual_seed(3)
    cases = [torch.randn(5, 5, generator=g, dtype=torch.float64) for _ in range(8)]  # 1x1 and 2x2 pivots
    cases += [
        torch.randn(3, 6, 6, generator=g, dtype=torch.float64),          # a batch
        torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64),     # only a 2x2 pivot works
        torch.diag(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)),  # singular: info, no elimination
        torch.zeros(3, 3, dtype=torch.float64),
        torch.empty(0, 0, dtype=torch.float64),
    ]
    return cases


@pytest.mark.parametrize("case", range(len(_ldl_cases())))
def test_ldl_factor_matches_lapack_pivots_and_solves(case):
    a = _ldl_cases()[case]
    ld, pivots, info = torch.linalg.ldl_factor_ex(a.to("tpu"))
    ld_cpu, pivots_cpu, info_cpu = torch.linalg.ldl_factor_ex(a)
    assert_close(ld, ld_cpu, atol=1e-10, rtol=1e-10)
    assert torch.equal(pivots.cpu(), pivots_cpu) and torch.equal(info.cpu(), info_cpu)
    if a.numel() and bool((info_cpu == 0).all()):
        b = torch.randn(a.shape[:-1] + (3,), dtype=torch.float64)
        x = torch.linalg.ldl_solve(ld, pivots, b.to("tpu"))
        assert_close(x, torch.linalg.ldl_solve(ld_cpu, pivots_cpu, b), atol=1e-9, rtol=1e-9)
        # And it solves the symmetric system the lower triangle describes.
        sym = a.tril() + a.tril(-1).mT
        assert_close(sym.to("tpu") @ x, b, atol=1e-8, rtol=1e-8)


def test_ldl_factor_errors():
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.ldl_factor_ex(torch.zeros(3, 3, device="tpu"), check_errors=True)
    with pytest.raises(RuntimeError, match="ldl_solve"):
        ld, pivots = torch.linalg.ldl_factor(torch.eye(3, device="tpu"))
        torch.linalg.ldl_solve(ld, pivots, torch.ones(4, 1, device="tpu"))
