"""Cold start: the first steps of models on ``tpu`` into an empty executable
cache (a fresh ``TPU_RS_CACHE_DIR``) and again with the cache that run
filled, against PyTorch CPU eager's first steps, each in a fresh process.

Cases: the Hugging Face GPT-2 training step ``bench.py`` times
(``gpt2_training.py``) under Strict and DeferAndFuse, and a ``timm``
DenseNet-121 (121 layers with batch norm) forward and backward on 2 images
of 64 x 64 under Strict. Printed per case: programs compiled, compile
seconds (summed over the compile threads, which run at once), the first
step, the first three steps (by then every program is built), and the
CPU's first step and first three.

    python crates/torch-bridge/benches/cold_start.py
"""

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

STEPS = 3


def gpt2():
    import gpt2_training

    return gpt2_training.runner()


def densenet():
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("densenet121", pretrained=False)
    images = torch.randn(2, 3, 64, 64)

    def on(device):
        m = copy.deepcopy(model).to(device)
        x = images.to(device)

        def step():
            m.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            return loss

        return step

    return on


CASES = {"gpt2": gpt2, "densenet121": densenet}


def child(case, device, mode):
    """Runs STEPS steps and prints their times and the runtime's counters."""
    import torch
    import torch_tpu_rs  # noqa: F401

    warnings.filterwarnings("ignore")
    step = CASES[case]()(device)
    times = []
    with torch.tpu.set_eager_mode(mode):
        for _ in range(STEPS):
            start = time.perf_counter()
            step().item()
            if device == "tpu":
                torch.tpu.synchronize()  # until the step's work is done
            times.append(time.perf_counter() - start)
    metrics = torch.tpu.metrics()
    print(json.dumps({"times": times, "compiles": metrics["compiles"], "compile_seconds": metrics["compile_seconds"]}))


def run(case, device, mode, cache):
    env = dict(os.environ, TPU_RS_CACHE_DIR=cache)
    out = subprocess.run(
        [sys.executable, __file__, "--child", case, device, mode],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{case} on {device} ({mode}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    cases = [("gpt2", "strict"), ("gpt2", "defer_and_fuse"), ("densenet121", "strict")]
    print(f"{'case':<28}{'cache':>7}{'programs':>10}{'compile s':>11}{'first s':>9}{'3 steps s':>11}{'cpu first s':>13}{'cpu 3 s':>9}")
    for case, mode in cases:
        cpu = run(case, "cpu", "strict", "")
        with tempfile.TemporaryDirectory() as cache:
            for label in ("cold", "warm"):
                r = run(case, "tpu", mode, cache)
                print(
                    f"{case + ' ' + mode:<28}{label:>7}{r['compiles']:>10}{r['compile_seconds']:>11.2f}"
                    f"{r['times'][0]:>9.2f}{sum(r['times']):>11.2f}{cpu['times'][0]:>13.2f}{sum(cpu['times']):>9.2f}"
                )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
    else:
        main()
