"""Small structures of Pauli expectation values run directly (``direct``): the compiled
path's entry points (``execute_structures``, ``vjp_structures``) give, through the direct
plan, what ``execute`` and ``compute_vjp`` give for the tapes they stand for, for every
gate of capabilities.toml (plain, controlled, adjoint), native templates, broadcasts,
Hamiltonians, batches of cotangents, both dtypes and both accumulation modes; and what
does not fit takes the general path."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import pytest
from gate_cases import GATES, NON_UNITARY, gate_forms, gate_spec
from pennylane.devices import ExecutionConfig

from pennylane_custatevec import direct, options
from pennylane_custatevec.backends.base import Backend
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.program import compiles_by_gate

_WIRES = [0, "a", 2, 5, "b", 7, 8]


def _config(device) -> ExecutionConfig:
    config = ExecutionConfig(
        gradient_method="adjoint", use_device_jacobian_product=True, interface="torch"
    )
    return device.setup_execution_config(config)


def _measurements(wires) -> list:
    first, last = wires[0], wires[-1]
    hamiltonian = qml.Hamiltonian(
        [0.3, -0.7, 0.25], [qml.Y(wires[1]), qml.Z(first) @ qml.X(last), qml.Z(first)]
    )
    return [qml.expval(qml.Z(first) @ qml.X(last)), qml.expval(hamiltonian)]


def _processed(device, tape):
    """The tape as the compiled path hands it over: preprocessed (validated), its
    trainable parameters those of its gates with a generator (PennyLane's decompositions
    make every parameter of a tape trainable, observables' too)."""
    config = _config(device)
    (processed,), _ = device.preprocess_transforms(config)((tape,))
    differentiable, start = set(), 0
    for op in processed.operations:
        if op.has_generator or compiles_by_gate(op):
            differentiable.update(range(start, start + len(op.data)))
        start += len(op.data)
    trainable = [i for i in processed.trainable_params if i in differentiable]
    return processed.copy(trainable_params=trainable), config


def _ran_directly(run) -> bool:
    """Whether a ``StructureRun`` ran directly: what it kept of each tape is a
    ``direct.DirectKept``."""
    return all(isinstance(entry, direct.DirectKept) for entry in run.kept)


def _assert_matches_the_tapes(device, template, tapes, *, expect_direct: bool, rng):
    """Run the structure of ``template`` with each tape's parameters: results, one VJP,
    a batch of 3 cotangents and a second VJP of one run agree with ``execute`` and
    ``compute_vjp`` of the tape (to 1e-12); whether the run was direct is ``expect_direct``."""
    processed, config = _processed(device, template)
    structure = device.structure_of(processed)
    for tape in tapes:
        expected_tape, _ = _processed(device, tape)
        values = expected_tape.get_parameters(trainable_only=False, operations_only=True)
        run = device.execute_structures([structure], [values], config)
        assert _ran_directly(run) is expect_direct
        expected = device.execute([expected_tape], config)[0]
        np.testing.assert_allclose(run.results[0], expected, atol=1e-12, rtol=0)
        shapes = [
            np.shape(value) for value in (expected if isinstance(expected, tuple) else [expected])
        ]
        dy = tuple(rng.uniform(-1, 1, shape) for shape in shapes)
        dy = dy if len(dy) > 1 else dy[0]
        got = device.vjp_structures(run, [dy], config)[0]
        want = device.compute_vjp([expected_tape], [dy], config)[0]
        _assert_gradients_close(got, want)
        again = device.vjp_structures(run, [dy], config)[0]  # the state was taken: simulated
        _assert_gradients_close(again, want)
        rows = tuple(rng.uniform(-1, 1, (3, *shape)) for shape in shapes)
        rows = rows if len(rows) > 1 else rows[0]
        batched = device.vjp_structures(
            device.execute_structures([structure], [values], config), [rows], config
        )[0]
        for k in range(3):
            row = tuple(r[k] for r in rows) if len(shapes) > 1 else rows[k]
            single = device.compute_vjp([expected_tape], [row], config)[0]
            _assert_gradients_close([np.asarray(g)[k] for g in batched], single)


def _assert_gradients_close(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12, rtol=0)


def _gate(name: str, form: str, draw: int):
    n_wires, factory = gate_spec(name)
    op = factory(np.random.default_rng([sum(map(ord, name + form)), draw]), _WIRES[:n_wires])
    if form == "controlled":
        op = qml.ctrl(op, control=_WIRES[-1], control_values=0)
    elif form == "adjoint":
        op = qml.adjoint(op)
    return op


def _gate_tape(op, draw: int) -> qml.tape.QuantumScript:
    """A layer of RY (trainable), then ``op`` (trainable where the adjoint method takes
    it), then Pauli expvals and a Hamiltonian."""
    angles = np.random.default_rng(draw).uniform(0, 3, len(_WIRES))
    layer = [qml.RY(a, wires=w) for a, w in zip(angles, _WIRES, strict=True)]
    n_parameters = len(_WIRES) + len(op.data)  # the gates', not the observables'
    return qml.tape.QuantumScript(
        [*layer, op], _measurements(_WIRES), trainable_params=list(range(n_parameters))
    )


_ROTATIONS = {"RX", "RY", "RZ", "IsingXX", "IsingYY", "IsingZZ", "MultiRZ", "PauliRot"}
_ROTATIONS |= {"CRX", "CRY", "CRZ"}
"""Gates whose parameter a rotation's angle rule reads, plain or controlled: their
structures run from the parameters alone (an adjoint rotation is a rebuilt operation)."""
_NOT_REPLAYABLE = {
    ("ControlledQubitUnitary", "plain"),
    ("ControlledQubitUnitary", "adjoint"),
    ("QubitUnitary", "controlled"),
}
"""Gates that PennyLane's ``bind_new_parameters`` rebuilds without their control values
(``Structure.replayable``): the compiled path runs them through the QNode."""


@pytest.mark.parametrize(
    ("name", "form"),
    [(name, form) for name in sorted(set(GATES) - NON_UNITARY) for form in gate_forms(name)],
)
def test_every_gate_runs_as_its_tape(name, form, rng):
    device = qml.device("custatevec.qubit", wires=_WIRES, backend="cpu")
    template = _gate_tape(_gate(name, form, 0), 0)
    tapes = [_gate_tape(_gate(name, form, draw), draw) for draw in (1, 2)]
    processed, _ = _processed(device, template)
    if (name, form) in _NOT_REPLAYABLE:
        with pytest.raises(ValueError, match="cannot be rebuilt"):
            device.structure_of(processed)  # the compiled path runs it through the QNode
        return
    structure = device.structure_of(processed)
    plan = direct.plan_of(device._backend, structure)  # noqa: SLF001
    assert plan is not None, "every gate of 7 wires at most fits a direct run"
    # a gate that an angle rule reads runs from the parameters alone; any other with
    # parameters (PhaseShift, an adjoint rotation, ...) compiles the call's tape
    assert plan.recompiles == bool(structure.rebuilt_operations)
    if name in _ROTATIONS and form != "adjoint":
        assert not plan.recompiles
    _assert_matches_the_tapes(device, template, tapes, expect_direct=True, rng=rng)


def _template_tape(draw: int, batch: int | None) -> qml.tape.QuantumScript:
    rng = np.random.default_rng(draw)
    features = rng.uniform(0, 3, (batch, 3) if batch else 3)
    ops = [
        qml.AngleEmbedding(features, wires=[0, 1, 2]),
        qml.StronglyEntanglingLayers(rng.uniform(0, 3, (2, 3, 3)), wires=[0, 1, 2]),
        qml.BasicEntanglerLayers(rng.uniform(0, 3, (1, 3)), wires=[0, 1, 2]),
        qml.CNOT([2, 0]),
        qml.Hadamard(1),
    ]
    return qml.tape.QuantumScript(ops, _measurements([0, 1, 2]), trainable_params=[1, 2])


@pytest.mark.parametrize("c_dtype", [np.complex128, np.complex64])
@pytest.mark.parametrize("batch", [None, 6], ids=["one", "broadcast"])
@pytest.mark.parametrize("calls", ["cpu", "base"])
def test_templates_and_broadcasts_run_as_their_tapes(batch, c_dtype, calls, rng, monkeypatch):
    """On the CPU backend's one-call kernels, and on the base class's compositions of
    ``run_sequence_measured`` and ``sweep_sequence_from_words`` (what a backend without
    them runs: one bra per row, per word and vector for a broadcast, per vector and row
    for a broadcast with a batch of cotangents)."""
    if calls == "base":
        for name in ("run_sequence_measured", "sweep_sequence_from_words"):
            monkeypatch.setattr(CPUBackend, name, getattr(Backend, name))
    device = qml.device("custatevec.qubit", wires=3, backend="cpu", c_dtype=c_dtype)
    template = _template_tape(0, batch)
    tapes = [_template_tape(draw, batch) for draw in (1, 2)]
    if c_dtype is np.complex64:  # the general path at single precision: equal to round-off
        processed, config = _processed(device, template)
        structure = device.structure_of(processed)
        expected_tape, _ = _processed(device, tapes[0])
        values = expected_tape.get_parameters(trainable_only=False, operations_only=True)
        run = device.execute_structures([structure], [values], config)
        assert _ran_directly(run)
        np.testing.assert_allclose(
            run.results[0], device.execute([expected_tape], config)[0], atol=1e-6
        )
        dy = (np.full(batch, 0.5) if batch else 0.5, np.full(batch, -1.0) if batch else -1.0)
        got = device.vjp_structures(run, [dy], config)[0]
        want = device.compute_vjp([expected_tape], [dy], config)[0]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5)
        return
    _assert_matches_the_tapes(device, template, tapes, expect_direct=True, rng=rng)


