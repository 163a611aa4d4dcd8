"""Every gate of capabilities.toml, its adjoint and its controlled form, against default.qubit.

The list of gates is read from ``pennylane_custatevec/capabilities.toml`` so that these
tests follow the file: a gate added there without a factory in tests/gate_cases.py fails
``test_every_toml_gate_has_a_factory``.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conftest import (
    MIXED_WIRES,
    TOL,
    assert_allclose_nested,
    generic_layer,
    make_devices,
    stable_seed,
)
from gate_cases import GATE_WIRES, GATES, NON_UNITARY, make_gate
from reference import random_state, random_unitary
from scipy.stats import unitary_group

INVERTIBLE = [name for name, spec in GATES.items() if "invertible" in spec.get("properties", [])]
CONTROLLABLE = [
    name for name, spec in GATES.items() if "controllable" in spec.get("properties", [])
]

DTYPES = [np.complex128, np.complex64]


def compare_states(op_fn, rng, dtype=np.complex128, wires=GATE_WIRES):
    """A generic state on every wire, then ``op_fn()``, then the state, on both devices."""
    angles = rng.uniform(0, 2 * np.pi, size=(len(wires), 2))
    dev, ref = make_devices(wires, c_dtype=dtype)

    def circuit():
        generic_layer(wires, angles)
        op_fn()
        return qml.state()

    result = qml.QNode(circuit, dev)()
    expected = qml.QNode(circuit, ref)()
    assert result.dtype == np.complex128
    assert_allclose_nested(result, expected, atol=TOL[dtype])
    return result


def test_toml_lists_gates():
    assert len(GATES) > 50
    assert "RX" in GATES and "QubitUnitary" in GATES
    assert set(INVERTIBLE) <= set(GATES) and set(CONTROLLABLE) <= set(GATES)


@pytest.mark.parametrize("name", list(GATES))
def test_every_toml_gate_has_a_factory(name):
    assert hasattr(qml, name), f"{name} in capabilities.toml is not a PennyLane operator"
    op, _ = make_gate(name, np.random.default_rng(0))
    assert isinstance(op, getattr(qml, name))  # SQISW is an alias of SISWAP


@pytest.mark.parametrize("dtype", DTYPES, ids=["c128", "c64"])
@pytest.mark.parametrize("name", list(GATES))
def test_gate(name, dtype):
    rng = np.random.default_rng(stable_seed("gate", name))
    op, _ = make_gate(name, rng)
    compare_states(lambda: qml.apply(op), rng, dtype)


@pytest.mark.parametrize("name", list(GATES))
def test_gate_runs_natively(name):
    """A gate the TOML lists reaches the device undecomposed."""
    rng = np.random.default_rng(stable_seed("native", name))
    op, _ = make_gate(name, rng)
    dev = qml.device("custatevec.qubit", wires=GATE_WIRES)
    # State preparations run natively only as the first operation. The other gate is no
    # rotation, which the preprocessing would gather with a rotation (see test_rotations.py).
    first = name in ("StatePrep", "BasisState")
    other = qml.Hadamard(GATE_WIRES[0])
    ops = [op, other] if first else [other, op]
    tape = qml.tape.QuantumScript(ops, [qml.state()])
    (processed,), _ = dev.preprocess_transforms()((tape,))
    assert [o.name for o in processed.operations] == [o.name for o in ops]


@pytest.mark.parametrize("dtype", DTYPES, ids=["c128", "c64"])
@pytest.mark.parametrize("name", INVERTIBLE)
def test_adjoint_gate(name, dtype):
    rng = np.random.default_rng(stable_seed("adjoint", name))
    op, _ = make_gate(name, rng)
    adj = qml.adjoint(op)
    assert isinstance(adj, qml.ops.op_math.Adjoint)
    compare_states(lambda: qml.apply(adj), rng, dtype)


@pytest.mark.parametrize("name", INVERTIBLE)
def test_adjoint_undoes_gate(name):
    """gate followed by its adjoint is the identity on custatevec alone (exact inverse)."""
    rng = np.random.default_rng(stable_seed("undo", name))
    op, _ = make_gate(name, rng)
    wires = GATE_WIRES
    angles = rng.uniform(0, 2 * np.pi, size=(len(wires), 2))
    dev = qml.device("custatevec.qubit", wires=wires)

    @qml.qnode(dev)
    def both():
        generic_layer(wires, angles)
        qml.apply(op)
        qml.adjoint(op)
        return qml.state()

    @qml.qnode(dev)
    def neither():
        generic_layer(wires, angles)
        return qml.state()

    np.testing.assert_allclose(both(), neither(), atol=1e-10)


@pytest.mark.parametrize("dtype", DTYPES, ids=["c128", "c64"])
@pytest.mark.parametrize("name", CONTROLLABLE)
def test_controlled_gate(name, dtype):
    rng = np.random.default_rng(stable_seed("ctrl", name))
    op, rest = make_gate(name, rng, extra=2)
    values = [int(v) for v in rng.permutation([0, 1])]  # mixed 0/1
    controlled = qml.ctrl(op, control=rest, control_values=values)
    compare_states(lambda: qml.apply(controlled), rng, dtype)


@pytest.mark.parametrize("name", CONTROLLABLE)
def test_controlled_adjoint_gate(name):
    rng = np.random.default_rng(stable_seed("ctrl-adj", name))
    op, rest = make_gate(name, rng, extra=1)
    gate = qml.ctrl(qml.adjoint(op), control=rest, control_values=[0])
    compare_states(lambda: qml.apply(gate), rng)
    gate2 = qml.adjoint(qml.ctrl(op, control=rest, control_values=[1]))
    compare_states(lambda: qml.apply(gate2), rng)


def test_gate_on_subset_of_device_wires_and_unused_wires(rng):
    """Ops touching only some device wires; the state still spans every device wire."""
    dev, ref = make_devices(MIXED_WIRES)
    u = random_unitary(4, rng)

    def circuit():
        qml.Hadamard("z")
        qml.QubitUnitary(u, wires=["z", 3])
        qml.CRY(0.4, wires=[3, "a"])
        return qml.state()

    result = qml.QNode(circuit, dev)()
    assert result.shape == (32,)
    assert_allclose_nested(result, qml.QNode(circuit, ref)(), atol=1e-10)


# --- state preparation ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["c128", "c64"])
@pytest.mark.parametrize("prep", ["StatePrep", "BasisState"])
def test_state_prep_first_on_subset(prep, dtype):
    rng = np.random.default_rng(stable_seed("prep-first", prep))
    wires = ["q1", "a", 0]  # a subset of MIXED_WIRES, not in device order
    state = random_state(3, rng) if prep == "StatePrep" else np.array([1, 1, 0])
    angles = rng.uniform(0, 2 * np.pi, size=(5, 2))

    def circuit():
        getattr(qml, prep)(state, wires=wires)
        qml.CNOT(["q1", "z"])
        qml.RY(angles[0, 0], wires=3)
        qml.CRX(angles[1, 0], wires=["a", 3])
        return qml.state()

    dev, ref = make_devices(MIXED_WIRES, c_dtype=dtype)
    assert_allclose_nested(qml.QNode(circuit, dev)(), qml.QNode(circuit, ref)(), TOL[dtype])


@pytest.mark.parametrize("prep", ["StatePrep", "BasisState"])
def test_state_prep_first_on_all_wires_is_exact(prep):
    rng = np.random.default_rng(stable_seed("prep-all", prep))
    state = random_state(5, rng) if prep == "StatePrep" else np.array([1, 0, 1, 1, 0])

    def circuit():
        getattr(qml, prep)(state, wires=MIXED_WIRES[::-1])
        return qml.state()

    dev, ref = make_devices(MIXED_WIRES)
    result = qml.QNode(circuit, dev)()
    assert_allclose_nested(result, qml.QNode(circuit, ref)(), 1e-10)


@pytest.mark.parametrize("prep", ["StatePrep", "BasisState"])
def test_state_prep_in_the_middle(prep):
    """A state preparation after other gates acts on |0> wires (its decomposition)."""
    rng = np.random.default_rng(stable_seed("prep-middle", prep))
    state = random_state(2, rng) if prep == "StatePrep" else np.array([1, 1])

    def circuit():
        qml.Hadamard("a")
        qml.CNOT(["a", 3])
        getattr(qml, prep)(state, wires=["z", "q1"])
        qml.CNOT(["q1", 0])
        qml.CRZ(0.7, wires=["z", "a"])
        return qml.state()

    dev, ref = make_devices(MIXED_WIRES)
    assert_allclose_nested(qml.QNode(circuit, dev)(), qml.QNode(circuit, ref)(), 1e-10)


def test_state_prep_with_expval():
    state = random_state(2, np.random.default_rng(3))

    def circuit():
        qml.StatePrep(state, wires=[0, "z"])
        qml.RX(0.3, wires="z")
        return qml.expval(qml.Z("z") @ qml.X(0)), qml.probs(wires=["z", 0])

    dev, ref = make_devices(MIXED_WIRES)
    assert_allclose_nested(qml.QNode(circuit, dev)(), qml.QNode(circuit, ref)(), 1e-10)


# --- specific gates --------------------------------------------------------------------


@pytest.mark.parametrize("wires", [(), ("a",), ("z", 0)])
def test_global_phase(wires):
    phi = 0.8123
    compare_states(lambda: qml.GlobalPhase(phi, wires=wires), np.random.default_rng(1))


@pytest.mark.parametrize("values", [[1], [0], [0, 1], [1, 0, 1]])
def test_controlled_global_phase(values):
    controls = ["z", 3, "a"][: len(values)]
    gate = qml.ctrl(qml.GlobalPhase(-1.37), control=controls, control_values=values)
    result = compare_states(lambda: qml.apply(gate), np.random.default_rng(2))
    # A controlled global phase is a relative phase: it must change the state.
    plain = compare_states(lambda: None, np.random.default_rng(2))
    assert not np.allclose(result, plain)


@pytest.mark.parametrize(
    "n_controls, values",
    [(1, [0]), (1, [1]), (2, [0, 1]), (3, [1, 0, 1]), (4, [0, 0, 1, 0])],
)
def test_multi_controlled_x(n_controls, values):
    wires = GATE_WIRES[::-1][: n_controls + 1]
    gate = qml.MultiControlledX(wires=wires, control_values=values)
    compare_states(lambda: qml.apply(gate), np.random.default_rng(n_controls))


@pytest.mark.parametrize(
    "word", ["X", "I", "IZ", "YI", "XIYZ", "IIII", "ZZZ", "YXY", "IXIY", "XYZIX"]
)
@pytest.mark.parametrize("dtype", DTYPES, ids=["c128", "c64"])
def test_pauli_rot_words(word, dtype):
    rng = np.random.default_rng(stable_seed("paulirot", word))
    wires = list(rng.permutation(np.array(GATE_WIRES, dtype=object)))[: len(word)]
    theta = rng.uniform(-4, 4)
    compare_states(lambda: qml.PauliRot(theta, word, wires=wires), rng, dtype)
    compare_states(lambda: qml.adjoint(qml.PauliRot(theta, word, wires=wires)), rng, dtype)
    extra = [w for w in GATE_WIRES if w not in wires][0]
    gate = qml.ctrl(qml.PauliRot(theta, word, wires=wires), control=extra, control_values=0)
    compare_states(lambda: qml.apply(gate), rng, dtype)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_multi_rz(n):
    rng = np.random.default_rng(stable_seed("multirz", n))
    wires = list(rng.permutation(np.array(GATE_WIRES[:-1], dtype=object)))[:n]
    theta = rng.uniform(-4, 4)
    compare_states(lambda: qml.MultiRZ(theta, wires=wires), rng)
    compare_states(lambda: qml.adjoint(qml.MultiRZ(theta, wires=wires)), rng)
    gate = qml.ctrl(qml.MultiRZ(theta, wires=wires), control=GATE_WIRES[-1], control_values=0)
    compare_states(lambda: qml.apply(gate), rng)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_qubit_unitary_sizes(k):
    rng = np.random.default_rng(stable_seed("qu", k))
    u = unitary_group.rvs(2**k, random_state=k)
    wires = list(rng.permutation(np.array(GATE_WIRES[:-2], dtype=object)))[:k]
    compare_states(lambda: qml.QubitUnitary(u, wires=wires), rng)
    compare_states(lambda: qml.adjoint(qml.QubitUnitary(u, wires=wires)), rng)
    gate = qml.ctrl(
        qml.QubitUnitary(u, wires=wires[::-1]), control=GATE_WIRES[-2:], control_values=[1, 0]
    )
    compare_states(lambda: qml.apply(gate), rng)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_diagonal_qubit_unitary_sizes(k):
    rng = np.random.default_rng(stable_seed("dqu", k))
    d = np.exp(1j * rng.uniform(0, 2 * np.pi, size=2**k))
    wires = list(rng.permutation(np.array(GATE_WIRES, dtype=object)))[:k]
    compare_states(lambda: qml.DiagonalQubitUnitary(d, wires=wires), rng)


@pytest.mark.parametrize("n_controls", [1, 2, 3])
def test_controlled_qubit_unitary_control_values(n_controls):
    rng = np.random.default_rng(stable_seed("cqu", n_controls))
    u = unitary_group.rvs(4, random_state=n_controls + 10)
    wires = list(rng.permutation(np.array(GATE_WIRES, dtype=object)))[: n_controls + 2]
    values = [int(v) for v in rng.integers(0, 2, size=n_controls)]
    values[0] = 1 - values[-1] if n_controls > 1 else values[0]
    gate = qml.ControlledQubitUnitary(u, wires=wires, control_values=values)
    compare_states(lambda: qml.apply(gate), rng)
    compare_states(lambda: qml.adjoint(gate), rng)


def test_nested_controls(rng):
    base = qml.IsingXY(0.37, wires=["a", 0])
    gate = qml.ctrl(qml.ctrl(base, control="z", control_values=0), control=[3], control_values=1)
    compare_states(lambda: qml.apply(gate), rng)


@pytest.mark.parametrize(
    "template",
    ["StronglyEntanglingLayers", "QFT", "BasicEntanglerLayers", "GroverOperator"],
)
def test_adjoint_of_template(template):
    rng = np.random.default_rng(stable_seed("template", template))
    wires = ["z", "a", 0, "q1"]
    if template == "StronglyEntanglingLayers":
        weights = rng.uniform(0, 2 * np.pi, size=(2, 4, 3))
        build = lambda: qml.adjoint(qml.StronglyEntanglingLayers)(weights, wires=wires)  # noqa: E731
    elif template == "BasicEntanglerLayers":
        weights = rng.uniform(0, 2 * np.pi, size=(2, 4))
        build = lambda: qml.adjoint(qml.BasicEntanglerLayers)(weights, wires=wires)  # noqa: E731
    elif template == "QFT":
        build = lambda: qml.adjoint(qml.QFT)(wires=wires)  # noqa: E731
    else:
        build = lambda: qml.adjoint(qml.GroverOperator)(wires=wires)  # noqa: E731
    compare_states(build, rng, wires=MIXED_WIRES)


@pytest.mark.parametrize("basis", [[0], [1], [1, 0], [0, 1, 1]], ids=str)
def test_basis_state_projector_in_circuit(basis):
    """A basis-state projector in the middle of a circuit postselects and renormalises."""
    rng = np.random.default_rng(stable_seed("projector", basis))
    wires = list(rng.permutation(np.array(GATE_WIRES, dtype=object)))[: len(basis)]
    result = compare_states(lambda: qml.Projector(np.array(basis), wires=wires), rng)
    np.testing.assert_allclose(np.linalg.norm(result), 1.0, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2])
def test_state_vector_projector_in_circuit(n):
    """A state-vector Projector as a circuit operation applies |phi><phi| (not only its
    diagonal) and renormalises."""
    rng = np.random.default_rng(stable_seed("sv-projector", n))
    phi = random_state(n, rng)
    wires = GATE_WIRES[1 : 1 + n]
    compare_states(lambda: qml.Projector(phi, wires=wires), rng)


def test_non_native_gate_is_decomposed():
    """A gate outside the TOML (e.g. a QFT or Permute) decomposes and matches."""
    rng = np.random.default_rng(5)
    compare_states(lambda: qml.QFT(wires=["a", 0, "z"]), rng, wires=MIXED_WIRES)
    compare_states(lambda: qml.Permute([0, "z", "a"], wires=["a", 0, "z"]), rng, wires=MIXED_WIRES)


def test_many_gates_random_circuit():
    """A longer random circuit drawing gates from the whole TOML list."""
    rng = np.random.default_rng(2024)
    names = [n for n in GATES if n not in NON_UNITARY]
    ops = []
    for _ in range(60):
        name = names[rng.integers(len(names))]
        op, rest = make_gate(name, rng, extra=1)
        kind = rng.integers(3)
        if kind == 1 and name in INVERTIBLE:
            op = qml.adjoint(op)
        elif kind == 2 and name in CONTROLLABLE and rest:
            op = qml.ctrl(op, control=rest, control_values=int(rng.integers(2)))
        ops.append(op)

    def apply_all():
        for op in ops:
            qml.apply(op)

    for dtype in DTYPES:
        compare_states(apply_all, np.random.default_rng(1), dtype)
