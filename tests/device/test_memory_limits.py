"""Memory checked before allocating (issue 14, item 6): the final states kept for the
derivatives in total, the bras of the adjoint sweeps (eager and deferred, Jacobian and
VJP), and the samples of a sampled circuit.

Free memory is monkeypatched to a small value (and ``simulate.UNCHECKED_BYTES`` to 0, so
that these small circuits are checked at all); ``Allocations`` follows every state batch
the backend allocates, so that the tests assert the peak of what is alive, and that a
refused run allocated nothing. Each case runs on the CPU backend and on the cuStateVec
double.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pennylane as qml
import pytest
from conftest import DEVICE, assert_allclose_nested, stable_seed
from pennylane import numpy as pnp

from pennylane_custatevec import simulate
from pennylane_custatevec.simulate import RunTooLargeError, StateTooLargeError

ATOL = 1e-10
MODES = ["deferred", "eager"]
N = 6
VECTOR = 16 * 2**N  # bytes of one state vector of N qubits, complex128


@pytest.fixture(params=["cpu", "custatevec"])
def backend_name(request):
    """The CPU backend, and the cuStateVec backend on its NumPy double."""
    if request.param == "custatevec":
        request.getfixturevalue("gpu_double")
    return request.param


@pytest.fixture(autouse=True)
def no_cycle_collection():
    """Python's cycle collector off for each test (after one collection): the batches
    followed here are then freed exactly when the device lets go of them, not whenever
    the collector last ran (which moved with the hash seed, and made these tests fail
    now and then). A batch that only a reference cycle held would stay counted: a
    failure here, deterministically."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def checked(monkeypatch):
    """Every request is checked against free memory, however small."""
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)


class Allocations:
    """The state batches a backend allocates (through its allocating methods), alive now
    and at most, and how much was alive before each allocation: each batch is followed
    until it is freed."""

    METHODS = ("zero_state", "from_host", "product_state", "copy", "concatenate")

    def __init__(self, backend, monkeypatch):
        self.live = self.peak = 0
        self.live_before: list[int] = []
        self._followed: set[int] = set()
        for name in self.METHODS:
            monkeypatch.setattr(backend, name, self._followed_by(getattr(backend, name)))

    def _followed_by(self, allocate):
        def allocating(*args, **kwargs):
            self.live_before.append(self.live)
            array = allocate(*args, **kwargs)
            key = id(array)
            if key not in self._followed:  # a product state may come from zero_state
                self._followed.add(key)
                self.live += array.nbytes
                self.peak = max(self.peak, self.live)
                weakref.finalize(array, self._freed, key, array.nbytes)
            return array

        return allocating

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._followed.discard(key)

    def restart(self) -> None:
        """Count allocations and the peak from now on."""
        self.peak, self.live_before = self.live, []


def limit_memory(dev, monkeypatch, available: int, allocations: Allocations | None = None):
    """The device's backend (and the host) report ``available`` free bytes, less what
    ``allocations`` holds alive, if given (as a real query would)."""

    def free() -> int:
        return available - (allocations.live if allocations else 0)

    monkeypatch.setattr(dev._backend, "available_bytes", free)
    monkeypatch.setattr(dev._backend, "available_host_bytes", free)


def derivatives_allocate_nothing(dev, monkeypatch) -> Allocations:
    """Follow the allocations of the device's derivatives (the untracked implementations
    behind compute_derivatives and compute_vjp, which execute_and_... call too):
    ``live_before`` stays empty if they allocate nothing."""
    allocations = Allocations(dev._backend, monkeypatch)
    for name in ("_compute_derivatives", "_compute_vjp"):
        method = getattr(dev, name)

        def restarted(*args, method=method, **kwargs):
            allocations.restart()
            return method(*args, **kwargs)

        monkeypatch.setattr(dev, name, restarted)
    return allocations


def device(backend_name, mode="deferred", wires=N, **kwargs):
    """fusion_qubits=2 on both backends, so that the memory the deferred sweep's
    reductions take is the same on both."""
    return qml.device(
        DEVICE,
        wires=wires,
        backend=backend_name,
        grad_accumulation=mode,
        fusion_qubits=2,
        seed=7,
        **kwargs,
    )


def layer(weights):
    for wire in range(N):
        qml.RY(weights[wire], wires=wire)
    for wire in range(N - 1):
        qml.CNOT([wire, wire + 1])


WEIGHTS = np.random.default_rng(stable_seed("memory-weights")).uniform(-np.pi, np.pi, N)


def broadcast_circuit(x):
    """A trainable broadcast parameter ``x`` (the device's preprocessing expands it into
    one tape per entry) between fixed layers."""
    layer(WEIGHTS)
    qml.RX(x, wires=0)
    qml.RZ(0.3 * x, wires=2)
    layer(WEIGHTS[::-1])
    return qml.expval(qml.Z(N - 1) @ qml.X(1))


