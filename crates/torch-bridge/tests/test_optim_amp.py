"""Fused optimizers and the AMP loss scaler, as CUDA recipes use them, on
tpu against the same recipe on PyTorch's CPU."""

import copy

import pytest
import torch

from conftest import assert_close


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(device, make_opt, steps=5, dtype=torch.float32):
    model = _model().to(device=device, dtype=dtype)
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 6, generator=g).to(device=device, dtype=dtype)
        loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


OPTIMIZERS = {
    "adamw fused": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw fused amsgrad maximize": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, maximize=True, fused=True),
    "adam fused weight decay": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.05, fused=True),
    "adamw fused tensor lr": lambda p: torch.optim.AdamW(p, lr=torch.tensor(1e-2), fused=True),
    "sgd fused": lambda p: torch.optim.SGD(p, lr=0.1, fused=True),
    "sgd fused momentum dampening": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.2, fused=True),
    "sgd fused nesterov weight decay maximize": lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01, maximize=True, fused=True
    ),
    "sgd fused tensor lr": lambda p: torch.optim.SGD(p, lr=torch.tensor(0.1), momentum=0.5, fused=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_steps_equal_the_cpu(mode, name):
    cpu_model, cpu_opt, cpu_losses = _train("cpu", OPTIMIZERS[name])
    tpu_model, tpu_opt, tpu_losses = _train("tpu", OPTIMIZERS[name])
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), atol=1e-6, rtol=1e-5)
    for p, q in zip(tpu_model.parameters(), cpu_model.parameters()):
        assert_close(p, q, atol=1e-6, rtol=1e-5)
        assert tpu_opt.state[p].keys() == cpu_opt.state[q].keys()
        for key, value in cpu_opt.state[q].items():
            if isinstance(value, torch.Tensor) and key != "step":
                assert_close(tpu_opt.state[p][key], value, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("optimizer", [torch.optim.AdamW, torch.optim.SGD])
def test_fused_steps_on_bfloat16_parameters_match_the_cpu(optimizer):
    make = lambda p: optimizer(p, lr=1e-2, fused=True)
    cpu_model, _, _ = _train("cpu", make, steps=3, dtype=torch.bfloat16)
    tpu_model, _, _ = _train("tpu", make, steps=3, dtype=torch.bfloat16)
    for p, q in zip(tpu_model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def _scaled_run(device, init_scale, fused, steps=6):
    model = _model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9 if fused else 0.0, fused=fused)
    scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=2)
    g = torch.Generator().manual_seed(2)
    scales = []
    for _ in range(steps):
        x = torch.randn(4, 6, generator=g).to(device)
        with torch.autocast(device, dtype=torch.float16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("init_scale", [2.0**8, 2.0**70])
def test_grad_scaler_with_float16_autocast_equals_the_cpu(init_scale, fused):
    """2**70 overflows float16 gradients: those steps are skipped and the
    scale backs off, as on the CPU. A fused optimizer unscales inside its
    step (``grad_scale``, ``found_inf``)."""
    cpu_model, cpu_scales = _scaled_run("cpu", init_scale, fused)
    tpu_model, tpu_scales = _scaled_run("tpu", init_scale, fused)
    assert tpu_scales == cpu_scales
    for p, q in zip(tpu_model.parameters(), cpu_model.parameters()):
        assert_close(p, q, atol=2e-3, rtol=2e-3)


def test_unscale_flags_non_finite_gradients():
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([[4.0, float("inf")]]), torch.tensor([8.0])]
    tpu = [g.to("tpu") for g in grads]
    found = torch.zeros(1, device="tpu")
    torch._amp_foreach_non_finite_check_and_unscale_(tpu, found, torch.full((1,), 0.5, device="tpu"))
    assert found.item() == 1.0
    for t, g in zip(tpu, grads):
        assert torch.equal(t.cpu(), g * 0.5)
    finite = [torch.tensor([1.0, 3.0], device="tpu")]
    found.zero_()
    torch._amp_foreach_non_finite_check_and_unscale_(finite, found, torch.full((1,), 2.0, device="tpu"))
    assert found.item() == 0.0 and torch.equal(finite[0].cpu(), torch.tensor([2.0, 6.0]))