def test_the_eager_mode_runs_the_forward_directly_and_sweeps_the_general_way(rng):
    device = qml.device("custatevec.qubit", wires=3, backend="cpu")
    with options(grad_accumulation="eager"):
        _assert_matches_the_tapes(
            device,
            _template_tape(0, None),
            [_template_tape(1, None)],
            expect_direct=True,
            rng=rng,
        )


def test_zero_cotangents_and_no_trainable_parameters():
    device = qml.device("custatevec.qubit", wires=3, backend="cpu")
    processed, config = _processed(device, _template_tape(0, None))
    structure = device.structure_of(processed)
    values = processed.get_parameters(trainable_only=False, operations_only=True)
    run = device.execute_structures([structure], [values], config)
    assert _ran_directly(run)
    for cotangent in [(0.0, None), (0.0, 0.0)]:  # a None entry; plain zeros (read directly)
        run = device.execute_structures([structure], [values], config)
        gradients = device.vjp_structures(run, [cotangent], config)[0]
        assert [np.shape(g) for g in gradients] == [(2, 3, 3), (1, 3)]
        assert not any(np.any(g) for g in gradients)
    untrained, config = _processed(device, _template_tape(0, None).copy(trainable_params=[]))
    structure = device.structure_of(untrained)
    run = device.execute_structures([structure], [values], config)
    assert _ran_directly(run)
    assert device.vjp_structures(run, [(1.0, 1.0)], config) == ((),)


