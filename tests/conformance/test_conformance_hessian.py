"""Second derivatives of QNodes on custatevec.qubit against default.qubit's (backprop):
Hessians of scalar, vector-valued, ragged and post-processed outputs and of variances,
with parameter-shift and with "best" (``max_diff=2``: "best" must take parameter-shift,
as the adjoint method has no second derivatives), in every interface; an explicit
``diff_method="adjoint"`` with ``max_diff=2`` must raise a clear error instead of returning
zeros.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conformance_support import (
    ADJOINT_CONFIGS,
    BEST,
    PARAMETER_SHIFT,
    custatevec_device,
    interface,
    interface_config_params,
    reference_qnode,
)
from pennylane.exceptions import DeviceError, QuantumFunctionError

ATOL = 1e-7
X = np.array([1.0, 2.0])  # the angles of hessian_best.py


def gates(x):
    qml.RY(x[0], wires=0)
    qml.RX(x[1], wires=0)
    qml.CNOT(wires=[0, 1])
    qml.RY(x[0], wires=1)


RETURNS = {
    "expval": lambda: qml.expval(qml.Z(0)),
    "probs": lambda: qml.probs(wires=[0, 1]),
    "ragged": lambda: (qml.expval(qml.Z(0) @ qml.X(1)), qml.probs(wires=[1])),
    "var_probs": lambda: (qml.var(qml.Z(0) @ qml.X(1)), qml.probs(wires=[0])),
}


def circuit_returning(returns: str):
    def circuit(x):
        gates(x)
        return RETURNS[returns]()

    return circuit


REFERENCE_HESSIANS: dict = {}
"""default.qubit's Hessians by (test case key, interface): one parametrized test's cases
share them."""


def hessians(circuit, iface, config, mode, postprocess=None, reference_key=None):
    """(custatevec's Hessian with ``config``, ``max_diff=2``; default.qubit's backprop
    Hessian) of ``circuit`` at ``X``, with ``postprocess`` applied to the QNode's output.
    ``reference_key``: names the case, so that default.qubit's Hessian is taken once."""
    ours = qml.QNode(
        circuit,
        custatevec_device(2, mode),
        interface=iface.name,
        max_diff=2,
        **config.qnode_kwargs(),
    )
    ref = reference_qnode(circuit, 2)
    if postprocess is not None:
        ours, ref = postprocess(ours), postprocess(ref)
    ref_iface = iface.for_reference_derivatives()
    key = (reference_key, ref_iface.name)
    if reference_key is None or key not in REFERENCE_HESSIANS:
        REFERENCE_HESSIANS[key] = ref_iface.hessian(ref, ref_iface.trainable(X))
    return iface.hessian(ours, iface.trainable(X)), REFERENCE_HESSIANS[key]


@pytest.mark.parametrize("returns", RETURNS)
@pytest.mark.parametrize(
    ("interface_name", "config", "mode"),
    interface_config_params(configs=[PARAMETER_SHIFT, BEST]),
)
def test_hessian(interface_name, config, mode, returns):
    iface = interface(interface_name)
    circuit = circuit_returning(returns)
    hessian, expected = hessians(circuit, iface, config, mode, reference_key=returns)
    assert hessian.shape == expected.shape
    np.testing.assert_allclose(hessian, expected, atol=ATOL, rtol=0)


def test_hessian_best_values():
    """hessian_best.py: the Hessian of <Z> after RY(a) RX(b), in closed form."""
    a, b = X
    closed_form = np.array(
        [
            [-np.cos(a) * np.cos(b), np.sin(a) * np.sin(b)],
            [np.sin(a) * np.sin(b), -np.cos(a) * np.cos(b)],
        ]
    )

    def circuit(x):
        qml.RY(x[0], wires=0)
        qml.RX(x[1], wires=0)
        return qml.expval(qml.Z(0))

    hessian, expected = hessians(circuit, interface("torch"), BEST, "deferred")
    np.testing.assert_allclose(expected[0], closed_form, atol=1e-12)
    np.testing.assert_allclose(hessian[0], closed_form, atol=ATOL)


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"),
    interface_config_params(configs=[PARAMETER_SHIFT, BEST]),
)
def test_hessian_of_postprocessed_outputs(interface_name, config, mode):
    """Classical processing after the QNode, mixing its outputs with the argument (of one
    probs output: PennyLane's autograd parameter-shift Hessian cannot stack tuple outputs
    in such processing, on default.qubit as here)."""

    def postprocess(qnode):
        def cost(x):
            p = qnode(x)
            return qml.math.stack([x[0] * p[0], p[0] * p[1] + qml.math.sin(x[1]) * p[1]])

        return cost

    circuit, iface = circuit_returning("probs"), interface(interface_name)
    hessian, expected = hessians(circuit, iface, config, mode, postprocess, "postprocessed")
    assert hessian.shape == expected.shape
    np.testing.assert_allclose(hessian, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"), interface_config_params(configs=ADJOINT_CONFIGS)
)
def test_explicit_adjoint_hessian_refused(interface_name, config, mode):
    """``diff_method="adjoint"`` with ``max_diff=2``: an error that says the adjoint
    method has no second derivatives, never a zero Hessian."""
    iface = interface(interface_name)
    ours = qml.QNode(
        circuit_returning("expval"),
        custatevec_device(2, mode),
        interface=interface_name,
        max_diff=2,
        **config.qnode_kwargs(),
    )
    with pytest.raises((DeviceError, QuantumFunctionError, ValueError)) as error:
        iface.hessian(ours, iface.trainable(X))
    message = str(error.value)
    assert "adjoint" in message
    assert any(word in message for word in ("max_diff", "order", "second")), message
