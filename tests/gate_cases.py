"""The gates of capabilities.toml as test cases, shared by the tests of every area: the
gate list (``GATES``), a factory per gate (``gate_spec``), the forms each gate is tested in
(``gate_forms``), a gate on random wires (``make_gate``); and pairs of one gate with two
draws of its parameters, on a tape (``gate_pair``, ``tape_around``), for the structure
tests."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pennylane as qml
from conftest import MIXED_WIRES
from reference import random_state, random_unitary
from scipy.stats import unitary_group

import pennylane_custatevec

TOML_PATH = Path(pennylane_custatevec.__file__).parent / "capabilities.toml"
with TOML_PATH.open("rb") as _f:
    GATES: dict = tomllib.load(_f)["operators"]["gates"]

# Seven wires with mixed labels, non-contiguous ints, not sorted: room for a 4-wire gate
# plus two controls plus a spectator.
GATE_WIRES = [*MIXED_WIRES, 11, "anc"]


def _angles(rng, n):
    return rng.uniform(-2 * np.pi, 2 * np.pi, size=n)


def _block_encode(rng, w):
    a = rng.normal(size=(2, 2)) + 1j * rng.normal(size=(2, 2))
    a /= 1.2 * np.linalg.norm(a, 2)  # spectral norm < 1
    return qml.BlockEncode(a, wires=w)


def _controlled_qubit_unitary(rng, w):
    u = unitary_group.rvs(4, random_state=int(rng.integers(2**31)))
    values = [int(v) for v in rng.permutation([0, 1])]
    return qml.ControlledQubitUnitary(u, wires=w, control_values=values)


# name -> (number of wires, factory(rng, wires) -> operator) for gates whose shape is not
# given by the class's num_params / num_wires.
SPECIAL = {
    "Identity": (2, lambda r, w: qml.Identity(w)),
    "GlobalPhase": (2, lambda r, w: qml.GlobalPhase(_angles(r, 1)[0], wires=w)),
    "MultiControlledX": (
        4,
        lambda r, w: qml.MultiControlledX(wires=w, control_values=[0, 1, 0]),
    ),
    "PauliRot": (4, lambda r, w: qml.PauliRot(_angles(r, 1)[0], "XIYZ", wires=w)),
    "MultiRZ": (3, lambda r, w: qml.MultiRZ(_angles(r, 1)[0], wires=w)),
    "PCPhase": (3, lambda r, w: qml.PCPhase(_angles(r, 1)[0], dim=3, wires=w)),
    "QubitUnitary": (3, lambda r, w: qml.QubitUnitary(random_unitary(8, r), wires=w)),
    "ControlledQubitUnitary": (4, _controlled_qubit_unitary),
    "DiagonalQubitUnitary": (
        3,
        lambda r, w: qml.DiagonalQubitUnitary(np.exp(1j * _angles(r, 8)), wires=w),
    ),
    "BlockEncode": (2, _block_encode),
    "StatePrep": (2, lambda r, w: qml.StatePrep(random_state(2, r), wires=w)),
    "BasisState": (3, lambda r, w: qml.BasisState(np.array([1, 0, 1]), wires=w)),
    # A projector in a circuit postselects (both devices renormalise the state after it).
    "Projector": (2, lambda r, w: qml.Projector(np.array([1, 0]), wires=w)),
}
NON_UNITARY = {"StatePrep", "BasisState", "Projector"}


def gate_spec(name):
    """(number of wires, factory) for the TOML gate ``name``."""
    if name in SPECIAL:
        return SPECIAL[name]
    cls = getattr(qml, name)
    n_params, n_wires = cls.num_params, cls.num_wires
    assert isinstance(n_params, int) and isinstance(n_wires, int), name
    return n_wires, lambda r, w: cls(*_angles(r, n_params), wires=w)


def gate_forms(name: str) -> list[str]:
    """The forms a gate is tested in: plain, and controlled and adjoint where its
    capabilities.toml entry says it is controllable, invertible."""
    properties = GATES[name].get("properties", [])
    forms = ["plain"]
    if "controllable" in properties:
        forms.append("controlled")
    if "invertible" in properties:
        forms.append("adjoint")
    return forms


def make_gate(name, rng, available=GATE_WIRES, extra=0):
    """The gate on a random choice (and order) of wires, and ``extra`` further wires."""
    n_wires, factory = gate_spec(name)
    chosen = list(rng.permutation(np.array(available, dtype=object)))
    wires, rest = chosen[:n_wires], chosen[n_wires:]
    return factory(rng, wires), rest[:extra]


# --- Pairs of one gate (two draws of its parameters) for the structure tests ------------

_WIRES = [0, "a", 2, 5, "b", 7, 8]
SAME_HYPERPARAMETERS_EXPECTED_DIFFERENT = {"ControlledQubitUnitary", "BlockEncode"}
"""Gates whose hyperparameters differ between two draws: the factory draws the control
values; BlockEncode's ``norm`` is computed from its matrix. Two structures, exactly."""


def gate_pair(name: str, form: str, seed: int):
    """The gate ``name`` twice on the same wires, with two draws of its parameters, in
    ``form``: plain, controlled (on a spectator wire) or adjoint."""
    n_wires, factory = gate_spec(name)
    wires = _WIRES[:n_wires]
    pair = []
    for draw in range(2):
        op = factory(np.random.default_rng([seed, draw]), wires)
        if form == "controlled":
            op = qml.ctrl(op, control=_WIRES[-1], control_values=0)
        elif form == "adjoint":
            op = qml.adjoint(op)
        pair.append(op)
    return pair


def tape_around(op) -> qml.tape.QuantumScript:
    """``op`` after a layer of rotations (a state preparation stays first)."""
    layer = [qml.RY(0.1 + 0.2 * i, wires=w) for i, w in enumerate(_WIRES)]
    ops = [op, *layer] if isinstance(op, qml.operation.StatePrepBase) else [*layer, op]
    return qml.tape.QuantumScript(ops, [qml.expval(qml.Z(0))])
