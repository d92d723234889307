"""Benchmarks of the PyTorch bridge, printing ratios measured in one run:

1. Per-op eager overhead: small ops on ``tpu`` (Strict) against the same ops
   in PyTorch's CPU eager mode; and a function of some 250 small ops run
   eagerly on ``tpu`` (Strict, DeferAndFuse) and as a ``torch.compile``d
   graph (replayed as one block), against PyTorch CPU eager.
2. A GPT-2 training step (4 layers, d=256, vocab 1024, batch 8 x 128;
   forward, backward, AdamW) on ``tpu`` under Strict and DeferAndFuse
   against PyTorch CPU eager: ms/step, the ratio, programs per step, the
   time to issue a step (trace) and to finish it (execute), and the time
   until the first step's work is done and the first three steps' (they
   compile, or load from the on-disk cache when a previous run left them
   there).
3. Generation: Hugging Face ``generate`` (greedy, 48 new tokens after a
   16-token prompt) of a GPT-2 with 2 layers of width 128 and one with 4 of
   width 256 on ``tpu`` under Strict and DeferAndFuse, with the default
   (dynamic) KV cache and the static cache, each with the default settings
   (shape buckets ``pow2``) and with buckets off, against PyTorch CPU
   eager: ms/token, the ratio, and for the first generation after a
   warm-up of another prompt length (11 tokens, 4 new ones): programs
   built, its ms/token (compiles included) and that against the CPU's.
4. FFT: ``rfft`` of a [64, 4096] float32 batch, its ``irfft`` back, and an
   ``stft`` magnitude of 64 one-second 16 kHz signals, on ``tpu`` (Strict)
   against PyTorch CPU eager: ms per call and the ratio.
5. Distributed, on localhost: ``all_reduce`` latency and bus bandwidth of
   ``tpu_dist`` on tpu tensors against Gloo on CPU tensors of the same
   sizes, in the same processes; a DDP step (an MLP, global batch 256) on
   1 and 2 ranks, on tpu (tpu_dist) and on the CPU (Gloo).

    python crates/torch-bridge/benches/bench.py [--steps N] [--skip-gpt2] [--skip-generate] [--skip-fft]
"""

import argparse
import copy
import os
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch
import torch_tpu_rs
import transformers

import gpt2_training

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
        "add_ [64,64]": lambda a, b: a.add_(b),
        "mul scalar [64,64]": lambda a, b: a * 2.0,
        "relu [64,64]": lambda a, b: a.relu(),
        "sum [64,64]": lambda a, b: a.sum(),
        "matmul [64,64]^2": lambda a, b: a @ b,
        "softmax [64,64]": lambda a, b: a.softmax(-1),
        "view(-1)": lambda a, b: a.view(-1),
        "x[0]": lambda a, b: a[0],
        "view+transpose": lambda a, b: a.view(16, 256).t(),
    }
    tx, ty = x.to("tpu"), y.to("tpu")
    for name, fn in cases.items():
        cpu = timed(lambda: fn(x, y), repeats, lambda: None)
        tpu = timed(lambda: fn(tx, ty), repeats, torch.tpu.synchronize)
        print(f"{name:<24}{cpu * 1e6:>14.1f}{tpu * 1e6:>15.1f}{tpu / cpu:>14.2f}")


def compiled_graph(repeats):
    def f(x, w):
        for _ in range(50):
            x = torch.tanh(x @ w) * 0.5 + x
            x = x.reshape(4, 64).t().reshape(16, 16)
        return x

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="tpu_rs")
    x, w = torch.randn(16, 16), torch.randn(16, 16) * 0.1
    tx, tw = x.to("tpu"), w.to("tpu")
    print(f"a function of 250 ops on [16,16] (median of 5 x {repeats} calls)")
    print(f"{'':<24}{'µs/call':>14}{'tpu/cpu time':>14}")
    with torch.no_grad():
        cpu = timed(lambda: f(x, w), repeats, lambda: None)
        rows = [("cpu eager", cpu)]
        for mode in ("strict", "defer_and_fuse"):
            with torch.tpu.set_eager_mode(mode):
                rows.append((f"tpu {mode}", timed(lambda: f(tx, tw), repeats, torch.tpu.synchronize)))
        rows.append(("tpu compiled (replay)", timed(lambda: compiled(tx, tw), repeats, torch.tpu.synchronize)))
    for name, t in rows:
        print(f"{name:<24}{t * 1e6:>14.1f}{t / cpu:>14.2f}")


