""" "best" asks on every call whether the adjoint method serves the circuit: answered once
per ``structures.adjoint_serve_key`` (values apart), and never reused where anything it
decides on differs."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from pennylane import numpy as pnp

from pennylane_custatevec.structures import adjoint_serve_key


def _circuit(x, v):
    qml.StatePrep(v, wires=[0, 1])
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    return qml.expval(qml.Z(0) @ qml.Z(1))


V = np.array([0.6, 0.2, 0.5, 0.3]) / np.sqrt(0.74)


def test_one_answer_per_structure_whatever_the_values():
    device = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_circuit, device)
    for step in range(4):
        x = pnp.array([0.3 + step, -0.2 * step], requires_grad=True)
        qml.grad(lambda v: qnode(v, V))(x)
    assert list(device._serve_answers.values()) == [True]


class _PhaseByMatrix(qml.operation.Operation):
    """diag(1, e^{i phi}) defined by its matrix alone: no generator, so the adjoint method
    refuses it trainable; parameter-shift takes it by its frequency."""

    num_wires = 1
    num_params = 1
    grad_method = "A"
    parameter_frequencies = [(1,)]

    @staticmethod
    def compute_matrix(phi):
        return qml.math.diag(qml.math.stack([qml.math.ones_like(phi), qml.math.exp(1j * phi)]))


def _phased_circuit(x, phi):
    qml.Hadamard(1)
    _PhaseByMatrix(phi, wires=1)
    qml.RX(x[0], 0)
    qml.CNOT([0, 1])
    qml.RY(x[1], 1)
    return qml.expval(qml.X(1) + qml.Z(0) @ qml.Z(1))


def test_the_answer_follows_what_it_decides_on():
    """A gate the adjoint method takes constant but not trainable: "best" takes
    parameter-shift where it is trainable, with the same derivatives as default.qubit's
    parameter-shift, also after the same circuit with a constant gate was served by the
    adjoint method; with shots likewise."""
    device = qml.device("custatevec.qubit", wires=2)
    qnode = qml.QNode(_phased_circuit, device)
    reference = qml.QNode(
        _phased_circuit, qml.device("default.qubit", wires=2), diff_method="parameter-shift"
    )
    x = pnp.array([0.3, -0.2], requires_grad=True)
    constant = pnp.array(0.7, requires_grad=False)
    trainable = pnp.array(0.7, requires_grad=True)
    qml.grad(qnode, argnums=0)(x, constant)
    ours = qml.jacobian(qnode, argnums=[0, 1])(x, trainable)
    theirs = qml.jacobian(reference, argnums=[0, 1])(x, trainable)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-8)
    assert abs(float(ours[1])) > 0.1
    qml.set_shots(qnode, 100)(x, constant)
    assert set(device._serve_answers.values()) == {True, False}


@pytest.mark.parametrize(
    "value",
    [np.array(0.3 + 0.0j), "tracer"],
    ids=["complex", "jax tracer"],
)
def test_values_that_may_decide_are_checked_every_call(value):
    config = qml.devices.ExecutionConfig()
    if value == "tracer":
        jax = pytest.importorskip("jax")
        keys = []

        def record(v):
            tape = qml.tape.QuantumScript([qml.RX(v, 0)], [qml.expval(qml.Z(0))])
            keys.append(adjoint_serve_key(tape, config, None))
            return v

        jax.jit(record)(0.3)
        assert keys == [None]
        return
    tape = qml.tape.QuantumScript([qml.RX(value, 0)], [qml.expval(qml.Z(0))])
    assert adjoint_serve_key(tape, config, None) is None


def test_keys_differ_in_trainability_and_shots_but_not_in_values():
    config = qml.devices.ExecutionConfig()

    def key(x, shots=None):
        tape = qml.tape.QuantumScript([qml.RX(x, 0)], [qml.expval(qml.Z(0))], shots=shots)
        return adjoint_serve_key(tape, config, None)

    assert key(pnp.array(0.3)) == key(pnp.array(1.7))
    assert key(pnp.array(0.3)) != key(pnp.array(0.3, requires_grad=False))
    assert key(pnp.array(0.3)) != key(pnp.array(0.3), shots=10)


def test_threads_sharing_a_device_and_copies(monkeypatch):
    """Two threads asking with more structures than the device keeps (answers evicted
    while the other thread reads): every call right; a device with answers deep-copies."""
    import copy
    import threading

    from pennylane_custatevec.preprocess import config as config_module

    monkeypatch.setattr(config_module, "MAX_SERVE_ANSWERS", 2)
    device = qml.device("custatevec.qubit", wires=3)
    errors = []

    def work(offset):
        try:
            for depth in range(1, 13):

                @qml.qnode(device)
                def circuit(x, depth=depth):
                    for layer in range(depth):
                        qml.RX(x, (layer + offset) % 3)
                    return qml.expval(qml.Z(offset % 3))

                x = pnp.array(0.3, requires_grad=True)
                turns = sum(1 for layer in range(depth) if (layer + offset) % 3 == offset % 3)
                np.testing.assert_allclose(
                    qml.grad(circuit)(x), -turns * np.sin(turns * 0.3), atol=1e-10
                )
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(offset,)) for offset in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert 0 < len(device._serve_answers) <= 2
    assert copy.deepcopy(device)._serve_answers == device._serve_answers


def test_the_adjoint_answer_runs_the_adjoint_preprocessing_without_its_boundary():
    """``supports_derivatives`` and "best" run the adjoint method's named stages
    (``pipeline.ADJOINT_SERVING_STAGES``): the whole preprocessing of an adjoint config but
    its boundary, which refuses nothing and depends on the snapshot debugger, a state that
    the answer's key does not hold."""
    import types

    from pennylane.devices import ExecutionConfig

    device = qml.device("custatevec.qubit", wires=2, backend="cpu")
    device._debugger = types.SimpleNamespace(active=True)  # noqa: SLF001 (qml.snapshots')
    config = device.setup_execution_config(
        ExecutionConfig(gradient_method="adjoint", interface="jax")
    )
    full = [t.tape_transform.__name__ for t in device.preprocess_transforms(config)]
    serving = [t.tape_transform.__name__ for t in device.adjoint_serving_transforms(config)]
    assert full[:2] == ["results_off_the_jit_root", "snapshots_as_circuits"]
    assert serving == full[2:]
    assert serving[-1] == "validate_adjoint_differentiation"
