"""PyTorch CPU eager's training-step throughput on the GPT the `gpt` bench
runs (the model of tests/fixtures/torch_gpt.py, AdamW), printed as
``tokens/s N``.

usage: python torch_gpt_step.py VOCAB BLOCK LAYERS HEADS EMBD BATCH STEPS
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
from torch_gpt import Gpt  # noqa: E402


def main():
    vocab, block, layers, heads, embd, batch, steps = map(int, sys.argv[1:8])
    torch.manual_seed(0)
    model = Gpt(vocab, block, layers, heads, embd)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    n = batch * block
    x = (torch.arange(n) * 31 + 7).remainder(vocab).view(batch, block)
    y = (torch.arange(n) * 31 + 38).remainder(vocab).view(batch, block)

    def step():
        loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    print(f"tokens/s {steps * n / (time.perf_counter() - start):.1f}")


if __name__ == "__main__":
    main()