def spectral(repeats):
    x = torch.randn(64, 4096)
    audio = torch.randn(64, 16000)
    window = torch.hann_window(512)
    cases = [
        ("rfft [64, 4096]", lambda x, a, w: torch.fft.rfft(x)),
        ("irfft(rfft) [64, 4096]", lambda x, a, w: torch.fft.irfft(torch.fft.rfft(x), n=4096)),
        ("|stft| 64 x 16000", lambda x, a, w: torch.stft(a, 512, hop_length=128, window=w, return_complex=True).abs()),
    ]
    print(f"\nFFT (median of 5 x {repeats} calls; tpu under strict)")
    print(f"{'':<26}{'cpu eager ms':>14}{'tpu ms':>10}{'tpu/cpu time':>14}")
    tx, ta, tw = x.to("tpu"), audio.to("tpu"), window.to("tpu")
    with torch.no_grad(), torch.tpu.set_eager_mode("strict"):
        for name, f in cases:
            cpu = timed(lambda: f(x, audio, window), repeats, lambda: None)
            tpu = timed(lambda: f(tx, ta, tw), repeats, torch.tpu.synchronize)
            print(f"{name:<26}{cpu * 1e3:>14.2f}{tpu * 1e3:>10.2f}{tpu / cpu:>14.2f}")


def gpt2_step(steps):
    runner = gpt2_training.runner()

    def measure(device, mode=None):
        step = runner(device)
        sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
        if mode is None:
            return timed(step, steps, sync), None
        with torch.tpu.set_eager_mode(mode):
            # Each of the first steps until its work is done: the first
            # traces and compiles (or loads from the disk cache); programs a
            # later step needs first compile then.
            start = time.perf_counter()
            firsts = []
            for _ in range(3):
                step().item()
                sync()
                firsts.append(time.perf_counter() - start)
            first, settled = firsts[0], firsts[-1]
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
        return t, (programs, first, settled, traced - start, done - traced)

    tokens = gpt2_training.BATCH * gpt2_training.SEQ
    cpu, _ = measure("cpu")
    strict, strict_info = measure("tpu", torch.tpu.EagerMode.STRICT)
    fused, fused_info = measure("tpu", torch.tpu.EagerMode.DEFER_AND_FUSE)
    print(f"\nGPT-2 training step ({gpt2_training.describe()}; median of 5 x {steps} steps)")
    print(f"{'':<22}{'ms/step':>10}{'tokens/s':>11}{'speed vs cpu':>14}{'programs':>10}"
          f"{'trace ms':>10}{'execute ms':>12}{'first step s':>14}{'3 steps s':>11}")
    print(f"{'cpu eager (torch)':<22}{cpu * 1e3:>10.1f}{tokens / cpu:>11.0f}{1.0:>14.2f}")
    for name, t, (programs, first, settled, trace, execute) in [
        ("tpu strict", strict, strict_info),
        ("tpu defer_and_fuse", fused, fused_info),
    ]:
        print(f"{name:<22}{t * 1e3:>10.1f}{tokens / t:>11.0f}{cpu / t:>14.2f}{programs:>10.0f}"
              f"{trace * 1e3:>10.1f}{execute * 1e3:>12.1f}{first:>14.2f}{settled:>11.2f}")
    print(f"defer_and_fuse vs strict: {strict / fused:.2f}x")


