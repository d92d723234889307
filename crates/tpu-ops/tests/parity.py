"""Runs op cases on PyTorch CPU for the parity test (`tests/parity.rs`).

Usage: parity.py CASES.json RESULTS.json

CASES.json holds `{"cases": [case, ...]}`; each case has `op`, `expr` (the
op record's PyTorch expression over `x`, the inputs, and `a`, the
attributes), `kind` ("forward" or "backward"), `inputs` and `attrs`, and for
backward cases the `cotangents` of the outputs. A tensor is
`{"dtype": "f32", "shape": [2, 3], "data": [...]}`, row-major, with
non-finite floats written "nan", "inf" and "-inf" and complex values as
`[re, im]` pairs.

RESULTS.json gets one result per case, in order: `{"outputs": [tensor]}`
for a forward case, `{"grads": [tensor or null]}` for a backward case (the
gradient of the sum of outputs times cotangents, per input), or
`{"error": message, "unsupported": bool}` when PyTorch raised;
`unsupported` means PyTorch has no CPU kernel for that dtype.
"""

import json
import math
import sys
import warnings

import torch
import torch.nn.functional as F

DTYPES = {
    "bool": torch.bool,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
    "u32": torch.uint32,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "c64": torch.complex64,
    "c128": torch.complex128,
}
NAMES = {v: k for k, v in DTYPES.items()}
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def number(v):
    return NON_FINITE.get(v, v) if isinstance(v, str) else v


def json_float(v):
    return v if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def to_torch(t):
    dtype = DTYPES[t["dtype"]]
    if dtype.is_complex:
        values = torch.tensor([complex(number(re), number(im)) for re, im in t["data"]],
                              dtype=torch.complex128)
    elif dtype.is_floating_point:
        data = [number(v) for v in t["data"]]
        values = torch.tensor(data, dtype=torch.float64)
    else:
        values = torch.tensor(t["data"], dtype=torch.int64)
    return values.to(dtype).reshape(t["shape"])


def from_torch(t):
    t = t.detach()
    if t.dtype not in NAMES:
        raise TypeError(f"PyTorch returned {t.dtype}, which the test cannot compare")
    if t.dtype.is_complex:
        data = [[json_float(v.real), json_float(v.imag)]
                for v in t.to(torch.complex128).flatten().tolist()]
    elif t.dtype.is_floating_point:
        data = [json_float(v) for v in t.to(torch.float64).flatten().tolist()]
    else:
        data = t.to(torch.int64).flatten().tolist()
    return {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data": data}


def attr(value):
    (kind, v), = value.items()
    return DTYPES[v] if kind == "dtype" else v


def evaluate(case, inputs):
    scope = {"torch": torch, "F": F, "math": math, "x": inputs,
             "a": {k: attr(v) for k, v in case["attrs"].items()}}
    out = eval(case["expr"], scope)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def forward(case):
    outputs = evaluate(case, [to_torch(t) for t in case["inputs"]])
    return {"outputs": [from_torch(o) for o in outputs]}


def backward(case):
    inputs = []
    for t in case["inputs"]:
        x = to_torch(t)
        if x.is_floating_point() or x.is_complex():
            wide = torch.complex128 if x.is_complex() else torch.float64
            x = x.to(wide).requires_grad_(True)
        inputs.append(x)
    outputs = evaluate(case, inputs)
    pairs = [(o, to_torch(c).to(o.dtype)) for o, c in zip(outputs, case["cotangents"])
             if (o.is_floating_point() or o.is_complex()) and o.requires_grad]
    wrt = [x for x in inputs if x.requires_grad]
    grads = torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs],
                                allow_unused=True) if pairs else [None] * len(wrt)
    grads = iter(grads)
    result = []
    for x in inputs:
        if not x.requires_grad:
            result.append(None)
            continue
        g = next(grads)
        result.append(from_torch(torch.zeros_like(x) if g is None else g))
    return {"grads": result}


def run(case):
    try:
        return forward(case) if case["kind"] == "forward" else backward(case)
    except Exception as e:  # the Rust side reports it against the op
        message = f"{type(e).__name__}: {e}".splitlines()[0]
        unsupported = (isinstance(e, NotImplementedError) or "not implemented for" in message
                       or "uint32, uint64 types is not supported" in message)
        return {"error": message, "unsupported": unsupported}


def main():
    cases_path, results_path = sys.argv[1:3]
    with open(cases_path) as f:
        cases = json.load(f)["cases"]
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # degrees-of-freedom notes and the like
    results = [run(c) for c in cases]
    with open(results_path, "w") as f:
        json.dump({"torch": torch.__version__, "results": results}, f)


if __name__ == "__main__":
    main()
