"""The opt-in CPU fallback (``TORCH_TPU_CPU_FALLBACK=1``) gives the CPU's
semantics exactly: every argument an op's schema marks written (in-place
``self``, ``out=``, tensor lists such as a fused optimizer's state) ends up
in its tpu tensor, and results that alias a written argument are that tpu
tensor."""

import copy
import functools

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._python_dispatch import TorchDispatchMode

from torch_tpu_rs.aten import registry

# OpInfo entries and samples per entry: enough to reach every kind of
# written argument, few enough to keep the test quick.
SAMPLES_PER_OP = 2


def _writes(op):
    """The positions and names of the arguments ``op``'s schema writes."""
    return [
        (i, a.name) for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    ]


class _WritingCalls(TorchDispatchMode):
    """Records the aten calls that write an argument, each with its inputs
    as they were before the call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _writes(func):
            self.calls.append((func, *copy.deepcopy((args, kwargs))))
        return func(*args, **kwargs)


def _capture(fn):
    mode = _WritingCalls()
    with mode:
        fn()
    return mode.calls


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _holdable(call):
    """True when every tensor of ``call`` has a dtype the tpu device holds
    (complex and float8 values cannot reach a tpu op at all)."""
    _, args, kwargs = call
    return all(_tpu_holds(t.dtype) for t in _tensors(list(args) + list(kwargs.values())))


@functools.cache
def _tpu_holds(dtype):
    try:
        torch.empty(0, dtype=dtype, device="tpu")
        return True
    except NotImplementedError:
        return False


def _argument(args, kwargs, index, name):
    return args[index] if index < len(args) else kwargs.get(name)


def _calls():
    """Writing aten calls as real code makes them, on the CPU: the in-place
    and ``out=`` variants of PyTorch's OpInfo samples, and the fused
    optimizer and AMP ops that ``torch.optim`` and ``GradScaler`` call."""
    calls = {}
    for info in op_db:
        samples = list(info.sample_inputs("cpu", torch.float32))[:SAMPLES_PER_OP]
        for sample in samples:
            variants = []
            if info.inplace_variant is not None:
                variants.append(lambda s=sample: info.inplace_variant(s.input.clone(), *s.args, **s.kwargs))
            if info.supports_out:
                def out_variant(s=sample):
                    expected = info.op(s.input, *s.args, **s.kwargs)
                    if isinstance(expected, torch.Tensor):
                        info.op(s.input, *s.args, **s.kwargs, out=torch.empty_like(expected))
                variants.append(out_variant)
            for variant in variants:
                try:
                    found = _capture(variant)[:1]  # the variant's own call
                except Exception:
                    continue  # a sample the CPU rejects for this form
                for call in found:
                    calls.setdefault(str(call[0]), call)
    for call in _optimizer_calls():
        calls.setdefault(str(call[0]), call)
    return [c for c in calls.values() if _holdable(c)]


def _optimizer_calls():
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    for p in params:
        p.grad = torch.randn_like(p)
    found = []
    for make in (
        lambda: torch.optim.AdamW(params, lr=0.1, fused=True),
        lambda: torch.optim.Adam(params, lr=0.1, fused=True, amsgrad=True),
        lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=True),
        lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True),
        lambda: torch.optim.AdamW(params, lr=0.1, foreach=True),
    ):
        opt = make()
        opt.step()  # creates the state; the second step's calls are captured
        with torch.no_grad():
            found += _capture(opt.step)
    grads = [torch.tensor([1.0, float("inf")]), torch.tensor([2.0, 4.0])]
    found += _capture(lambda: torch._amp_foreach_non_finite_check_and_unscale_(
        grads, torch.zeros(()), torch.tensor(0.5)))
    found += _capture(lambda: torch._amp_update_scale_(
        torch.tensor(65536.0), torch.zeros((), dtype=torch.int32), torch.ones(()), 2.0, 0.5, 2000))
    return found


CALLS = _calls()


def test_the_writing_forms_are_all_reached():
    """The calls below cover each kind of written argument the fallback
    must write back, so none of them passes by not being run."""
    kinds = set()
    for op, _, _ in CALLS:
        for i, _ in _writes(op):
            arg = op._schema.arguments[i]
            kinds.add("list" if isinstance(arg.type, torch.ListType) else "out" if arg.is_out else "self")
    assert kinds == {"list", "out", "self"}
    names = {str(op) for op, _, _ in CALLS}
    for needed in ("aten._fused_adamw_.default", "aten._amp_foreach_non_finite_check_and_unscale_.default"):
        assert needed in names
    assert len(CALLS) > 200


@pytest.mark.parametrize("call", CALLS, ids=[str(c[0]) for c in CALLS])
def test_fallback_writes_every_mutated_argument_as_the_cpu_does(monkeypatch, call):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    op, args, kwargs = call
    cpu_args, cpu_kwargs = copy.deepcopy((args, kwargs))
    tpu_args, tpu_kwargs = _to(args, "tpu"), _to(kwargs, "tpu")
    # Random ops draw from the CPU generator in both runs: from one state.
    # (Optimizer steps write parameters under no_grad, as here.)
    state = torch.get_rng_state()
    # The fallback warns once per op and process: this test's warnings are
    # its own, and later tests still see their first.
    monkeypatch.setattr(registry, "_warned", set())
    with torch.no_grad():
        expected = op(*cpu_args, **cpu_kwargs)
        torch.set_rng_state(state)
        with pytest.warns(UserWarning, match="running it on the CPU"):
            got = registry._cpu_fallback(op, tpu_args, tpu_kwargs)
    compared = 0
    for index, name in _writes(op):
        want = _tensors(_argument(cpu_args, cpu_kwargs, index, name))
        have = _tensors(_argument(tpu_args, tpu_kwargs, index, name))
        assert len(want) == len(have), name
        for w, h in zip(want, have):
            assert h.device.type == "tpu", name
            torch.testing.assert_close(h.cpu(), w, equal_nan=True, msg=f"{op}: written argument {name}")
            compared += 1
    assert compared > 0, f"{op}: no written argument was compared"
    # Results equal the CPU's, and a result the op returns as one of its
    # written arguments is that very tpu tensor, as on the CPU.
    cpu_written = {id(t) for i, n in _writes(op) for t in _tensors(_argument(cpu_args, cpu_kwargs, i, n))}
    written = {id(t) for i, n in _writes(op) for t in _tensors(_argument(tpu_args, tpu_kwargs, i, n))}
    assert len(_tensors(expected)) == len(_tensors(got))
    for w, h in zip(_tensors(expected), _tensors(got)):
        assert h.device.type == "tpu"
        torch.testing.assert_close(h.cpu(), w, equal_nan=True, msg=f"{op}: result")
        assert (id(w) in cpu_written) == (id(h) in written), f"{op}: aliasing of a result"


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _batches(steps):
    """A regression the MLP can learn: y = sin(x . w)."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 1, generator=g)
    xs = [torch.randn(32, 8, generator=g) for _ in range(steps)]
    return [(x, torch.sin(x @ w)) for x in xs]


