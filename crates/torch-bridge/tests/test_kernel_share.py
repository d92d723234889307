"""How much of a GPT-2 workload still runs a Python kernel per aten call
(``kernel_share.py``, in a fresh process with counting on): at most 5% of
calls, and a training step with none besides attention's."""

import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).with_name("kernel_share.py")

#: The largest share of aten calls on tpu that may reach a Python kernel.
SHARE_BARS = {"forward": 0.05, "decode": 0.05}
#: Attention goes through a Python kernel (one call per layer) once a
#: generation has grown a KV cache held padded to a shape bucket, as the
#: script's decode before the step did.
ATTENTION_CALLS = 4


def test_python_kernel_share_of_gpt2(tmp_path):
    out = tmp_path / "share.json"
    env = {**os.environ, "TORCH_TPU_COUNT_KERNELS": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], env=env, capture_output=True, text=True, timeout=900)
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-4000:]
    results = {r["workload"]: r for r in json.loads(out.read_text())}
    for workload, bar in SHARE_BARS.items():
        r = results[workload]
        assert sum(r["aten"].values()) > 100, f"{workload}: the dispatch mode saw too few calls to judge"
        assert r["share"] <= bar, f"{workload}: {r['share']:.0%} of aten calls reached a Python kernel (bar {bar:.0%}): {r['python']}"
    python = dict(results["training step"]["python"])
    attention = python.pop("scaled_dot_product_attention", 0)
    assert attention == ATTENTION_CALLS
    assert python == {}, f"a training step made Python kernel calls besides attention's: {python}"
    # Counting works: calls that reach a Python kernel are counted by name
    # (in decode, attention over the padded cache; nothing else).
    assert set(results["decode"]["python"]) == {"scaled_dot_product_attention"}, results["decode"]["python"]
    assert results["decode"]["python"]["scaled_dot_product_attention"] > 0
