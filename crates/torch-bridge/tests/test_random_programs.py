"""Seeded random programs of tensor ops, run on the CPU and on tpu in each
eager mode, must leave the same values behind.

A program keeps a pool of tensors and applies ops to it: new tensors,
elementwise ops with broadcasting and type promotion, casts, reductions,
products, views that alias (slices, transposes, selects, reshapes,
expands), in-place writes through those views, ``out=`` forms, host reads,
and dropped tensors with ``gc.collect()`` and allocation churn in between,
so that freed buffers are reused while others still alias them. Every
choice depends only on the seed and on shapes and dtypes, so both devices
run the same program."""

import gc
import random

import pytest
import torch

MODES = ["strict", "debug", "defer_and_fuse"]
SEEDS = range(16)
OPS_PER_PROGRAM = 60
SHAPES = [(4,), (3, 4), (2, 3, 4), (1, 4), (3, 1), (2, 1, 4)]
DTYPES = [torch.float32, torch.float32, torch.float64, torch.int64, torch.int32, torch.bfloat16, torch.bool]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


def _broadcastable(a, b):
    try:
        torch.broadcast_shapes(a, b)
        return True
    except RuntimeError:
        return False


def _shares(a, b):
    # Storage identity by data pointer: distinct per live storage on both
    # devices, so both programs decide alike.
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _writable(t):
    # Expanded views (stride 0 over a dim of size > 1) cannot be written.
    return all(s != 0 or n == 1 for n, s in zip(t.shape, t.stride()))


class Program:
    """One seeded program on one device."""

    def __init__(self, seed, device):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.device = device
        self.pool = []
        self.reads = []

    def fresh(self, shape, dtype):
        if dtype == torch.bool:
            cpu = torch.rand(shape, generator=self.gen) > 0.5
        elif dtype.is_floating_point:
            cpu = (torch.rand(shape, generator=self.gen) * 4 - 2).to(dtype)
        else:
            cpu = torch.randint(-5, 6, shape, generator=self.gen).to(dtype)
        return cpu.to(self.device)

    def pick(self, pred=lambda t: True):
        choices = [i for i, t in enumerate(self.pool) if pred(t)]
        return self.pool[self.rng.choice(choices)] if choices else None

    def step(self):
        kind = self.rng.choice(
            ["new", "binary", "binary", "unary", "view", "view", "inplace", "inplace", "out", "reduce", "matmul", "cast", "drop", "read"]
        )
        if kind == "new" or len(self.pool) < 2:
            self.pool.append(self.fresh(self.rng.choice(SHAPES), self.rng.choice(DTYPES)))
        elif kind == "binary":
            a = self.pick()
            b = self.pick(lambda t: _broadcastable(t.shape, a.shape))
            op = self.rng.choice(BINARY)
            if torch.bool in (a.dtype, b.dtype) and op == "sub":
                op = "add" if a.dtype != b.dtype else "maximum"
            if a.dtype == b.dtype == torch.bool and op in ("add", "mul"):
                op = "maximum"
            self.pool.append(getattr(torch, op)(a, b))
        elif kind == "unary":
            a = self.pick(lambda t: t.dtype.is_floating_point)
            if a is not None:
                self.pool.append(getattr(torch, self.rng.choice(["neg", "abs", "tanh", "relu", "sigmoid"]))(a))
        elif kind == "view":
            self.view()
        elif kind == "inplace":
            self.inplace()
        elif kind == "out":
            self.out()
        elif kind == "reduce":
            a = self.pick(lambda t: t.ndim > 0 and t.dtype != torch.bool)
            if a is not None:
                dim = self.rng.randrange(a.ndim)
                if a.dtype.is_floating_point and self.rng.random() < 0.5:
                    self.pool.append(a.mean(dim, keepdim=self.rng.random() < 0.5))
                else:
                    self.pool.append(a.sum(dim))
        elif kind == "matmul":
            a = self.pick(lambda t: t.ndim == 2 and t.dtype in (torch.float32, torch.float64))
            if a is not None:
                b = self.pick(lambda t: t.ndim == 2 and t.dtype == a.dtype and t.shape[0] == a.shape[1])
                if b is not None:
                    self.pool.append(a @ b)
        elif kind == "cast":
            self.pool.append(self.pick().to(self.rng.choice(DTYPES)))
        elif kind == "drop":
            del self.pool[self.rng.randrange(len(self.pool))]
            churn = [self.fresh(self.rng.choice(SHAPES), torch.float32) for _ in range(self.rng.randrange(4))]
            del churn
            gc.collect()
        elif kind == "read":
            # A copy: on the CPU `.cpu()` returns the tensor itself.
            self.reads.append(self.pick().cpu().clone())

    def view(self):
        a = self.pick(lambda t: t.ndim > 0)
        if a is None:
            return
        how = self.rng.choice(["slice", "transpose", "select", "unsqueeze", "flatten", "expand"])
        dim = self.rng.randrange(a.ndim)
        if how == "slice" and a.shape[dim] > 1:
            self.pool.append(a.narrow(dim, 1, a.shape[dim] - 1))
        elif how == "transpose" and a.ndim >= 2:
            self.pool.append(a.transpose(0, a.ndim - 1))
        elif how == "select" and a.ndim >= 2:
            self.pool.append(a.select(dim, a.shape[dim] - 1))
        elif how == "unsqueeze":
            self.pool.append(a.unsqueeze(dim))
        elif how == "flatten" and a.is_contiguous():
            self.pool.append(a.view(-1))
        elif how == "expand" and 1 in a.shape:
            self.pool.append(a.expand(*[3 if n == 1 else n for n in a.shape]))

    def inplace(self):
        x = self.pick(_writable)
        if x is None:
            return
        y = self.pick(
            lambda t: not _shares(t, x)
            and _broadcastable(t.shape, x.shape)
            and torch.broadcast_shapes(t.shape, x.shape) == x.shape
            and torch.can_cast(torch.result_type(x, t), x.dtype)
        )
        if y is None:
            return
        how = self.rng.choice(["add_", "mul_", "copy_", "fill_"])
        if how == "fill_":
            x.fill_(self.rng.choice([0, 1, 2]))
        elif how == "copy_":
            x.copy_(y)
        elif x.dtype == torch.bool:
            x.logical_or_(y) if how == "add_" else x.logical_and_(y)
        else:
            getattr(x, how)(y)

    def out(self):
        a = self.pick(lambda t: t.dtype != torch.bool)
        b = self.pick(lambda t: _broadcastable(t.shape, a.shape) and t.dtype != torch.bool)
        if b is None:
            return
        shape = torch.broadcast_shapes(a.shape, b.shape)
        dtype = torch.result_type(a, b)
        dst = self.pick(
            lambda t: t.shape == shape and t.dtype == dtype and _writable(t) and not _shares(t, a) and not _shares(t, b)
        )
        if dst is None or self.rng.random() < 0.3:
            dst = torch.empty(0, dtype=dtype, device=self.device)
            self.pool.append(dst)
        torch.add(a, b, out=dst)

    def run(self):
        for _ in range(OPS_PER_PROGRAM):
            self.step()
        return [t.cpu() for t in self.pool], self.reads