def generation():
    # The rows with buckets off recompile per length on purpose.
    warnings.simplefilter("ignore", torch_tpu_rs.RecompileWarning)
    print("generate: greedy, 16-token prompt, 48 new tokens (best of 5, cpu and tpu samples in turn);")
    print("  first: the first generation after a warm-up of an 11-token prompt, compiles included")
    print(
        f"{'model':<10}{'mode':<16}{'cache':<14}{'cpu ms/tok':>11}{'tpu ms/tok':>11}{'tpu/cpu':>9}"
        f"{'first programs':>16}{'first ms/tok':>14}{'first/cpu':>11}"
    )
    prompt = (torch.arange(16) * 7 + 3).remainder(1024).unsqueeze(0)
    for layers, width in ((2, 128), (4, 256)):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=4, vocab_size=1024, n_positions=128)
        cpu_model = transformers.GPT2LMHeadModel(config).eval()
        for cache in ("dynamic", "dynamic, off", "static", "static, off"):
            kwargs = dict(max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)
            if cache.startswith("static"):
                kwargs["cache_implementation"] = "static"

            def per_token(tpu_model, tpu_prompt):
                """ms/token on cpu and on tpu, best of 5 samples taken in
                turn, so both see the same load on the machine."""
                cpu_model.generate(prompt, **kwargs)
                cpu_times, tpu_times = [], []
                for _ in range(5):
                    start = time.perf_counter()
                    cpu_model.generate(prompt, **kwargs)
                    cpu_times.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    tpu_model.generate(tpu_prompt, **kwargs)
                    torch.tpu.synchronize()
                    tpu_times.append(time.perf_counter() - start)
                return min(cpu_times) * 1e3 / 48, min(tpu_times) * 1e3 / 48

            with torch.no_grad():
                for mode in ("strict", "defer_and_fuse"):
                    tpu_model = copy.deepcopy(cpu_model).to("tpu")
                    torch._dynamo.reset()
                    buckets = None if cache.endswith("off") else "pow2"
                    with torch.tpu.set_eager_mode(mode), torch.tpu.set_shape_buckets(buckets):
                        tpu_model.generate(prompt[:, :11].to("tpu"), **dict(kwargs, max_new_tokens=4, min_new_tokens=4))
                        built = torch.tpu.metrics()
                        before = built["compiles"] + built["disk_cache_hits"]
                        start = time.perf_counter()
                        tpu_model.generate(prompt.to("tpu"), **kwargs)
                        torch.tpu.synchronize()
                        first = time.perf_counter() - start
                        built = torch.tpu.metrics()
                        programs = built["compiles"] + built["disk_cache_hits"] - before
                        cpu, tpu = per_token(tpu_model, prompt.to("tpu"))
                    first_ms = first * 1e3 / 48
                    print(
                        f"{f'{layers}x{width}':<10}{mode:<16}{cache:<14}{cpu:>11.2f}{tpu:>11.2f}{tpu / cpu:>8.2f}x"
                        f"{programs:>16}{first_ms:>14.1f}{first_ms / cpu:>10.1f}x"
                    )


def launch(world, steps):
    """Runs ``dist_bench.py`` on ``world`` local ranks; rank 0's lines."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = Path(__file__).with_name("dist_bench.py")
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(steps)],
            env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
            stdout=subprocess.PIPE, text=True,
        )
        for r in range(world)
    ]
    outputs = [p.communicate(timeout=1200)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"the distributed benchmark failed: exit codes {[p.returncode for p in procs]}")
    return [line.split("\t") for line in outputs[0].splitlines() if "\t" in line]


def distributed(steps):
    two, one = launch(2, steps), launch(1, steps)
    print("\nall_reduce on 2 local ranks (float32; median of 5 samples; the slowest rank's time)")
    print(f"{'bytes':>10}{'gloo cpu µs':>13}{'tpu_dist µs':>13}{'gloo GB/s':>11}{'tpu_dist GB/s':>15}{'tpu_dist/gloo time':>20}")
    for _, size, cpu_t, cpu_bw, tpu_t, tpu_bw in (r for r in two if r[0] == "all_reduce"):
        cpu_t, tpu_t = float(cpu_t), float(tpu_t)
        print(f"{size:>10}{cpu_t * 1e6:>13.1f}{tpu_t * 1e6:>13.1f}{float(cpu_bw) / 1e9:>11.2f}"
              f"{float(tpu_bw) / 1e9:>15.2f}{tpu_t / cpu_t:>20.2f}")
    ddp = {(r[1], int(r[2])): float(r[3]) for r in one + two if r[0] == "ddp"}
    print(f"\nDDP step (MLP 4 x 512, AdamW, global batch 256; median of 5 x {steps} steps)")
    print(f"{'':<22}{'1 rank ms':>11}{'2 ranks ms':>12}{'2 ranks / 1 rank time':>23}")
    for device, name in (("cpu", "cpu (gloo)"), ("tpu", "tpu (tpu_dist)")):
        a, b = ddp[(device, 1)], ddp[(device, 2)]
        print(f"{name:<22}{a * 1e3:>11.1f}{b * 1e3:>12.1f}{b / a:>23.2f}")
    print(f"tpu_dist on tpu vs gloo on cpu, 2 ranks: {ddp[('cpu', 2)] / ddp[('tpu', 2)]:.2f}x speed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per sample")
    parser.add_argument("--repeats", type=int, default=200, help="op calls per sample")
    parser.add_argument("--skip-gpt2", action="store_true", help="skip the per-op and training benchmarks")
    parser.add_argument("--skip-generate", action="store_true", help="skip the generation benchmark")
    parser.add_argument("--skip-fft", action="store_true", help="skip the FFT benchmark")
    args = parser.parse_args()
    print(torch.tpu.get_device_properties(0).description)
    if not args.skip_gpt2:
        per_op(args.repeats)
        compiled_graph(max(args.repeats // 10, 1))
        gpt2_step(args.steps)
    if not args.skip_generate:
        generation()
    if not args.skip_fft:
        spectral(max(args.repeats // 20, 1))
    distributed(args.steps)


if __name__ == "__main__":
    main()
