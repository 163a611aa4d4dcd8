"""Native templates (templates.py): StronglyEntanglingLayers, BasicEntanglerLayers and
AngleEmbedding run whole, without PennyLane's decomposition.

Their results and gradients must equal default.qubit's (which decomposes them) to
round-off in every mode, fusion width and backend; a VJP must come back with the
parameter's shape; and the preprocessing must decompose a template wherever PennyLane
could not take its gradient whole (Jacobian contraction, other gradient methods, a tape
whose trainable parameters differ in shape) or where its gates are not the ones the
device compiles.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
import torch
from adjoint_cases import assert_same_run, torch_run
from conftest import (
    DEVICE,
    MIXED_WIRES,
    assert_sampled_matches_exact,
    stable_seed,
)
from pennylane.devices import ExecutionConfig
from pennylane.tape import QuantumScript

from pennylane_custatevec.templates import NATIVE_TEMPLATES, template_gates

ATOL = 1e-10
WIRES = MIXED_WIRES  # ["a", 3, "q1", 0, "z"]
N = len(WIRES)


def templates_circuit(x, sel, bel):
    """Every native template, with non-default hyperparameters, amid plain gates."""
    qml.Hadamard(WIRES[2])
    qml.AngleEmbedding(x, wires=WIRES, rotation="Y")
    qml.StronglyEntanglingLayers(sel, wires=WIRES[::-1], ranges=(2, 1), imprimitive=qml.CZ)
    qml.CRY(0.3, wires=[WIRES[0], WIRES[4]])
    qml.BasicEntanglerLayers(bel, wires=WIRES[1:], rotation=qml.RZ)
    qml.StronglyEntanglingLayers(sel, wires=WIRES, imprimitive=qml.CY)
    return qml.expval(qml.Z(WIRES[0]) @ qml.X(WIRES[3])), qml.probs(wires=WIRES[1:3])


def template_values(seed, batch=None):
    rng = np.random.default_rng(seed)
    x_shape = (N - 1,) if batch is None else (batch, N - 1)  # fewer features than wires
    return [
        rng.uniform(-np.pi, np.pi, size=x_shape),
        rng.uniform(-np.pi, np.pi, size=(2, N, 3)),
        rng.uniform(-np.pi, np.pi, size=(3, N - 1)),
    ]


def reference_run(circuit, values, seed, trainable, wires=WIRES):
    return torch_run(
        circuit,
        qml.device("default.qubit", wires=wires),
        values,
        seed,
        trainable,
        diff_method="backprop",
    )


def device_operations(circuit, dev, values, trainable, **qnode_kwargs):
    """The names of the operations the device receives for ``circuit(*values)`` (in all
    its tapes)."""
    params = [
        torch.tensor(v, requires_grad=bool(t)) for v, t in zip(values, trainable, strict=True)
    ]
    qnode = qml.QNode(circuit, dev, interface="torch", **qnode_kwargs)
    tapes, _ = qml.workflow.construct_batch(qnode, level="device")(*params)
    return [op.name for tape in tapes for op in tape.operations]


# ---------------------------------------------------------------------------------------
# 1. The gates of each template are PennyLane's decomposition


@pytest.mark.parametrize(
    "template",
    [
        qml.StronglyEntanglingLayers(np.ones((3, 4, 3)), wires=[3, "b", 0, 9]),
        qml.StronglyEntanglingLayers(np.ones((2, 3, 3)), wires=[0, 1, 2], ranges=(2, 1)),
        qml.StronglyEntanglingLayers(np.ones((1, 1, 3)), wires=[7]),
        qml.StronglyEntanglingLayers(np.ones((2, 2, 3)), wires=[0, 1], imprimitive=qml.CZ),
        qml.BasicEntanglerLayers(np.ones((2, 4)), wires=range(4), rotation=qml.RY),
        qml.BasicEntanglerLayers(np.ones((2, 2)), wires=["x", "y"]),
        qml.BasicEntanglerLayers(np.ones((2, 1)), wires=[5], rotation=qml.RZ),
        qml.AngleEmbedding(np.ones(3), wires=range(5), rotation="Z"),
    ],
    ids=lambda op: f"{op.name}-{len(op.wires)}",
)
def test_gates_match_pennylane_decomposition(template):
    """Each gate of ``template_gates``, with its element's angle, is the next gate of
    PennyLane's decomposition (Rot as RZ RY RZ)."""
    rng = np.random.default_rng(stable_seed("gates", template.name, len(template.wires)))
    values = rng.uniform(-3, 3, size=template.data[0].shape)
    op = qml.ops.functions.bind_new_parameters(template, [values])
    expected = []
    for gate in op.decomposition():
        expected.extend(gate.decomposition() if isinstance(gate, qml.Rot) else [gate])
    gates = template_gates(op)
    assert len(gates) == len(expected)
    flat = values.reshape(-1)
    for (gate, element), reference in zip(gates, expected, strict=True):
        assert gate.name == reference.name
        assert gate.wires == reference.wires
        if element is None:
            assert reference.num_params == 0
        else:
            assert flat[element] == pytest.approx(float(reference.data[0]), abs=0)


