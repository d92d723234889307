"""How many aten calls on tpu still reach a Python kernel, for GPT-2 (4
layers, 256 wide, sequence 128, batch 8): the training forward pass, a
greedy decode loop with Hugging Face's dynamic cache, and a whole AdamW
training step (its backward runs on autograd's device threads, which a
dispatch mode does not see, so only its Python kernel calls are counted).
Run with ``TORCH_TPU_COUNT_KERNELS=1``; prints a table and writes JSON."""

import argparse
import collections
import json

import torch
import torch_tpu_rs
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch_tpu_rs.aten import PYTHON_KERNEL_CALLS

transformers.logging.set_verbosity_error()


def _on_tpu(args, kwargs):
    for a in (*args, *kwargs.values()):
        for t in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(t, torch.Tensor) and t.device.type == "tpu":
                return True
            if isinstance(t, torch.device) and t.type == "tpu":
                return True
    return False


class AtenCalls(TorchDispatchMode):
    """Counts the aten calls that run on tpu, by overload."""

    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _on_tpu(args, kwargs):
            self.calls[func._schema.name.removeprefix("aten::") + ("." + func._overloadname if func._overloadname != "default" else "")] += 1
        return func(*args, **kwargs)


def measure(name, work):
    before = PYTHON_KERNEL_CALLS.copy()
    with AtenCalls() as counter:
        work()
    torch.tpu.synchronize()
    python = PYTHON_KERNEL_CALLS - before
    return {"workload": name, "aten": dict(counter.calls), "python": dict(python)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, vocab_size=1000)
    model = transformers.GPT2LMHeadModel(config).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1000, (8, 128)).to("tpu")

    def step():
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        step()
    model.eval()
    prompt = torch.randint(0, 1000, (1, 8)).to("tpu")

    def decode():
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)

    decode()
    def forward():
        model(ids, labels=ids).loss.item()

    model.train()
    results = [measure("forward", forward), measure("training step", step)]
    model.eval()
    results.append(measure("decode", decode))
    for r in results:
        aten, python = sum(r["aten"].values()), sum(r["python"].values())
        r["share"] = python / max(aten, 1)
        seen = f"{aten} aten calls on tpu, " if r["workload"] != "training step" else ""
        print(f"{r['workload']}: {seen}{python} reached a Python kernel" + (f" ({r['share']:.0%})" if seen else ""))
        for op, n in collections.Counter(r["python"]).most_common(12):
            print(f"    {op:<40}{n:>6}")
    with open(args.json, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
