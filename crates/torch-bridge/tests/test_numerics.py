"""Accuracy of the reductions and normalisations models lean on, on inputs
that are hard for float32: a large mean with a small spread. Each result
is judged against a float64 CPU run, relative to PyTorch's own float32 CPU
error on the same input: tpu may be more accurate than the CPU, never
much less."""

import pytest
import torch
import torch.nn.functional as F

# How much further from float64 than PyTorch's float32 CPU run a tpu result
# may be, and a floor of a few float32 ulps (relative to the result's norm)
# for results the CPU happens to round almost exactly.
WORSE_THAN_CPU = 4.0
ULPS = 8 * torch.finfo(torch.float32).eps

INPUTS = {
    # Batch-norm-like activations: mean 1e4, standard deviation 1e-2.
    "mean 1e4 std 1e-2": lambda g: torch.randn(16, 8, 12, 12, generator=g, dtype=torch.float64) * 1e-2 + 1e4,
    "mean -300 std 1e-3": lambda g: torch.randn(16, 8, 12, 12, generator=g, dtype=torch.float64) * 1e-3 - 300,
    "mean 0 std 1": lambda g: torch.randn(16, 8, 12, 12, generator=g, dtype=torch.float64),
}


def _batch_norm(x):
    running_mean = torch.zeros(x.shape[1], dtype=x.dtype, device=x.device)
    running_var = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    y, save_mean, save_invstd = torch.ops.aten.native_batch_norm(x, None, None, running_mean, running_var, True, 0.5, 1e-5)
    return {"y": y, "save_mean": save_mean, "save_invstd": save_invstd, "running_mean": running_mean, "running_var": running_var}


def _layer_norm(x):
    flat = x.reshape(x.shape[0], -1)
    y, mean, rstd = torch.ops.aten.native_layer_norm(flat, [flat.shape[1]], None, None, 1e-5)
    return {"y": y, "mean": mean, "rstd": rstd}


def _group_norm(x):
    n, c = x.shape[:2]
    y, mean, rstd = torch.ops.aten.native_group_norm(x, None, None, n, c, x[0, 0].numel(), 4, 1e-5)
    return {"y": y, "mean": mean, "rstd": rstd}


def _moments(x):
    var, mean = torch.var_mean(x, dim=(0, 2, 3))
    return {"var": torch.var(x, dim=(0, 2, 3), correction=0), "std": x.std(dim=(2, 3)), "var_mean.var": var,
            "var_mean.mean": mean, "mean": x.mean(dim=(0, 2, 3))}


def _softmax(x):
    rows = x.reshape(x.shape[0] * x.shape[1], -1)
    return {"softmax": rows.softmax(-1), "log_softmax": rows.log_softmax(-1), "logsumexp": rows.logsumexp(-1)}


def _grads(forward):
    """The gradients of a weighted sum of ``forward``'s outputs with respect
    to its input, weight and bias."""
    def run(x):
        c = x.shape[1]
        g = torch.Generator().manual_seed(7)
        weight = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(x.device, x.dtype).requires_grad_()
        bias = torch.randn(c, generator=g, dtype=torch.float64).to(x.device, x.dtype).requires_grad_()
        x = x.detach().requires_grad_()
        y = forward(x, weight, bias)
        w = torch.randn(y.shape, generator=g, dtype=torch.float64).to(x.device, x.dtype)
        (y * w).sum().backward()
        return {"grad input": x.grad, "grad weight": weight.grad, "grad bias": bias.grad}

    return run


CASES = {
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "group_norm": _group_norm,
    "var/std/mean": _moments,
    "softmax/logsumexp": _softmax,
    "batch_norm backward": _grads(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)),
    "group_norm backward": _grads(lambda x, w, b: F.group_norm(x, 4, w, b)),
    "layer_norm backward": _grads(lambda x, w, b: F.layer_norm(x.transpose(1, 3), (x.shape[1],), w, b)),
}


@pytest.mark.parametrize("input_name", INPUTS)
@pytest.mark.parametrize("case", CASES)
def test_as_accurate_as_the_cpu_against_float64(mode, case, input_name):
    x64 = INPUTS[input_name](torch.Generator().manual_seed(0))
    x32 = x64.float()
    reference = CASES[case](x32.double())  # the float32 input, computed in float64
    cpu = CASES[case](x32.clone())
    tpu = CASES[case](x32.to("tpu"))
    for name, want in reference.items():
        scale = want.norm().item()
        cpu_error = (cpu[name].double() - want).norm().item()
        tpu_error = (tpu[name].cpu().double() - want).norm().item()
        allowed = WORSE_THAN_CPU * cpu_error + ULPS * scale
        assert tpu_error <= allowed, (
            f"{case} {name} on {input_name}: tpu is {tpu_error:.3e} from float64, "
            f"PyTorch's CPU {cpu_error:.3e} (|reference| {scale:.3e})"
        )