def probs_circuit(wires=tuple(range(N)), broadcast=0):
    """Probabilities on ``wires`` (a Jacobian has one bra per outcome) after two trainable
    gates; with ``broadcast``, a non-trainable broadcast gate of that many entries (the
    deferred mode sweeps the whole broadcast as one batch)."""

    def circuit(a, b):
        layer(WEIGHTS)
        if broadcast:
            qml.RZ(np.linspace(0.1, 1.3, broadcast), wires=3)
        qml.RX(a, wires=0)
        qml.RY(b, wires=N - 1)
        return qml.probs(wires=list(wires))

    return circuit


def jacobians(circuit, dev, *args, **kwargs):
    """(ours, default.qubit's) autograd Jacobians of ``circuit`` at ``args``."""
    node = qml.QNode(circuit, dev, diff_method="adjoint", **kwargs)
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=N))
    argnums = list(range(len(args)))
    ours = qml.jacobian(node, argnums=argnums)(*args)
    return ours, qml.jacobian(reference, argnums=argnums)(*args)


A, B = pnp.array(0.3, requires_grad=True), pnp.array(-0.4, requires_grad=True)


# ---------------------------------------------------------------------------------------
# The final states kept for the derivatives, in total


@pytest.mark.parametrize("mode", MODES)
def test_trainable_broadcast_kept_states_over_free_memory_run_in_chunks(
    mode, backend_name, checked, monkeypatch
):
    """A trainable broadcast parameter of 16 entries (expanded into 16 tapes): their final
    states together (16 vectors) do not fit in 8 vectors of free memory, so none is kept;
    the forward pass runs in chunks that fit, the derivatives simulate the states again in
    chunks that fit, and the Jacobian equals default.qubit's. With enough memory all 16
    are kept (the peak shows it), so the peak below is the check's doing."""
    x = pnp.array(np.linspace(-1.2, 2.0, 16), requires_grad=True)
    dev = device(backend_name, mode)
    allocations = Allocations(dev._backend, monkeypatch)
    limit_memory(dev, monkeypatch, 1 << 40)
    ours, expected = jacobians(broadcast_circuit, dev, x)
    assert_allclose_nested(ours, expected, atol=ATOL)
    assert allocations.peak >= 16 * VECTOR  # every state kept

    available = 8 * VECTOR
    limit_memory(dev, monkeypatch, available, allocations)
    allocations.restart()
    ours, _ = jacobians(broadcast_circuit, dev, x)
    assert_allclose_nested(ours, expected, atol=ATOL)
    assert allocations.live_before  # it allocated, within the limit:
    assert allocations.peak <= available


@pytest.mark.parametrize("mode", MODES)
def test_kept_states_of_the_previous_execution_are_freed_first(
    mode, backend_name, checked, monkeypatch
):
    """The states kept by one execution are released before the next one runs (it
    replaces them anyway), so that they do not count against its memory."""
    dev = device(backend_name, mode)
    node = qml.QNode(probs_circuit(), dev, diff_method="adjoint", device_vjp=True)
    allocations = Allocations(dev._backend, monkeypatch)
    node(A, B)
    assert allocations.live == VECTOR  # the kept state
    allocations.restart()
    node(B, A)
    assert allocations.live_before[0] == 0
    assert allocations.live == VECTOR


def test_small_runs_skip_the_memory_query(backend_name, monkeypatch):
    """Up to ``simulate.UNCHECKED_BYTES`` in total (kept states, bras, samples), no
    free-memory query: the fast path of small circuits."""
    dev = device(backend_name)

    def queried():
        raise AssertionError("free memory was queried for a small run")

    monkeypatch.setattr(dev._backend, "available_bytes", queried)
    monkeypatch.setattr(dev._backend, "available_host_bytes", queried)
    x = pnp.array([0.2, 0.7, 1.1], requires_grad=True)
    ours, expected = jacobians(broadcast_circuit, dev, x)
    assert_allclose_nested(ours, expected, atol=ATOL)
    ours, expected = jacobians(probs_circuit(broadcast=3), dev, A, B)
    assert_allclose_nested(ours, expected, atol=ATOL)
    sampled = qml.set_shots(qml.QNode(broadcast_circuit, dev), 1000)
    assert np.shape(sampled(0.3)) == ()


# ---------------------------------------------------------------------------------------
# The bras of the sweeps


