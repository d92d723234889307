"""PyTorch's OpInfo database on ``tpu`` against PyTorch's CPU (see
``opinfo.py``), in a fresh process: the pass rate of each stage, among the
entries compared on tpu (not those the CPU cannot run or whose values are
random), must stay at or above its bar. The bars are
the rates measured when they were last raised, less about a point for
entries that pass or fail by a rounding; raise them as ops land."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).with_name("opinfo.py")

#: The lowest pass rate (passed / (passed + failed): entries whose stage had
#: nothing to compare count as neither) each stage may have.
BARS = {
    "float32 forward": 0.975,
    "bfloat16 forward": 0.94,
    "float32 gradients": 0.965,
    "complex64 forward": 0.82,
    "complex64 gradients": 0.81,
}


@pytest.fixture(scope="module")
def opinfo(tmp_path_factory):
    out = tmp_path_factory.mktemp("opinfo") / "opinfo.json"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_TPU_CPU_FALLBACK"}
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=1800,
    )
    print(run.stdout[-6000:])
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("stage", list(BARS))
def test_opinfo_pass_rate(opinfo, stage):
    passed, failed, not_comparable, total = opinfo["summary"][stage]
    print(f"OpInfo on tpu, {stage}: {passed} passed, {failed} failed, {not_comparable} not comparable of {total}")
    rate = passed / max(1, passed + failed)
    assert rate >= BARS[stage], (
        f"{stage}: {rate:.1%} of the entries compared on tpu pass, below the bar of "
        f"{BARS[stage]:.1%}; failing: "
        + ", ".join(sorted(n for n, f in opinfo["failures"].items() if stage in f))
    )
