"""Soak test: a small MLP trained on ``tpu`` for many steps, watching for
leaks. Every ``--every`` steps it prints the step, the device bytes tpu-rs
buffers hold (``torch.tpu.metrics()["live_bytes"]``), the programs built
(``compiles``, fresh compiles, plus ``disk_cache_hits``, programs loaded from
the on-disk cache) and the process's resident memory. At the end a verdict:
``flat`` when, from the warm-up step on, device bytes and programs do not
change and RSS stays within 2% of its value then; otherwise what grew.

    python crates/torch-bridge/benches/soak.py [--steps 10000] [--every 500]
        [--warmup 1000] [--json PATH]
    TPU_RS_EAGER=defer_and_fuse python crates/torch-bridge/benches/soak.py

It runs in the eager mode in force (``TPU_RS_EAGER``). ``--json`` also
writes the table and verdict as JSON; the reliability tests run it with a
few hundred steps and read that. ``make_model``, ``make_data`` and
``train_step`` are shared with those tests.
"""

import argparse
import json
import os

import torch

WIDTH = 64
BATCH = 32
CLASSES = 10
#: RSS may move this much (relative) after warm-up and still count as flat.
RSS_TOLERANCE = 0.02


def make_model(device, seed=0):
    """Three Linear layers of width 64 and their AdamW, on ``device``."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, CLASSES),
    ).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def make_data(batches=8, seed=1):
    """A few CPU batches to cycle through (each step copies one over)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
        for _ in range(batches)
    ]


def train_step(model, opt, batch, device):
    """One step: forward, cross-entropy, backward, AdamW; the loss as a float."""
    x, y = (t.to(device) for t in batch)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def sample(step, loss):
    m = torch.tpu.metrics()
    return {
        "step": step,
        "loss": loss,
        "live_bytes": m["live_bytes"],
        "compiles": m["compiles"],
        "disk_cache_hits": m["disk_cache_hits"],
        "programs": m["compiles"] + m["disk_cache_hits"],
        "rss": rss_bytes(),
    }


def format_table(rows):
    lines = [f"{'step':>7} {'live bytes':>12} {'compiles':>9} {'disk hits':>10} {'rss MiB':>9} {'loss':>10}"]
    for r in rows:
        lines.append(
            f"{r['step']:>7} {r['live_bytes']:>12} {r['compiles']:>9} {r['disk_cache_hits']:>10}"
            f" {r['rss'] / 2**20:>9.1f} {r['loss']:>10.4g}"
        )
    return "\n".join(lines)


def verdict(rows, warmup):
    """``flat``, or what grew after ``warmup`` (the first row at or past it)."""
    after = [r for r in rows if r["step"] >= warmup]
    if len(after) < 2:
        return f"too short: no two samples from step {warmup} on"
    base, grew = after[0], []
    for key in ("live_bytes", "programs"):
        values = [r[key] for r in after]
        if len(set(values)) > 1:
            grew.append(f"{key} {base[key]} -> {after[-1][key]} (min {min(values)}, max {max(values)})")
    top = max(r["rss"] for r in after)
    if top > base["rss"] * (1 + RSS_TOLERANCE):
        grew.append(f"rss {base['rss'] / 2**20:.1f} MiB -> max {top / 2**20:.1f} MiB")
    return "flat" if not grew else "grew: " + "; ".join(grew)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=1_000)
    parser.add_argument("--json", help="also write the table and verdict here")
    args = parser.parse_args()

    mode = torch.tpu.eager_mode().value
    print(f"soak: {args.steps} steps, eager mode {mode}", flush=True)
    model, opt = make_model("tpu")
    data = make_data()
    rows = [sample(0, float("nan"))]
    print(format_table(rows), flush=True)
    for step in range(1, args.steps + 1):
        loss = train_step(model, opt, data[step % len(data)], "tpu")
        if step % args.every == 0:
            rows.append(sample(step, loss))
            print(format_table(rows[-1:]).splitlines()[1], flush=True)
    result = verdict(rows, args.warmup)
    print(f"verdict ({mode}, after step {args.warmup}): {result}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode, "rows": rows, "verdict": result}, f)


if __name__ == "__main__":
    main()
