"""The installed wheel stands on its own: importing it and training a step
loads no shared library from the system beyond what every manylinux wheel
may assume (the C and C++ runtimes), besides torch's own and the PJRT
plugin's. Gloo and what it links come from the wheel."""

import json
import os
import subprocess
import sys
import textwrap

import torch_tpu_rs

# The libraries the manylinux policies let a wheel take from the system
# (those a Python extension of this kind can link).
MANYLINUX_SYSTEM = ("libc.so", "libm.so", "libdl.so", "librt.so", "libpthread.so", "libgcc_s.so",
                    "libstdc++.so", "ld-linux-x86-64.so", "ld-linux-aarch64.so")

SYSTEM_DIRS = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/", "/usr/local/lib/")

CHILD = """
import json, os
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
import torch

def libraries():
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if ".so" in line.split()[-1]}

before = libraries()
import torch_tpu_rs
torch.manual_seed(0)
cpu = torch.nn.Linear(8, 4)
tpu = torch.nn.Linear(8, 4).to("tpu")
tpu.load_state_dict(cpu.state_dict())
x, y = torch.randn(16, 8), torch.randn(16, 4)
losses = []
for model, device in ((cpu, "cpu"), (tpu, "tpu")):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    losses.append(torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).item())
print(json.dumps({"loaded": sorted(libraries() - before), "losses": losses}))
"""


def test_import_and_a_training_step_load_nothing_from_the_system_beyond_manylinux():
    env = dict(os.environ, LD_LIBRARY_PATH="")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    cpu_loss, tpu_loss = result["losses"]
    assert abs(cpu_loss - tpu_loss) <= 1e-5 * abs(cpu_loss), result["losses"]

    package = os.path.dirname(torch_tpu_rs.__file__)
    bundled = package.rstrip("/") + ".libs"
    loaded = result["loaded"]
    assert any(path.startswith(package) for path in loaded), loaded
    assert any(os.path.basename(path).startswith("libgloo") and path.startswith(bundled) for path in loaded), loaded
    # Python packages' own modules (numpy's, the interpreter's) may load;
    # from the system's library folders only what manylinux allows.
    from_system = [
        path for path in loaded
        if path.startswith(SYSTEM_DIRS) and not os.path.basename(path).startswith(MANYLINUX_SYSTEM)
    ]
    assert from_system == [], f"the bridge loaded libraries from the system: {from_system}"


def test_the_extension_names_only_bundled_torch_and_manylinux_libraries():
    extension = torch_tpu_rs._C.__file__
    dynamic = subprocess.run(["readelf", "-d", extension], capture_output=True, text=True, check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    bundled = set(os.listdir(os.path.dirname(torch_tpu_rs.__file__).rstrip("/") + ".libs"))
    torch_libs = {"libc10.so", "libtorch_cpu.so"}
    others = [n for n in needed if n not in bundled and n not in torch_libs and not n.startswith(MANYLINUX_SYSTEM)]
    assert others == [], f"{extension} needs {others} from the system"
    assert any(n.startswith("libgloo-") for n in needed), needed


def test_importing_the_package_before_torch_works():
    # torch's backend autoload then finds the package half-initialised.
    code = "import torch_tpu_rs, torch\nprint(torch.ones(2, device='tpu').sum().item())\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["2.0"], out.stderr[-3000:]
