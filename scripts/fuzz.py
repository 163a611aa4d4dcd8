"""Random layered circuits on custatevec.qubit against default.qubit, at real sizes.

The unit tests run every circuit small, with the tiling thresholds lowered (conftest); this
script runs random circuits at the sizes where the device's real thresholds pick fused
blocks, tiled runs, rotation pairs, Z runs, permutation runs and gate sequences (any
number of wires, 14-19 for the tiled runs), and compares values and gradients with
default.qubit (backprop):

- layers of random one-qubit gates (Rot, RX, RY, RZ, PhaseShift, U3, H, S, T, SX,
  adjoint S, adjoint RX, or none) on every wire, each followed by an entangler (a CNOT
  ring, CZ pairs, random CNOTs, a few IsingZZ, CRX or IsingXX, a few gates of the wide
  pool on random wires, or nothing); the wide pool: SWAP, CY, CH, CRY, CRZ, CRot,
  ControlledPhaseShift, IsingXY, IsingYY, SingleExcitation, MultiRZ, Toffoli, CSWAP,
  MultiControlledX, RX with two controls (one on |0>), DoubleExcitation, PauliRot of a
  random word;
- measured: expvals of Z on three wires, or a Hamiltonian of a Pauli word and an X with
  an expval of Y, or probs of two wires, or the variance of a Pauli word with the expval
  of a random Hermitian on one wire, or a random two-wire Hermitian's expval with a
  Hamiltonian's variance, or a basis-state Projector's expval with that of a product of
  a Hermitian and a Z;
- with ``--broadcast``, an RY layer of a broadcast minibatch (2 or 3 rows) first, the
  minibatch differentiated too;
- with ``--mid-measurements``, mid-circuit measurements among the layers (a reset, a
  postselection, a Pauli product measurement of a random word on 1-3 wires, which
  default.qubit cannot run and measures here by an ancilla, conditional gates, measured
  outcomes; ``mid_measured_function``), on
  the device's default wires: values and Jacobians (the adjoint method, or
  parameter-shift where the circuit measures outcomes; to 1e-6 there, as PennyLane's
  parameter-shift takes finite differences for conditional gates) in both accumulation
  modes, and for a circuit that postselects the values and its Jacobians by finite
  differences and "best" (1e-5 and 1e-6), each either run and right or refused by name
  (the run ends with how often each happened); the same circuits again with
  ``mcm_method="tree-traversal"``: the values, and the Jacobian by parameter-shift (to
  1e-6, or refused by name where the circuit postselects);
- with ``--shared-device``, four circuits of the same random gates, each with its own
  measurements and parameters, on one device (QNodes and compiled QNodes), called in
  turns: the device's caches meet circuits that share a structure but not their data;
- with ``--constants``, about one parameter in three a constant (a float the quantum
  function closes over), the others trainable: constants before, between and after
  trainable gates, through the QNode and the compiled QNode (``with_constants``);
- with ``--jax``, jax instead of autograd and torch: about one parameter in three a
  constant, the others elements of the differentiated jax array; the adjoint method (device
  VJPs off and on, both accumulation modes), "best" and ``jax.jit`` (``check_jax``);
- with ``--matrices``, trainable matrices and a trainable prepared state: about one
  one-qubit gate in three a ``QubitUnitary`` of the matrix RZ(a) RY(b) RZ(c) and one
  entangler gate in three a two-qubit ``QubitUnitary`` of IsingXY(a) (RX(b) x I), their
  angles 0 half the time (the identity and diagonal matrices, where the decompositions
  that PennyLane's gradient transforms differentiate are degenerate), and the circuit
  opened by a ``StatePrep`` on two wires of the normalised vector (1, a, 0, b i) (zero
  amplitudes): through the QNode and the compiled QNode, as without it;
- with ``--shots``, sampled results (20000 seeded shots; with ``fusion_qubits=4`` too)
  against the exact ones: probs of three wires, a Pauli word's expval and a Z's variance,
  each within 5 standard errors (the reported difference: the largest in standard
  errors); every other circuit with a mid-circuit measurement (reset or not) and a
  conditional RY, run by the deferred method and (4000 shots, up to 14 wires) the
  one-shot method;
- with ``--compiled``, generated quantum functions (``tests/compiled_generator.py``:
  chains of torch operations on the arguments with random draws, globals that change
  between calls and Python control flow, feeding gates and templates) through
  ``pennylane_custatevec.compile`` against the QNode over ``--calls`` calls in both
  accumulation modes: values, gradients and random generator states per call, and
  vmap and batched cotangents for functions without random draws; a mismatch prints the
  function's source.

Each circuit runs on the device with its defaults, with ``grad_accumulation="eager"`` and
with ``fusion_qubits=4`` (``--broadcast``: with ``c_dtype="complex64"``, to 1e-4), through
the QNode (autograd's Jacobian; torch's VJP with ``--broadcast``) and through
``pennylane_custatevec.compile`` (three calls, torch VJPs of seeded cotangents). A
difference above the tolerance prints ``MISMATCH`` with the seed; the exit status is 1
where one was seen.

    python scripts/fuzz.py --first-seed 1000 --count 60 --min-wires 16 --max-wires 19
    python scripts/fuzz.py --broadcast --count 40 --min-wires 3 --max-wires 17
    python scripts/fuzz.py --mid-measurements --count 40 --min-wires 4 --max-wires 16
    python scripts/fuzz.py --shots --count 40 --min-wires 3 --max-wires 19
    python scripts/fuzz.py --shared-device --count 40 --min-wires 3 --max-wires 16
    python scripts/fuzz.py --jax --count 40 --min-wires 3 --max-wires 12
    python scripts/fuzz.py --constants --count 40 --min-wires 3 --max-wires 16
    python scripts/fuzz.py --matrices --count 40 --min-wires 3 --max-wires 14
    python scripts/fuzz.py --compiled --count 200 --min-wires 3 --max-wires 8 --calls 60
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import warnings
from pathlib import Path

import numpy as np
import pennylane as qml
import torch
from pennylane import numpy as pnp

import pennylane_custatevec

ONE_QUBIT = ("Rot", "RX", "RY", "RZ", "PhaseShift", "U3", "H", "S", "T", "SX", "AdjS", "AdjRX")
ONE_QUBIT += ("none",) * 4
PARAMETERS = {"Rot": 3, "RX": 1, "RY": 1, "RZ": 1, "PhaseShift": 1, "U3": 3, "AdjRX": 1}
PARAMETERS.update({"IsingZZ": 1, "CRX": 1, "IsingXX": 1, "IsingXY": 1, "IsingYY": 1})
PARAMETERS.update({"CRY": 1, "CRZ": 1, "CRot": 3, "ControlledPhaseShift": 1, "MultiRZ": 1})
PARAMETERS.update({"SingleExcitation": 1, "DoubleExcitation": 1, "CtrlRX": 1})
WIDE = {  # the other gates of the wide pool, by their number of wires
    2: ("SWAP", "CY", "CH", "CRY", "CRZ", "CRot", "ControlledPhaseShift", "IsingXY", "IsingYY"),
    3: ("Toffoli", "CSWAP", "CtrlRX", "MultiControlledX"),
}
WIDE[2] += ("SingleExcitation", "MultiRZ")
WIDE[4] = ("DoubleExcitation", "MultiRZ")
PARAMETERS.update({"Matrix1": 3, "Matrix2": 2, "Prep": 2})
FIXED = {"H": qml.Hadamard, "S": qml.S, "T": qml.T, "SX": qml.SX}
TOLERANCE = 1e-8


def n_parameters(name: str) -> int:
    """The number of parameters of gate ``name`` (a PauliRot's name carries its word)."""
    return 1 if name.startswith("PauliRot:") else PARAMETERS.get(name, 0)


def random_gates(rng: np.random.Generator, n: int, layers: int) -> list[tuple[str, tuple]]:
    """(gate name, wires) of ``layers`` random layers on ``n`` wires (module docstring)."""
    gates = []
    for _ in range(layers):
        for wire in range(n):
            name = ONE_QUBIT[rng.integers(len(ONE_QUBIT))]
            if name != "none":
                gates.append((name, (wire,)))
        pattern = rng.integers(6)
        if pattern == 0:
            gates += [("CNOT", (w, (w + 1) % n)) for w in range(n)]
        elif pattern == 1:
            gates += [("CZ", (w, w + 1)) for w in range(0, n - 1, 2)]
        elif pattern == 2:
            for _ in range(n // 2):
                a, b = rng.choice(n, 2, replace=False)
                gates.append(("CNOT", (int(a), int(b))))
        elif pattern == 3:
            for _ in range(3):
                a, b = rng.choice(n, 2, replace=False)
                gates.append((("IsingZZ", "CRX", "IsingXX")[rng.integers(3)], (int(a), int(b))))
        elif pattern == 4:
            gates += _wide_gates(rng, n, int(rng.integers(2, 6)))
    return gates


def _wide_gates(rng: np.random.Generator, n: int, count: int) -> list[tuple[str, tuple]]:
    """``count`` gates of the wide pool (``WIDE``, PauliRot of a random word) on random
    wires, high and low."""
    gates = []
    for _ in range(count):
        width = int(rng.choice([k for k in (2, 3, 4) if k <= n]))
        wires = tuple(int(w) for w in rng.choice(n, width, replace=False))
        if rng.integers(len(WIDE[width]) + 1) == 0:
            name = "PauliRot:" + "".join(rng.choice(list("XYZ"), width))
        else:
            name = str(rng.choice(WIDE[width]))
        gates.append((name, wires))
    return gates


def apply_gate(name: str, wires: tuple, parameters) -> None:
    """Queue gate ``name`` on ``wires`` with its ``parameters``."""
    if name.startswith("PauliRot:"):
        qml.PauliRot(parameters[0], name.split(":")[1], wires=wires)
    elif name == "CtrlRX":  # two controls, one on |0>
        qml.ctrl(qml.RX(parameters[0], wires=wires[0]), control=wires[1:], control_values=[1, 0])
    elif name == "AdjRX":
        qml.adjoint(qml.RX(parameters[0], wires=wires))
    elif name == "AdjS":
        qml.adjoint(qml.S(wires))
    elif name == "Matrix1":  # RZ(a) RY(b) RZ(c) as a matrix
        a, b, c = (qml.RZ.compute_matrix, qml.RY.compute_matrix, qml.RZ.compute_matrix)
        rotation = qml.math.dot(a(parameters[0]), qml.math.dot(b(parameters[1]), c(parameters[2])))
        qml.QubitUnitary(rotation, wires=wires)
    elif name == "Matrix2":  # IsingXY(a) (RX(b) x I) as a matrix
        local = qml.math.kron(qml.RX.compute_matrix(parameters[1]), np.eye(2))
        qml.QubitUnitary(qml.math.dot(qml.IsingXY.compute_matrix(parameters[0]), local), wires)
    elif name == "Prep":  # (1, a, 0, b i) / sqrt(1 + a**2 + b**2): zero amplitudes
        a, b = parameters[0], parameters[1]
        # the norm from the real parameters: autograd's derivative of a complex vector's
        # norm is wrong (default.qubit's backpropagation gives it too)
        norm = qml.math.sqrt(1.0 + a**2 + b**2)
        vector = qml.math.stack([1.0 + 0 * a, a, 0 * a, 1j * b]) / norm
        qml.StatePrep(vector, wires=wires)
    elif name in FIXED:
        FIXED[name](wires)
    else:
        getattr(qml, name)(*parameters, wires=wires)


def random_measurements(rng: np.random.Generator, n: int):
    """A function that queues one of the module docstring's measurements."""
    kind = rng.integers(6)
    wires = [int(w) for w in rng.choice(n, 3, replace=False)]
    if kind == 4:
        a = rng.normal(size=(4, 4)) + 1j * rng.normal(size=(4, 4))
        hermitian = qml.Hermitian(a + a.conj().T, wires=[wires[0], wires[2]])
        w0, w1, w2 = wires
        terms = [qml.Z(w0) @ qml.Z(w1), qml.X(w2), qml.Y(w0) @ qml.X(w1) @ qml.Z(w2)]
        hamiltonian = qml.Hamiltonian([0.5, -0.8, 0.3], terms)
        return lambda: [qml.expval(hermitian), qml.var(hamiltonian)]
    if kind == 5:
        a = rng.normal(size=(2, 2)) + 1j * rng.normal(size=(2, 2))
        product = qml.Hermitian(a + a.conj().T, wires=wires[0]) @ qml.Z(wires[1])
        projector = qml.Projector([1, 0], wires=wires[1:])
        return lambda: [qml.expval(projector), qml.expval(product)]
    if kind == 3:
        a = rng.normal(size=(2, 2)) + 1j * rng.normal(size=(2, 2))
        hermitian = qml.Hermitian(a + a.conj().T, wires=wires[2])
        word = qml.Z(wires[0]) @ qml.X(wires[1])
        return lambda: [qml.var(word), qml.expval(hermitian)]
    if kind == 0:
        return lambda: [qml.expval(qml.Z(w)) for w in wires]
    if kind == 1:
        word = qml.X(wires[0]) @ qml.Y(wires[1]) @ qml.Z(wires[2])
        hamiltonian = qml.Hamiltonian([0.3, -1.2], [word, qml.X(wires[1])])
        return lambda: [qml.expval(hamiltonian), qml.expval(qml.Y(wires[2]))]
    return lambda: qml.probs(wires=wires[:2])


def quantum_function(gates, measurements, embedded: bool):
    """The circuit of ``gates`` (parameters in order from ``params``), after an RY layer of
    the rows ``x`` where ``embedded``."""

    def apply_gates(params):
        k = 0
        for name, wires in gates:
            count = n_parameters(name)
            apply_gate(name, wires, params[k : k + count])
            k += count
        return measurements()

    if not embedded:
        return apply_gates

    def circuit(x, params):
        for wire in range(x.shape[-1]):
            qml.RY(x[..., wire], wires=wire)
        return apply_gates(params)

    return circuit


def _stacked(result):
    return torch.stack(result, -1) if isinstance(result, (list, tuple)) else result


def _value_and_jacobian(qnode, params) -> tuple[np.ndarray, np.ndarray]:
    """A QNode's flattened results at ``params`` and their Jacobian (autograd)."""
    p = pnp.array(params, requires_grad=True)
    flat = lambda q: pnp.hstack(qnode(q))  # noqa: E731
    return flat(p), qml.jacobian(flat)(p)


def _compiled_difference(compiled, params, want, want_jacobian, cotangent_seed: int) -> float:
    """The largest difference of a compiled QNode's results and its torch VJP (a seeded
    cotangent) at ``params`` from the reference's values and Jacobian."""
    p = torch.tensor(params, requires_grad=True)
    out = _stacked(compiled(p))
    if params.size == 0:  # a circuit without parameters: its values only
        return _largest(np.abs(out.numpy() - want))
    rng = np.random.default_rng(cotangent_seed)
    cotangent = torch.tensor(rng.normal(size=tuple(out.shape)))
    (out * cotangent).sum().backward()
    return max(
        _largest(np.abs(out.detach().numpy() - want)),
        _largest(np.abs(p.grad.numpy() - cotangent.numpy() @ want_jacobian)),
    )


def with_constants(rng: np.random.Generator, fn, values: np.ndarray):
    """(a quantum function of the trainable parameters, their values): about one of the
    ``values`` in three becomes a constant that ``fn`` (a function of all of them) gets as
    a Python float, the others come from the trainable array in order; None where none is
    trainable."""
    constant = rng.uniform(size=values.size) < 1 / 3
    if constant.all():
        return None
    positions = np.cumsum(~constant) - 1  # a trainable parameter's element of the array

    def mixed(params):
        every = zip(values, constant, positions, strict=True)
        return fn([float(v) if c else params[p] for v, c, p in every])

    return mixed, values[~constant]


def with_matrices(rng: np.random.Generator, gates: list, n: int) -> tuple[list, np.ndarray]:
    """(the gates with about one in three one-qubit gates a ``Matrix1`` and one in three
    two-qubit gates a ``Matrix2``, opened by a ``Prep`` on two wires; a mask of the
    parameters of those matrices, which the caller sets to 0 half the time)."""
    changed = [("Prep", tuple(int(w) for w in rng.choice(n, 2, replace=False)))]
    for name, wires in gates:
        if len(wires) == 1 and name != "none" and rng.uniform() < 1 / 3:
            name = "Matrix1"
        elif len(wires) == 2 and rng.uniform() < 1 / 3:
            name = "Matrix2"
        changed.append((name, wires))
    mask = np.concatenate(
        [np.full(n_parameters(g), g.startswith("Matrix")) for g, _ in changed] or [[]]
    )
    return changed, mask.astype(bool)


def _largest(values) -> float:
    """The largest of ``values``, 0 where there are none (a circuit without parameters
    has an empty Jacobian)."""
    return float(np.max(values, initial=0.0))


def check_plain(
    seed: int, n: int, layers: int, constants: bool = False, matrices: bool = False
) -> tuple[float, bool]:
    """(the largest difference, whether one was above its tolerance) of one random circuit
    (module docstring), without a batch; ``constants``: about one parameter in three a
    constant (``with_constants``); ``matrices``: trainable matrices and a prepared state
    (``with_matrices``)."""
    rng = np.random.default_rng(seed)
    gates = random_gates(rng, n, layers)
    if matrices:
        gates, at_matrices = with_matrices(rng, gates, n)
    fn = quantum_function(gates, random_measurements(rng, n), embedded=False)
    params = rng.uniform(0, 2 * np.pi, sum(n_parameters(g) for g, _ in gates))
    if matrices and rng.uniform() < 0.5:  # the identity and diagonal matrices
        params[at_matrices & (rng.uniform(size=params.size) < 0.5)] = 0.0
    if constants:
        mixed = with_constants(rng, fn, params)
        if mixed is None:
            return 0.0, False
        fn, params = mixed
    reference = qml.QNode(fn, qml.device("default.qubit", wires=n), diff_method="backprop")

    worst, mismatched = 0.0, False
    want, want_jacobian = _value_and_jacobian(reference, params)
    for options in ({}, {"grad_accumulation": "eager"}, {"fusion_qubits": 4}):
        device = qml.device("custatevec.qubit", wires=n, **options)
        ours = qml.QNode(fn, device, diff_method="adjoint", device_vjp=True)
        got, jacobian = _value_and_jacobian(ours, params)
        difference = max(_largest(np.abs(got - want)), _largest(np.abs(jacobian - want_jacobian)))
        worst = max(worst, difference)
        if difference > TOLERANCE:
            mismatched = True
            print(f"MISMATCH seed {seed} n {n} {options} QNode: {difference:.2e}", flush=True)
    device = qml.device("custatevec.qubit", wires=n)
    qnode = qml.QNode(fn, device, interface="torch", diff_method="adjoint", device_vjp=True)
    compiled = pennylane_custatevec.compile(qnode)
    for call in range(3):
        values = params + 0.1 * call
        want, want_jacobian = _value_and_jacobian(reference, values)
        difference = _compiled_difference(compiled, values, want, want_jacobian, call)
        worst = max(worst, difference)
        if difference > TOLERANCE:
            mismatched = True
            print(f"MISMATCH seed {seed} n {n} compiled call {call}: {difference:.2e}", flush=True)
    return worst, mismatched


def check_jax(seed: int, n: int, layers: int) -> tuple[float, bool]:
    """As ``check_plain``, with jax: each gate parameter is a constant (a float the
    quantum function closes over) or an element of the differentiated jax array, at
    random (about one in three constant: constants before, between and after trainable
    gates); the values and ``jax.jacobian`` of the QNode with the adjoint method (device
    VJPs off and on, both accumulation modes), with "best", and under ``jax.jit``, against
    default.qubit's backprop."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(seed)
    gates = random_gates(rng, n, layers)
    measurements = random_measurements(rng, n)
    values = rng.uniform(0, 2 * np.pi, sum(n_parameters(g) for g, _ in gates))
    mixed = with_constants(rng, quantum_function(gates, measurements, False), values)
    if mixed is None:
        return 0.0, False
    fn, trainable_values = mixed

    def flat(qnode):
        return lambda params: jnp.hstack(qnode(params))

    params = jnp.array(trainable_values)
    reference = flat(qml.QNode(fn, qml.device("default.qubit", wires=n), diff_method="backprop"))
    want, want_jacobian = reference(params), jax.jacobian(reference)(params)
    worst, mismatched = 0.0, False
    runs = [
        ({}, {"diff_method": "adjoint"}, False),
        ({}, {"diff_method": "adjoint", "device_vjp": True}, False),
        ({"grad_accumulation": "eager"}, {"diff_method": "adjoint", "device_vjp": True}, False),
        ({}, {}, False),  # "best"
        ({}, {"diff_method": "adjoint"}, True),
    ]
    for device_options, qnode_options, jitted in runs:
        device = qml.device("custatevec.qubit", wires=n, **device_options)
        ours = flat(qml.QNode(fn, device, **qnode_options))
        forward, jacobian = ours, jax.jacobian(ours)
        if jitted:
            forward, jacobian = jax.jit(forward), jax.jit(jacobian)
        difference = max(
            _largest(np.abs(np.asarray(forward(params)) - want)),
            _largest(np.abs(np.asarray(jacobian(params)) - want_jacobian)),
        )
        worst = max(worst, difference)
        if difference > TOLERANCE:
            mismatched = True
            label = f"{device_options} {qnode_options}" + (" jit" if jitted else "")
            print(f"MISMATCH seed {seed} n {n} jax {label}: {difference:.2e}", flush=True)
    return worst, mismatched


def check_broadcast(seed: int, n: int, layers: int) -> tuple[float, bool]:
    """As ``check_plain``, after a broadcast RY layer, differentiated for the parameters and
    the minibatch (complex64 runs are checked to 1e-4 and left out of the largest
    difference)."""
    rng = np.random.default_rng(seed)
    gates = random_gates(rng, n, layers)
    fn = quantum_function(gates, random_measurements(rng, n), embedded=True)
    params = rng.uniform(0, 2 * np.pi, sum(n_parameters(g) for g, _ in gates))
    x = rng.uniform(0, np.pi, (int(rng.integers(2, 4)), n))

    def run(qnode):
        """The results and the VJP of a seeded cotangent, for the parameters and the
        minibatch together (the minibatch trainable too: a circuit may have no
        parameters)."""
        p = torch.tensor(params, requires_grad=True)
        batch = torch.tensor(x, requires_grad=True)
        out = _stacked(qnode(batch, p))
        cotangent = torch.tensor(np.random.default_rng(7).normal(size=tuple(out.shape)))
        (out * cotangent).sum().backward()
        p_grad = np.zeros(params.shape) if p.grad is None else p.grad.numpy()
        return out.detach().numpy(), np.concatenate([p_grad, batch.grad.numpy().ravel()])

    reference = qml.QNode(
        fn, qml.device("default.qubit", wires=n), interface="torch", diff_method="backprop"
    )
    want, want_gradient = run(reference)
    worst, mismatched = 0.0, False
    for options in ({}, {"grad_accumulation": "eager"}, {"c_dtype": "complex64"}):
        tolerance = 1e-4 if "c_dtype" in options else TOLERANCE
        device = qml.device("custatevec.qubit", wires=n, **options)
        qnode = qml.QNode(fn, device, interface="torch", diff_method="adjoint", device_vjp=True)
        compiled = pennylane_custatevec.compile(qnode)
        for label, calls in (("QNode", [qnode]), ("compiled", [compiled] * 3)):
            for call, ours in enumerate(calls):
                got, gradient = run(ours)
                difference = max(
                    _largest(np.abs(got - want)), _largest(np.abs(gradient - want_gradient))
                )
                if "c_dtype" not in options:
                    worst = max(worst, difference)
                if difference > tolerance:
                    mismatched = True
                    print(
                        f"MISMATCH seed {seed} n {n} {options} {label} call {call}: "
                        f"{difference:.2e}",
                        flush=True,
                    )
    return worst, mismatched


def mid_measured_function(rng: np.random.Generator, n: int, layers: int):
    """(quantum function of ``params``, number of parameters, how the device differentiates
    it): ``layers`` random layers, a mid-circuit measurement (with reset or not), an RY
    conditioned on it, more layers, a second measurement (postselected on a random
    outcome, or not), a CRX conditioned on both; measured: expvals of wires, and, in
    every other circuit, the first outcome's expval and the second one's probabilities.
    The adjoint method takes neither those outcomes nor a postselection: then
    parameter-shift; a circuit that postselects: None (``check_mid_measured`` tries
    finite differences and "best", which the device runs or refuses by name where
    PennyLane's gradient transforms get it wrong)."""
    first, second = random_gates(rng, n, layers), random_gates(rng, n, 1)
    a, b, c, d = (int(w) for w in rng.choice(n, 4, replace=False))
    reset = bool(rng.integers(2))
    postselect = [None, None, 0, 1][rng.integers(4)]
    outcomes_measured = bool(rng.integers(2))
    word = qml.X(c) @ qml.Z(d)
    counts = [sum(n_parameters(g) for g, _ in gates) for gates in (first, second)]
    product_wires = [int(w) for w in rng.choice(n, int(rng.integers(1, 4)), replace=False)]
    product_word = "".join(rng.choice(list("XYZ"), len(product_wires)))

    def circuit(params, by_ancilla=False):
        """``by_ancilla``: the Pauli product measurement as default.qubit can run it."""
        # first, where the measured wires are in a product state: after random layers
        # the two outcomes can be alike (<P> = 0, a wire maximally entangled: seen, a
        # flipped outcome label went unnoticed); a fixed rotation of each wire sets <P>
        for wire in product_wires:
            qml.Rot(0.4, 1.1, -0.3, wires=wire)
        measure_product = _by_ancilla if by_ancilla else qml.pauli_measure
        m2 = measure_product(product_word, product_wires)
        qml.cond(m2, qml.RY)(1.3, wires=a)  # the outcome's label shows in the values
        k = 0
        for gates in (first, second):
            for name, wires in gates:
                count = n_parameters(name)
                apply_gate(name, wires, params[k : k + count])
                k += count
            if gates is first:
                m0 = qml.measure(a, reset=reset)
                qml.cond(m0, qml.RY)(params[k], wires=b)
                k += 1
        m1 = qml.measure(b, postselect=postselect)
        qml.cond(m0 & ~m1, qml.CRX)(params[k], wires=[c, d])
        values = [qml.expval(qml.Z(a)), qml.expval(word)]
        if outcomes_measured:
            return [*values, qml.expval(m0), qml.probs(op=m1), qml.expval(m2)]
        return values

    if postselect is not None:
        return circuit, sum(counts) + 2, None
    return circuit, sum(counts) + 2, "parameter-shift" if outcomes_measured else "adjoint"


ANCILLA = "ancilla"
"""The wire on which the reference measures a Pauli product (reset after each use)."""


def _by_ancilla(word: str, wires: list[int]):
    """The Pauli product measurement of ``word`` on ``wires`` by an ancilla, independent of
    the device's own (``preprocess.mid_circuit._pauli_product_as_parity``): H, the word
    controlled by the ancilla, H, measure it (outcome 0: the projection (I + P)/2,
    eigenvalue +1)."""
    paulis = {"X": qml.X, "Y": qml.Y, "Z": qml.Z}
    qml.H(ANCILLA)
    for letter, wire in zip(word, wires, strict=True):
        qml.ctrl(paulis[letter](wire), control=ANCILLA)
    qml.H(ANCILLA)
    return qml.measure(ANCILLA, reset=True)


def _difference(got: np.ndarray, want: np.ndarray) -> float:
    """The largest difference, NaN (a postselection of probability zero) equal to NaN;
    infinite where only one side is NaN."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("inf")
    both = ~np.isnan(got)
    return _largest(np.abs(got[both] - want[both]))


def check_mid_measured(seed: int, n: int, layers: int) -> tuple[float, bool]:
    """As ``check_plain``, for a circuit with mid-circuit measurements
    (``mid_measured_function``), in both accumulation modes: the values, and the
    Jacobians by the adjoint method or parameter-shift; a circuit that postselects: the
    values, and the Jacobians by finite differences and by "best" (parameter-shift), each
    either refused by name or equal to default.qubit's backprop Jacobian (a derivative
    that is neither is a mismatch); then with ``mcm_method="tree-traversal"``, the values
    and the parameter-shift Jacobian, the same way."""
    rng = np.random.default_rng(seed)
    fn, count, diff_method = mid_measured_function(rng, n, layers)
    params = rng.uniform(0, 2 * np.pi, count)
    reference_fn = functools.partial(fn, by_ancilla=True)
    reference = qml.QNode(reference_fn, qml.device("default.qubit"), diff_method="backprop")

    def flat(qnode, trainable: bool):
        return lambda p: pnp.hstack(qnode(pnp.array(p, requires_grad=trainable)))

    want = flat(reference, False)(params)
    want_jacobian = qml.jacobian(flat(reference, True))(pnp.array(params))
    # PennyLane's parameter-shift takes finite differences for operations without a shift
    # rule (conditional gates): differences of 1e-8 from backprop on default.qubit too
    tolerances = {"parameter-shift": 1e-6, "best": 1e-6, "finite-diff": 1e-5}
    methods = [diff_method] if diff_method else ["finite-diff", "best"]
    worst, mismatched = 0.0, False

    def reference_jacobian(method: str) -> np.ndarray:
        """default.qubit's backprop Jacobian; where the values are NaN (a postselection of
        probability zero: no derivative), default.qubit's Jacobian by ``method`` (finite
        differences of NaN values are NaN only where a shift reaches them)."""
        if not np.isnan(want).any():
            return want_jacobian
        qnode = qml.QNode(reference_fn, qml.device("default.qubit"), diff_method=method)
        return qml.jacobian(flat(qnode, True))(pnp.array(params))

    def compare(difference: float, tolerance: float, what: str) -> None:
        nonlocal worst, mismatched
        worst = max(worst, difference)
        if difference > tolerance:
            mismatched = True
            print(f"MISMATCH seed {seed} n {n} {what}: {difference:.2e}", flush=True)

    for options in ({}, {"grad_accumulation": "eager"}):
        device = qml.device("custatevec.qubit", **options)
        values = flat(qml.QNode(fn, device), False)(params)
        compare(_difference(values, want), TOLERANCE, f"{options} values")
        for method in methods:
            qnode = qml.QNode(fn, device, diff_method=method)
            try:
                jacobian = qml.jacobian(flat(qnode, True))(pnp.array(params))
            except qml.exceptions.DeviceError as error:
                if diff_method or "probability of the postselection" not in str(error):
                    raise
                POSTSELECTION_VERDICTS[method, "refused"] += 1
                continue
            if not diff_method:
                POSTSELECTION_VERDICTS[method, "run"] += 1
            compare(
                _difference(jacobian, reference_jacobian(method)),
                tolerances.get(method, TOLERANCE),
                f"{options} {method} Jacobian",
            )
        tree = {"mcm_method": "tree-traversal"}
        values = flat(qml.QNode(fn, device, **tree), False)(params)
        compare(_difference(values, want), TOLERANCE, f"{options} tree-traversal values")
        qnode = qml.QNode(fn, device, diff_method="parameter-shift", **tree)
        try:
            jacobian = qml.jacobian(flat(qnode, True))(pnp.array(params))
        except qml.exceptions.DeviceError as error:
            if diff_method or "probability of the postselection" not in str(error):
                raise
            POSTSELECTION_VERDICTS["tree-traversal parameter-shift", "refused"] += 1
            continue
        if not diff_method:
            POSTSELECTION_VERDICTS["tree-traversal parameter-shift", "run"] += 1
        compare(
            _difference(jacobian, want_jacobian),
            tolerances["parameter-shift"],
            f"{options} tree-traversal parameter-shift Jacobian",
        )
    return worst, mismatched


POSTSELECTION_VERDICTS: collections.Counter = collections.Counter()
"""How often each method ran or was refused on a postselecting circuit (printed at the
end of a ``--mid-measurements`` run: both must occur for the check to mean something)."""


def check_shared(seed: int, n: int, layers: int) -> tuple[float, bool]:
    """Four circuits on one device and through one compiled QNode each, called in turns
    (twice round): the same random gates, each with its own measurements (own Hermitian
    matrices, wires, kinds) and parameters, so that the device's caches of structures,
    observables and kept states meet circuits that share a structure but not their data.
    Values and Jacobians (QNodes: autograd; compiled: torch VJPs) against default.qubit."""
    rng = np.random.default_rng(seed)
    gates = random_gates(rng, n, layers)
    count = sum(n_parameters(g) for g, _ in gates)
    variants = []
    for _ in range(4):
        fn = quantum_function(gates, random_measurements(rng, n), embedded=False)
        reference = qml.QNode(fn, qml.device("default.qubit", wires=n), diff_method="backprop")
        variants.append((fn, rng.uniform(0, 2 * np.pi, count), reference))
    device = qml.device("custatevec.qubit", wires=n)
    ours = [qml.QNode(fn, device, diff_method="adjoint", device_vjp=True) for fn, _, _ in variants]
    compiled = [
        pennylane_custatevec.compile(
            qml.QNode(fn, device, interface="torch", diff_method="adjoint", device_vjp=True)
        )
        for fn, _, _ in variants
    ]

    expected = [_value_and_jacobian(reference, p) for _, p, reference in variants]
    worst, mismatched = 0.0, False
    for round_index in range(2):
        for k in range(4):
            (_, params, _), (want, want_jacobian) = variants[k], expected[k]
            got, jacobian = _value_and_jacobian(ours[k], params)
            difference = max(
                _largest(np.abs(got - want)),
                _largest(np.abs(jacobian - want_jacobian)),
                _compiled_difference(compiled[k], params, want, want_jacobian, k),
            )
            worst = max(worst, difference)
            if difference > TOLERANCE:
                mismatched = True
                print(
                    f"MISMATCH seed {seed} n {n} circuit {k} round {round_index}: {difference:.2e}",
                    flush=True,
                )
    return worst, mismatched


SHOTS = 20000
SIGMAS = 5.0
"""A sampled estimate differs from the exact value by at most SIGMAS standard errors (a
chance of about 6e-7 per comparison for a correct sampler) plus 1e-9."""


ONE_SHOT_SHOTS = 4000
"""Shots of the one-shot method's runs (it simulates one state vector per shot)."""