# ---------------------------------------------------------------------------------------
# 2. Results and gradients against default.qubit


TRAINABLE = {
    "sel": [False, True, False],  # one tensor in two templates: two trainable parameters
    "bel": [False, False, True],
    "features": [True, False, False],
}


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("trained", list(TRAINABLE))
def test_vjp_equals_default_qubit(trained, mode, k):
    values = template_values(stable_seed("vjp", trained, mode, k))
    trainable = TRAINABLE[trained]
    dev = qml.device(DEVICE, wires=WIRES, grad_accumulation=mode, fusion_qubits=k)
    names = device_operations(templates_circuit, dev, values, trainable, device_vjp=True)
    assert names.count("StronglyEntanglingLayers") == 2
    assert {"AngleEmbedding", "BasicEntanglerLayers"} <= set(names)
    seed = stable_seed("loss", trained, mode, k)
    run = torch_run(
        templates_circuit, dev, values, seed, trainable, diff_method="adjoint", device_vjp=True
    )
    reference = reference_run(templates_circuit, values, seed, trainable)
    assert_same_run(run, reference, ATOL)
    for grad, value, t in zip(run[1], values, trainable, strict=True):
        assert grad is None or (t and grad.shape == value.shape)


@pytest.mark.parametrize("mode", ["deferred", "eager"])
def test_broadcast_features(mode):
    """A minibatch of features (not trainable) with trainable weights: one batched sweep
    in the deferred mode, and the gradients summed over the batch."""
    values = template_values(stable_seed("broadcast", mode), batch=4)
    trainable = TRAINABLE["sel"]
    dev = qml.device(DEVICE, wires=WIRES, grad_accumulation=mode, fusion_qubits=3)
    names = device_operations(templates_circuit, dev, values, trainable, device_vjp=True)
    assert {"AngleEmbedding", "StronglyEntanglingLayers"} <= set(names)
    run = torch_run(templates_circuit, dev, values, 7, trainable, device_vjp=True)
    assert_same_run(run, reference_run(templates_circuit, values, 7, trainable), ATOL)


@pytest.mark.parametrize("trainable", [False, True])
def test_broadcast_layer_weights_decompose(trainable):
    """Broadcast weights of a layer template: PennyLane sees that broadcasting only in
    the template's gates (its batch_size is None), so the template decomposes."""

    def circuit(sel, bel):
        qml.StronglyEntanglingLayers(sel, wires=WIRES)
        qml.BasicEntanglerLayers(bel, wires=WIRES)
        return qml.expval(qml.Z(WIRES[1]))

    rng = np.random.default_rng(3)
    values = [rng.uniform(-3, 3, size=(3, 2, N, 3)), rng.uniform(-3, 3, size=(3, 1, N))]
    dev = qml.device(DEVICE, wires=WIRES)
    names = device_operations(circuit, dev, values, [trainable] * 2, device_vjp=True)
    assert not set(names) & {"StronglyEntanglingLayers", "BasicEntanglerLayers"}
    if not trainable:
        result = qml.QNode(circuit, dev)(*values)
        expected = qml.QNode(circuit, qml.device("default.qubit", wires=WIRES))(*values)
        assert result.shape == (3,)
        np.testing.assert_allclose(result, expected, atol=ATOL, rtol=0)
        return
    run = torch_run(circuit, dev, values, 11, device_vjp=True)
    assert run[0].shape == (3,)
    assert_same_run(run, reference_run(circuit, values, 11, None), ATOL)