def first_divergence(seed, mode):
    """Runs both programs in lockstep and names the first step after which
    their pools differ (for the failure message)."""
    cpu = Program(seed, "cpu")
    with torch.tpu.set_eager_mode(mode):
        tpu = Program(seed, "tpu")
        for step in range(OPS_PER_PROGRAM):
            cpu.step()
            tpu.step()
            for i, (a, b) in enumerate(zip(cpu.pool, tpu.pool)):
                try:
                    torch.testing.assert_close(b.cpu(), a, equal_nan=True, **_tolerance(a.dtype))
                except AssertionError as e:
                    return f"step {step}: pool[{i}] ({a.dtype}{list(a.shape)}) differs: {e}"
    return "no divergence in lockstep"


def _tolerance(dtype):
    if dtype == torch.bfloat16:
        return dict(atol=0.1, rtol=0.05)
    if dtype.is_floating_point:
        return dict(atol=1e-4, rtol=1e-4)
    return dict(atol=0, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_program_equals_cpu(seed, mode):
    want_pool, want_reads = Program(seed, "cpu").run()
    with torch.tpu.set_eager_mode(mode):
        program = Program(seed, "tpu")
        got_pool, got_reads = program.run()
        assert all(t.device.type == "tpu" for t in program.pool)
    assert len(got_pool) == len(want_pool)
    for i, (got, want) in enumerate(zip(got_pool + got_reads, want_pool + want_reads)):
        assert got.dtype == want.dtype and got.shape == want.shape, i
        close = torch.isclose(got.double(), want.double(), equal_nan=True, **_tolerance(want.dtype)).all()
        assert close, f"tensor {i} differs; lockstep replay: {first_divergence(seed, mode)}"
