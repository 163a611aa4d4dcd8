"""The metric tensor tests' shared cases: a random circuit around each differentiable
gate (``gate_circuit``), its references on default.qubit (``reference_metrics``: PennyLane's
adjoint metric tensor, its exact blocks over PennyLane's parametrized layers, and
``qml.metric_tensor``'s approximations), and a layered circuit with classical processing
(``layered_circuit``); used by tests/metric/ and tests/mpi/."""

from __future__ import annotations

import functools

import numpy as np
import pennylane as qml
from adjoint_cases import COMPOSITE, PARAMETRIZED, WIRES, gate_case, surrounding_circuit
from conftest import stable_seed
from pennylane import numpy as pnp

GATE_NAMES = PARAMETRIZED + list(COMPOSITE)
"""Every gate the adjoint method differentiates, plain and composite."""

PENNYLANE_COVARIANCE_OFF = {
    "CRX",
    "CRY",
    "CRZ",
    "ctrl_RX_values01",
    "ctrl_RY_value0",
    "ctrl_IsingXX_value0",
    "ctrl_CRZ_value0",
    "adjoint_CRY",
    "ctrl_adjoint_RY",
    "adjoint_ctrl_RZ",
    "ctrl_PauliRot",
    "ctrl_Rot_values10",
    "DoubleExcitationPlus",
    "DoubleExcitationMinus",
}
"""Gates whose block-diagonal metric ``qml.metric_tensor`` (PennyLane 0.45) gets wrong or
refuses: controlled rotations (a generator with a projector: its covariances differ from
the blocks of its own adjoint metric tensor and from finite differences, on the diagonal
or, for a controlled Rot, off it) and DoubleExcitationPlus/Minus
(DiagGatesUndefinedError). There the device's approximations are compared with the exact
blocks of the adjoint metric tensor only."""


def gate_circuit(name: str):
    """(quantum function of a flat parameter array x, x): non-trainable layers around a
    trainable RX, a trainable IsingZZ, the gate with trainable parameters and a trainable
    RY on its first wire."""
    rng = np.random.default_rng(stable_seed("metric", name))
    gate = gate_case(name, rng)
    before, after = surrounding_circuit(rng)
    k = len(gate.data)

    def circuit(x):
        for op in before:
            qml.apply(op)
        qml.RX(x[0], WIRES[0])
        qml.IsingZZ(x[1], [WIRES[1], WIRES[2]])
        qml.apply(qml.ops.functions.bind_new_parameters(gate, [x[2 + i] for i in range(k)]))
        qml.RY(x[2 + k], gate.wires[0])
        for op in after:
            qml.apply(op)
        return qml.expval(qml.Z(WIRES[0]))

    x = pnp.array(rng.uniform(-np.pi, np.pi, 3 + k), requires_grad=True)
    return circuit, x


def exact_blocks(metric: np.ndarray, tape_layers, diagonal: bool) -> np.ndarray:
    """The blocks of ``metric`` over the layers (lists of positions), or its diagonal."""
    mask = np.zeros(metric.shape, dtype=bool)
    for layer in tape_layers:
        mask[np.ix_(layer, layer)] = True
    if diagonal:
        mask &= np.eye(metric.shape[0], dtype=bool)
    return np.where(mask, metric, 0.0)


def _one_generator_term(op) -> bool:
    """PennyLane's metric tensors' stopping condition (``_multipar_stopping_fn``)."""
    try:
        return len(op.data) == 0 or (op.has_generator and len(op.generator().terms()[0]) == 1)
    except qml.exceptions.TermsUndefinedError:
        return True


def _expanded(qnode, x):
    """The QNode's tape expanded as PennyLane's metric tensors expand it, its trainable
    parameters taken again."""
    tape = qml.workflow.construct_tape(qnode)(x)
    [expanded], _ = qml.transforms.decompose(
        tape,
        gate_set=qml.decomposition.gate_sets.ROTATIONS_PLUS_CNOT,
        stopping_condition=_one_generator_term,
    )
    expanded.trainable_params = qml.math.get_trainable_indices(
        expanded.get_parameters(trainable_only=False)
    )
    return expanded


@functools.cache
def reference_metrics(name: str) -> dict:
    """default.qubit's metrics of ``gate_circuit(name)`` (numpy): "adjoint" (the full
    one, ``qml.adjoint_metric_tensor``), "block-diag" and "diag" (the exact blocks of the
    expanded tape's full metric over PennyLane's layers, composed with the classical
    Jacobian J of x to the expanded tape's parameters: J^T blocks J), and PennyLane's
    approximations "pl block-diag", "pl diag" (not for the gates of
    ``PENNYLANE_COVARIANCE_OFF``)."""
    circuit, x = gate_circuit(name)
    qnode = qml.QNode(circuit, qml.device("default.qubit", wires=WIRES))
    references = {"adjoint": np.asarray(qml.adjoint_metric_tensor(qnode)(x))}
    expanded = _expanded(qnode, x)
    tape_metric = np.asarray(qml.adjoint_metric_tensor(expanded))  # informative: the metric
    position = {index: p for p, index in enumerate(expanded.trainable_params)}
    layers = [
        [position[i] for i in layer.param_inds if i in position]
        for layer in expanded.graph.parametrized_layers
    ]
    layers = [layer for layer in layers if layer]
    jacobian = np.asarray(
        qml.jacobian(
            lambda x: qml.math.stack(_expanded(qnode, x).get_parameters(trainable_only=True))
        )(x)
    ).reshape(len(expanded.trainable_params), len(x))
    for approx in ("block-diag", "diag"):
        blocks = exact_blocks(tape_metric, layers, approx == "diag")
        references[approx] = jacobian.T @ blocks @ jacobian
        if name not in PENNYLANE_COVARIANCE_OFF:
            references[f"pl {approx}"] = np.asarray(qml.metric_tensor(qnode, approx=approx)(x))
    return references


def layered_circuit(n_wires: int = 4, layers: int = 2):
    """A quantum function of (weights (layers, n, 3), scale) with classical processing:
    strongly entangling layers of ``weights * scale``, an RX of ``scale ** 2`` and an
    IsingXX of ``2 scale``."""

    def circuit(weights, scale):
        qml.StronglyEntanglingLayers(weights * scale, wires=range(n_wires))
        qml.RX(scale**2, wires=0)
        qml.IsingXX(2 * scale, wires=[0, n_wires - 1])
        return qml.expval(qml.Z(0) @ qml.Z(1))

    rng = np.random.default_rng(stable_seed("layered", n_wires, layers))
    weights = rng.uniform(-np.pi, np.pi, (layers, n_wires, 3))
    return circuit, weights, 0.8
