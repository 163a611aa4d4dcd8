"""The trip of a VJP's cotangents through the package's modules ("rooms"): every call
between the package's modules from ``compute_vjp`` down to the backend, for an execution
followed by its VJP (4 qubits, two layers of RY, RZ and a ring of CNOTs, deferred
accumulation, the CPU backend).

Prints the rooms entered (distinct modules), the calls that climb back up (into a module
of a higher layer than the caller's, doc/architecture.md's table) and the returns to a
room already left (a call into a module that the trip entered and left before), then the
sequence of rooms. Run from a checkout's root: ``python scripts/vjp_trip.py``.
"""

from __future__ import annotations

import pathlib
import re
import sys

import numpy as np
import pennylane as qml
from pennylane.devices import ExecutionConfig

ROOT = pathlib.Path.cwd()
PACKAGE = ROOT / "pennylane_custatevec"


def layers() -> dict[str, int]:
    text = (ROOT / "doc" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    table: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for module in re.findall(r"`([\w.]+)`", row.group(2)):
                table[module] = int(row.group(1))
    return table


def module_of(filename: str) -> str | None:
    path = pathlib.Path(filename)
    try:
        parts = list(path.resolve().relative_to(PACKAGE.resolve()).with_suffix("").parts)
    except ValueError:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) or "pennylane_custatevec"


def trip() -> list[tuple[str, str, bool]]:
    """(caller's module, callee's module, whether the callee is a room left before and
    not on the call stack now) for every call between two package modules during
    ``compute_vjp``."""
    dev = qml.device("custatevec.qubit", wires=4, backend="cpu")
    rng = np.random.default_rng(0)
    operations = []
    for _ in range(2):
        for wire in range(4):
            operations += [qml.RY(rng.uniform(-3, 3), wire), qml.RZ(rng.uniform(-3, 3), wire)]
        operations += [qml.CNOT([wire, (wire + 1) % 4]) for wire in range(4)]
    tape = qml.tape.QuantumScript(
        operations, [qml.expval(qml.Z(0)), qml.expval(qml.X(1) @ qml.Z(2))]
    )
    tape.trainable_params = list(range(len(tape.get_parameters())))
    config = dev.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", use_device_jacobian_product=True)
    )
    tapes, _ = dev.preprocess_transforms(config)((tape,))
    dev.execute(tapes, config)
    calls: list[tuple[str, str, bool]] = []
    stack: list[str | None] = []
    left: set[str] = set()

    def profile(frame, event, _arg):
        if event == "call":
            callee = module_of(frame.f_code.co_filename)
            caller = next((m for m in reversed(stack) if m is not None), None)
            if callee is not None and caller is not None and callee != caller:
                calls.append((caller, callee, callee in left and callee not in stack))
            stack.append(callee)
        elif event == "return" and stack:
            module = stack.pop()
            if module is not None and module not in stack:
                left.add(module)

    cotangents = [(np.float64(0.7), np.float64(-0.3)) for _ in tapes]
    sys.setprofile(profile)
    try:
        dev.compute_vjp(tapes, cotangents, config)
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    table = layers()
    calls = trip()
    climbs = [(a, b) for a, b, _ in calls if table.get(b, -1) > table.get(a, -1)]
    returns = sum(again for _, _, again in calls)
    entered = list(dict.fromkeys(b for _, b, _ in calls))
    print(f"calls between modules: {len(calls)}")
    print(f"rooms entered: {len(entered)}")
    print(
        f"climbs back up (into a higher layer): {len(climbs)} calls, "
        f"{len(set(climbs))} distinct (caller, callee) pairs"
    )
    again = {(a, b) for a, b, back in calls if back}
    print(f"returns to a room already left: {returns} calls, {len(again)} distinct pairs")
    print("rooms, in order of first entry: " + " -> ".join(entered))


if __name__ == "__main__":
    main()
