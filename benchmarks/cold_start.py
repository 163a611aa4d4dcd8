"""A fresh install's first calls: how long each takes on this device against the peers,
and which kernels compile on which call.

Each configuration runs in its own Python process with its own empty ``NUMBA_CACHE_DIR``:

- *fresh install*: ``pip install --no-deps --target`` of this checkout into a new
  directory (which compiles the CPU kernels into the package, ``backends/kernel_build.py``;
  the table gives its time), then the steps with that directory first on the path;
- *warm*: the same installed copy a second time;
- *kernels compiled at the call*: this checkout with numba's own cache locator only
  (``NUMBA_CACHE_LOCATOR_CLASSES=UserProvidedCacheLocator``), which is how every install
  ran before the kernels were compiled ahead;
- the peers.

The steps, in order, in one process:

- import pennylane and torch; import pennylane_custatevec;
- a 4-qubit AngleEmbedding + StronglyEntanglingLayers circuit, ``expval``, torch, adjoint,
  value and backward: calls 1, 2, 3 (other values each call);
- Hadamard, CRX, IsingXX, PhaseShift, Toffoli, ``probs``, backward: calls 1, 2;
- the quick-start demo (``demos/torchlayer_classifier.py``'s model, compiled): its first
  three training batches; and, in a process of its own, the demo alone (its first batch
  is a new user's first wait).

    python benchmarks/cold_start.py                # the table, this device and the peers
    python benchmarks/cold_start.py --kernels      # and the kernels compiled per step

Prints a markdown table (seconds per step) and, with ``--kernels``, per step and
configuration of this device the numba functions compiled (top-level compilations: a
kernel's callees compile inside it) with their signatures and seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
device_name, record_kernels, mixed_method = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
demo_only, demos = sys.argv[4] == "demo", sys.argv[5]
steps, kernels, current = [], [], ["import pennylane + torch"]
start = time.perf_counter()
if record_kernels:
    import numba.core.event as event

    class CompileLog(event.Listener):
        depth = 0

        def on_start(self, e):
            CompileLog.depth += 1
            e.data["started"] = time.perf_counter()

        def on_end(self, e):
            CompileLog.depth -= 1
            if CompileLog.depth == 0:
                function = e.data["dispatcher"].py_func
                kernels.append((current[0], function.__module__.rsplit(".", 1)[-1] + "."
                                + function.__qualname__, str(e.data["args"]),
                                time.perf_counter() - e.data["started"]))

    event.register("numba:compile", CompileLog())
import pennylane as qml
import torch

def step(name, function):
    current[0] = name
    t = time.perf_counter()
    function()
    steps.append((name, time.perf_counter() - t))

steps.append(("import pennylane + torch", time.perf_counter() - start))
if device_name == "custatevec.qubit":
    step("import pennylane_custatevec", lambda: __import__("pennylane_custatevec"))
    print("MODULE" + sys.modules["pennylane_custatevec"].__file__)
torch.manual_seed(0)
dev = qml.device(device_name, wires=4)

@qml.qnode(dev, interface="torch", diff_method="adjoint")
def layered(x, w):
    qml.AngleEmbedding(x, wires=range(4))
    qml.StronglyEntanglingLayers(w, wires=range(4))
    return qml.expval(qml.Z(0) @ qml.Z(1))

@qml.qnode(dev, interface="torch", diff_method=mixed_method)
def mixed(a):
    qml.Hadamard(0)
    qml.CRX(a[0], wires=[0, 1])
    qml.IsingXX(a[1], wires=[1, 2])
    qml.PhaseShift(a[2], wires=3)
    qml.Toffoli(wires=[0, 1, 2])
    return qml.probs(wires=[0, 1, 3])

def layered_call():
    x = torch.rand(4, dtype=torch.float64, requires_grad=True)
    w = torch.rand(2, 4, 3, dtype=torch.float64, requires_grad=True)
    layered(x, w).backward()

def mixed_call():
    a = torch.rand(3, dtype=torch.float64, requires_grad=True)
    (mixed(a) * torch.arange(8.0, dtype=torch.float64)).sum().backward()

for call in () if demo_only else (1, 2, 3):
    step(f"AngleEmbedding + StronglyEntanglingLayers, expval, backward: call {call}", layered_call)
for call in () if demo_only else (1, 2):
    step(f"Hadamard, CRX, IsingXX, PhaseShift, Toffoli, probs, backward: call {call}", mixed_call)
if device_name == "custatevec.qubit":
    sys.path.insert(0, demos)
    import torchlayer_classifier as demo

    model = demo.build_model(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.rand(48, 2) * 2 - 1
    y = (x[:, 0] > 0).long()

    def batch(i):
        optimizer.zero_grad()
        rows = slice(16 * i, 16 * i + 16)
        loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()

    for i in range(3):
        demo = "quick-start demo alone" if demo_only else "quick-start demo"
        step(f"{demo}: batch {i + 1}", lambda: batch(i))
print("RESULT" + json.dumps({"steps": steps, "kernels": kernels}))
"""