@pytest.mark.parametrize(
    "case",
    ["probs", "variance", "state preparation", "too large", "rebuilt matrix"],
)
def test_what_takes_the_general_path(case, rng):
    """Other measurements and larger circuits take the general path; a state preparation
    and a gate rebuilt with its parameters run directly, from the call's compilation."""
    too_large = CPUBackend.sequence_amplitudes.bit_length()  # qubits: one more than served
    wires = too_large if case == "too large" else 3
    device = qml.device("custatevec.qubit", wires=wires, backend="cpu")

    def tape(draw):
        r = np.random.default_rng(draw)
        ops = [qml.RX(r.uniform(0, 3), wires=w) for w in range(wires)]
        ops += [qml.CNOT([0, 1])]
        measurements = _measurements([0, 1, 2])
        if case == "probs":
            measurements = [qml.probs(wires=[0, 1])]
        elif case == "variance":
            measurements = [qml.var(qml.Z(0))]
        elif case == "state preparation":
            ops = [qml.StatePrep(np.exp(1j * r.uniform(0, 3, 8)) / np.sqrt(8), [0, 1, 2]), *ops]
        elif case == "rebuilt matrix":
            ops.append(qml.QubitUnitary(qml.matrix(qml.Rot(*r.uniform(0, 3, 3), wires=2)), 2))
        first = 1 if case == "state preparation" else 0  # the RX angles, not the state
        return qml.tape.QuantumScript(ops, measurements, trainable_params=[first, first + 1])

    fits = case in ("state preparation", "rebuilt matrix")
    _assert_matches_the_tapes(device, tape(0), [tape(1)], expect_direct=fits, rng=rng)