def check_sampled(seed: int, n: int, layers: int) -> tuple[float, bool]:
    """A random circuit's sampled results (``SHOTS`` shots, seeded) against default.qubit's
    exact ones: probs of three random wires, the expval of a random Pauli word of three
    wires and the variance of a Z; each within ``SIGMAS`` standard errors (the returned
    difference: the largest in standard errors). With the device's defaults and with
    ``fusion_qubits=4``; every other circuit measures a wire mid-circuit (with a reset or
    not) and conditions an RY on the outcome, and runs with ``mcm_method="deferred"`` and
    (``ONE_SHOT_SHOTS`` shots, up to 14 wires) ``"one-shot"`` instead."""
    rng = np.random.default_rng(seed)
    gates = random_gates(rng, n, layers)
    params = rng.uniform(0, 2 * np.pi, sum(n_parameters(g) for g, _ in gates) + 1)
    wires = [int(w) for w in rng.choice(n, 3, replace=False)]
    letters = [str(letter) for letter in rng.choice(list("XYZ"), 3)]
    word = qml.prod(*(getattr(qml, letter)(w) for letter, w in zip(letters, wires, strict=True)))
    mid_measured = bool(rng.integers(2))
    measured, target = (int(w) for w in rng.choice(n, 2, replace=False))
    reset = bool(rng.integers(2))

    def circuit(p):
        quantum_function(gates, lambda: None, embedded=False)(p[:-1])
        if mid_measured:
            m = qml.measure(measured, reset=reset)
            qml.cond(m, qml.RY)(p[-1], wires=target)
        return qml.probs(wires=wires), qml.expval(word), qml.var(qml.Z(wires[0]))

    exact = qml.QNode(circuit, qml.device("default.qubit"))(params)
    if mid_measured:
        runs = [({"mcm_method": "deferred"}, SHOTS)]
        if n <= 14:
            runs.append(({"mcm_method": "one-shot"}, ONE_SHOT_SHOTS))
    else:
        runs = [({}, SHOTS), ({"fusion_qubits": 4}, SHOTS)]
    worst, mismatched = 0.0, False
    for options, shots in runs:
        errors = _sampling_errors(exact, shots)
        qnode_options = {k: v for k, v in options.items() if k == "mcm_method"}
        device_options = {k: v for k, v in options.items() if k != "mcm_method"}
        device = qml.device("custatevec.qubit", shots=shots, seed=seed, **device_options)
        sampled = qml.QNode(circuit, device, **qnode_options)(params)
        for got, want, error in zip(sampled, exact, errors, strict=True):
            deviation = np.abs(np.asarray(got) - np.asarray(want))
            sigmas = float(np.max(deviation / (np.asarray(error) + 1e-9)))
            worst = max(worst, sigmas)
            if np.any(deviation > SIGMAS * np.asarray(error) + 1e-9):
                mismatched = True
                print(f"MISMATCH seed {seed} n {n} {options}: {sigmas:.1f} sigma", flush=True)
    return worst, mismatched