def test_a_fused_step_is_one_program_under_strict():
    model = _model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    model(torch.ones(2, 6, device="tpu")).sum().backward()
    with torch.tpu.set_eager_mode("strict"):
        opt.step()  # compiles
        torch.tpu.synchronize()
        before = torch.tpu.metrics()["executions"]
        opt.step()
        torch.tpu.synchronize()
        ran = torch.tpu.metrics()["executions"] - before
    # The step counters' increment (an op of the optimizer's own) and the
    # fused update of all six tensors.
    assert ran <= 8, ran
    state = copy.deepcopy(opt.state_dict())
    assert state["state"][0]["step"].item() == 2


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=True),
        lambda p: torch.optim.RMSprop(p, lr=1e-2, foreach=True),
        lambda p: torch.optim.Adagrad(p, lr=1e-2, foreach=True),
    ],
    ids=["adamw", "sgd", "rmsprop", "adagrad"],
)
def test_foreach_optimizers_and_gradient_clipping_equal_the_cpu(make):
    """The ``_foreach_*`` kernels CUDA's default optimizers and
    ``clip_grad_norm_(foreach=True)`` call."""

    def train(device):
        model = _model().to(device)
        opt = make(model.parameters())
        g = torch.Generator().manual_seed(3)
        norms = []
        for _ in range(3):
            x = torch.randn(4, 6, generator=g).to(device)
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, foreach=True).item())
            opt.step()
        return model, norms

    cpu_model, cpu_norms = train("cpu")
    tpu_model, tpu_norms = train("tpu")
    torch.testing.assert_close(tpu_norms, cpu_norms, atol=1e-6, rtol=1e-5)
    for p, q in zip(tpu_model.parameters(), cpu_model.parameters()):
        assert_close(p, q, atol=1e-6, rtol=1e-5)


FOREACH_CASES = {
    "mul_.Scalar": lambda a, b, c, s: torch._foreach_mul_(a, 0.3),
    "mul_.List": lambda a, b, c, s: torch._foreach_mul_(a, b),
    "mul_.ScalarList": lambda a, b, c, s: torch._foreach_mul_(a, [0.3, -2.0]),
    "mul_.Tensor": lambda a, b, c, s: torch._foreach_mul_(a, s),
    "div_.Scalar": lambda a, b, c, s: torch._foreach_div_(a, 0.3),
    "div_.ScalarList": lambda a, b, c, s: torch._foreach_div_(a, [0.3, 7.0]),
    "div_.List": lambda a, b, c, s: torch._foreach_div_(a, c),
    "add_.Scalar": lambda a, b, c, s: torch._foreach_add_(a, 0.1),
    "add_.List alpha": lambda a, b, c, s: torch._foreach_add_(a, b, alpha=-0.01),
    "add.Tensor alpha": lambda a, b, c, s: a.__setitem__(slice(None), torch._foreach_add(a, s, alpha=2.0)),
    "sub_.ScalarList": lambda a, b, c, s: torch._foreach_sub_(a, [1.5, 0.3]),
    "lerp_.Scalar": lambda a, b, c, s: torch._foreach_lerp_(a, b, 0.1),
    "lerp_.Scalar 0.9": lambda a, b, c, s: torch._foreach_lerp_(a, b, 0.9),
    "lerp_.List": lambda a, b, c, s: torch._foreach_lerp_(a, b, c),
    "addcmul_.Scalar": lambda a, b, c, s: torch._foreach_addcmul_(a, b, b, 0.001),
    "addcdiv_.ScalarList": lambda a, b, c, s: torch._foreach_addcdiv_(a, b, c, [-0.01, 0.02]),
    "sqrt_": lambda a, b, c, s: torch._foreach_sqrt_(c),
    "neg": lambda a, b, c, s: a.__setitem__(slice(None), torch._foreach_neg(a)),
    "sqrt": lambda a, b, c, s: a.__setitem__(slice(None), torch._foreach_sqrt(c)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(FOREACH_CASES))
def test_foreach_kernels_equal_the_cpu_in_one_program(case, dtype):
    """Each ``_foreach_*`` call is one program under Strict and gives the
    CPU's values bit for bit; a half-type add scaled by ``alpha`` may round
    once less than the CPU, and square roots are not always correctly
    rounded on one side (the plugin's in float64, PyTorch's AVX-512 kernel
    in float32): each within one ulp."""
    g = torch.Generator().manual_seed(0)
    shapes = [(3, 5), (7,)]
    a = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    b = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    c = [(torch.rand(s, generator=g) + 0.25).to(dtype) for s in shapes]
    s = torch.tensor(0.7)
    f = FOREACH_CASES[case]
    tpu = [[t.to("tpu") for t in ts] for ts in (a, b, c)] + [s.to("tpu")]
    f(a, b, c, s)
    torch.tpu.synchronize()
    before = torch.tpu.metrics()["executions"]
    f(*tpu)
    torch.tpu.synchronize()
    assert torch.tpu.metrics()["executions"] - before == 1, case
    for got, want in zip(tpu[0] + tpu[2], a + c):
        assert got.dtype == want.dtype, case
        if ("alpha" in case and dtype in (torch.bfloat16, torch.float16)) or ("sqrt" in case and dtype in (torch.float32, torch.float64)):
            eps = torch.finfo(dtype).eps  # of the result, or of operands near 1 where it cancels
            assert_close(got, want, atol=2 * eps, rtol=eps)
        else:
            assert torch.equal(got.cpu(), want), case