def test_state_output():
    """The VJP of a state (real weights: the real part of the complex cotangent product)."""

    def circuit(weights):
        qml.StronglyEntanglingLayers(weights, wires=WIRES[:3])
        return qml.state()

    values = [np.random.default_rng(4).uniform(-3, 3, size=(2, 3, 3))]
    runs = {
        mode: torch_run(
            circuit,
            qml.device(DEVICE, wires=WIRES[:3], grad_accumulation=mode),
            values,
            13,
            device_vjp=True,
        )
        for mode in ("deferred", "eager")
    }
    assert_same_run(runs["deferred"], runs["eager"], ATOL)
    assert_same_run(runs["deferred"], reference_run(circuit, values, 13, None, WIRES[:3]), ATOL)


def test_cuStateVec_double(gpu_double):
    values = template_values(stable_seed("double"), batch=3)
    trainable = TRAINABLE["bel"]
    dev = qml.device(DEVICE, wires=WIRES, backend="custatevec", fusion_qubits=3)
    run = torch_run(templates_circuit, dev, values, 17, trainable, device_vjp=True)
    assert_same_run(run, reference_run(templates_circuit, values, 17, trainable), ATOL)


def test_sampled_results():
    """With shots the templates run whole too; probabilities from 40000 seeded shots."""
    values = template_values(stable_seed("shots"))
    assert_sampled_matches_exact(templates_circuit, values, WIRES, 21)


# ---------------------------------------------------------------------------------------
# 3. Where the preprocessing decomposes


def test_jacobian_path_decomposes():
    """device_vjp=False: PennyLane contracts a Jacobian per scalar parameter."""
    values = template_values(stable_seed("jacobian"))
    trainable = TRAINABLE["sel"]
    dev = qml.device(DEVICE, wires=WIRES)
    names = device_operations(templates_circuit, dev, values, trainable, device_vjp=False)
    assert "StronglyEntanglingLayers" not in names
    assert {"AngleEmbedding", "BasicEntanglerLayers"} <= set(names)  # not trainable: whole
    run = torch_run(templates_circuit, dev, values, 23, trainable, device_vjp=False)
    assert_same_run(run, reference_run(templates_circuit, values, 23, trainable), ATOL)


@pytest.mark.parametrize(
    "trainable", [[True, True, False], [False, True, True]], ids=["features_sel", "sel_bel"]
)
def test_parameters_of_several_shapes_decompose(trainable):
    """Trainable parameters of different shapes in one tape: PennyLane's torch interface
    stacks a tape's VJPs, so the templates with a trainable parameter run gate by gate."""
    values = template_values(stable_seed("shapes", *trainable))
    dev = qml.device(DEVICE, wires=WIRES)
    names = device_operations(templates_circuit, dev, values, trainable, device_vjp=True)
    for name, t in zip(
        ["AngleEmbedding", "StronglyEntanglingLayers", "BasicEntanglerLayers"],
        trainable,
        strict=True,
    ):
        assert (name in names) != t
    run = torch_run(templates_circuit, dev, values, 29, trainable, device_vjp=True)
    assert_same_run(run, reference_run(templates_circuit, values, 29, trainable), ATOL)


def test_parameter_shift():
    values = template_values(stable_seed("shift"))
    trainable = [False, True, False]
    dev = qml.device(DEVICE, wires=WIRES)
    run = torch_run(templates_circuit, dev, values, 31, trainable, diff_method="parameter-shift")
    assert_same_run(run, reference_run(templates_circuit, values, 31, trainable), 1e-9)


