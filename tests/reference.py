"""Reference helpers for the test suite, in one module: random states, unitaries and
Hermitian matrices; dense numpy references of the backend operations (``dense_operator``,
``ref_apply``, ``ref_probs``, the block-step references); and the cases and ``check_*``
functions of the backend contract, which ``test_backend_contract.py`` runs on every backend
and ``test_cpu.py`` and the double's tests use for what is particular to one; and
the device-level pieces that test files in ``tests/`` and ``tests/conformance/`` share
(a parameter-shift Hessian through PennyLane's cache, the refusal of a state too large for
the free memory, a lock that tells when a thread waited for a recording).

Conventions (backends/base.py): state index bits are little-endian; ``targets[j]`` is the
state bit that becomes bit ``j`` of a matrix index; the gate acts where every control bit
equals its control value; batched data has a leading axis of length 1 (shared) or B.
"""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pennylane as qml
import pytest
from conftest import DEVICE, stable_seed
from pennylane import numpy as pnp

from pennylane_custatevec.simulate import StateTooLargeError

# --- random states, unitaries, Hermitian matrices ----------------------------------------


def random_unitary(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-random unitary from a QR decomposition (deterministic for a given rng)."""
    z = (rng.normal(size=(dim, dim)) + 1j * rng.normal(size=(dim, dim))) / np.sqrt(2)
    q, r = np.linalg.qr(z)
    d = np.diagonal(r)
    return q * (d / np.abs(d))


def random_state(num_qubits: int, rng: np.random.Generator, batch=None) -> np.ndarray:
    shape = (2**num_qubits,) if batch is None else (batch, 2**num_qubits)
    v = rng.normal(size=shape) + 1j * rng.normal(size=shape)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def random_hermitian(dim: int, rng: np.random.Generator) -> np.ndarray:
    a = rng.normal(size=(dim, dim)) + 1j * rng.normal(size=(dim, dim))
    return (a + a.conj().T) / 2


# --- dense references and the backend contract's cases and checks ---------------------


PAULI = {
    "I": np.eye(2, dtype=complex),
    "X": np.array([[0, 1], [1, 0]], dtype=complex),
    "Y": np.array([[0, -1j], [1j, 0]]),
    "Z": np.diag([1.0 + 0j, -1.0]),
}


BACKEND_TOL = {np.complex128: 1e-12, np.complex64: 2e-5}


def word_matrix(word: str) -> np.ndarray:
    """Letter j acts on bit j of the matrix index (so it is the rightmost kron factor)."""
    m = np.ones((1, 1), dtype=complex)
    for letter in word:
        m = np.kron(PAULI[letter], m)
    return m


def dense_operator(n, matrix, targets, controls=(), values=()):
    """The 2**n x 2**n operator of ``matrix`` on ``targets`` under the controls."""
    k = len(targets)
    dim = 1 << n
    op = np.eye(dim, dtype=complex)
    offsets = [sum(((a >> j) & 1) << t for j, t in enumerate(targets)) for a in range(1 << k)]
    target_mask = sum(1 << t for t in targets)
    for base in range(dim):
        if base & target_mask:
            continue
        if any(((base >> c) & 1) != v for c, v in zip(controls, values, strict=True)):
            continue
        rows = [base | o for o in offsets]
        op[np.ix_(rows, rows)] = matrix
    return op


def ref_apply(psi, matrices, targets, controls=(), values=()):
    """Reference psi_b <- U_b psi_b with the dense operator (small n) of each matrix."""
    n = psi.shape[1].bit_length() - 1
    matrices = np.broadcast_to(matrices, (psi.shape[0],) + matrices.shape[1:])
    return np.stack(
        [
            dense_operator(n, m, targets, controls, values) @ v
            for m, v in zip(matrices, psi, strict=True)
        ]
    )


def ref_apply_blocks(psi, matrices, targets, controls=(), values=()):
    """The same as ref_apply by fancy indexing: usable for large n (threaded kernels)."""
    batch, dim = psi.shape
    k = len(targets)
    matrices = np.broadcast_to(matrices, (batch, 1 << k, 1 << k))
    idx = np.arange(dim)
    keep = (idx & sum(1 << t for t in targets)) == 0
    for c, v in zip(controls, values, strict=True):
        keep &= ((idx >> c) & 1) == v
    offsets = np.array(
        [sum(((a >> j) & 1) << t for j, t in enumerate(targets)) for a in range(1 << k)]
    )
    rows = idx[keep][:, None] | offsets[None, :]
    out = psi.copy()
    for b in range(batch):
        out[b, rows] = psi[b, rows] @ matrices[b].T
    return out


def ref_probs(psi, bits):
    p = np.abs(psi) ** 2
    idx = np.arange(psi.shape[1])
    outcome = np.zeros_like(idx)
    for j, bit in enumerate(bits):
        outcome |= ((idx >> bit) & 1) << j
    out = np.zeros((psi.shape[0], 1 << len(bits)))
    for b in range(psi.shape[0]):
        np.add.at(out[b], outcome, p[b])
    return out


def random_states(n, batch, rng):
    v = rng.normal(size=(batch, 1 << n)) + 1j * rng.normal(size=(batch, 1 << n))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def each_vector_contiguous(state) -> bool:
    """A batch's layout: C-contiguous, or each vector contiguous at a padded stride (the
    cuStateVec backend's vectors under 128 bytes; a split batch's local slices)."""
    local = getattr(state, "local", state)
    return local.flags.c_contiguous or local.strides[-1] == local.dtype.itemsize


def backend_state(backend, psi):
    state = backend.from_host(psi)
    assert state.dtype == backend.dtype and each_vector_contiguous(state)
    return state


def rotation(word, angle):
    p = word_matrix(word)
    return np.cos(angle / 2) * np.eye(len(p)) - 1j * np.sin(angle / 2) * p


N = 6


TARGET_CASES = [
    # (targets, controls, control values)
    ((0,), (), ()),
    ((5,), (), ()),
    ((2,), (0,), (1,)),
    ((3,), (5, 1), (0, 1)),
    ((0,), (1, 2), (0, 0)),  # three fixed bits all low
    ((1, 0), (), ()),
    ((0, 5), (), ()),
    ((4, 2), (3,), (0,)),
    ((2, 3), (0, 1), (1, 0)),
    ((5, 0), (2, 4), (1, 1)),
    ((0, 1, 2), (), ()),
    ((4, 0, 2), (), ()),
    ((5, 3, 1), (0,), (0,)),
    ((1, 4, 3), (5, 0), (1, 0)),
    ((3, 1, 0, 5), (2,), (1,)),
]


def target_case_id(case):
    targets, controls, values = case
    digits = ["".join(map(str, part)) for part in (targets, controls, values)]
    return "t{}-c{}-v{}".format(*digits)


DIAG_CASES = [
    ((0,), (), ()),
    ((5,), (2,), (0,)),
    ((3, 1), (), ()),
    ((0, 4), (5, 2), (1, 0)),
    ((2, 5, 0), (1,), (1,)),
    ((1,), (0, 2, 3), (0, 1, 0)),
    ((), (3, 4), (1, 0)),  # a phase on the control subspace only
]


PAULI_CASES = [
    ("X", (0,), (), ()),
    ("X", (4,), (1, 5), (1, 0)),
    ("Y", (5,), (1,), (0,)),
    ("Z", (3,), (0, 4), (1, 1)),
    ("I", (2,), (), ()),
    ("XX", (0, 1), (), ()),
    ("XY", (4, 1), (), ()),
    ("ZZ", (2, 5), (3,), (0,)),
    ("YZ", (0, 3), (5,), (1,)),
    ("ZX", (1, 4), (), ()),
    ("XIZ", (5, 2, 0), (), ()),
    ("YXZ", (2, 0, 5), (3,), (1,)),
    ("ZZZ", (0, 1, 2), (3,), (0,)),
    ("YYYY", (5, 3, 1, 0), (), ()),
    ("XYZX", (1, 2, 4, 5), (0, 3), (0, 1)),
    ("II", (1, 3), (0,), (1,)),
]


def pauli_case_id(case):
    word, targets, controls, values = case
    return f"{word}-{target_case_id((targets, controls, values))}"


def check_state_management(backend, dtype):
    """zero_state, to_host, copy, scale and available_bytes of any backend."""
    state = backend.zero_state(4, 3)
    assert state.shape == (3, 16) and state.dtype == dtype
    expected = np.zeros((3, 16))
    expected[:, 0] = 1
    np.testing.assert_array_equal(backend.to_host(state), expected)
    assert backend.to_host(state).dtype == np.complex128
    copy = backend.copy(state)
    backend.apply_pauli(copy, "X", (2,))
    np.testing.assert_array_equal(backend.to_host(state), expected)  # the copy is independent
    assert backend.to_host(copy)[0, 4] == 1
    factors = np.array([1j, -1, 0.5])
    backend.scale(copy, factors)
    np.testing.assert_allclose(backend.to_host(copy)[:, 4], factors, atol=1e-7)
    assert backend.available_bytes() > 0


MANY_Z_WORDS = [
    ("ZZ", (0, 5)),
    ("Z", (3,)),
    ("", ()),
    ("ZZZ", (1, 2, 4)),
    ("ZZ", (0, 5)),
    ("ZIZZ", (5, 1, 2, 0)),
]
"""Enough Z words (one repeated, one empty) for the sums' one-diagonal path."""


