"""PyTorch's Gloo all_reduce (sum, f32 CPU tensors) on 2 processes, the
peer of the `cross_process` bench: one line ``BYTES MEDIAN_US`` per size.

usage: python gloo_all_reduce.py BYTES...
"""
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def runs_for(nbytes):
    return 5 if nbytes >= 4 << 20 else 21


def worker(rank, port, sizes, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        dist.all_reduce(x)
        samples = []
        for _ in range(runs_for(nbytes)):
            start = time.perf_counter()
            dist.all_reduce(x)
            samples.append(time.perf_counter() - start)
        samples.sort()
        if rank == 0:
            out.put((nbytes, samples[len(samples) // 2] * 1e6))
    dist.destroy_process_group()


def main():
    sizes = [int(s) for s in sys.argv[1:]]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, sizes, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in sizes]
    for p in procs:
        p.join(timeout=60)
    for nbytes, us in results:
        print(nbytes, f"{us:.1f}")


if __name__ == "__main__":
    main()
