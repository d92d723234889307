"""Seeing what runs from PyTorch: ``torch.tpu.profile`` writes a Chrome
trace with compile, launch and transfer spans and graph cuts attributed to
this file; a changed batch size is a recompile naming the dimension, and
repeated ones warn at the user's line; ``TPU_RS_PROFILE`` traces a whole
process; ``torch.tpu.metrics_report`` prints the summary."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torch_tpu_rs

HERE = os.path.basename(__file__)


def events_of(path):
    with open(path) as f:
        trace = json.load(f)
    return trace["traceEvents"]


def of(events, cat):
    return [e for e in events if e.get("cat") == cat]


def tiny_gpt_step(model, opt, tokens):
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


class TinyGpt(torch.nn.Module):
    def __init__(self, vocab=32, dim=32, heads=2, layers=1, block=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(block, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.blocks = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        t = tokens.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        x = self.embed(tokens) + self.pos[:t]
        return self.head(self.blocks(x, mask=mask, is_causal=True))


def test_a_gpt_steps_trace_has_compiles_launches_transfers_and_cuts_from_this_file(tmp_path):
    torch.manual_seed(0)
    model = TinyGpt().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, 32, (2, 16)).to("tpu")
    path = tmp_path / "trace.json"
    with torch.tpu.set_eager_mode("defer_and_fuse"), torch.tpu.profile(path):
        for _ in range(3):
            tiny_gpt_step(model, opt, tokens)
        model.head.weight.sum().item()  # reads the last update
    events = events_of(path)

    compiles = of(events, "compile")
    assert compiles and all(c["args"]["cache"] in ("memory", "disk", "compiled") for c in compiles)
    assert of(events, "execute"), "no launch spans"
    directions = {t["name"] for t in of(events, "transfer")}
    assert {"host_to_device", "device_to_host"} <= directions, directions
    cuts = of(events, "cut")
    assert cuts, "DeferAndFuse cut no graph"
    # Backward's cuts at its `loss.backward()` line (torch runs backward on
    # a thread of its own), the read's at the read.
    assert all(c["args"]["at"].startswith(__file__) for c in cuts), [c["args"]["at"] for c in cuts]
    assert {"backward", "host_read"} <= {c["name"] for c in cuts}, [c["name"] for c in cuts]
    ops = of(events, "op")
    assert any(o["args"]["at"].startswith(__file__) for o in ops), "no op attributed to this file"
    assert any(e.get("args", {}).get("bytes", 0) > 0 for e in of(events, "memory"))


def test_a_changed_batch_size_is_a_recompile_naming_the_dimension(tmp_path):
    layer = torch.nn.Linear(11, 3).to("tpu")
    before = torch.tpu.metrics()["recompiles_by_reason"]["input_shape"]
    path = tmp_path / "trace.json"
    with torch.tpu.set_eager_mode("strict"), torch.tpu.profile(path):
        for batch in (6, 10):
            layer(torch.ones(batch, 11, device="tpu")).cpu()
    assert torch.tpu.metrics()["recompiles_by_reason"]["input_shape"] > before
    details = [r["args"]["detail"] for r in of(events_of(path), "recompile")]
    assert any("dim 0: 6 -> 10" in d for d in details), details


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_switching_modes_back_keeps_the_programs_built(tmp_path, mode):
    """A mode switched away from and back to (as each torch.compile'd graph
    does under Strict) keeps what it built: nothing is looked up again."""
    x = torch.arange(6.0, device="tpu")
    other = "defer_and_fuse" if mode == "strict" else "strict"
    with torch.tpu.set_eager_mode(mode):
        (x.exp() * 3).sum().cpu()
        with torch.tpu.set_eager_mode(other):
            (x + 1).cpu()
        with torch.tpu.profile(tmp_path / "trace.json"):
            (x.exp() * 3).sum().cpu()
    assert of(events_of(tmp_path / "trace.json"), "compile") == []


WARNS = """
import os, sys, warnings, json
import torch, torch_tpu_rs
x = torch.ones(3, device="tpu")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for n in range(2, 14):
        torch.cumsum(torch.ones(n, 2, device="tpu") * x[0], 0).cpu()
ours = [w for w in caught if issubclass(w.category, torch_tpu_rs.RecompileWarning)]
print(json.dumps([[str(w.message), w.filename, w.lineno] for w in ours]))
"""


def test_repeated_recompiles_warn_once_at_the_users_line(tmp_path):
    """In a fresh process (the threshold counts every build of the op)."""
    script = tmp_path / "grows.py"
    script.write_text(WARNS)
    env = dict(os.environ, TPU_RS_EAGER="strict")
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    warned = json.loads(run.stdout.strip().splitlines()[-1])
    cumsum = [w for w in warned if "`cumsum`" in w[0]]
    assert len(cumsum) == 1, warned
    message, filename, line = cumsum[0]
    assert (filename, line) == (str(script), 8), cumsum
    assert "input 0 dim 0" in message and "compiled 8 programs" in message, message


TRAINS = """
import json, warnings
import torch, torch_tpu_rs
torch.manual_seed(0)
widths = [48, 40, 32, 24, 20, 16, 12, 8, 6, 4]
layers = [torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
net = torch.nn.Sequential(*[m for l in layers for m in (l, torch.nn.Tanh())]).to("tpu")
opt = torch.optim.AdamW(net.parameters())
x = torch.randn(5, 48).to("tpu")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        loss = net(x).square().mean()
        opt.zero_grad(); loss.backward(); opt.step()
    loss.item()
print(json.dumps([str(w.message) for w in caught if issubclass(w.category, torch_tpu_rs.RecompileWarning)]))
"""


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_parameters_of_many_shapes_do_not_warn(tmp_path, mode):
    """Nine layers of different sizes build programs for many shapes of
    each op, each once: that is no shape that keeps changing."""
    script = tmp_path / "trains.py"
    script.write_text(TRAINS)
    env = dict(os.environ, TPU_RS_EAGER=mode)
    run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []


def test_the_report_prints_the_summary_and_the_counters(tmp_path, capsys):
    with torch.tpu.profile(tmp_path / "trace.json"):
        (torch.ones(4, 4, device="tpu") @ torch.ones(4, 4, device="tpu")).cpu()
    report = torch.tpu.metrics_report()
    printed = capsys.readouterr().out
    assert report in printed
    for part in ("top ops by dispatch time", "matmul", "graph cuts:", "recompiles:", "process totals:"):
        assert part in report, report


def test_a_second_profile_at_once_is_an_error(tmp_path):
    with torch.tpu.profile(tmp_path / "outer.json"):
        with pytest.raises(torch_tpu_rs.TpuError, match="already being recorded"):
            with torch.tpu.profile(tmp_path / "inner.json"):
                pass


def test_tpu_rs_profile_traces_a_whole_process(tmp_path):
    """The trace is complete JSON after the process exits, with no
    explicit stop."""
    path = tmp_path / "process.json"
    code = "import torch\nx = torch.ones(5, device='tpu')\nprint((x * 2).sum().item())\n"
    env = dict(os.environ, TPU_RS_PROFILE=str(path))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    events = events_of(path)
    assert {e["name"] for e in of(events, "op")} >= {"mul", "sum"}
    assert of(events, "transfer")
