"""PyTorch's OpInfo database on the ``tpu`` device against PyTorch's CPU.

Each entry of ``op_db`` has its first samples run on ``tpu`` and compared
with the CPU's results: forward values in float32, bfloat16 and complex64,
and, for entries that support autograd, gradients in float32 and complex64
(each where the CPU runs the entry in that dtype). There is no CPU fallback: an aten op
without a tpu kernel fails its entry.

Run as a script for the summary (``python opinfo.py [--ops a,b]
[--samples N] [--verbose] [--json PATH]``); ``test_opinfo.py`` runs it in a
fresh process under pytest against the pass-rate bars.
"""

import argparse
import collections
import json
import math
import os
import signal
import sys
import time

os.environ.pop("TORCH_TPU_CPU_FALLBACK", None)

import torch  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

#: Samples run per entry and dtype.
SAMPLES = 3
#: Seconds one entry may take before it counts as failed (a hang is a failure).
ENTRY_TIMEOUT_S = 60
#: Forward tolerances per dtype (XLA's transcendental functions differ from
#: PyTorch's by a few ulps).
TOLERANCE = {torch.float32: (1e-4, 1.3e-4), torch.bfloat16: (1e-2, 1.6e-2), torch.complex64: (1e-4, 1.3e-4)}
#: Gradient tolerances (gradients chain several ops).
GRAD_TOLERANCE = (1e-3, 1e-3)


class NotComparable(Exception):
    """Nothing of the stage could be compared on tpu (the CPU itself cannot
    run it, or its values are random): neither a pass nor a failure."""


class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def _map(x, f, other=lambda v: v):
    """``x`` with ``f`` applied to its tensors and ``other`` to its other leaves."""
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, f, other) for v in x)
    if isinstance(x, dict):
        return {k: _map(v, f, other) for k, v in x.items()}
    return other(x)


def _tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _compare(tpu, cpu, tolerance, what):
    if isinstance(cpu, torch.Tensor):
        if not isinstance(tpu, torch.Tensor):
            raise AssertionError(f"{what}: got {type(tpu).__name__}, want a tensor")
        if tpu.device.type != "tpu":
            raise AssertionError(f"{what}: result on {tpu.device}, want tpu")
        atol, rtol = tolerance
        torch.testing.assert_close(
            tpu.cpu(), cpu, atol=atol, rtol=rtol, equal_nan=True, check_stride=False, msg=lambda m: f"{what}: {m}")
    elif isinstance(cpu, (list, tuple)):
        if not isinstance(tpu, (list, tuple)) or len(tpu) != len(cpu):
            raise AssertionError(f"{what}: got {type(tpu).__name__}, want {len(cpu)} results")
        for i, (t, c) in enumerate(zip(tpu, cpu)):
            _compare(t, c, tolerance, f"{what}[{i}]")
    elif isinstance(cpu, float) and math.isnan(cpu):
        if not (isinstance(tpu, float) and math.isnan(tpu)):
            raise AssertionError(f"{what}: got {tpu}, want nan")
    elif tpu != cpu:
        raise AssertionError(f"{what}: got {tpu!r}, want {cpu!r}")


#: Entries whose values are undefined (uninitialised memory).
UNDEFINED_VALUES = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}


def _random(op, sample):
    """True when the op's values cannot be compared, only shapes and
    dtypes: it draws random numbers (its CPU result changes from call to
    call, or the entry fixes the seed itself with `wrapper_set_seed`) or
    leaves memory uninitialised."""
    if op.name in UNDEFINED_VALUES:
        return True
    if "wrapper_set_seed" in getattr(getattr(op.op, "__code__", None), "co_names", ()):
        return True
    a, b = _call(op, sample), _call(op, sample)
    try:
        _compare_cpu(a, b)
        return False
    except AssertionError:
        return True


def _compare_cpu(a, b):
    for x, y in zip(_tensors(a), _tensors(b)):
        torch.testing.assert_close(x, y, equal_nan=True, atol=0, rtol=0)


def _same_shapes(tpu, cpu):
    ts, cs = _tensors(tpu), _tensors(cpu)
    if [(t.shape, t.dtype) for t in ts] != [(c.shape, c.dtype) for c in cs]:
        raise AssertionError("random op: shapes or dtypes differ from the CPU's")


