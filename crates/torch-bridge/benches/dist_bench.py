"""The distributed half of ``bench.py``: one rank of a job on localhost,
started by it with torchrun's variables. The job's group is
``cpu:gloo,tpu:tpu_dist``, so the same processes time Gloo on CPU tensors
and tpu_dist on tpu tensors of the same sizes. Rank 0 prints
tab-separated results for ``bench.py`` to lay out."""

import datetime
import statistics
import sys
import time

import torch
import torch.distributed as dist

SIZES = [256, 16 * 1024, 256 * 1024, 4 * 1024 * 1024]  # float32 elements


def timed(fn, sync, repeats):
    fn()
    sync()
    samples = []
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / repeats)
    # Every rank reports the slowest's time: a collective ends for all.
    t = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_reduce():
    n = dist.get_world_size()
    for size in SIZES:
        repeats = max(3, min(200, 2_000_000 // size))
        row = [f"all_reduce\t{size * 4}"]
        for device, sync in (("cpu", lambda: None), ("tpu", torch.tpu.synchronize)):
            x = torch.ones(size, device=device)
            t = timed(lambda: dist.all_reduce(x), sync, repeats)
            # Bus bandwidth, as nccl-tests counts it: what each rank moves.
            row.append(f"{t}\t{2 * (n - 1) / n * size * 4 / t}")
        if dist.get_rank() == 0:
            print("\t".join(row), flush=True)


def ddp_step(device, steps):
    torch.manual_seed(0)
    width = 512
    model = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(width, width), torch.nn.GELU())])
    model = torch.nn.parallel.DistributedDataParallel(model.to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = 256 // dist.get_world_size()
    x = torch.randn(batch, width, device=device)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    sync = torch.tpu.synchronize if device == "tpu" else (lambda: None)
    for _ in range(2):
        step()
    t = timed(step, sync, steps)
    if dist.get_rank() == 0:
        print(f"ddp\t{device}\t{dist.get_world_size()}\t{t}", flush=True)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    dist.init_process_group("cpu:gloo,tpu:tpu_dist", timeout=datetime.timedelta(seconds=300))
    if dist.get_world_size() > 1:
        all_reduce()
    for device in ("cpu", "tpu"):
        ddp_step(device, steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
