"""One rank of a ``tpu_dist`` job that ``test_dist.py`` starts, with the
variables torchrun sets: ``python dist_worker.py SCENARIO``. A scenario
that finds anything wrong raises, and the rank exits non-zero."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

TIMEOUT = float(os.environ.get("TPU_DIST_TEST_TIMEOUT", "60"))


def init(backend="tpu_dist"):
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT))
    return dist.get_rank(), dist.get_world_size()


def value(rank, shape, dtype):
    """Rank ``rank``'s small integers: every reduction is exact."""
    n = torch.Size(shape).numel()
    x = (torch.arange(n) * 3 + rank * 5) % 7 - 3
    if dtype.is_floating_point is False and not dtype.is_signed:
        x = x + 3
    return x.reshape(shape).to(dtype)


def exact(got, want, what):
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")


REDUCE = {
    dist.ReduceOp.SUM: lambda xs: sum(xs[1:], xs[0]),
    dist.ReduceOp.PRODUCT: lambda xs: torch.stack(xs).prod(0).to(xs[0].dtype),
    dist.ReduceOp.MAX: lambda xs: torch.stack(xs).amax(0),
    dist.ReduceOp.MIN: lambda xs: torch.stack(xs).amin(0),
    dist.ReduceOp.AVG: lambda xs: torch.stack(xs).mean(0),
}


