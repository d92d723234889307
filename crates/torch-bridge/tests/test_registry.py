"""The aten kernels against the tpu-rs registry: every op a kernel calls
exists, and each functional kernel brings its in-place and out= forms."""

import pathlib
import re

import pytest
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
    for functional, in_place, out in [("atan2", "atan2_", "atan2.out"), ("remainder.Scalar", "remainder_.Scalar", "remainder.Scalar_out"),
                                      ("prod.dim_int", None, "prod.int_out"), ("cosh", "cosh_", "cosh.out")]:
        assert REGISTERED[functional] == "kernel"
        if in_place:
            assert REGISTERED[in_place] == "inplace"
        assert REGISTERED[out] == "out"
    assert REGISTERED["set_.source_Storage"] == "rebind"


def test_views_are_native_metadata_over_the_same_storage():
    """View kernels are C++ (no Python kernel runs for them): they share the
    storage and see later writes through the base."""
    for name in ("view", "_unsafe_view", "as_strided", "_reshape_alias", "unfold", "alias"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "PrivateUse1"), name
        assert name not in REGISTERED or REGISTERED[name] == "native", name
    x = torch.arange(24.0).reshape(4, 6)
    t = x.to("tpu")
    views = {
        "view": lambda a: a.view(2, 12),
        "transpose": lambda a: a.t(),
        "slice": lambda a: a[1:3, ::2],
        "select": lambda a: a[2],
        "expand": lambda a: a[:1].expand(3, 6),
        "unfold": lambda a: a.unfold(1, 2, 2),
        "detach": lambda a: a.detach(),
        "as_strided": lambda a: a.as_strided((3, 3), (5, 2), 1),
    }
    for name, f in views.items():
        v = f(t)
        assert v.untyped_storage().data_ptr() == t.untyped_storage().data_ptr(), name
        assert torch.equal(v.cpu(), f(x)), name
    t.mul_(2)
    for name, f in views.items():
        assert torch.equal(f(t).cpu(), f(x * 2)), name
    with pytest.raises(RuntimeError, match="out of bounds for storage of size"):
        t.as_strided((10, 10), (10, 1))
    with pytest.raises(RuntimeError, match="shape '\\[5, 5\\]' is invalid for input of size 24"):
        t.view(5, 5)


def test_derived_forms_run():
    x = torch.randn(3, 4)
    t = x.to("tpu")
    t.exp_()
    out = torch.empty(0, device="tpu")
    torch.sum(t, 1, out=out)
    torch.testing.assert_close(out.cpu(), x.exp().sum(1))