def _qnode_pair(device_vjp: bool):
    """The template circuit as a torch QNode on this device and on default.qubit."""

    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=[0, 1, 2])
        qml.StronglyEntanglingLayers(weights, wires=[0, 1, 2])
        return [m for m in _measurements([0, 1, 2])]

    ours = qml.QNode(
        circuit,
        qml.device("custatevec.qubit", wires=3, backend="cpu"),
        interface="torch",
        diff_method="adjoint",
        device_vjp=device_vjp,
    )
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=3), interface="torch")
    return ours, reference


@pytest.mark.parametrize("device_vjp", [True, False], ids=["vjp", "jacobian"])
def test_the_device_path_runs_a_known_structure_directly(device_vjp, mocker):
    """A QNode without ``compile``: from the second call of a structure its tapes run
    directly, the VJP from the kept run (``DirectKept``), a Jacobian from it made a
    KeptState; values and gradients equal default.qubit's."""
    import torch

    forward = mocker.spy(direct, "forward")
    ours, reference = _qnode_pair(device_vjp)
    rng = np.random.default_rng(7)
    for _ in range(3):
        x = torch.tensor(rng.uniform(0, 3, 3))
        weights = rng.uniform(0, 3, (2, 3, 3))
        results = []
        for qnode in (ours, reference):
            w = torch.tensor(weights, requires_grad=True)
            out = qnode(x, w)
            (out[0] - 2.0 * out[1]).backward()
            results.append((torch.stack(out).detach(), w.grad))
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    assert forward.call_count == 2


def test_direct_states_that_do_not_fit_in_memory_take_the_general_path(mocker, monkeypatch):
    """The final states kept of the tapes that would run directly are checked against
    free memory together, as the general path's: where they do not fit, the general
    path runs them (in chunks that fit, keeping none)."""
    from pennylane_custatevec import simulate

    device = qml.device("custatevec.qubit", wires=3, backend="cpu")
    tapes = [_template_tape(draw, None) for draw in range(5)]
    config = _config(device)
    device.execute(tapes[:2], config)  # the structure is made on its second tape
    forward = mocker.spy(direct, "forward")
    device.execute(tapes[2:3], config)
    assert forward.call_count == 1
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)
    vector = simulate.state_bytes(device._backend, 3, 1)  # noqa: SLF001
    monkeypatch.setattr(device._backend, "available_bytes", lambda: 3 * vector // 2)  # noqa: SLF001
    results = device.execute(tapes[2:5], config)  # three states kept would not fit
    assert forward.call_count == 1
    reference = qml.device("default.qubit", wires=3)
    expected = [qml.execute([tape], reference)[0] for tape in tapes[2:5]]
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)