@pytest.mark.parametrize(
    "make",
    [
        lambda w: qml.StronglyEntanglingLayers(w, wires=WIRES, imprimitive=qml.ISWAP),
        lambda w: qml.BasicEntanglerLayers(w[:, :, 0], wires=WIRES, rotation=qml.PhaseShift),
    ],
    ids=["entangler_ISWAP", "rotation_PhaseShift"],
)
def test_other_gates_decompose(make):
    """Templates whose gates are not rotations and Pauli entanglers decompose."""

    def circuit(weights):
        make(weights)
        return qml.expval(qml.Z(WIRES[0]))

    values = [np.random.default_rng(6).uniform(-3, 3, size=(2, N, 3))]
    dev = qml.device(DEVICE, wires=WIRES)
    names = device_operations(circuit, dev, values, [True], device_vjp=True)
    assert not set(names) & {t.__name__ for t in NATIVE_TEMPLATES}
    run = torch_run(circuit, dev, values, 37, device_vjp=True)
    assert_same_run(run, reference_run(circuit, values, 37, None), ATOL)


def test_autograd_interface():
    weights = qml.numpy.array(np.random.default_rng(8).uniform(-3, 3, size=(2, N, 3)))

    def circuit(w):
        qml.StronglyEntanglingLayers(w, wires=WIRES)
        return qml.expval(qml.Z(WIRES[0]) @ qml.Z(WIRES[4]))

    dev = qml.device(DEVICE, wires=WIRES)
    ours = qml.grad(qml.QNode(circuit, dev, diff_method="adjoint", device_vjp=True))(weights)
    ref = qml.grad(qml.QNode(circuit, qml.device("default.qubit", wires=WIRES)))(weights)
    assert ours.shape == weights.shape
    np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0)


# ---------------------------------------------------------------------------------------
# 4. The device API: a template's VJP and Jacobian entries have its parameter's shape


def test_device_api_shapes():
    weights = np.random.default_rng(9).uniform(-3, 3, size=(2, 3, 3))
    template = qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2])
    tape = QuantumScript(
        [qml.RY(0.7, wires=1), template], [qml.expval(qml.Z(0)), qml.probs(wires=[2])]
    )
    tape.trainable_params = [0, 1]
    decomposed = QuantumScript(
        [qml.RY(0.7, wires=1)]
        + [
            gate
            for op in template.decomposition()
            for gate in (op.decomposition() if isinstance(op, qml.Rot) else [op])
        ],
        tape.measurements,
    )
    dev = qml.device(DEVICE, wires=3)
    config = ExecutionConfig(gradient_method="adjoint")
    jacobian = dev.compute_derivatives(tape, config)
    flat = dev.compute_derivatives(decomposed, config)
    # decomposed, every parameter trainable: RY, then per layer and wire RZ RY RZ, whose
    # columns 1, 2, ... are the template's elements in order
    rotations = range(1, 1 + weights.size)
    assert jacobian[0][1].shape == (2, 3, 3)
    assert jacobian[1][1].shape == (2, 2, 3, 3)
    np.testing.assert_allclose(jacobian[0][0], flat[0][0], atol=ATOL)
    np.testing.assert_allclose(
        jacobian[0][1].reshape(-1), [flat[0][i] for i in rotations], atol=ATOL
    )
    np.testing.assert_allclose(
        jacobian[1][1].reshape(2, -1), np.stack([flat[1][i] for i in rotations], -1), atol=ATOL
    )
    dy = (np.float64(0.5), np.array([1.0, -2.0]))
    vjp = dev.compute_vjp(tape, dy, config)
    assert np.shape(vjp[0]) == () and vjp[1].shape == (2, 3, 3)
    expected = 0.5 * jacobian[0][1] + np.tensordot(dy[1], jacobian[1][1], axes=1)
    np.testing.assert_allclose(vjp[1], expected, atol=ATOL)
