"""``qml.Tracker`` counts and PennyLane's execution cache on custatevec.qubit against
default.qubit: the counts of batches, executions, simulations, derivatives and VJPs for a
forward and backward pass, for each differentiation configuration and interface, are
default.qubit's; with ``cache=True`` the same tapes hit the cache (the same number of
executions), also for tapes whose angles differ in their last bits.
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conformance_support import (
    ADJOINT_CONFIGS,
    ADJOINT_JACOBIAN,
    ADJOINT_JACOBIAN_ON_EXECUTION,
    BEST,
    PARAMETER_SHIFT,
    DiffConfig,
    custatevec_device,
    interface,
    interface_config_params,
    reference_device,
)
from reference import parameter_shift_hessian

COUNTS_NOT_COMPARED = {"results", "resources", "errors"}
"""Tracked values that are not counts (results are compared elsewhere; resources count
the gates after each device's own preprocessing)."""


def counts(tracker) -> dict:
    return {k: v for k, v in tracker.totals.items() if k not in COUNTS_NOT_COMPARED}


def reference_config(config: DiffConfig, interface_name: str) -> DiffConfig:
    """The configuration whose counts custatevec's must equal: "best" is custatevec's
    adjoint with Jacobians on execution, under torch in the backward pass (where a second
    derivative shows; default.qubit's "best" is backprop, which it does not count as
    derivatives)."""
    if config is not BEST:
        return config
    return ADJOINT_JACOBIAN if interface_name == "torch" else ADJOINT_JACOBIAN_ON_EXECUTION


def circuit(x, y):
    """Expectation values only: default.qubit's adjoint turns a mix of expectation values
    and probabilities into one state measurement, which PennyLane's tracker counts as one
    execution where the mix is counted as one per measurement group (see
    ``test_tracker_counts_a_mixed_tape_as_measured``)."""
    qml.RX(x, wires=0)
    qml.RY(y[0], wires=1)
    qml.CNOT(wires=[0, 1])
    qml.Rot(y[1], x, 0.3, wires=1)
    return qml.expval(qml.Z(0) @ qml.Z(1)), qml.expval(qml.Y(1))


@pytest.mark.parametrize(
    ("interface_name", "config", "mode"),
    interface_config_params(configs=[*ADJOINT_CONFIGS, PARAMETER_SHIFT, BEST]),
)
def test_tracker_counts_forward_and_backward(interface_name, config, mode):
    """tracker_double_count.py: one Jacobian of a QNode (its forward pass and its
    backward pass) is counted as on default.qubit."""
    iface = interface(interface_name)
    totals = []
    for dev, cfg in (
        (custatevec_device(2, mode), config),
        (reference_device(2), reference_config(config, interface_name)),
    ):
        qnode = qml.QNode(circuit, dev, interface=interface_name, **cfg.qnode_kwargs())
        with qml.Tracker(dev) as tracker:
            iface.jacobian(qnode, iface.args([0.4, np.array([-0.7, 1.1])]))
        totals.append(counts(tracker))
    assert totals[0] == totals[1]


def mixed_circuit(x, y):
    qml.RX(x, wires=0)
    qml.RY(y[0], wires=1)
    qml.CNOT(wires=[0, 1])
    qml.Rot(y[1], x, 0.3, wires=1)
    return qml.expval(qml.Z(0) @ qml.Z(1)), qml.probs(wires=[1])


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("config", ADJOINT_CONFIGS, ids=lambda c: c.name)
def test_tracker_counts_a_mixed_tape_as_measured(config, mode):
    """A tape that mixes an expectation value and probabilities, run by an adjoint QNode:
    this device measures the tape as it is, and the tracker counts it by PennyLane's rule
    for that tape (one execution per measurement group), as default.qubit counts the same
    tape when it does not differentiate it by its adjoint method. (default.qubit's adjoint
    measures such a tape as one state and so counts one execution: documented in
    doc/differentiation.md.)"""
    args = (0.4, np.array([-0.7, 1.1]))
    totals = []
    for dev, cfg in ((custatevec_device(2, mode), config), (reference_device(2), PARAMETER_SHIFT)):
        qnode = qml.QNode(mixed_circuit, dev, **cfg.qnode_kwargs())
        with qml.Tracker(dev) as tracker:
            qnode(*args)
        totals.append(counts(tracker))
    assert totals[0] == totals[1]
    assert totals[0]["executions"] == 2


@pytest.mark.parametrize("mode", ["deferred", "eager"])
@pytest.mark.parametrize("config", ADJOINT_CONFIGS, ids=lambda c: c.name)
def test_tracker_counts_of_a_batch(config, mode):
    """One ``qml.execute`` of three tapes, forward and backward (torch)."""
    iface = interface("torch")
    totals = []
    for dev in (custatevec_device(2, mode), reference_device(2)):

        def run(a, b, dev=dev):
            tapes = [
                qml.tape.QuantumScript([qml.RX(a, 0), qml.RY(b, 1)], [qml.expval(qml.Z(0))]),
                qml.tape.QuantumScript([qml.RX(b, 0), qml.CNOT([0, 1])], [qml.probs([0, 1])]),
                qml.tape.QuantumScript([qml.IsingZZ(a, [0, 1])], [qml.expval(qml.X(1))]),
            ]
            return tuple(qml.execute(tapes, dev, **config.qnode_kwargs()))

        with qml.Tracker(dev) as tracker:
            iface.jacobian(run, iface.args([0.4, -0.9]))
        totals.append(counts(tracker))
    assert totals[0] == totals[1]


@pytest.mark.parametrize("angles", [[0.1, 0.2], [0.1 + np.pi / 2 - np.pi / 2, 0.2]])
def test_cache_hits_parameter_shift_hessian(angles):
    """cache_hash.py: the shifted tapes a parameter-shift Hessian repeats hit the cache
    as on default.qubit (12 executions, not 16), also where an angle is 0.1 plus one ulp
    (the shifts then reproduce it only to round-off, as PennyLane's hash rounds)."""
    hessian, executions = parameter_shift_hessian(custatevec_device(2), angles)
    expected_hessian, expected_executions = parameter_shift_hessian(reference_device(2), angles)
    np.testing.assert_allclose(hessian, expected_hessian, atol=1e-8)
    assert executions == expected_executions


def test_cache_hits_repeated_tapes_in_one_batch():
    """``qml.execute(cache=True)`` with a tape repeated in its batch, and again in a later
    call: executed once, as on default.qubit; the results equal default.qubit's."""

    def tapes(a):
        gates = [qml.RX(a, 0), qml.CNOT([0, 1]), qml.RY(0.3, 1)]
        first = qml.tape.QuantumScript(gates, [qml.expval(qml.Z(1))])
        return [first, first.copy(), qml.tape.QuantumScript(gates, [qml.probs([0])]), first]

    out = []
    for dev in (custatevec_device(2), reference_device(2)):
        cache = {}
        with qml.Tracker(dev) as tracker:
            first = qml.execute(tapes(0.5), dev, diff_method=None, cache=cache)
            again = qml.execute(tapes(0.5), dev, diff_method=None, cache=cache)
        out.append((first, again, counts(tracker)))
    (ours_first, ours_again, ours_counts), (ref_first, ref_again, ref_counts) = out
    assert ours_counts == ref_counts
    for got, want in zip([*ours_first, *ours_again], [*ref_first, *ref_again], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("interface_name", ["autograd", "torch"])
def test_qnode_cache_hessian_executions(interface_name):
    """A QNode with ``cache=True`` and ``max_diff=2``: its parameter-shift Hessian runs as
    many executions as on default.qubit."""
    iface = interface(interface_name)
    totals = []
    for dev in (custatevec_device(2), reference_device(2)):

        def single(x):
            qml.RX(x[0], wires=0)
            qml.RY(x[1], wires=1)
            qml.CNOT(wires=[0, 1])
            return qml.expval(qml.Z(0) @ qml.X(1))

        qnode = qml.QNode(
            single,
            dev,
            interface=interface_name,
            diff_method="parameter-shift",
            max_diff=2,
            cache=True,
        )
        with qml.Tracker(dev) as tracker:
            iface.hessian(qnode, iface.trainable(np.array([0.6, -0.2])))
        totals.append(counts(tracker))
    assert totals[0] == totals[1]
