"""The adjoint tests' shared cases and runs: the differentiable gates (``PARAMETRIZED``,
``COMPOSITE``, ``gate_case``), random circuits around them (``surrounding_circuit``,
``measurements_for``), torch runs of a QNode and their comparison (``torch_run``,
``assert_same_run``), and a device-API tape (``api_tape``); used by the tests of the
gradients, the compiled path, rotations and templates."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import torch
from conftest import MIXED_WIRES, assert_allclose_nested
from gate_cases import GATES, gate_spec
from pennylane.tape import QuantumScript

WIRES = MIXED_WIRES  # ["a", 3, "q1", 0, "z"]

# Gates whose parameter is a matrix or a state: not differentiable by the adjoint method.
MATRIX_DEFINED = {
    "QubitUnitary",
    "ControlledQubitUnitary",
    "DiagonalQubitUnitary",
    "BlockEncode",
    "StatePrep",
    "BasisState",
    "Projector",
}
PARAMETRIZED = [
    name
    for name in GATES
    if name not in MATRIX_DEFINED and getattr(qml, name).num_params not in (0, None)
]


def float64_tensor(value, requires_grad=True):
    return torch.tensor(value, dtype=torch.float64, requires_grad=requires_grad)


def random_angles(rng, n):
    return list(rng.uniform(-np.pi, np.pi, size=n))


def _real_parts(out) -> list:
    """Every output flattened to real 1-d tensors (complex ones as real and imaginary)."""
    parts = out if isinstance(out, (tuple, list)) else [out]
    flat = []
    for part in parts:
        if isinstance(part, (tuple, list)):
            flat.extend(_real_parts(part))
            continue
        t = torch.as_tensor(part)
        if t.is_complex():
            flat += [t.real.reshape(-1), t.imag.reshape(-1)]
        else:
            flat.append(t.reshape(-1).to(torch.float64))
    return flat


def real_vector(out) -> torch.Tensor:
    return torch.cat(_real_parts(out))


def random_loss(out, seed) -> torch.Tensor:
    """A fixed random linear combination of every (real) output."""
    vector = real_vector(out)
    weights = np.random.default_rng(seed).normal(size=vector.shape[0])
    return vector @ torch.tensor(weights, dtype=torch.float64)


def as_numpy(out):
    if isinstance(out, (tuple, list)):
        return type(out)(as_numpy(o) for o in out)
    return out.detach().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


def torch_run(circuit, device, values, seed, trainable=None, **qnode_kwargs):
    """Values and torch gradients of ``random_loss`` of ``circuit(*params)`` on ``device``.

    ``values`` are turned into float64 tensors, requiring grad where ``trainable`` says
    (default: all). Returns (numpy outputs, [grad or None per parameter])."""
    trainable = [True] * len(values) if trainable is None else trainable
    params = [
        float64_tensor(v, requires_grad=bool(tr)) for v, tr in zip(values, trainable, strict=True)
    ]
    qnode = qml.QNode(circuit, device, interface="torch", **qnode_kwargs)
    out = qnode(*params)
    random_loss(out, seed).backward()
    return as_numpy(out), [None if p.grad is None else p.grad.numpy() for p in params]


def assert_same_run(run, reference, atol):
    """Two torch_run results (outputs, gradients) agree."""
    (out, grads), (ref_out, ref_grads) = run, reference
    assert_allclose_nested(out, ref_out, atol=atol)
    assert len(grads) == len(ref_grads)
    for i, (g, r) in enumerate(zip(grads, ref_grads, strict=True)):
        if r is None:
            assert g is None, f"parameter {i} is not trainable but got a gradient"
        else:
            assert g is not None, f"parameter {i} got no gradient"
            np.testing.assert_allclose(g, r, atol=atol, rtol=0, err_msg=f"parameter {i}")


def _ctrl(base, n_controls, values):
    def factory(rng, wires):
        return qml.ctrl(
            base(rng, wires[n_controls:]), control=wires[:n_controls], control_values=values
        )

    return factory


def _toml(name):
    return gate_spec(name)[1]


# name -> (number of wires, factory(rng, wires) -> operator with numpy parameters)
COMPOSITE = {
    "ctrl_RX_values01": (3, _ctrl(_toml("RX"), 2, [0, 1])),
    "ctrl_RY_value0": (2, _ctrl(_toml("RY"), 1, [0])),
    "ctrl_PhaseShift": (2, _ctrl(_toml("PhaseShift"), 1, [1])),
    "ctrl_Rot_values10": (3, _ctrl(_toml("Rot"), 2, [1, 0])),
    "ctrl_IsingXX_value0": (3, _ctrl(_toml("IsingXX"), 1, [0])),
    "ctrl_CRZ_value0": (3, _ctrl(_toml("CRZ"), 1, [0])),
    "ctrl_GlobalPhase_value0": (2, _ctrl(_toml("GlobalPhase"), 1, [0])),
    "ctrl_PauliRot": (
        3,
        _ctrl(lambda r, w: qml.PauliRot(random_angles(r, 1)[0], "XY", wires=w), 1, [1]),
    ),
    "adjoint_RX": (1, lambda r, w: qml.adjoint(_toml("RX")(r, w))),
    "adjoint_Rot": (1, lambda r, w: qml.adjoint(_toml("Rot")(r, w))),
    "adjoint_U3": (1, lambda r, w: qml.adjoint(_toml("U3")(r, w))),
    "adjoint_CRY": (2, lambda r, w: qml.adjoint(_toml("CRY")(r, w))),
    "adjoint_DoubleExcitation": (4, lambda r, w: qml.adjoint(_toml("DoubleExcitation")(r, w))),
    "adjoint_ctrl_RZ": (2, lambda r, w: qml.adjoint(_ctrl(_toml("RZ"), 1, [0])(r, w))),
    "ctrl_adjoint_RY": (
        3,
        lambda r, w: qml.ctrl(qml.adjoint(_toml("RY")(r, w[2:])), w[:2], control_values=[1, 0]),
    ),
    "pow_RX": (1, lambda r, w: qml.pow(_toml("RX")(r, w), 3)),
}


def gate_case(name, rng):
    """(number of wires, operator with numpy parameters) for a gate name or a composite."""
    n_wires, factory = COMPOSITE[name] if name in COMPOSITE else gate_spec(name)
    wires = [WIRES[i] for i in rng.permutation(len(WIRES))[:n_wires]]
    return factory(rng, wires)


def surrounding_circuit(rng, wires=WIRES):
    """Random non-trainable layers (Hadamards, RYs, CNOTs) to put before and after a gate."""

    def layer():
        ops = [
            qml.RY(a, wires=w) for w, a in zip(wires, random_angles(rng, len(wires)), strict=True)
        ]
        for _ in range(2):
            w0, w1 = (wires[i] for i in rng.permutation(len(wires))[:2])
            ops += [qml.Hadamard(w0), qml.CNOT([w0, w1])]
        return ops

    return layer(), layer()


def measurements_for(outputs, rng, wires=WIRES):
    w = [wires[i] for i in rng.permutation(len(wires))]
    if outputs == "state":
        return [qml.state()]
    return [
        qml.expval(qml.Z(w[0])),
        qml.expval(qml.X(w[1]) @ qml.Y(w[2])),
        qml.expval(qml.Y(w[3])),
        qml.probs(wires=[w[4], w[0]]),
    ]


def api_tape(case):
    ops = [
        qml.RX(0.3, "a"),
        qml.CNOT(["a", 3]),
        qml.RY(0.5, 3),
        qml.IsingXX(0.2, [3, "q1"]),
        qml.RZ(0.7, "q1"),
        qml.CRY(0.4, ["q1", "a"]),
        qml.Hadamard(0),
        qml.PhaseShift(-0.9, 0),
        qml.CNOT([0, "q1"]),
    ]
    two = [qml.expval(qml.Z("a")), qml.expval(qml.Y(3) @ qml.X("q1") + qml.Z(0))]
    ham = [qml.expval(qml.Hamiltonian([0.2, -1.5], [qml.X(0) @ qml.Z("a"), qml.Y("q1")]))]
    tapes = {
        "two_expvals_three_params": (two, [0, 2, 4]),
        "one_expval_one_param": (two[:1], [0]),
        "one_expval_all_params": (two[1:], None),
        "hamiltonian_two_params": (ham, [3, 5]),  # 6, 7: its coefficients
        "three_expvals_one_param": ([*two, *ham], [1]),
    }
    measurements, trainable = tapes[case]
    tape = QuantumScript(ops, measurements)
    if trainable is not None:
        tape.trainable_params = trainable
    return tape