def check_forward(op, dtype, samples):
    """Compares each sample's values on tpu with the CPU's; raises
    :class:`NotComparable` when no sample's values could be compared."""
    compared = 0
    for tpu_sample, sample in samples:
        try:
            torch.manual_seed(0)
            expected = _call(op, sample)
        except Exception as e:  # noqa: BLE001
            raise NotComparable(f"CPU raises {type(e).__name__}") from e
        got = _call(op, tpu_sample)
        if _random(op, sample):
            _same_shapes(got, expected)
        else:
            # As PyTorch's own device tests do: the sample's processing makes
            # outputs that are defined only up to signs (SVD, eigenvectors)
            # comparable.
            process = sample.output_process_fn_grad
            _compare(process(got), process(expected), TOLERANCE[dtype], f"{dtype} forward")
            compared += 1
    if not compared:
        raise NotComparable("random or undefined values (shapes and dtypes checked)")


def _differentiable_outputs(out):
    return [t for t in _tensors(out) if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)]


def check_gradients(op, samples):
    """Compares each sample's gradients on tpu with the CPU's; raises
    :class:`NotComparable` naming why when no sample had any to compare."""
    compared, why = 0, set()
    for tpu_sample, sample in samples:
        inputs = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
        if not inputs:
            why.add("no input requires grad")
            continue
        try:
            out = _differentiable_outputs(sample.output_process_fn_grad(_call(op, sample)))
        except Exception as e:  # noqa: BLE001
            raise NotComparable(f"CPU raises {type(e).__name__}") from e
        if not out:
            why.add("no differentiable output")
            continue
        if _random(op, sample):
            why.add("random values")
            continue
        torch.manual_seed(1)
        cotangents = [torch.randn_like(o) for o in out]
        expected = torch.autograd.grad(out, inputs, cotangents, allow_unused=True)
        tpu_inputs = [t for t in _tensors((tpu_sample.input, tpu_sample.args, tpu_sample.kwargs)) if t.requires_grad]
        tpu_out = _differentiable_outputs(tpu_sample.output_process_fn_grad(_call(op, tpu_sample)))
        got = torch.autograd.grad(tpu_out, tpu_inputs, [c.to("tpu") for c in cotangents], allow_unused=True)
        for i, (g, e) in enumerate(zip(got, expected)):
            if e is None:
                continue
            if g is None:
                raise AssertionError(f"gradient {i}: none on tpu")
            _compare(g, e, GRAD_TOLERANCE, f"gradient {i}")
        compared += 1
    if not compared:
        raise NotComparable(", ".join(sorted(why)) or "no samples")


def _moved(device):
    """Moves a sample's tensors to ``device``: leaves stay leaves with the
    same requires_grad, and a view stays a view of its moved base (lazily
    conjugated as it was), so ops that reach into the storage around it
    (as_strided with a storage offset) see the same elements."""

    def move(t):
        if not isinstance(t, torch.Tensor) or t.device.type == device:
            return t
        if t._base is not None and not t.requires_grad:
            moved = t._base.detach().to(device).as_strided(t.size(), t.stride(), t.storage_offset())
            # A lazy conjugation (negation) reads its base's values conjugated.
            if t.is_conj() != moved.is_conj():
                moved = moved.conj()
            if t.is_neg() != moved.is_neg():
                moved = moved._neg_view()
            return moved
        return t.detach().to(device).requires_grad_(t.requires_grad)

    return move


def _to_cpu_sample(sample):
    """The sample as the CPU runs it, as PyTorch's ``test_compare_cpu``
    does: tensors the sample made on the device move, tensors it made on
    the CPU on purpose (split indices) stay."""
    cpu = sample.transform(_moved("cpu"))
    # Factory functions and `to` are told the device as an argument.
    cpu.args = _map(cpu.args, lambda v: v, _on_cpu)
    cpu.kwargs = _map(cpu.kwargs, lambda v: v, _on_cpu)
    return cpu


def _on_cpu(v):
    if isinstance(v, torch.device) and v.type == "tpu":
        return torch.device("cpu")
    return "cpu" if isinstance(v, str) and v.startswith("tpu") else v


def _samples(op, dtype, requires_grad, n):
    """The entry's first ``n`` samples, made on the device, each paired
    with its CPU copy."""
    out = []
    for s in op.sample_inputs("tpu", dtype, requires_grad=requires_grad):
        out.append((s, _to_cpu_sample(s)))
        if len(out) == n:
            break
    return out


def _first_line(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:200] if text else type(e).__name__


#: The checks each entry gets, in order; the first one is the headline.
STAGES = ("float32 forward", "bfloat16 forward", "float32 gradients", "complex64 forward", "complex64 gradients")


#: A stage's outcomes: compared on tpu and equal, compared and not, or
#: nothing to compare (the reason says why).
PASS, FAIL, NOT_COMPARABLE = "pass", "fail", "n/c"


