"""Device options, bad input, memory checks and bookkeeping of custatevec.qubit."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from conftest import AUTO_BACKEND, MIXED_WIRES, assert_allclose_nested, make_devices

import pennylane_custatevec
from pennylane_custatevec import CuStateVecDevice, simulate
from pennylane_custatevec.backends import BackendUnavailableError, CPUBackend
from pennylane_custatevec.simulate import StateTooLargeError


def test_device_loads_through_entry_point():
    dev = qml.device("custatevec.qubit", wires=2)
    assert isinstance(dev, CuStateVecDevice)
    assert dev.name == "custatevec.qubit"
    assert pennylane_custatevec.__version__


@pytest.mark.parametrize(
    "dtype, name", [(np.complex128, "complex128"), (np.complex64, "complex64")]
)
@pytest.mark.parametrize("backend", ["auto", "cpu"])
def test_repr_names_backend_and_dtype(dtype, name, backend):
    dev = qml.device("custatevec.qubit", wires=MIXED_WIRES, c_dtype=dtype, backend=backend)
    text = repr(dev)
    expected = AUTO_BACKEND if backend == "auto" else "cpu"
    assert f"backend={expected}" in text
    assert name in text
    assert "wires=5" in text
    assert dev.backend_name == expected
    assert dev.c_dtype == np.dtype(dtype)


def test_default_dtype_is_complex128():
    assert qml.device("custatevec.qubit", wires=1).c_dtype == np.complex128


@pytest.mark.skipif(AUTO_BACKEND == "custatevec", reason="the GPU backend is usable here")
def test_custatevec_backend_unavailable():
    with pytest.raises(BackendUnavailableError, match="not available"):
        qml.device("custatevec.qubit", wires=2, backend="custatevec")
    assert issubclass(BackendUnavailableError, qml.exceptions.DeviceError)


def test_unknown_option():
    with pytest.raises(ValueError, match="foo") as info:
        qml.device("custatevec.qubit", wires=2, foo=1)
    for option in ("seed", "c_dtype", "backend", "device_id"):
        assert option in str(info.value)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex256, int])
def test_bad_dtype(dtype):
    with pytest.raises(ValueError, match="complex128") as info:
        qml.device("custatevec.qubit", wires=2, c_dtype=dtype)
    assert "complex64" in str(info.value)


@pytest.mark.parametrize("backend", ["gpu", "CPU", "", "lightning"])
def test_bad_backend(backend):
    with pytest.raises(ValueError, match="auto") as info:
        qml.device("custatevec.qubit", wires=2, backend=backend)
    assert "cpu" in str(info.value) and "custatevec" in str(info.value)


def test_bad_seed():
    with pytest.raises(ValueError, match="seed"):
        qml.device("custatevec.qubit", wires=2, seed="bad")


def test_a_jit_traced_prng_key_is_refused_by_name():
    """PennyLane's TestPRNGKeySeed::test_integrate_prng_key_jitting builds the device inside
    jax.jit from a traced key (default.qubit samples with jax there): jax's
    TracerArrayConversionError became an error naming the seed and the ways out."""
    jax = pytest.importorskip("jax")

    @jax.jit
    def workflow(key):
        return qml.device("custatevec.qubit", wires=1, seed=key).wires.tolist()

    with pytest.raises(ValueError, match="seed is a jax PRNG key traced by jax.jit"):
        workflow(jax.random.PRNGKey(1))
    assert qml.device("custatevec.qubit", wires=1, seed=jax.random.PRNGKey(1)).wires.tolist()


@pytest.mark.parametrize("seed", [None, "global", 0, 2**40, np.random.default_rng(3)])
def test_good_seeds(seed):
    dev = qml.device("custatevec.qubit", wires=1, seed=seed)

    @qml.set_shots(shots=20)
    @qml.qnode(dev)
    def circuit():
        qml.Hadamard(0)
        return qml.sample(wires=0)

    assert circuit().shape == (20, 1)


def test_global_seed_follows_numpy_global_state():
    def draw():
        dev = qml.device("custatevec.qubit", wires=1, seed="global")

        @qml.set_shots(shots=100)
        @qml.qnode(dev)
        def circuit():
            qml.Hadamard(0)
            return qml.sample(wires=0)

        return circuit()

    np.random.seed(5)
    first = draw()
    np.random.seed(5)
    np.testing.assert_array_equal(first, draw())


def test_operation_on_wire_outside_device():
    dev = qml.device("custatevec.qubit", wires=["a", "b"])

    @qml.qnode(dev)
    def circuit():
        qml.Hadamard("c")
        return qml.expval(qml.Z("a"))

    with pytest.raises(qml.exceptions.WireError, match="c"):
        circuit()


def test_measurement_on_wire_outside_device():
    dev = qml.device("custatevec.qubit", wires=[0, 1])

    @qml.qnode(dev)
    def circuit():
        qml.Hadamard(0)
        return qml.expval(qml.Z(2))

    with pytest.raises(qml.exceptions.WireError):
        circuit()


def test_drawing_and_specs_of_a_circuit_off_the_device_wires():
    """qml.draw and qml.specs resolve "best" without running the circuit: a wire the device
    lacks is refused when it runs, not while drawing (default.qubit draws it too; the
    adjoint method's check raised WireError from supports_derivatives). One more wire than
    the device has is what ``mcm_method="deferred"`` needs for a measurement (PennyLane's
    ``test_specs_mcm``)."""
    dev = qml.device("custatevec.qubit", wires=[0, "a"])

    @qml.qnode(dev)
    def circuit(x):
        qml.RX(x, wires=0)
        for wire in range(3):
            qml.Hadamard(wire)
        return qml.expval(qml.Z(0) @ qml.Y(1))

    assert "RX(0.52)" in qml.draw(circuit)(0.52)
    assert qml.specs(circuit)(0.52).resources.num_gates == 4
    with pytest.raises(qml.exceptions.WireError, match="not found on the device"):
        circuit(0.52)

    @qml.qnode(qml.device("custatevec.qubit", wires=1))
    def measured():
        return qml.expval(qml.measure(0))

    assert qml.specs(measured)().resources.gate_types == {"MidMeasureMP": 1}


def test_device_without_wires_takes_circuit_wires():
    dev = qml.device("custatevec.qubit")
    ref = qml.device("default.qubit")

    def circuit():
        qml.Hadamard("x")
        qml.CNOT(["x", 7])
        qml.RY(0.3, wires="y")
        return qml.state(), qml.probs(wires=[7, "y"]), qml.expval(qml.X("y"))

    result = qml.QNode(circuit, dev)()
    assert result[0].shape == (8,)
    assert_allclose_nested(result, qml.QNode(circuit, ref)(), atol=1e-10)


def test_integer_wire_count():
    dev, ref = make_devices(3)

    def circuit():
        qml.Hadamard(0)
        qml.CNOT([0, 2])
        return qml.state()

    assert_allclose_nested(qml.QNode(circuit, dev)(), qml.QNode(circuit, ref)(), atol=1e-12)


def _forty_wire_circuit(dev):
    @qml.qnode(dev)
    def circuit():
        for w in range(40):
            qml.Hadamard(w)
        return qml.expval(qml.Z(0))

    return circuit


@pytest.mark.parametrize(
    "dtype, needed", [(np.complex128, "17,592,186,044,416"), (np.complex64, "8,796,093,022,208")]
)
def test_too_many_qubits_refused_before_allocating(dtype, needed, monkeypatch):
    def no_allocation(*args, **kwargs):
        raise AssertionError("the state was allocated")

    monkeypatch.setattr(CPUBackend, "zero_state", no_allocation)
    monkeypatch.setattr(CPUBackend, "from_host", no_allocation)
    dev = qml.device("custatevec.qubit", wires=40, c_dtype=dtype)
    with pytest.raises(StateTooLargeError) as info:
        _forty_wire_circuit(dev)()
    message = str(info.value)
    assert needed in message
    assert "available" in message
    assert isinstance(info.value, MemoryError)
    assert isinstance(info.value, qml.exceptions.DeviceError)


def test_too_many_qubits_without_monkeypatch():
    with pytest.raises(StateTooLargeError, match="17,592,186,044,416"):
        _forty_wire_circuit(qml.device("custatevec.qubit", wires=40))()


def test_memory_check_counts_the_broadcast_batch(monkeypatch):
    """A broadcast batch multiplies the memory needed."""
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)
    monkeypatch.setattr(CPUBackend, "available_bytes", lambda self: 3 * 16 * 2**10 - 1)
    dev = qml.device("custatevec.qubit", wires=10)

    @qml.qnode(dev)
    def circuit(x):
        qml.RX(x, wires=0)
        for w in range(1, 10):
            qml.Hadamard(w)
        return qml.expval(qml.Z(0))

    assert circuit(0.3) == pytest.approx(np.cos(0.3))
    with pytest.raises(StateTooLargeError, match=f"{3 * 16 * 2**10:,}"):
        circuit(np.array([0.1, 0.2, 0.3]))


def test_small_states_skip_the_memory_query(monkeypatch):
    """Up to UNCHECKED_BYTES the free-memory query (slower than the simulation) is skipped;
    one byte more and it runs."""
    queries = []

    def available(self):
        queries.append(1)
        return 1 << 40

    monkeypatch.setattr(CPUBackend, "available_bytes", available)
    backend = CPUBackend()
    n = (simulate.UNCHECKED_BYTES // 16).bit_length() - 1
    simulate.require_memory(backend, n, 1)
    assert queries == []
    simulate.require_memory(backend, n, 2)
    assert queries == [1]


def test_tracker_counts_executions():
    dev = qml.device("custatevec.qubit", wires=2)

    @qml.qnode(dev)
    def circuit(x):
        qml.RX(x, wires=0)
        return qml.expval(qml.Z(0))

    with qml.Tracker(dev) as tracker:
        circuit(0.1)
        circuit(0.2)
        circuit(0.3)
    assert tracker.totals["executions"] == 3
    assert tracker.totals["batches"] == 3
    assert len(tracker.history["results"]) == 3
    np.testing.assert_allclose(tracker.history["results"], np.cos([0.1, 0.2, 0.3]), atol=1e-12)


def test_tracker_counts_shots():
    dev = qml.device("custatevec.qubit", wires=2, seed=1)

    @qml.set_shots(shots=50)
    @qml.qnode(dev)
    def circuit():
        qml.Hadamard(0)
        return qml.expval(qml.Z(0)), qml.expval(qml.X(0))

    with qml.Tracker(dev) as tracker:
        circuit()
    # Z and X do not commute: two executions of 50 shots
    assert tracker.totals["shots"] == 100
    assert tracker.totals["executions"] == 2


def test_shots_on_device_still_work():
    with pytest.warns(qml.exceptions.PennyLaneDeprecationWarning):
        dev = qml.device("custatevec.qubit", wires=2, shots=123, seed=9)

    @qml.qnode(dev)
    def circuit():
        qml.Hadamard(0)
        return qml.sample(wires=[0, 1]), qml.expval(qml.Z(0))

    samples, value = circuit()
    assert samples.shape == (123, 2)
    np.testing.assert_array_equal(samples[:, 1], 0)
    assert -1 <= value <= 1


def test_execute_tapes_directly():
    dev = qml.device("custatevec.qubit", wires=2)
    tapes = [qml.tape.QuantumScript([qml.RX(x, 0)], [qml.expval(qml.Z(0))]) for x in (0.1, 0.5)] + [
        qml.tape.QuantumScript([qml.Hadamard(1)], [qml.probs(wires=[1])])
    ]
    results = dev.execute(tapes)
    assert isinstance(results, tuple) and len(results) == 3
    np.testing.assert_allclose(results[:2], np.cos([0.1, 0.5]), atol=1e-12)
    np.testing.assert_allclose(results[2], [0.5, 0.5], atol=1e-12)
    single = dev.execute(tapes[0])
    assert single == pytest.approx(np.cos(0.1))


def test_qml_execute_several_tapes():
    dev = qml.device("custatevec.qubit", wires=MIXED_WIRES)
    ref = qml.device("default.qubit", wires=MIXED_WIRES)
    tapes = [
        qml.tape.QuantumScript([qml.RY(0.4, "a"), qml.CNOT(["a", 0])], [qml.expval(qml.Z(0))]),
        qml.tape.QuantumScript([qml.RX(0.9, "z")], [qml.probs(wires=["z"]), qml.state()]),
    ]
    assert_allclose_nested(qml.execute(tapes, dev), qml.execute(tapes, ref), atol=1e-12)


@pytest.mark.parametrize("dtype", [np.complex128, np.complex64])
def test_result_dtypes(dtype):
    """Results are float64/complex128 whatever the state precision."""
    dev = qml.device("custatevec.qubit", wires=2, c_dtype=dtype)

    @qml.qnode(dev)
    def circuit():
        qml.Hadamard(0)
        return qml.expval(qml.Z(0)), qml.probs(wires=[0]), qml.state(), qml.var(qml.X(0))

    expval, probs, state, var = circuit()
    assert np.asarray(expval).dtype == np.float64
    assert probs.dtype == np.float64
    assert state.dtype == np.complex128
    assert np.asarray(var).dtype == np.float64


def _hadamard_measured(measurement, shots=None):
    """A QNode on a 2-wire device: a Hadamard on wire 0, then ``measurement()``; with
    ``shots`` set on the QNode."""
    dev = qml.device("custatevec.qubit", wires=2)

    @qml.qnode(dev)
    def circuit():
        qml.Hadamard(0)
        return measurement()

    return circuit if shots is None else qml.set_shots(circuit, shots=shots)


def test_preprocess_rejects_unsupported_measurement():
    circuit = _hadamard_measured(lambda: qml.classical_shadow(wires=[0]))
    with pytest.raises(qml.exceptions.DeviceError):
        circuit()


def test_state_with_shots_rejected():
    circuit = _hadamard_measured(qml.state, shots=10)
    with pytest.raises(qml.exceptions.DeviceError, match="state"):
        circuit()


def test_sample_without_shots_rejected():
    circuit = _hadamard_measured(lambda: qml.sample(wires=[0]))
    with pytest.raises(qml.exceptions.DeviceError, match="sample"):
        circuit()