def collectives(device):
    rank, n = init()
    on = lambda x: x.clone().to(device)
    shape = (2, 3)
    everyone = lambda dtype: [value(r, shape, dtype) for r in range(n)]
    for dtype in (torch.float32, torch.bfloat16, torch.int32, torch.int64):
        for op, reduce in REDUCE.items():
            if op == dist.ReduceOp.AVG and not dtype.is_floating_point:
                continue
            t = value(rank, shape, dtype).to(device)
            dist.all_reduce(t, op=op)
            exact(t, reduce(everyone(dtype)), f"all_reduce {op} {dtype}")

    mine = value(rank, shape, torch.float32)
    for root in range(n):
        t = mine.clone().to(device)
        dist.broadcast(t, src=root)
        exact(t, value(root, shape, torch.float32), f"broadcast from {root}")

    outs = [torch.empty(shape, device=device) for _ in range(n)]
    dist.all_gather(outs, on(mine))
    for r, o in enumerate(outs):
        exact(o, value(r, shape, torch.float32), "all_gather")
    out = torch.empty((n * 2, 3), dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(out, value(rank, shape, torch.int64).to(device))
    exact(out, torch.cat(everyone(torch.int64)), "all_gather_into_tensor")
    stacked = torch.empty((n, 2, 3), device=device)
    dist.all_gather_into_tensor(stacked, on(mine))
    exact(stacked, torch.stack(everyone(torch.float32)), "all_gather_into_tensor, stacked")

    big = lambda r: value(r, (2 * n, 3), torch.float32)
    out = torch.empty(shape, device=device)
    dist.reduce_scatter_tensor(out, big(rank).to(device))
    total = sum(big(r) for r in range(n))
    exact(out, total[2 * rank : 2 * rank + 2], "reduce_scatter_tensor")
    out = torch.empty(shape, device=device)
    dist.reduce_scatter(out, [b.to(device) for b in big(rank).split(2)], op=dist.ReduceOp.MAX)
    peak = torch.stack([big(r) for r in range(n)]).amax(0)
    exact(out, peak[2 * rank : 2 * rank + 2], "reduce_scatter max")

    # all_to_all_single: equal blocks, then rank r sends (r + j) % 3 rows to j.
    out = torch.empty((2 * n, 3), device=device)
    dist.all_to_all_single(out, big(rank).to(device))
    want = torch.cat([big(src)[2 * rank : 2 * rank + 2] for src in range(n)])
    exact(out, want, "all_to_all_single")
    splits = lambda r: [(r + j) % 3 for j in range(n)]
    x = value(rank, (sum(splits(rank)), 3), torch.int32)
    output_splits = [splits(j)[rank] for j in range(n)]
    out = torch.empty((sum(output_splits), 3), dtype=torch.int32, device=device)
    dist.all_to_all_single(out, x.to(device), output_splits, splits(rank))
    want = torch.cat([
        value(src, (sum(splits(src)), 3), torch.int32)[sum(splits(src)[:rank]) :][: splits(src)[rank]]
        for src in range(n)
    ])
    exact(out, want, "all_to_all_single with splits")
    outs = [torch.empty(3, device=device) for _ in range(n)]
    dist.all_to_all(outs, [value(rank * n + j, (3,), torch.float32).to(device) for j in range(n)])
    for src, o in enumerate(outs):
        exact(o, value(src * n + rank, (3,), torch.float32), "all_to_all")

    if n > 1:
        nxt, prev = (rank + 1) % n, (rank - 1) % n
        got = torch.empty(4, dtype=torch.int64, device=device)
        if rank % 2 == 0:
            dist.send(value(rank, (4,), torch.int64).to(device), nxt)
            dist.recv(got, prev)
        else:
            dist.recv(got, prev)
            dist.send(value(rank, (4,), torch.int64).to(device), nxt)
        exact(got, value(prev, (4,), torch.int64), "send/recv")

    t = on(mine)
    work = dist.all_reduce(t, async_op=True)
    assert work.wait(timeout=datetime.timedelta(seconds=TIMEOUT)), "wait"
    exact(t, sum(everyone(torch.float32)), "async all_reduce")

    t = on(mine)
    dist.reduce(t, dst=0)
    exact(t, sum(everyone(torch.float32)) if rank == 0 else mine, "reduce")
    gathered = [torch.empty(shape, device=device) for _ in range(n)] if rank == 0 else None
    dist.gather(on(mine), gathered, dst=0)
    if rank == 0:
        for r, g in enumerate(gathered):
            exact(g, value(r, shape, torch.float32), "gather")
    out = torch.empty(shape, device=device)
    scattered = [value(10 + r, shape, torch.float32).to(device) for r in range(n)] if rank == 0 else None
    dist.scatter(out, scattered, src=0)
    exact(out, value(10 + rank, shape, torch.float32), "scatter")

    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": r} for r in range(n)], objects
    dist.barrier()

    # Bad calls: typed errors naming the collective, and the group goes on.
    if n > 1:
        try:
            dist.reduce_scatter_tensor(torch.empty(1, device=device), torch.ones(n + 1, device=device))
        except RuntimeError as e:
            assert "reduce_scatter" in str(e), e
        else:
            raise AssertionError("reduce_scatter of an uneven input succeeded")
    unsupported = [("BAND", dist.ReduceOp.BAND), ("BOR", dist.ReduceOp.BOR), ("BXOR", dist.ReduceOp.BXOR),
                   ("PREMUL_SUM", dist._make_nccl_premul_sum(2.0))]
    for name, op in unsupported:
        try:
            dist.all_reduce(on(mine), op=op)
        except (NotImplementedError, RuntimeError) as e:
            assert name in str(e), e
        else:
            raise AssertionError(f"{name} succeeded")
    t = on(mine)
    dist.all_reduce(t)
    exact(t, sum(everyone(torch.float32)), "all_reduce after errors")

    # A group of the first and last ranks, in a store of its own.
    if n > 2:
        pair = dist.new_group([0, n - 1])
        t = on(mine)
        if rank in (0, n - 1):
            dist.all_reduce(t, group=pair)
            exact(t, value(0, shape, torch.float32) + value(n - 1, shape, torch.float32), "subgroup")
        else:
            exact(t, mine, "outside the subgroup")
        dist.barrier()
    dist.destroy_process_group()


def mixed():
    """``cpu:gloo,tpu:tpu_dist``: CPU tensors on Gloo, tpu tensors here."""
    rank, n = init("cpu:gloo,tpu:tpu_dist")
    c = torch.full((3,), float(rank))
    t = torch.full((3,), float(rank), device="tpu")
    dist.all_reduce(c)
    dist.all_reduce(t)
    want = torch.full((3,), float(sum(range(n))))
    exact(c, want, "cpu all_reduce")
    exact(t, want, "tpu all_reduce")
    group = dist.distributed_c10d._get_default_group()
    assert group._get_backend(torch.device("tpu")).name() == "tpu_dist"
    dist.destroy_process_group()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    )


def noting_collective_ends(ends):
    """Appends to ``ends`` the time each tpu_dist collective finishes."""
    from torch_tpu_rs import _dist

    submit = _dist.TpuDistBackend._submit

    def noting(self, name, run, result):
        def timed():
            run()
            ends.append(time.perf_counter())

        return submit(self, name, timed, result)

    _dist.TpuDistBackend._submit = noting


