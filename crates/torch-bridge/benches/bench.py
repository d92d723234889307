"""Benchmarks of the PyTorch bridge, printing ratios measured in one run:

1. Per-op eager overhead: small ops on ``tpu`` (Strict) against the same ops
   in PyTorch's CPU eager mode.
2. A GPT-2 training step (4 layers, d=256, vocab 1024, batch 8 x 128;
   forward, backward, AdamW) on ``tpu`` under Strict and DeferAndFuse
   against PyTorch CPU eager: ms/step, the ratio, programs per step, the
   time to issue a step (trace) and to finish it (execute), and the first
   step's time (compiles, or loads from the on-disk cache when a previous
   run left them there).

    python crates/torch-bridge/benches/bench.py [--steps N]
"""

import argparse
import copy
import statistics
import time

import torch
import transformers

transformers.logging.set_verbosity_error()


def timed(fn, repeats, sync):
    fn()
    sync()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / repeats)
    return statistics.median(samples)


def per_op(repeats):
    print(f"per-op eager time (median of 5 x {repeats} calls; results stay on the device)")
    print(f"{'op':<24}{'cpu eager µs':>14}{'tpu strict µs':>15}{'tpu/cpu time':>14}")
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    cases = {
        "add [64,64]": lambda a, b: a + b,
        "mul scalar [64,64]": lambda a, b: a * 2.0,
        "relu [64,64]": lambda a, b: a.relu(),
        "sum [64,64]": lambda a, b: a.sum(),
        "matmul [64,64]^2": lambda a, b: a @ b,
        "softmax [64,64]": lambda a, b: a.softmax(-1),
        "view+transpose": lambda a, b: a.view(16, 256).t(),
    }
    tx, ty = x.to("tpu"), y.to("tpu")
    for name, fn in cases.items():
        cpu = timed(lambda: fn(x, y), repeats, lambda: None)
        tpu = timed(lambda: fn(tx, ty), repeats, torch.tpu.synchronize)
        print(f"{name:<24}{cpu * 1e6:>14.1f}{tpu * 1e6:>15.1f}{tpu / cpu:>14.2f}")


def gpt2_step(steps):
    config = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=1024, n_positions=128)
    torch.manual_seed(0)
    base = transformers.GPT2LMHeadModel(config)
    base.train()
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    batch = torch.randint(0, config.vocab_size, (8, 128))

    def runner(device):
        model = copy.deepcopy(base).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = batch.to(device)

        def step():
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            return loss

        return step

    def measure(device, mode=None):
        step = runner(device)
        sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
        if mode is None:
            return timed(step, steps, sync), None
        with torch.tpu.set_eager_mode(mode):
            start = time.perf_counter()
            step().item()  # traces and compiles (or loads from the disk cache)
            first = time.perf_counter() - start
            for _ in range(2):  # settle
                step().item()
            t = timed(step, steps, sync)
            # One step on its own: programs it runs, time to issue it (trace)
            # and time until its results exist (execute).
            before = torch.tpu.metrics()["executions"]
            start = time.perf_counter()
            step()
            traced = time.perf_counter()
            sync()
            done = time.perf_counter()
            programs = torch.tpu.metrics()["executions"] - before
        return t, (programs, first, traced - start, done - traced)

    tokens = batch.numel()
    cpu, _ = measure("cpu")
    strict, strict_info = measure("tpu", torch.tpu.EagerMode.STRICT)
    fused, fused_info = measure("tpu", torch.tpu.EagerMode.DEFER_AND_FUSE)
    print(f"\nGPT-2 training step ({config.n_layer} layers, d={config.n_embd}, vocab {config.vocab_size}, "
          f"batch {tuple(batch.shape)}, AdamW; median of 5 x {steps} steps)")
    print(f"{'':<22}{'ms/step':>10}{'tokens/s':>11}{'speed vs cpu':>14}{'programs':>10}"
          f"{'trace ms':>10}{'execute ms':>12}{'first step s':>14}")
    print(f"{'cpu eager (torch)':<22}{cpu * 1e3:>10.1f}{tokens / cpu:>11.0f}{1.0:>14.2f}")
    for name, t, (programs, first, trace, execute) in [
        ("tpu strict", strict, strict_info),
        ("tpu defer_and_fuse", fused, fused_info),
    ]:
        print(f"{name:<22}{t * 1e3:>10.1f}{tokens / t:>11.0f}{cpu / t:>14.2f}{programs:>10.0f}"
              f"{trace * 1e3:>10.1f}{execute * 1e3:>12.1f}{first:>14.2f}")
    print(f"defer_and_fuse vs strict: {strict / fused:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per sample")
    parser.add_argument("--repeats", type=int, default=200, help="op calls per sample")
    args = parser.parse_args()
    print(torch.tpu.get_device_properties(0).description)
    per_op(args.repeats)
    gpt2_step(args.steps)


if __name__ == "__main__":
    main()