def _stage(check):
    """``(PASS | FAIL | NOT_COMPARABLE, why)`` for one check of one entry.
    Each starts from the same seed, so an entry's samples do not depend on
    which entries ran before it."""
    torch.manual_seed(0)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(ENTRY_TIMEOUT_S)
    try:
        check()
        return PASS, ""
    except NotComparable as e:
        return NOT_COMPARABLE, str(e)
    except _Timeout:
        return FAIL, f"over {ENTRY_TIMEOUT_S} s"
    except Exception as e:  # noqa: BLE001
        return FAIL, _first_line(e)
    finally:
        signal.alarm(0)


def run_entry(op, samples_per_dtype):
    """``{stage: (outcome, why)}`` for one OpInfo entry. A stage is not
    comparable where the CPU itself does not run it (no float32 or bfloat16
    kernel, no autograd support, a sample the CPU rejects) or nothing of it
    can be compared (no samples, random values, nothing differentiable)."""

    def forward(dtype):
        def check():
            if dtype not in op.supported_dtypes("cpu"):
                raise NotComparable(f"no {dtype} on CPU")
            samples = _samples(op, dtype, False, samples_per_dtype)
            if not samples:
                raise NotComparable("no samples")
            check_forward(op, dtype, samples)

        return check

    def gradients(dtype):
        def check():
            if not op.supports_autograd or dtype not in op.supported_backward_dtypes("cpu"):
                raise NotComparable(f"no {dtype} autograd on CPU")
            check_gradients(op, _samples(op, dtype, True, samples_per_dtype))

        return check

    checks = dict(zip(STAGES, (
        forward(torch.float32), forward(torch.bfloat16), gradients(torch.float32),
        forward(torch.complex64), gradients(torch.complex64))))
    return {stage: _stage(check) for stage, check in checks.items()}


def run(names=None, samples_per_dtype=SAMPLES, log=None):
    """Runs the entries (all, or those named) and returns
    ``{name: {stage: (outcome, why)}}``; ``log`` gets one line per entry."""
    import torch_tpu_rs  # noqa: F401  (registers the tpu device)

    results = {}
    for op in op_db:
        key = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if names and op.name not in names and key not in names:
            continue
        start = time.perf_counter()
        results[key] = run_entry(op, samples_per_dtype)
        if log:
            marks = " ".join(results[key][s][0] for s in STAGES)
            whys = "; ".join(f"{s}: {w}" for s, (o, w) in results[key].items() if o == FAIL)
            log(f"{key:45} {marks:15} {time.perf_counter() - start:6.2f}s {whys}")
    return results


def summary(results, stage=STAGES[0]):
    """``(passed, failed, not_comparable, total)`` for one stage."""
    counts = collections.Counter(r[stage][0] for r in results.values())
    return counts[PASS], counts[FAIL], counts[NOT_COMPARABLE], len(results)


def report(results):
    """The summary lines: one per stage with its rate over the entries
    compared, why the others were not comparable, and the commonest
    failures."""
    lines = []
    failures = collections.Counter()
    for r in results.values():
        for stage, (outcome, why) in r.items():
            if outcome == FAIL:
                failures[f"{stage}: {why[:110]}"] += 1
    lines.append("most common failures:")
    lines += [f"  {n:4}  {why}" for why, n in failures.most_common(40)]
    for stage in STAGES:
        passed, failed, not_comparable, total = summary(results, stage)
        rate = 100 * passed / max(1, passed + failed)
        reasons = collections.Counter(why for r in results.values() for o, why in [r[stage]] if o == NOT_COMPARABLE)
        lines.append(f"OpInfo on tpu, {stage}: {passed} passed, {failed} failed, {not_comparable} not comparable"
                     f" of {total} ({rate:.1f}% of those compared)")
        lines += [f"    not comparable: {n:4}  {why}" for why, n in reasons.most_common(8)]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", help="comma-separated entry names")
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--verbose", action="store_true", help="a line per entry")
    parser.add_argument("--json", help="write {stage: [passed, failed, not comparable, total]} and the failures here")
    args = parser.parse_args()
    names = set(args.ops.split(",")) if args.ops else None
    log = (lambda line: print(line, flush=True)) if args.verbose else None
    results = run(names, args.samples, log)
    print(report(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "summary": {stage: summary(results, stage) for stage in STAGES},
                "failures": {name: {s: why for s, (o, why) in r.items() if o == FAIL}
                             for name, r in results.items()
                             if any(o == FAIL for o, _ in r.values())},
            }, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