def _sampling_errors(exact, shots: int) -> list:
    """The standard errors of ``check_sampled``'s three results from ``shots`` shots."""
    probs, mean = exact[0], exact[1]
    z_mean = 1.0 - 2.0 * probs.reshape(2, 4).sum(1)[1]
    z_error = np.sqrt(max(1.0 - z_mean**2, 0.0) / shots)
    return [
        np.sqrt(probs * (1 - probs) / shots),
        np.sqrt(max(1.0 - mean**2, 0.0) / shots),
        # var(Z) = 1 - <Z>^2 from the same shots: where <Z> is within SIGMAS errors e of
        # z, |<Z>^2 - z^2| <= SIGMAS e (2 |z| + SIGMAS e) (second order where z = 0)
        2 * abs(z_mean) * z_error + SIGMAS * z_error**2,
    ]


def check_compiled(seed: int, n: int, layers: int, calls: int = 40) -> tuple[float, bool]:
    """The generated quantum function of ``seed`` on ``n`` wires through the compiled
    QNode and the QNode (``compiled_generator.fuzz_one``); a mismatch prints its message
    (the call, what differed, the function's source)."""
    tests = str(Path(__file__).resolve().parents[1] / "tests")
    if tests not in sys.path:  # the generator and its helpers live with the tests
        sys.path.insert(0, tests)
    from compiled_generator import fuzz_one

    worst, failure = fuzz_one(seed, n, layers, calls)
    if failure is not None:
        print(f"MISMATCH seed {seed} n {n}: {failure}", flush=True)
    return worst, failure is not None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--min-wires", type=int, default=3)
    parser.add_argument("--max-wires", type=int, default=13)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--broadcast", action="store_true")
    mode.add_argument("--mid-measurements", action="store_true")
    mode.add_argument("--shots", action="store_true")
    mode.add_argument("--shared-device", action="store_true")
    mode.add_argument("--jax", action="store_true")
    mode.add_argument("--constants", action="store_true")
    mode.add_argument("--matrices", action="store_true")
    mode.add_argument("--compiled", action="store_true")
    parser.add_argument("--calls", type=int, default=40, help="calls per --compiled function")
    args = parser.parse_args(argv)
    if args.min_wires < 3 or args.max_wires < args.min_wires:
        parser.error("--min-wires must be at least 3 and at most --max-wires")
    if args.mid_measurements and args.min_wires < 4:
        parser.error("--mid-measurements needs --min-wires of at least 4")
    check = check_broadcast if args.broadcast else check_plain
    if args.mid_measurements:
        check = check_mid_measured
    if args.shots:
        check = check_sampled
    if args.shared_device:
        check = check_shared
    if args.jax:
        check = check_jax
    if args.constants:
        check = functools.partial(check_plain, constants=True)
    if args.matrices:
        check = functools.partial(check_plain, matrices=True)
    if args.compiled:
        check = functools.partial(check_compiled, calls=args.calls)
    worst, mismatches = 0.0, 0
    for seed in range(args.first_seed, args.first_seed + args.count):
        rng = np.random.default_rng([seed, 1])
        n = int(rng.integers(args.min_wires, args.max_wires + 1))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*runs on the CPU backend.*")
            difference, mismatched = check(seed, n, int(rng.integers(2, 5)))
        mismatches += mismatched
        worst = max(worst, difference)
        print(f"seed {seed}: {n} wires, worst difference so far {worst:.2e}", flush=True)
    noun = "functions" if args.compiled else "circuits"
    print(f"{args.count} {noun}, {mismatches} with a mismatch; worst difference {worst:.2e}")
    if POSTSELECTION_VERDICTS:
        verdicts = ", ".join(f"{m} {v} {c}" for (m, v), c in sorted(POSTSELECTION_VERDICTS.items()))
        print(f"postselecting circuits' derivatives (per accumulation mode): {verdicts}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
