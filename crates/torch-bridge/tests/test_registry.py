"""The aten kernels against the tpu-rs registry: every op a kernel calls
exists, and each functional kernel brings its in-place and out= forms."""

import pathlib
import re

import torch
import torch_tpu_rs
from torch_tpu_rs.aten import REGISTERED

ATEN = pathlib.Path(torch_tpu_rs.__file__).parent / "aten"
CALLS = re.compile(r'\b(?:run|run_into|vjp|fill_random)\(\s*"([a-z0-9_]+)"')


def test_kernels_call_only_registered_ops():
    known = set(torch_tpu_rs.op_names())
    used = {name for path in ATEN.glob("*.py") for name in CALLS.findall(path.read_text())}
    assert used, "no op calls found"
    assert used <= known, sorted(used - known)


def test_functional_kernels_derive_in_place_and_out_forms():
    for functional, in_place, out in [("add.Tensor", "add_.Tensor", "add.out"), ("mul.Scalar", "mul_.Scalar", "mul.Scalar_out"),
                                      ("sum.dim_IntList", None, "sum.IntList_out"), ("exp", "exp_", "exp.out")]:
        assert REGISTERED[functional] == "kernel"
        if in_place:
            assert REGISTERED[in_place] == "inplace"
        assert REGISTERED[out] == "out"
    assert REGISTERED["view"] == "view"


def test_derived_forms_run():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    t.exp_()
    out = torch.empty(0, device="tpu")
    torch.sum(t, 1, out=out)
    torch.testing.assert_close(out.cpu(), x.exp().sum(1))