def ddp():
    """DDP on 2 ranks, each half of the global batch, against one model in
    the same process on the full batch: equal parameters after every step.
    The gradient all-reduce overlaps backward: in some step, the first
    layer's gradient (among the last computed) exists before the first
    bucket's all-reduce (the last layer's) has finished."""
    rank, n = init()
    ends, first_layer_grad, overlapped = [], [], 0
    noting_collective_ends(ends)
    # As under torchrun: each rank's `tpu` is tpu:LOCAL_RANK, when the
    # process has that many devices (in every thread, autograd's too).
    own = rank if rank < torch.tpu.device_count() else 0
    assert torch.tpu.current_device() == own, (torch.tpu.current_device(), own)
    with torch.tpu.set_eager_mode(os.environ["TPU_DIST_TEST_MODE"]):
        alone = model().to("tpu")
        replica = model().to("tpu")
        assert {p.device for p in replica.parameters()} == {torch.device("tpu", own)}
        ddp = torch.nn.parallel.DistributedDataParallel(replica, bucket_cap_mb=0.001)
        replica[0].weight.register_hook(lambda g: first_layer_grad.append(time.perf_counter()))
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (alone, ddp)]
        for step in range(4):
            ends.clear(), first_layer_grad.clear()
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
            part = slice(rank * 8 // n, (rank + 1) * 8 // n)
            for m, inputs, targets, opt in ((alone, x, y, opts[0]), (ddp, x[part], y[part], opts[1])):
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(inputs.to("tpu")), targets.to("tpu")).backward()
                opt.step()
            overlapped += first_layer_grad[0] < ends[0]
            for (name, a), b in zip(alone.named_parameters(), replica.parameters()):
                assert b.grad.device == torch.device("tpu", own), b.grad.device
                torch.testing.assert_close(
                    b.detach().cpu(), a.detach().cpu(), rtol=0, atol=1e-5,
                    msg=lambda m: f"step {step}, {name}: {m}",
                )
        # Gradient accumulation: two micro-batches, the first under
        # no_sync() (no all-reduce), against the whole batch at once.
        g = torch.Generator().manual_seed(99)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        halves = [slice(h * 8 + rank * 8 // n, h * 8 + (rank + 1) * 8 // n) for h in (0, 1)]
        for opt in opts:
            opt.zero_grad()
        (torch.nn.functional.mse_loss(alone(x.to("tpu")), y.to("tpu"))).backward()
        ends.clear()
        with ddp.no_sync():
            (torch.nn.functional.mse_loss(ddp(x[halves[0]].to("tpu")), y[halves[0]].to("tpu")) / 2).backward()
        assert not ends, f"{len(ends)} collectives ran under no_sync()"
        (torch.nn.functional.mse_loss(ddp(x[halves[1]].to("tpu")), y[halves[1]].to("tpu")) / 2).backward()
        assert ends, "the synchronized micro-batch ran no all-reduce"
        for opt in opts:
            opt.step()
        for (name, a), b in zip(alone.named_parameters(), replica.parameters()):
            torch.testing.assert_close(
                b.detach().cpu(), a.detach().cpu(), rtol=0, atol=1e-5,
                msg=lambda m: f"accumulated step, {name}: {m}",
            )
    assert overlapped, "no all-reduce ran while backward went on"
    print(f"rank {rank}: all-reduce overlapped backward in {overlapped} of 4 steps; no_sync accumulation equal")
    dist.destroy_process_group()


def transformer():
    """Without biases: the key projection's bias has a gradient of exactly
    zero in exact arithmetic (it shifts every score of a row alike), so its
    rounding noise, which AdamW scales up to full steps, would be compared."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, bias=False)
    return torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)


def fsdp2():
    """FSDP2 ``fully_shard`` of a 4-layer transformer (each layer, then the
    whole) on 2 ranks, each half of the global batch, against one model in
    the same process on the full batch: equal losses and parameters after
    each of 5 AdamW steps."""
    rank, n = init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    reshard = os.environ["TPU_DIST_TEST_RESHARD"] == "1"
    with torch.tpu.set_eager_mode(os.environ["TPU_DIST_TEST_MODE"]):
        mesh = init_device_mesh("tpu", (n,))
        alone, sharded = transformer().to("tpu"), transformer().to("tpu")
        for layer in sharded.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(sharded, mesh=mesh, reshard_after_forward=reshard)
        opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (alone, sharded)]
        for step in range(5):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 6, 16, generator=g), torch.randn(8, 6, 16, generator=g)
            part = slice(rank * 8 // n, (rank + 1) * 8 // n)
            losses = []
            for m, inputs, targets, opt in ((alone, x, y, opts[0]), (sharded, x[part], y[part], opts[1])):
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(m(inputs.to("tpu")), targets.to("tpu"))
                loss.backward()
                opt.step()
                losses.append(loss.detach())
            dist.all_reduce(losses[1], op=dist.ReduceOp.AVG)
            torch.testing.assert_close(losses[1].cpu(), losses[0].cpu(), rtol=1e-5, atol=1e-7)
            for (name, a), b in zip(alone.named_parameters(), sharded.parameters()):
                torch.testing.assert_close(
                    b.full_tensor().cpu(), a.detach().cpu(), rtol=1e-5, atol=1e-6,
                    msg=lambda m: f"step {step}, {name}: {m}",
                )
    print(f"rank {rank}: 5 steps equal", flush=True)
    dist.destroy_process_group()


def fsdp2_bf16():
    """FSDP2 with bf16 parameters and f32 gradient reduction: the same
    sharded training on tpu (tpu_dist) and on the CPU (gloo), in one job,
    within bf16 tolerance of each other at each of 5 SGD steps. (AdamW's
    first step is lr * sign(gradient): a gradient that is rounding noise in
    bf16 moves by 2 * lr between any two implementations.)"""
    rank, n = init("cpu:gloo,tpu:tpu_dist")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    models, opts = {}, {}
    for device in ("cpu", "tpu"):
        mesh = init_device_mesh(device, (n,))
        model = transformer().to(device)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        models[device], opts[device] = model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    worst = 0.0
    with torch.tpu.set_eager_mode(os.environ["TPU_DIST_TEST_MODE"]):
        for step in range(5):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 6, 16, generator=g), torch.randn(8, 6, 16, generator=g)
            part = slice(rank * 8 // n, (rank + 1) * 8 // n)
            losses = {}
            for device, model in models.items():
                opts[device].zero_grad()
                out = model(x[part].to(device))
                assert out.dtype == torch.bfloat16, out.dtype
                loss = torch.nn.functional.mse_loss(out.float(), y[part].to(device))
                loss.backward()
                opts[device].step()
                losses[device] = loss.detach().cpu()
            torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-2, atol=1e-2,
                                       msg=lambda m: f"step {step} loss: {m}")
            for (name, a), b in zip(models["cpu"].named_parameters(), models["tpu"].parameters()):
                assert b.dtype == torch.float32 and b.device.type == "tpu"
                a, b = a.full_tensor(), b.full_tensor().cpu()
                worst = max(worst, (a - b).abs().max().item())
                torch.testing.assert_close(b, a, rtol=1e-2, atol=1e-2, msg=lambda m: f"step {step}, {name}: {m}")
    print(f"rank {rank}: 5 bf16 steps within bf16 tolerance of gloo on cpu (largest difference {worst:.2e})", flush=True)
    dist.destroy_process_group()


def dtensor():
    """A column-parallel then row-parallel linear pair over a DTensor mesh
    of 2 tpu ranks, against one process's result."""
    init()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("tpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(3, 4), torch.randn(8, 4), torch.randn(4, 8)
    linear = torch.nn.functional.linear
    want = linear(linear(x, w1).relu(), w2)
    y = linear(
        distribute_tensor(x.to("tpu"), mesh, [Replicate()]),
        distribute_tensor(w1.to("tpu"), mesh, [Shard(0)]),
    ).relu()
    z = linear(y, distribute_tensor(w2.to("tpu"), mesh, [Shard(1)]))
    assert y.placements == (Shard(1),) and z.placements == (Partial(),), (y.placements, z.placements)
    torch.testing.assert_close(z.full_tensor().cpu(), want, rtol=1e-5, atol=1e-5)
    shard = distribute_tensor(w1.to("tpu"), mesh, [Shard(0)])
    rows = 8 // dist.get_world_size()
    exact(shard.to_local(), w1[dist.get_rank() * rows :][:rows], "Shard(0) local block")
    dist.destroy_process_group()


def dead():
    """The last rank exits right after joining; the others must fail in
    their next collectives within twice the timeout, naming it."""
    rank, n = init()
    if rank == n - 1:
        os._exit(0)
    start = time.monotonic()
    t = torch.ones(4, device="tpu")
    try:
        while time.monotonic() - start < 4 * TIMEOUT:
            dist.all_reduce(t)
    except RuntimeError as e:
        took = time.monotonic() - start
        text = str(e)
        assert took < 2 * TIMEOUT, f"took {took:.1f} s: {text}"
        assert "all_reduce" in text and f"rank {n - 1}" in text, text
        print(f"failed after {took:.2f} s: {text}", flush=True)
        if rank == 0:
            # The stores live here: they stay until the others have read
            # who is missing.
            time.sleep(TIMEOUT)
        os._exit(0)
    raise AssertionError("collectives kept succeeding with a rank dead")


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "collectives":
        collectives(os.environ.get("TPU_DIST_TEST_DEVICE", "tpu"))
    else:
        {"mixed": mixed, "ddp": ddp, "fsdp2": fsdp2, "fsdp2_bf16": fsdp2_bf16, "dtensor": dtensor, "dead": dead}[scenario]()