@pytest.mark.parametrize("mode", MODES)
def test_trainable_broadcast_refused_when_one_entry_does_not_fit(
    mode, backend_name, checked, monkeypatch
):
    """The Jacobian of probs on 6 wires needs 64 bras per entry of a trainable broadcast
    (3 entries, expanded): with room for 20 vectors the forward pass runs, and the
    derivatives are refused before they allocate anything, naming device_vjp=True; with
    device_vjp=True (one bra per VJP) it runs in the same memory and equals
    default.qubit."""

    def circuit(x):
        layer(WEIGHTS)
        qml.RX(x, wires=0)
        qml.RY(0.2, wires=1)
        return qml.probs(wires=range(N))

    x = pnp.array([0.3, -0.9, 1.7], requires_grad=True)
    dev = device(backend_name, mode)
    limit_memory(dev, monkeypatch, 20 * VECTOR)
    allocations = derivatives_allocate_nothing(dev, monkeypatch)
    with pytest.raises(RunTooLargeError, match="device_vjp=True") as info:
        jacobians(circuit, dev, x)
    assert allocations.live_before == []
    assert "64 bras" in str(info.value)
    assert f"{20 * VECTOR:,} bytes are available" in str(info.value)

    ours, expected = jacobians(circuit, dev, x, device_vjp=True)
    assert_allclose_nested(ours, expected, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
def test_jacobian_of_probs_on_many_wires_refused(mode, backend_name, checked, monkeypatch):
    """One bra per output: the Jacobian of probs on 6 wires needs 64 bras, which do not
    fit in 50 vectors; refused before the derivatives allocate anything, saying what it
    needs and that device_vjp=True (one bra) would fit, which it does. Probs on 4 wires
    (16 bras, and in the deferred mode their reductions and, on the GPU, a copy of the
    bras in each step) fit; both equal default.qubit."""
    dev = device(backend_name, mode)
    limit_memory(dev, monkeypatch, 50 * VECTOR)
    allocations = derivatives_allocate_nothing(dev, monkeypatch)
    with pytest.raises(RunTooLargeError) as info:
        jacobians(probs_circuit(), dev, A, B)
    assert allocations.live_before == []
    message = str(info.value)
    assert "64 bras" in message
    assert f"{50 * VECTOR:,} bytes are available" in message
    assert "These would fit: device_vjp=True" in message
    assert isinstance(info.value, StateTooLargeError)
    assert isinstance(info.value, MemoryError)
    assert isinstance(info.value, qml.exceptions.DeviceError)

    ours, expected = jacobians(probs_circuit(), dev, A, B, device_vjp=True)
    assert_allclose_nested(ours, expected, atol=ATOL)
    ours, expected = jacobians(probs_circuit(wires=(0, 2, 3, 5)), dev, A, B)
    assert_allclose_nested(ours, expected, atol=ATOL)


def test_deferred_broadcast_swept_whole_refused_names_what_fits(backend_name, checked, monkeypatch):
    """The deferred mode sweeps a broadcast whose trainable parameters are not broadcast
    as one batch: 4 entries x 16 bras (probs on 4 wires) do not fit in 60 vectors; the
    error names the eager mode (entry by entry) and a smaller broadcast, and each of them
    runs in that memory and equals default.qubit."""
    available = 60 * VECTOR
    dev = device(backend_name, "deferred")
    limit_memory(dev, monkeypatch, available)
    allocations = derivatives_allocate_nothing(dev, monkeypatch)
    with pytest.raises(RunTooLargeError) as info:
        jacobians(probs_circuit((0, 1, 2, 3), broadcast=4), dev, A, B)
    assert allocations.live_before == []
    message = str(info.value)
    assert "4 state vectors with 16 bras each" in message
    assert 'grad_accumulation="eager"' in message
    assert "device_vjp=True" in message
    entries = int(message.split("a broadcast of at most ")[1].split(" ")[0])
    assert 1 <= entries < 4

    smaller = probs_circuit((0, 1, 2, 3), broadcast=entries)
    ours, expected = jacobians(smaller, dev, A, B)
    assert_allclose_nested(ours, expected, atol=ATOL)
    eager = device(backend_name, "eager")
    limit_memory(eager, monkeypatch, available)
    ours, expected = jacobians(probs_circuit((0, 1, 2, 3), broadcast=4), eager, A, B)
    assert_allclose_nested(ours, expected, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
def test_jacobian_batch_within_free_memory(mode, backend_name, checked, monkeypatch):
    """Eight tapes of one structure in one qml.execute, whose Jacobians need 4 bras each:
    the deferred mode sweeps them in chunks, the eager mode one by one, their states,
    bras and temporaries within 24 vectors (the 8 kept final states among them); equal to
    default.qubit."""
    circuit = probs_circuit((1, 4))

    def cost(params, dev, diff_method):
        tapes = [qml.tape.make_qscript(circuit)(a, b) for a, b in params]
        return pnp.stack(qml.execute(tapes, dev, diff_method=diff_method))

    rng = np.random.default_rng(stable_seed("memory-batch"))
    params = pnp.array(rng.uniform(-np.pi, np.pi, (8, 2)), requires_grad=True)
    dev = device(backend_name, mode)
    available = 24 * VECTOR
    allocations = Allocations(dev._backend, monkeypatch)
    limit_memory(dev, monkeypatch, available, allocations)
    ours = qml.jacobian(cost)(params, dev, "adjoint")
    assert allocations.peak <= available
    ref = qml.device("default.qubit", wires=N)
    expected = qml.jacobian(cost)(params, ref, "backprop")
    assert_allclose_nested(ours, expected, atol=ATOL)


@pytest.mark.parametrize("mode", MODES)
def test_state_jacobian_refused(mode, backend_name, checked, monkeypatch):
    """The Jacobian of qml.state() holds a derivative per trainable gate: 8 gates and the
    state do not fit in 6 vectors; refused before allocating, naming device_vjp=True."""

    def circuit(angles):
        for i in range(8):
            qml.RY(angles[i], wires=i % N)
        return qml.state()

    dev = device(backend_name, mode)
    limit_memory(dev, monkeypatch, 6 * VECTOR)
    allocations = derivatives_allocate_nothing(dev, monkeypatch)
    node = qml.QNode(circuit, dev, diff_method="adjoint")
    angles = pnp.array(np.linspace(0.1, 0.8, 8), requires_grad=True)
    with pytest.raises(RunTooLargeError, match="device_vjp=True") as info:
        qml.jacobian(lambda a: pnp.real(node(a)))(angles)
    assert allocations.live_before == []
    assert "9 state vectors" in str(info.value)


# ---------------------------------------------------------------------------------------
# Samples


def sampled_circuit():
    qml.Hadamard(0)
    qml.CNOT([0, 1])
    return qml.expval(qml.Z(0)), qml.probs(wires=[0, 1])


def test_billion_shots_refused_before_sampling(backend_name, monkeypatch):
    """shots=10**9 on two wires would allocate tens of GB of samples: refused before the
    backend samples (with the host's real free memory), naming a number of shots that
    fits, and shots=None (every measurement has an exact value)."""
    dev = device(backend_name, wires=2)

    def sampled(*args, **kwargs):
        raise AssertionError("sampled before the memory check refused the run")

    monkeypatch.setattr(dev._backend, "sample", sampled)
    monkeypatch.setattr(dev._backend, "available_host_bytes", lambda: 10**9)
    node = qml.set_shots(qml.QNode(sampled_circuit, dev), 10**9)
    with pytest.raises(RunTooLargeError) as info:
        node()
    message = str(info.value)
    assert "Sampling 1,000,000,000 shots of 2 wires" in message
    assert "of host memory; 1,000,000,000 bytes are available" in message
    assert "shots=None (exact expectation values" in message
    fitting = int(message.split("shots=")[1].split(" ")[0].replace(",", ""))
    assert 10**6 < fitting < 10**8


def test_shots_that_fit_run(backend_name, checked, monkeypatch):
    """The number of shots the error names fits: it runs (seeded) and agrees with the
    exact values."""
    dev = device(backend_name, wires=2)
    monkeypatch.setattr(dev._backend, "available_host_bytes", lambda: 10**7)
    node = qml.set_shots(qml.QNode(sampled_circuit, dev), 10**6)
    with pytest.raises(RunTooLargeError) as info:
        node()
    fitting = int(str(info.value).split("shots=")[1].split(" ")[0].replace(",", ""))
    mean, probs = qml.set_shots(qml.QNode(sampled_circuit, dev), fitting)()
    assert abs(mean) < 5 / np.sqrt(fitting)
    np.testing.assert_allclose(probs, [0.5, 0, 0, 0.5], atol=5 / np.sqrt(fitting))


def test_shot_vector_total_refused(backend_name, monkeypatch):
    """A shot vector's partitions are sampled together: 100 partitions of 10**6 shots
    (10**8 in all, with qml.sample) do not fit in 10**8 bytes, though one partition
    would; the error names the total that fits (and not shots=None: samples have no
    exact value)."""
    dev = device(backend_name, wires=2)
    monkeypatch.setattr(dev._backend, "sample", lambda *a: pytest.fail("sampled"))
    monkeypatch.setattr(dev._backend, "available_host_bytes", lambda: 10**8)

    def circuit():
        qml.Hadamard(0)
        return qml.sample(wires=[0, 1])

    node = qml.set_shots(qml.QNode(circuit, dev), [(10**6, 100)])
    with pytest.raises(RunTooLargeError) as info:
        node()
    message = str(info.value)
    assert "Sampling 100,000,000 shots" in message
    assert "a shot vector of 100 partitions sampled together" in message
    assert "at most" in message and "shots in all" in message
    assert "shots=None" not in message