MIXED_METHOD = {"lightning.qubit": "best"}
"""The probs circuit's diff_method where the adjoint method does not serve it (lightning's
adjoint differentiates expectation values only); else ``"adjoint"``."""


def run(
    device_name: str, cache: str, record_kernels: bool, demo_only: bool = False, **environment: str
) -> dict:
    os.makedirs(cache, exist_ok=True)
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONWARNINGS": "ignore", **environment}
    method = MIXED_METHOD.get(device_name, "adjoint")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            device_name,
            "1" if record_kernels else "0",
            method,
            "demo" if demo_only else "all",
            str(ROOT / "demos"),
        ],
        cwd=cache,  # not the checkout: python -c puts the working directory first on the path
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{device_name} failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(lines[-1][len("RESULT") :])
    result["module"] = next(
        (line[len("MODULE") :] for line in done.stdout.splitlines() if line.startswith("MODULE")),
        None,
    )
    return result


def install(target: pathlib.Path) -> float:
    """``pip install --no-deps --target target`` of this checkout (the package build
    compiles the CPU kernels); its seconds."""
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools would reuse its last build
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), "."],
        cwd=ROOT,
        check=True,
    )
    return time.perf_counter() - start


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", action="store_true", help="list the kernels compiled")
    parser.add_argument(
        "--peers",
        nargs="*",
        default=["default.qubit", "lightning.qubit"],
        help="peer devices (default: default.qubit lightning.qubit; those not installed skip)",
    )
    args = parser.parse_args(argv)
    columns: dict[str, dict] = {}
    fresh, warm = "custatevec.qubit, fresh install", "custatevec.qubit, warm"
    at_call = "custatevec.qubit, kernels compiled at the call"
    with tempfile.TemporaryDirectory() as scratch:
        site = pathlib.Path(scratch) / "site"
        seconds = install(site)
        paths = [str(site), os.environ.get("PYTHONPATH")]
        path = {"PYTHONPATH": os.pathsep.join(filter(None, paths))}
        columns[fresh] = run("custatevec.qubit", f"{scratch}/fresh", args.kernels, **path)
        columns[fresh]["steps"].insert(0, ("pip install . (the kernels compiled)", seconds))
        columns[warm] = run("custatevec.qubit", f"{scratch}/warm", False, **path)
        demo = run("custatevec.qubit", f"{scratch}/demo", False, demo_only=True, **path)
        columns[fresh]["steps"] += demo["steps"][2:]
        for name in (fresh, warm):
            if not columns[name]["module"].startswith(str(site)):
                raise RuntimeError(f"{name} imported {columns[name]['module']}, not the install")
    with tempfile.TemporaryDirectory() as cache:
        locator = {"NUMBA_CACHE_LOCATOR_CLASSES": "UserProvidedCacheLocator"}
        columns[at_call] = run("custatevec.qubit", f"{cache}/all", args.kernels, **locator)
        demo = run("custatevec.qubit", f"{cache}/demo", False, demo_only=True, **locator)
        columns[at_call]["steps"] += demo["steps"][2:]
    for peer in args.peers:
        with tempfile.TemporaryDirectory() as cache:
            try:
                columns[peer] = run(peer, cache, False)
            except RuntimeError as error:
                print(f"({peer} skipped: {str(error).splitlines()[0]})", file=sys.stderr)
    names = list(dict.fromkeys(name for c in columns.values() for name, _ in c["steps"]))
    print("| step (4 qubits, torch, adjoint) | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name in names:
        cells = [_seconds(dict(c["steps"]).get(name)) for c in columns.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for peer, method in MIXED_METHOD.items():
        if peer in columns:
            print(
                f"\n{peer}: the probs circuit with diff_method={method!r} (its adjoint "
                "method differentiates expectation values only)."
            )
    if args.kernels:
        for name in (fresh, at_call):
            kernels = columns[name]["kernels"]
            print(
                f"\nnumba compilations (top level), {name}: {len(kernels)}, "
                f"{sum(k[3] for k in kernels):.1f} s"
            )
            if kernels:
                print("\n| step | kernel | signature | seconds |\n|---|---|---|---|")
            for step, kernel, signature, seconds in kernels:
                print(f"| {step} | {kernel} | {signature[:80]} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