def test_a_structure_with_gates_without_a_generator_runs_directly_for_parameter_shift():
    """Parameter-shift's tapes keep trainable Rot gates (no generator): their structure
    runs directly (the forward pass); the direct sweep is planned at the first VJP only,
    which the adjoint method would ask for after refusing such gates by name."""
    forward_runs = []

    def circuit(angles):
        qml.Rot(*angles, wires=0)
        qml.CNOT([0, 1])
        return qml.expval(qml.Z(1) @ qml.X(0))

    ours = qml.QNode(
        circuit,
        qml.device("custatevec.qubit", wires=2, backend="cpu"),
        diff_method="parameter-shift",
    )
    reference = qml.QNode(circuit, qml.device("default.qubit", wires=2), diff_method="backprop")
    original = direct.forward

    def counted(*args, **kwargs):
        forward_runs.append(len(args[1]))
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(direct, "forward", counted)
        for seed in range(2):
            angles = qml.numpy.array(np.random.default_rng(seed).uniform(0, 3, 3))
            np.testing.assert_allclose(ours(angles), reference(angles), atol=1e-12)
            np.testing.assert_allclose(
                qml.grad(ours)(angles), qml.grad(reference)(angles), atol=1e-12
            )
    assert sum(forward_runs) > 0


@pytest.mark.parametrize("calls", ["cpu", "base binding", "base"])
@pytest.mark.parametrize("name", sorted(_ROTATIONS))
def test_the_forward_jacobian_is_the_vjps_of_unit_cotangents(name, calls, monkeypatch):
    """``run_direct_jacobian`` (the compiled path's Jacobian lanes): its result is
    ``execute``'s, its Jacobian's rows folded are ``compute_vjp`` of the unit cotangents,
    on the CPU backend's bound kernel, on the base class's binding of the CPU backend's
    ``run_sequence_jacobian`` (what the cuStateVec backend binds) and on the base class's
    composition of ``run_sequence_measured`` and ``sweep_sequence_from_words``; its run
    holds no state (a VJP of it simulates again)."""
    if calls in ("base binding", "base"):
        monkeypatch.setattr(CPUBackend, "bind_sequence_jacobian", Backend.bind_sequence_jacobian)
    if calls == "base":
        monkeypatch.setattr(CPUBackend, "run_sequence_jacobian", Backend.run_sequence_jacobian)
    bound = []
    original = (
        Backend.bind_sequence_jacobian if calls != "cpu" else CPUBackend.bind_sequence_jacobian
    )
    monkeypatch.setattr(
        CPUBackend,
        "bind_sequence_jacobian",
        lambda self, *args: bound.append(args) or original(self, *args),
    )
    device = qml.device("custatevec.qubit", wires=_WIRES, backend="cpu")
    processed, config = _processed(device, _gate_tape(_gate(name, "plain", 0), 0))
    plan = device.direct_plan(device.structure_of(processed), config)
    assert plan is not None
    for draw in (1, 2):
        tape, _ = _processed(device, _gate_tape(_gate(name, "plain", draw), draw))
        values = tape.get_parameters(trainable_only=False, operations_only=True)
        angles = direct.call_data(plan, values).angles
        result, run, jacobian = device.run_direct_jacobian(plan, angles)
        np.testing.assert_allclose(result, device.execute([tape], config)[0], atol=1e-12, rtol=0)
        assert jacobian.shape == (2, plan.circuit.n_columns)
        for m, dy in enumerate([(1.0, 0.0), (0.0, 1.0)]):
            want = device.compute_vjp([tape], [dy], config)[0]
            _assert_gradients_close(plan.circuit.fold(jacobian[m]), want)
        assert run.states == [None]
        dy = (0.3, -0.7)
        _assert_gradients_close(
            device.vjp_direct(run, dy), device.compute_vjp([tape], [dy], config)[0]
        )
    assert len(bound) == 1  # bound once per structure, for both calls