def check_add_pauli_sum(backend, words):
    """dst += sum_k c_k P_k src with src unchanged, against the dense operator."""
    rng = np.random.default_rng(stable_seed("pauli_sum", str(words)))
    dst, src = random_states(N, 3, rng), random_states(N, 1, rng)
    coefficients = rng.normal(size=len(words)) + 1j * rng.normal(size=len(words))
    state, source = backend.from_host(dst), backend.from_host(src)
    backend.add_pauli_sum(state, source, words, coefficients)
    operator = sum(
        c * dense_operator(N, word_matrix(w), t)
        for (w, t), c in zip(words, coefficients, strict=True)
    )
    np.testing.assert_allclose(backend.to_host(state), dst + (operator @ src[0])[None], atol=1e-12)
    np.testing.assert_array_equal(backend.to_host(source), src)


def check_expval_pauli_words(backend, words, dtype):
    """<P_k> of every word for each of 3 vectors, (3, K) float64, against dense operators."""
    rng = np.random.default_rng(stable_seed("expval_pauli_words", str(words)))
    psi = random_states(N, 3, rng)
    out = backend.expval_pauli_words(backend.from_host(psi), words)
    assert out.dtype == np.float64 and out.shape == (3, len(words))
    for k, (word, targets) in enumerate(words):
        op = dense_operator(N, word_matrix(word), targets)
        expected = np.real(np.einsum("bi,ij,bj->b", psi.conj(), op, psi))
        np.testing.assert_allclose(out[:, k], expected, atol=BACKEND_TOL[dtype] * 10)


