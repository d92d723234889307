"""``torch.compile(backend="tpu_rs")``: a graph's first run records the
tpu-rs calls its kernels make and later runs replay them. Every run must
give the CPU's values: new input values, training steps, random numbers,
inputs written in place and host reads inside the graph."""

import copy
import json

import pytest
import torch
import torch_tpu_rs

from conftest import assert_close


def _metrics_executions():
    return torch.tpu.metrics()["executions"]


@pytest.mark.parametrize("backend", ["tpu_rs", None])
def test_replayed_runs_follow_new_inputs_and_train_like_the_cpu(mode, backend):
    """``None``: plain ``torch.compile(model)``, which hands tpu graphs to tpu_rs."""
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    tpu_model = copy.deepcopy(model).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=0.1)
    compiled = torch.compile(tpu_model, backend="tpu_rs") if backend else torch.compile(tpu_model)
    for step in range(4):
        x = torch.randn(5, 8)
        loss = model(x).square().mean()
        tpu_loss = compiled(x.to("tpu")).square().mean()
        assert_close(tpu_loss, loss.detach())
        loss.backward()
        tpu_loss.backward()
        for p, q in zip(model.parameters(), tpu_model.parameters()):
            assert_close(q.grad, p.grad)
        opt.step()
        tpu_opt.step()
        opt.zero_grad()
        tpu_opt.zero_grad()
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(5, 8)
            assert_close(compiled(x.to("tpu")), model(x))


def test_graphs_that_cannot_be_replayed_still_run_each_time(mode):
    """Random numbers differ per call (such a run is not recorded); an input
    written in place (recorded, its write replayed) is seen as on the CPU."""
    torch._dynamo.reset()

    def noisy(x):
        return x + torch.rand_like(x)

    compiled = torch.compile(noisy, backend="tpu_rs")
    x = torch.zeros(1000, device="tpu")
    a, b = compiled(x), compiled(x)
    assert not torch.equal(a.cpu(), b.cpu())
    assert 0.4 < float(a.mean()) < 0.6

    def bump(buf, x):
        buf.add_(x)
        return buf * 2

    compiled = torch.compile(bump, backend="tpu_rs")
    buf, cpu_buf = torch.zeros(3, device="tpu"), torch.zeros(3)
    for _ in range(3):
        x = torch.randn(3)
        assert_close(compiled(buf, x.to("tpu")), bump(cpu_buf, x))
        assert_close(buf, cpu_buf)


def test_a_replay_writes_into_its_inputs_as_the_graph_did(monkeypatch, mode):
    """A decode step updates its static KV cache in place: the replay makes
    the graph's writes itself (into whole inputs, rows of them, and inputs
    that are views of a larger tensor), with no kernel call after it."""
    torch._dynamo.reset()

    def step(cache, total, window, pos, x):
        cache.index_copy_(1, pos, x)
        total.add_(x.sum())
        window.mul_(2).add_(total)
        return cache.sum(1) * total

    compiled = torch.compile(step, backend="tpu_rs")
    cache, total, base = torch.zeros(2, 6, 3), torch.zeros(()), torch.arange(8.0)
    tpu = [t.to("tpu") for t in (cache, total, base)]
    with torch.no_grad():
        for i in range(4):
            pos, x = torch.tensor([i]), torch.randn(2, 1, 3)
            want = step(cache, total, base[2:5], pos, x)
            args = (tpu[0], tpu[1], tpu[2][2:5], pos.to("tpu"), x.to("tpu"))
            calls = []
            if i == 3:  # recorded, then replayed
                for name in ("run", "run_into", "copy_into"):
                    real = getattr(torch_tpu_rs._C, name)
                    monkeypatch.setattr(torch_tpu_rs._C, name, lambda *a, _r=real, **k: calls.append(a) or _r(*a, **k))
            got = compiled(*args)
            monkeypatch.undo()
            assert calls == []
            assert_close(got, want)
            for t, c in zip(tpu, (cache, total, base)):
                assert_close(t, c)


def test_a_replayed_graph_launches_as_one_program_without_the_python_kernels(monkeypatch, tmp_path):
    torch._dynamo.reset()

    def f(x, w):
        return torch.tanh(x @ w).sum(0) * 3 - x.mean()

    compiled = torch.compile(f, backend="tpu_rs")
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    with torch.no_grad():
        for _ in range(3):
            compiled(x.to("tpu"), w.to("tpu"))
        x, w = x.to("tpu"), w.to("tpu")
        torch.tpu.synchronize()
        kernel_calls = []
        run = torch_tpu_rs._C.run
        monkeypatch.setattr(torch_tpu_rs._C, "run", lambda *a, **k: kernel_calls.append(a[0]) or run(*a, **k))
        before = _metrics_executions()
        trace = tmp_path / "replay.json"
        with torch.tpu.profile(str(trace)):
            got = compiled(x, w)
            torch.tpu.synchronize()
        assert _metrics_executions() - before == 1
        assert kernel_calls == []
    assert_close(got, f(x.cpu(), w.cpu()))
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [(e.get("cat"), e["name"]) for e in events if e.get("ph") == "X"]
    # The recorded calls join the pending graph as one block, not op by op.
    assert ("replay", "graph") in spans
    assert not [s for s in spans if s[0] == "op"], spans
    (replay,) = [e for e in events if e.get("cat") == "replay"]
    assert "test_compile.py" in replay["args"]["at"], replay