def _train(device, make_optimizer, scaled, steps=20):
    model = _mlp().to(device)
    opt = make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(device, init_scale=2.0**16) if scaled else None
    losses = []
    for x, y in _batches(steps):
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=torch.float16, enabled=scaled):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        if scaled:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        losses.append(loss.item())
        yield losses[-1], [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize(
    "name, make_optimizer, scaled",
    [
        ("fused adamw", lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True), False),
        ("fp16 grad scaler", lambda p: torch.optim.SGD(p, lr=1e-2), True),
        ("fp16 grad scaler + fused adamw", lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True), True),
    ],
)
def test_training_through_the_fallback_equals_the_cpu_at_every_step(monkeypatch, mode, name, make_optimizer, scaled):
    monkeypatch.setenv("TORCH_TPU_CPU_FALLBACK", "1")
    monkeypatch.setattr(registry, "_warned", set())
    cpu = _train("cpu", make_optimizer, scaled)
    tpu = _train("tpu", make_optimizer, scaled)
    first = last = None
    for step, ((cpu_loss, cpu_params), (tpu_loss, tpu_params)) in enumerate(zip(cpu, tpu, strict=True)):
        assert tpu_loss == pytest.approx(cpu_loss, rel=1e-3, abs=1e-5), f"{name}: loss at step {step}"
        for c, t in zip(cpu_params, tpu_params):
            torch.testing.assert_close(t, c, atol=1e-4, rtol=1e-3, msg=f"{name}: parameters after step {step}")
        first = tpu_loss if first is None else first
        last = tpu_loss
    assert last < first, f"{name}: the model did not learn ({first} -> {last})"