BLOCK_STEP_TARGETS = [(), (0,), (5,), (3, 1), (0, 5), (0, 1, 2), (4, 0, 2), (1, 5, 3)]


def flip_index(index: int, gates) -> int:
    """``index`` after bit flips ``gates`` (in order): (controls, target) flips the target
    where every control bit is 1."""
    for controls, target in gates:
        if all((index >> c) & 1 for c in controls):
            index ^= 1 << target
    return index


def flip_sources(gates, n: int) -> np.ndarray:
    """The source map of the run ``gates`` (``Backend.apply_bit_permutation``): amplitude y
    comes from the index the inverse run (each flip its own inverse, reversed) maps y to;
    columns src(e_j) ^ src(0), then src(0)."""
    constant = flip_index(0, gates[::-1])
    columns = [flip_index(1 << j, gates[::-1]) ^ constant for j in range(n)]
    return np.array(columns + [constant], dtype=np.int64)


def check_bit_permutation(backend):
    """apply_bit_permutation equals its bit flips applied one by one (apply_pauli), for
    CNOT chains and rings over low, high and all bits, X gates and a control value 0, on
    batches (exactly: it only moves amplitudes)."""
    for n, batch, seed in ((6, 2, 0), (9, 1, 1), (9, 3, 2), (12, 2, 3)):
        rng = np.random.default_rng(stable_seed("bit permutation", n, batch, seed))
        psi = random_states(n, batch, rng)
        ring = [((b,), (b - 1) % n) for b in range(n - 1, -1, -1)]
        high = [((b,), b - 1) for b in range(n - 1, n // 2, -1)]
        low = [((b,), b - 1) for b in range(n // 2, 0, -1)] + [((), 0), ((), 1)]
        shuffled = [
            ((int(c),), int(t)) for c, t in (rng.choice(n, 2, replace=False) for _ in range(7))
        ]
        for gates in (ring, high, low, shuffled, ring[: n // 2], ring[n // 2 :]):
            expected = backend.from_host(psi)
            for controls, target in gates:
                backend.apply_pauli(expected, "X", (target,), controls, (1,) * len(controls))
            state = backend.from_host(psi)
            moved = {t for _, t in gates}
            if len(moved | set(range(6))) > 16:  # the CPU backend's group limit
                continue
            backend.apply_bit_permutation(state, flip_sources(gates, n))
            np.testing.assert_array_equal(backend.to_host(state), backend.to_host(expected))
    # a control value 0 (an X sandwich) is affine too
    psi = random_states(5, 1, np.random.default_rng(9))
    expected = backend.from_host(psi)
    backend.apply_pauli(expected, "X", (1,), (3,), (0,))
    state = backend.from_host(psi)
    gates = [((), 3), ((3,), 1), ((), 3)]
    backend.apply_bit_permutation(state, flip_sources(gates, 5))
    np.testing.assert_array_equal(backend.to_host(state), backend.to_host(expected))


def _axis_letters(n):
    """Letter i names axis i of a (2,) * n state tensor, which is state bit n - 1 - i."""
    return list("abcdefghijklmnop"[:n])


def ref_block_apply(psi, matrices, targets):
    """psi_v <- M_v psi_v by einsum over the (2,) * n tensor of each vector: ``matrices``
    (V, d, d) reshaped to (2,) * 2k, row bits then column bits, most significant first."""
    n, k = psi.shape[1].bit_length() - 1, len(targets)
    state = _axis_letters(n)
    new = list("qrstuvwx"[:k])
    rows = [new[j] for j in reversed(range(k))]
    cols = [state[n - 1 - targets[j]] for j in reversed(range(k))]
    out = list(state)
    for j, bit in enumerate(targets):
        out[n - 1 - bit] = new[j]
    spec = "Z{},Z{}->Z{}".format("".join(rows + cols), "".join(state), "".join(out))
    tensors = np.einsum(
        spec, matrices.reshape((len(matrices),) + (2,) * 2 * k), psi.reshape((-1,) + (2,) * n)
    )
    return tensors.reshape(psi.shape)


def ref_block_reduction(bras, phi, targets):
    """T[v, a, c] = sum_rest conj(bra_v[a, rest]) phi_v[c, rest] by einsum, one phi per bra."""
    n, k = phi.shape[1].bit_length() - 1, len(targets)
    state = _axis_letters(n)
    a_bits, c_bits = list("qrstuvwx"[:k]), list("QRSTUVWX"[:k])
    bra_axes, phi_axes = list(state), list(state)
    for j, bit in enumerate(targets):
        bra_axes[n - 1 - bit], phi_axes[n - 1 - bit] = a_bits[j], c_bits[j]
    out = "".join(a_bits[::-1] + c_bits[::-1])  # bit j of a (and c) is targets[j]
    spec = "Z{},Z{}->Z{}".format("".join(bra_axes), "".join(phi_axes), out)
    tensors = np.einsum(spec, bras.conj().reshape((-1,) + (2,) * n), phi.reshape((-1,) + (2,) * n))
    return tensors.reshape(len(bras), 1 << k, 1 << k)


Z_RUN_CASES = [
    # (qubits, masks, angles per vector (rows: vectors), rows of bras per vector)
    (3, [0b011, 0b110, 0b101], [[0.3, 0.3, 0.3]], 1),
    (9, [0b11, 0b101000000, 0b10010, 0b110000000, 0b1], [[0.3, 0.3, -0.7, 0.3, 1.1]], 3),
    (8, [0b10000001, 0b01100000, 0b00000110], [[0.5, -0.5, 0.5], [0.5, -0.5, 0.5]], 2),
    (
        7,
        [0b1111111, 0b0000011, 0b1000000, 0b0101010],
        [[0.1, 0.2, 0.3, 0.4], [1.0, -2.0, 0.5, 0.0]],
        1,
    ),
]


def check_z_rotations(backend):
    """apply_z_rotations equals the rotations one by one (apply_pauli_rotation), and
    adjoint_z_rotations_step returns <bra|Z_j|phi> and undoes them on phi and the bras."""
    for n, masks, angles, rows in Z_RUN_CASES:
        rng = np.random.default_rng(stable_seed("z-run", n, len(masks)))
        angles = np.array(angles)
        batch = angles.shape[0]
        psi = random_state(n, rng, batch).reshape(batch, -1)
        bras = rng.normal(size=(batch * rows, 2**n)) + 1j * rng.normal(size=(batch * rows, 2**n))
        expected = backend.from_host(psi)
        words = [[bit for bit in range(n) if mask >> bit & 1] for mask in masks]
        for j, bits in enumerate(words):
            backend.apply_pauli_rotation(expected, angles[:, j], "Z" * len(bits), bits)
        state = backend.from_host(psi)
        backend.apply_z_rotations(state, angles, masks)
        tol = BACKEND_TOL[backend.dtype.type]
        np.testing.assert_allclose(backend.to_host(state), backend.to_host(expected), atol=tol)
        products = np.zeros((batch, rows, len(masks)), dtype=complex)
        expected_host = backend.to_host(expected)
        for j in range(len(masks)):
            parity = (np.bitwise_count(np.arange(2**n) & masks[j]) & 1).astype(float)
            flipped = expected_host * (1.0 - 2.0 * parity)
            for b in range(batch):
                products[b, :, j] = np.conj(bras[b * rows : (b + 1) * rows]) @ flipped[b]
        phi, bra_state = backend.copy(expected), backend.from_host(bras)
        got = backend.gather([backend.adjoint_z_rotations_step(phi, bra_state, angles, masks)])[0]
        np.testing.assert_allclose(got, products, atol=tol * 10)
        np.testing.assert_allclose(backend.to_host(phi), psi, atol=tol)
        undone = backend.from_host(bras)
        for j, bits in enumerate(words):
            backend.apply_pauli_rotation(
                undone, -np.repeat(angles[:, j], rows), "Z" * len(bits), bits
            )
        np.testing.assert_allclose(backend.to_host(bra_state), backend.to_host(undone), atol=tol)


ONE_QUBIT_ROTATION_CASES = [  # n, paulis, targets, angles (1 or B, 2), batch, rows
    (3, "XY", (0, 2), [[0.3, -1.1]], 1, 1),
    (5, "ZX", (4, 1), [[0.7, 2.0], [-0.4, 0.9]], 2, 2),
    (6, "YY", (5, 0), [[1.3, 0.2]], 2, 3),
    (7, "XZ", (3, 4), [[-2.1, 0.6], [0.5, 1.7], [0.0, -0.8]], 3, 1),
]


def check_one_qubit_rotations(backend):
    """apply_one_qubit_rotations equals the rotations one by one (apply_pauli_rotation), and
    adjoint_one_qubit_rotations_step returns <bra|P_j|phi> and undoes them on phi and the bras."""
    tol = BACKEND_TOL[backend.dtype.type]
    for n, paulis, targets, angles, batch, rows in ONE_QUBIT_ROTATION_CASES:
        rng = np.random.default_rng(stable_seed("rotations", n, paulis))
        angles = np.array(angles)
        per_vector = np.broadcast_to(angles, (batch, 2))
        psi = random_state(n, rng, batch).reshape(batch, -1)
        bras = rng.normal(size=(batch * rows, 2**n)) + 1j * rng.normal(size=(batch * rows, 2**n))
        expected = backend.from_host(psi)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            backend.apply_pauli_rotation(expected, angles[:, j], letter, (bit,))
        state = backend.from_host(psi)
        backend.apply_one_qubit_rotations(state, angles, paulis, targets)
        np.testing.assert_allclose(backend.to_host(state), backend.to_host(expected), atol=tol)
        products = np.zeros((batch, rows, 2), dtype=complex)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            flipped = backend.copy(expected)
            backend.apply_pauli(flipped, letter, (bit,))
            flipped = backend.to_host(flipped)
            for b in range(batch):
                products[b, :, j] = np.conj(bras[b * rows : (b + 1) * rows]) @ flipped[b]
        phi, bra_state = backend.copy(expected), backend.from_host(bras)
        step = backend.adjoint_one_qubit_rotations_step(phi, bra_state, angles, paulis, targets)
        np.testing.assert_allclose(backend.gather([step])[0], products, atol=tol * 10)
        np.testing.assert_allclose(backend.to_host(phi), psi, atol=tol)
        undone = backend.from_host(bras)
        for j, (letter, bit) in enumerate(zip(paulis, targets, strict=True)):
            backend.apply_pauli_rotation(undone, -np.repeat(per_vector[:, j], rows), letter, (bit,))
        np.testing.assert_allclose(backend.to_host(bra_state), backend.to_host(undone), atol=tol)


def check_adjoint_block_step(backend):
    """M_b^dagger on phi_b and its R bras, and T of each bra before with phi after, for
    blocks of 0 to 3 (unsorted, non-contiguous) bits, B of 1 and 3, R of 1 and 4, shared
    and per-vector matrices, against the einsum references."""
    dtype = backend.dtype.type
    tol = BACKEND_TOL[dtype]
    for targets, batch, rows, shared in itertools.product(
        BLOCK_STEP_TARGETS, (1, 3), (1, 4), (True, False)
    ):
        case = (targets, batch, rows, shared)
        rng = np.random.default_rng(stable_seed("block_step", *case))
        d = 1 << len(targets)
        phi = random_states(N, batch, rng).astype(dtype)
        bras = random_states(N, batch * rows, rng).astype(dtype)
        matrices = np.stack([random_unitary(d, rng) for _ in range(1 if shared else batch)])
        adjoints = np.broadcast_to(matrices.conj().transpose(0, 2, 1), (batch, d, d))
        phi_after = ref_block_apply(phi.astype(complex), adjoints, targets)
        bras_after = ref_block_apply(
            bras.astype(complex), np.repeat(adjoints, rows, axis=0), targets
        )
        expected = ref_block_reduction(
            bras.astype(complex), np.repeat(phi_after, rows, axis=0), targets
        ).reshape(batch, rows, d, d)
        phi_state, bras_state = backend_state(backend, phi), backend_state(backend, bras)
        out = backend.adjoint_block_step(phi_state, bras_state, matrices, targets)
        (t,) = backend.gather([out])
        assert isinstance(t, np.ndarray), case
        assert t.shape == (batch, rows, d, d) and t.dtype == np.complex128, case
        np.testing.assert_allclose(t, expected, atol=tol, err_msg=str(case))
        np.testing.assert_allclose(backend.to_host(phi_state), phi_after, atol=tol)
        np.testing.assert_allclose(backend.to_host(bras_state), bras_after, atol=tol)


TILED_RUN_CASES = [(0, 1), (1, 0, 1, 0), (0, 1, 0), (3, 0, 5, 1), (2, 1, 0, 4, 3, 5), (5,)]
"""Gate bits of tiled runs: repeated, unsorted; within the CPU's test tiles (bits 0 and 1,
see conftest) and above them (its gate-by-gate fallback)."""


def check_tiled_matrices(backend):
    """apply_tiled_matrices equals its gates one by one, and adjoint_tiled_matrices_step
    returns each gate's adjoint_block_step reduction (T_j of the bra after gate j with phi
    before it) and undoes the run on phi and its R bras, for B of 1 and 3, R of 1 and 4,
    shared and per-vector matrices, against the einsum references."""
    dtype = backend.dtype.type
    tol = BACKEND_TOL[dtype]
    for targets, batch, rows, shared in itertools.product(
        TILED_RUN_CASES, (1, 3), (1, 4), (True, False)
    ):
        case = (targets, batch, rows, shared)
        rng = np.random.default_rng(stable_seed("tiled run", *case))
        m = len(targets)
        phi = random_states(N, batch, rng).astype(dtype)
        bras = random_states(N, batch * rows, rng).astype(dtype)
        gates = np.stack(
            [
                np.stack([random_unitary(2, rng) for _ in range(m)])
                for _ in range(1 if shared else batch)
            ]
        )  # (1 or B, m, 2, 2)
        per_vector = np.broadcast_to(gates, (batch, m, 2, 2))
        expected = phi.astype(complex)
        for j, bit in enumerate(targets):
            expected = ref_block_apply(expected, per_vector[:, j], (bit,))
        state = backend_state(backend, phi)
        backend.apply_tiled_matrices(state, gates, targets)
        np.testing.assert_allclose(backend.to_host(state), expected, atol=tol, err_msg=str(case))

        ket, lam = expected, bras.astype(complex)
        reductions = [None] * m
        for j in reversed(range(m)):
            adjoint = per_vector[:, j].conj().transpose(0, 2, 1)
            ket = ref_block_apply(ket, adjoint, (targets[j],))
            reductions[j] = ref_block_reduction(lam, np.repeat(ket, rows, axis=0), (targets[j],))
            lam = ref_block_apply(lam, np.repeat(adjoint, rows, axis=0), (targets[j],))
        bras_state = backend_state(backend, bras)
        out = backend.adjoint_tiled_matrices_step(state, bras_state, gates, targets)
        (t,) = backend.gather([out])
        assert isinstance(t, np.ndarray), case
        assert t.shape == (batch, rows, m, 2, 2) and t.dtype == np.complex128, case
        np.testing.assert_allclose(
            t, np.stack(reductions, axis=1).reshape(batch, rows, m, 2, 2), atol=tol * 10,
            err_msg=str(case),
        )  # fmt: skip
        np.testing.assert_allclose(backend.to_host(state), ket, atol=tol, err_msg=str(case))
        np.testing.assert_allclose(backend.to_host(bras_state), lam, atol=tol, err_msg=str(case))


def check_gather(backend):
    """Backend arrays of several shapes and dtypes come back as numpy arrays, unchanged."""
    assert backend.gather([]) == []
    rng = np.random.default_rng(stable_seed("gather", backend.dtype.name))
    hosts = [random_states(4, 3, rng), random_states(2, 1, rng), random_states(N, 2, rng)]
    arrays = [backend.from_host(host) for host in hosts]
    block = backend.adjoint_block_step(
        arrays[2], backend.from_host(hosts[2][::-1]), random_unitary(4, rng)[None], (3, 0)
    )  # a complex128 reduction of shape (2, 1, 4, 4) among states of the backend's dtype
    (alone,) = backend.gather([block])
    gathered = backend.gather([arrays[0], block, arrays[1]])
    assert len(gathered) == 3 and all(isinstance(g, np.ndarray) for g in gathered)
    assert gathered[1].shape == (2, 1, 4, 4) and gathered[1].dtype == np.complex128
    np.testing.assert_array_equal(gathered[1], alone)
    for host, out in zip(hosts[:2], (gathered[0], gathered[2]), strict=True):
        assert out.shape == host.shape and out.dtype == backend.dtype
        np.testing.assert_array_equal(out, host.astype(backend.dtype))


def check_product_state(backend):
    """Vector b is the Kronecker product of factors[b, j] on bits[j], |0> on other bits."""
    rng = np.random.default_rng(stable_seed("product-state", backend.dtype.name))
    tol = 1e-6 if backend.dtype == np.complex64 else 1e-12
    for n, bits, batch in [
        (N, (0, 2, 3, 5), 2),
        (N, tuple(range(N)), 1),
        (4, (3,), 3),
        (1, (0,), 1),
    ]:
        factors = rng.normal(size=(batch, len(bits), 2)) + 1j * rng.normal(
            size=(batch, len(bits), 2)
        )
        state = backend.to_host(backend.product_state(n, factors, bits))
        assert state.shape == (batch, 1 << n)
        for b in range(batch):
            expected = np.ones(1, dtype=np.complex128)
            for bit in reversed(range(n)):  # bit n-1 is the most significant
                one_qubit = factors[b, bits.index(bit)] if bit in bits else np.array([1, 0])
                expected = np.kron(expected, one_qubit)
            np.testing.assert_allclose(state[b], expected, atol=tol, rtol=tol)


def check_concatenate(backend):
    """The vectors of each batch one after the other, in a new batch."""
    rng = np.random.default_rng(stable_seed("concatenate", backend.dtype.name))
    hosts = [random_states(4, batch, rng).astype(backend.dtype) for batch in (1, 3, 2)]
    states = [backend.from_host(host) for host in hosts]
    joined = backend.concatenate(states)
    assert joined.shape == (6, 16) and joined.dtype == backend.dtype
    assert each_vector_contiguous(joined)
    np.testing.assert_array_equal(backend.to_host(joined), np.concatenate(hosts))
    backend.apply_pauli(states[1], "X", (2,))  # the new batch shares no memory
    backend.apply_pauli(joined, "Y", (0,))
    np.testing.assert_array_equal(backend.to_host(states[0]), hosts[0])
    np.testing.assert_array_equal(
        backend.to_host(joined)[1:4], ref_apply(hosts[1], PAULI["Y"][None], (0,))
    )
    views = backend.concatenate(
        [backend.vectors(states[2], 1, 2), backend.vectors(states[1], 0, 1)]
    )
    np.testing.assert_array_equal(
        backend.to_host(views),
        np.concatenate([hosts[2][1:2], ref_apply(hosts[1][:1], PAULI["X"][None], (2,))]),
    )
    single = backend.concatenate(states[:1])
    backend.scale(single, np.array([0.0]))
    np.testing.assert_array_equal(backend.to_host(states[0]), hosts[0])


# --- device-level pieces shared by test files ----------------------------------------------


def parameter_shift_hessian(dev, angles) -> tuple[np.ndarray, int]:
    """(Hessian, executions): the parameter-shift Hessian of a variance by its two angles,
    through ``qml.execute(cache=True)`` (cache_hash.py), and the tracker's execution count.
    The shifted tapes repeat, and those whose angles differ only by round-off must hit the
    cache as on default.qubit."""
    params = pnp.array(angles, requires_grad=True)

    def cost(x):
        tape = qml.tape.QuantumScript(
            [qml.RX(x[0], 0), qml.RY(x[1], 1), qml.CNOT([0, 1])],
            [qml.var(qml.prod(qml.PauliZ(0), qml.PauliX(1)))],
        )
        return qml.execute(
            [tape], dev, diff_method=qml.gradients.param_shift, cache=True, max_diff=2
        )[0]

    with qml.Tracker(dev) as tracker:
        hessian = qml.jacobian(qml.grad(cost))(params)
    return hessian, tracker.totals["executions"]


def assert_21_qubits_refused(backend: str) -> None:
    """A 21-qubit circuit on ``backend`` (its complex128 state: 2**21 * 16 = 33,554,432
    bytes), run where the test made 1 MiB the free memory, is refused with a
    ``StateTooLargeError`` that names both figures and the backend's memory."""
    dev = qml.device(DEVICE, wires=21, backend=backend)

    @qml.qnode(dev)
    def circuit():
        for wire in range(21):
            qml.Hadamard(wire)
        return qml.expval(qml.Z(0))

    message = rf"needs 33,554,432 bytes of {backend} memory; 1,048,576 bytes are available"
    with pytest.raises(StateTooLargeError, match=message):
        circuit()


class SignallingLock:
    """A re-entrant lock, as PennyLane's recordings hold (``AnnotatedQueue._lock``), that
    sets ``asked`` when a thread asks for it while another thread holds it: a threading
    test's way to know that the device waited for a recording to end."""

    def __init__(self):
        self._lock = threading.RLock()
        self.asked = threading.Event()

    def acquire(self, blocking=True, timeout=-1):
        if self._lock.acquire(blocking=False):
            return True
        self.asked.set()
        return self._lock.acquire(blocking, timeout) if blocking else False

    def release(self):
        self._lock.release()

    def _is_owned(self):
        return self._lock._is_owned()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