def test_replayed_outputs_that_share_a_value_or_are_inputs_stay_apart(mode):
    """A graph may return one value twice (a clone shares it), an input
    itself, or a constant: each replayed output is its own tensor."""
    torch._dynamo.reset()

    def f(x):
        y = x * 2
        return y, y.clone(), x, torch.ones(2, device=x.device)

    compiled = torch.compile(f, backend="tpu_rs")
    for _ in range(3):
        x = torch.randn(2)
        y, z, same, ones = compiled(x.to("tpu"))
        y.add_(1)
        assert_close(y, x * 2 + 1)
        assert_close(z, x * 2)
        assert_close(same, x)
        assert_close(ones, torch.ones(2))


@pytest.mark.parametrize("shared", ["clone", "scalar"])
def test_inputs_sharing_a_value_are_told_apart(mode, shared):
    """A clone shares its source's value until written, and a filled 0-d
    tensor may hold the same value as a literal in the graph: later calls
    with other tensors must still see their own values."""
    torch._dynamo.reset()

    def f(a, b):
        return a * 2 + b * 3 + 2.0

    compiled = torch.compile(f, backend="tpu_rs")
    a = torch.randn(4, device="tpu")
    if shared == "clone":
        compiled(a, a.clone())
    else:
        compiled(a, torch.zeros((), device="tpu").fill_(2.0))
    for _ in range(3):
        a, b = torch.randn(4), torch.randn(4 if shared == "clone" else ())
        assert_close(compiled(a.to("tpu"), b.to("tpu")), f(a, b))


def test_a_graph_that_raises_keeps_its_error_and_runs_again():
    from torch_tpu_rs._compile import _fused

    calls = []

    def graph(x):
        calls.append(x)
        if len(calls) == 1:
            raise ValueError("boom")
        return [x * 2]

    run = _fused(graph, None)
    x = torch.ones(3, device="tpu")
    with pytest.raises(ValueError, match="boom"):
        run([x])
    for _ in range(2):  # recorded, then replayed
        assert_close(run([x])[0], torch.full((3,), 2.0))
    assert len(calls) == 2


def test_a_replay_runs_only_on_inputs_laid_out_as_recorded():
    """Other strides, offsets or storage sizes record a run of their own;
    each layout seen replays from then on."""
    from torch_tpu_rs._compile import _fused

    calls = []

    def graph(x):
        calls.append(x)
        return [x * 2 + 1, (x * 3).t()[1:]]

    run = _fused(graph, None)
    base = torch.arange(24.0)
    layouts = [
        lambda t: t[:12].reshape(3, 4),  # contiguous
        lambda t: t[:12].reshape(4, 3).t(),  # transposed
        lambda t: t[1:13].reshape(3, 4),  # offset into a larger storage
        lambda t: t.reshape(3, 8)[:, :4],  # strided rows
    ]
    strides = {}
    for rounds in range(3):
        for k, view in enumerate(layouts):
            cpu = view(base * (rounds + 1))
            got, window = run([view((base * (rounds + 1)).to("tpu"))])
            assert got.shape == cpu.shape
            assert_close(got, cpu * 2 + 1)
            assert_close(window, (cpu * 3).t()[1:])
            # Replayed outputs are laid out as the recorded run's.
            assert strides.setdefault(k, (got.stride(), window.stride())) == (got.stride(), window.stride())
        assert len(calls) == len(layouts), "each layout records once"


def test_a_replay_inside_another_graphs_recording_is_recorded_there(mode):
    """A recorded graph run while another graph is being recorded runs its
    calls through the kernels, so the outer recording sees them; the outer
    graph then replays them on new inputs."""
    from torch_tpu_rs._compile import _fused

    inner = _fused(lambda x: [torch.tanh(x) * 3], None)
    x = torch.randn(5, device="tpu")
    for _ in range(2):  # recorded, then replayed
        inner([x])
    outer_calls = []

    def outer_graph(x, y):
        outer_calls.append(1)
        return [inner([x + y])[0] - y]

    outer = _fused(outer_graph, None)
    for _ in range(3):
        a, b = torch.randn(5), torch.randn(5)
        assert_close(outer([a.to("tpu"), b.to("tpu")])[0], torch.tanh(a + b) * 3 - b)
    assert len(outer_calls) == 1, "recorded once, then replayed"
