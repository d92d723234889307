"""CUDA scripts with ``cuda`` changed to ``tpu``: the idioms
``docs/porting-from-cuda.md`` lists, each against the same script on the
CPU."""

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers


class _Images(torch.utils.data.Dataset):
    """FashionMNIST-shaped samples; each says which DataLoader worker made it."""

    def __init__(self, n=96):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 1, 28, 28, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return self.x[i], self.y[i], -1 if info is None else info.id


def _quickstart(device, num_workers, pin_memory):
    """PyTorch's quickstart training loop; the losses and the workers seen."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(
        _Images(), batch_size=16, num_workers=num_workers, pin_memory=pin_memory
    )
    losses, workers, pinned = [], set(), set()
    for _ in range(2):
        for x, y, worker in loader:
            pinned.add(x.is_pinned())
            workers.update(worker.tolist())
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, workers, pinned


@pytest.mark.parametrize("device", ["tpu", "cpu"])
def test_quickstart_with_worker_processes_and_pinned_memory(device):
    expected, _, _ = _quickstart("cpu", num_workers=0, pin_memory=False)
    losses, workers, pinned = _quickstart(device, num_workers=2, pin_memory=True)
    assert workers == {0, 1}  # both worker processes made batches
    assert pinned == {True}
    torch.testing.assert_close(losses, expected, atol=1e-5, rtol=1e-4)


def _tiny_gpt2():
    vocab = {f"w{i}": i for i in range(60)}
    vocab["[UNK]"] = 60
    tokens = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokens.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tokens, unk_token="[UNK]", eos_token="[UNK]")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=61, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=60, eos_token_id=60
    )
    return transformers.GPT2LMHeadModel(config).eval(), tokenizer


def _generated(model, tokenizer, **kwargs):
    pipe = transformers.pipeline("text-generation", model=model, tokenizer=tokenizer, **kwargs)
    text = pipe("w1 w2 w3 w4", max_new_tokens=8, do_sample=False)[0]["generated_text"]
    return text, pipe.device, next(model.parameters()).device


def test_pipeline_keeps_a_model_on_tpu():
    model, tokenizer = _tiny_gpt2()
    expected, _, _ = _generated(model, tokenizer)
    text, pipe_device, model_device = _generated(model.to("tpu"), tokenizer)
    assert (pipe_device.type, model_device.type) == ("tpu", "tpu")
    assert text == expected
    # An explicit device still wins.
    _, pipe_device, model_device = _generated(model, tokenizer, device="cpu")
    assert (pipe_device.type, model_device.type) == ("cpu", "cpu")


def test_device_map_auto_places_the_model_on_tpu(tmp_path):
    model, _ = _tiny_gpt2()
    model.save_pretrained(tmp_path)
    placed = transformers.GPT2LMHeadModel.from_pretrained(tmp_path, device_map="auto")
    assert {p.device.type for p in placed.parameters()} == {"tpu"}
    ids = torch.randint(0, 60, (2, 7))
    torch.testing.assert_close(placed(ids.to("tpu")).logits.cpu(), model(ids).logits, atol=1e-5, rtol=1e-4)


def test_accelerator_calls_cuda_code_makes():
    assert torch.accelerator.current_accelerator() == torch.device("tpu")
    torch.accelerator.synchronize()
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats()
    x = torch.ones(256, 256, device="tpu")
    torch.accelerator.synchronize()
    assert torch.accelerator.memory_allocated() >= x.nbytes
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] >= x.nbytes
    free, total = torch.accelerator.get_memory_info(0)
    assert 0 < free <= total == torch.tpu.get_device_properties().total_memory
    start, end = torch.tpu.Event(enable_timing=True), torch.Event("tpu", enable_timing=True)
    start.record()
    (x @ x).sum().item()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0


def test_memory_of_the_cpu_plugin_is_the_hosts():
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    total_kib = int(info["MemTotal"].split()[0])
    free, total = torch.tpu.mem_get_info()
    assert total == total_kib * 1024
    assert 0 < free <= total


@pytest.mark.parametrize(
    "kind, capability",
    [("TPU v4", (4, 0)), ("TPU v5 lite", (5, 0)), ("TPU v5p", (5, 0)), ("TPU7x", (7, 0)), ("cpu", (0, 0))],
)
def test_device_capability_is_the_tpu_generation(kind, capability):
    assert torch.tpu._capability(kind) == capability


def test_device_capability_of_the_cpu_plugin():
    assert torch.tpu.get_device_capability() == (0, 0)


_GENERATE = """
import json, warnings, torch, transformers
torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=2, n_positions=64)
model = transformers.GPT2LMHeadModel(config).eval().to("tpu")
ids = torch.randint(0, 60, (1, 5)).to("tpu")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0)  # the user's line
print(json.dumps([[w.category.__name__, w.filename, w.lineno] for w in seen]))
"""


def test_recompile_warnings_point_at_the_users_line():
    env = {**os.environ, "TPU_RS_SHAPE_BUCKETS": "off"}  # so the growing cache recompiles
    out = subprocess.run(
        [sys.executable, "-c", _GENERATE], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    seen = [w for w in json.loads(out.stdout.strip().splitlines()[-1]) if w[0] == "RecompileWarning"]
    assert seen, out.stderr
    line = next(n for n, text in enumerate(_GENERATE.splitlines(), 1) if "the user's line" in text)
    assert {(f, n) for _, f, n in seen} == {("<string>", line)}
