"""cuStateVec backend: cupy state vectors updated through ``cuquantum.bindings.custatevec``.

The libraries come from ``gpu.import_libraries`` (called when a backend is built), so that
importing the package never needs them; tests replace that function with a NumPy double
of the library (``tests/custatevec_double.py``) and the code below runs unchanged on it.

Every library call follows NVIDIA's Python samples: positional arguments in the C API's
order, pointers as Python ints (``array.data.ptr`` on the device, ``array.ctypes.data``
on the host), ``0`` for NULL. State index bits are little-endian and ``targets[j]`` is
the state bit that becomes bit ``j`` of a matrix index, as in the backend protocol, so
targets pass through unchanged.

Backends on one GPU share its handle and stream (``gpu.gpu_context``); workspaces come
from the stream-ordered pool set as the handle's memory handler, so calls pass ``0, 0``
for their workspace. Nothing synchronises the stream except reading results on the host.
"""

from __future__ import annotations

import functools

import numpy as np

from ..pauli import pauli_word_matrix
from . import gpu
from .base import Backend, bra_rows
from .custatevec_args import (
    NULL,
    SMALL_BATCHED_TARGETS,
    batch_layout,
    control_as_target,
    on_host,
    padded_stride,
    pauli_as_permutation,
    pauli_groups,
    runs_batched,
    split_at_bits,
    vector_pointers,
    vector_runs,
    without_identities,
)
from .custatevec_calls import LibraryCalls
from .gpu import Libraries, resolve_device_id
from .host import free_host_bytes
from .primitives import FusionTraits, StateBatch

BATCHED_SAMPLING_BITS = 20
"""A batch samples up to this many bits from their marginal on the device, in one pass
(2**k float64 per vector: 8 MiB at 20); more bits, or one vector, through the library's
sampler, one vector at a time."""


def _on_device(method):
    """Run the method with the GPU's context locked (one thread at a time on its handle),
    the GPU current and its stream as cupy's stream."""

    @functools.wraps(method)
    def on_device(self, *args, **kwargs):
        with self._context.lock, self._device, self._stream:
            return method(self, *args, **kwargs)

    return on_device


CUSTATEVEC_FUSION_TRAITS = FusionTraits(
    # not what a benchmark chose: no GPU run yet; a guess that blocks of 4 qubits stay
    # memory-bound on a GPU (doc/options.md)
    default_width=4,
    block_costs=None,  # bandwidth-bound: a block on up to ~5 bits costs one pass (fuse greedily)
    z_runs=False,  # Z words are cheap there, and join the greedy dense blocks
    rotations_per_pass=1,  # rotations join the greedy dense blocks (one pass each) there
    min_fused_amplitudes=0,  # every fused block saves a kernel launch
    pauli_rotation_step_for_lone_rotations=False,  # a dense reduction is bandwidth-bound here too
)
"""How fusion plans for the cuStateVec backend (see FusionTraits)."""


class CuStateVecBackend(Backend):
    """State vectors as a cupy array of shape (B, 2**n) on one GPU: C-contiguous, or, for
    vectors under 128 bytes, the view of a padded one (``custatevec_args.padded_stride``).

    Its own kernels: everything but the runs of rotations (``apply_z_rotations``,
    ``apply_one_qubit_rotations`` and their sweep steps, which fusion never plans here: see its
    traits), ``product_state``, ``inner_pauli``, ``inner_matrix``, ``add_pauli_sum`` and
    ``adjoint_pauli_rotation_step``, which are the base class's compositions of these kernels."""

    name = "custatevec"
    fusion_traits = CUSTATEVEC_FUSION_TRAITS
    min_product_state_amplitudes = 0  # one kernel launch instead of one per gate

    def __init__(
        self,
        dtype: np.dtype = np.complex128,
        device_id: int | None = None,
        libraries: Libraries | None = None,
        rank_on_node: int | None = None,
    ):
        libraries = libraries or gpu.import_libraries()
        self._cp = libraries.cupy
        self.dtype = np.dtype(dtype)
        self.device_id = resolve_device_id(self._cp, device_id, rank_on_node)
        self._context = gpu.gpu_context(libraries, self.device_id)
        self._device, self._stream = self._context.device, self._context.stream
        self._calls = LibraryCalls(
            libraries.custatevec,
            self._context.handle,
            libraries.cuda_data_type,
            single=self.dtype == np.complex64,
        )

    # --- memory ------------------------------------------------------------------------

    sample_host_bytes = 16
    """``sample``: the uniform draws (float64) and the outcomes (int64), on the host."""

    def available_host_bytes(self) -> int:
        return free_host_bytes()

    def scratch_vectors(self, kets: int, bras: int, reduction: bool) -> int:
        # an inner product applies the operator to a copy of the kets (add_scaled's
        # product is the size of its source); a deferred step copies the bras to reduce
        # over them (adjoint_block_step, whose view of phi may be a copy too) or holds a
        # copy of phi as it moves from word to word (the base class's commuting steps)
        return bras + 2 * kets if reduction else kets

    @_on_device
    def available_bytes(self) -> int:
        """Free GPU memory plus what cupy's pool holds unused (it serves new arrays first).
        The stream-ordered pool of cuStateVec's workspaces keeps its memory across
        synchronisations (``gpu.UNLIMITED_RELEASE_THRESHOLD``) where cupy's arrays cannot
        use it: it gives back what it holds unused first. Asked only before a large
        allocation (``simulate.require_memory``), so workspaces are rarely made anew."""
        runtime = self._cp.cuda.runtime
        runtime.memPoolTrimTo(runtime.deviceGetDefaultMemPool(self.device_id), 0)
        free_bytes, _total_bytes = runtime.memGetInfo()
        return free_bytes + self._cp.get_default_memory_pool().free_bytes()

    def _batch(self, batch_size: int, amplitudes: int, zeroed: bool = True) -> StateBatch:
        """New memory for ``batch_size`` vectors, each starting 128-byte aligned: a
        C-contiguous array, or the ``[:, :amplitudes]`` view of a padded one (the smallest
        vectors, ``custatevec_args.padded_stride``)."""
        stride = padded_stride(amplitudes, self.dtype)
        allocate = self._cp.zeros if zeroed else self._cp.empty
        memory = allocate((batch_size, stride), dtype=self.dtype)
        return memory if stride == amplitudes else memory[:, :amplitudes]

    @_on_device
    def zero_state(self, n_qubits: int, batch_size: int) -> StateBatch:
        state = self._batch(batch_size, 1 << n_qubits)
        state[:, 0] = 1.0
        return state

    @_on_device
    def from_host(self, vectors: np.ndarray) -> StateBatch:
        host = np.array(vectors, dtype=self.dtype, order="C", ndmin=2, copy=None)
        if padded_stride(host.shape[1], self.dtype) == host.shape[1]:
            return self._cp.asarray(host)
        state = self._batch(*host.shape, zeroed=False)
        state[...] = host
        return state

    @_on_device
    def to_host(self, state: StateBatch) -> np.ndarray:
        return self._cp.asnumpy(state).astype(np.complex128, copy=False)

    @_on_device
    def copy(self, state: StateBatch) -> StateBatch:
        if padded_stride(state.shape[1], self.dtype) == state.shape[1]:
            return state.copy()
        copied = self._batch(*state.shape, zeroed=False)
        copied[...] = state
        return copied

    # the bit swaps of the distributed backend (messages.py's routes): on this stream (a
    # non-blocking one: the null stream would not wait for it)

    @_on_device
    def read_block(self, block, out: np.ndarray | None = None) -> np.ndarray:
        """A host copy of ``block`` (into ``out``: pinned memory, for the pinned route),
        waiting for the stream."""
        return self._cp.asnumpy(block, out=out)

    @_on_device
    def write_block(self, block, values) -> None:
        """``block[...] = values``: device values copied on the stream; host values
        through a device buffer, asynchronously from pinned memory (the caller leaves
        ``values`` alone until the stream is waited for)."""
        if on_host(values):
            staged = self._cp.empty(values.shape, dtype=values.dtype)
            staged.set(values, stream=self._stream)
            values = staged
        block[...] = values

    @_on_device
    def pinned_buffer(self, amplitudes: int) -> np.ndarray:
        """``amplitudes`` of the backend's dtype in page-locked host memory (cupy's pinned
        pool, which takes it back when the array is dropped)."""
        memory = self._cp.cuda.alloc_pinned_memory(amplitudes * self.dtype.itemsize)
        return np.frombuffer(memory, self.dtype, amplitudes)

    @_on_device
    def outside_readable(self, block) -> StateBatch:
        """``block`` as contiguous GPU memory that a reader outside the stream (CUDA-aware
        MPI) may read: a copy where it is strided, the stream waited for."""
        contiguous = self._cp.ascontiguousarray(block)
        self._stream.synchronize()
        return contiguous

    @_on_device
    def device_buffer(self, shape: tuple[int, ...]) -> StateBatch:
        """Uninitialised GPU memory of the backend's dtype (no stream work on it)."""
        return self._cp.empty(shape, dtype=self.dtype)

    def synchronize(self) -> None:
        """Wait for the stream (the pinned route, before its buffers are reused)."""
        self._stream.synchronize()

    def vectors(self, state: StateBatch, start: int, stop: int) -> StateBatch:
        return state[start:stop]

    # --- gates -------------------------------------------------------------------------

    @_on_device
    def apply_matrix(self, state, matrices, targets, controls=(), control_values=()) -> None:
        matrices = np.ascontiguousarray(matrices, dtype=np.complex128)
        self._calls.apply_matrices(state, matrices, targets, controls, control_values)

    @_on_device
    def apply_diagonal(self, state, diagonals, targets, controls=(), control_values=()) -> None:
        diagonals = np.ascontiguousarray(diagonals, dtype=np.complex128)
        if not len(targets):
            if not len(controls):
                self.scale(state, diagonals[:, 0])
                return
            diagonals, targets, controls, control_values = control_as_target(
                diagonals, controls, control_values
            )
        if runs_batched(state, len(targets)):
            matrices = diagonals[:, :, None] * np.eye(diagonals.shape[1])
            self.apply_matrix(state, matrices, targets, controls, control_values)
            return
        shared = diagonals.shape[0] == 1
        for vector, (pointer, n_bits) in enumerate(vector_runs(state, shared)):
            diagonal = diagonals[0 if shared else vector]
            self._calls.generalized_permutation(
                pointer, n_bits, NULL, diagonal, targets, controls, control_values
            )

    @_on_device
    def apply_pauli_rotation(
        self, state, angles, paulis, targets, controls=(), control_values=()
    ) -> None:
        angles = np.ascontiguousarray(angles, dtype=np.float64).reshape(-1)
        letters, bits = without_identities(paulis, targets)
        if not letters:  # exp(-i angle/2 I) is a phase
            phases = np.exp(-0.5j * angles)[:, None]
            self.apply_diagonal(state, phases, (), controls, control_values)
            return
        if runs_batched(state, len(bits)):
            word = pauli_word_matrix(letters)
            half = 0.5 * angles[:, None, None]
            matrices = np.cos(half) * np.eye(len(word)) - 1j * np.sin(half) * word
            self.apply_matrix(state, matrices, bits, controls, control_values)
            return
        shared = len(angles) == 1
        for vector, (pointer, n_bits) in enumerate(vector_runs(state, shared)):
            angle = angles[0 if shared else vector]
            self._calls.pauli_rotation(
                pointer, n_bits, angle, letters, bits, controls, control_values
            )

    @_on_device
    def apply_pauli(self, state, paulis, targets, controls=(), control_values=()) -> None:
        letters, bits = without_identities(paulis, targets)
        if not letters:
            return
        if runs_batched(state, len(bits)):
            matrix = pauli_word_matrix(letters)[None]
            self.apply_matrix(state, matrix, bits, controls, control_values)
            return
        permutation, diagonal = pauli_as_permutation(letters)
        for pointer, n_bits in vector_runs(state):
            self._calls.generalized_permutation(
                pointer, n_bits, permutation, diagonal, bits, controls, control_values
            )

    @_on_device
    def apply_bit_permutation(self, state, sources) -> None:
        """The base class's gather, on the backend's GPU and stream (cupy's indexing runs
        on the current stream: outside it, it would race with the library's calls)."""
        super().apply_bit_permutation(state, sources)

    @_on_device
    def scale(self, state, factors) -> None:
        state *= self._cp.asarray(np.asarray(factors, dtype=self.dtype).reshape(-1, 1))

    # --- expectations and inner products -----------------------------------------------

    def expval_pauli(self, state, paulis, targets) -> np.ndarray:
        return self.expval_pauli_words(state, [(paulis, targets)])[:, 0]

    @_on_device
    def expval_pauli_words(self, state, words) -> np.ndarray:
        """One vector: one call for every word. A batch: the words grouped on at most
        ``SMALL_BATCHED_TARGETS`` bits (``pauli_groups``), each group one
        ``compute_expectation_batched`` of its words' dense matrices over every vector,
        into device memory, read back in one transfer; wider words one call per vector."""
        n_svs = state.shape[0]
        out = np.zeros((n_svs, len(words)), dtype=np.float64)
        kept = [without_identities(paulis, targets) for paulis, targets in words]
        if not words:
            return out
        n_bits = batch_layout(state)[1]
        if n_svs == 1:
            self._calls.expvals_on_pauli_basis(state.data.ptr, n_bits, kept, out[0])
            return out
        groups, wide = pauli_groups(kept, SMALL_BATCHED_TARGETS)
        values = [self._word_expvals(state, bits, members) for bits, members in groups]
        for (_, members), group_values in zip(groups, self._to_host_at_once(values), strict=True):
            out[:, [k for k, _ in members]] = group_values.real
        if wide:
            row = np.zeros(len(wide))
            for vector, pointer in enumerate(vector_pointers(state)):
                self._calls.expvals_on_pauli_basis(pointer, n_bits, [kept[k] for k in wide], row)
                out[vector, wide] = row
        return out

    def _word_expvals(self, state, bits, members):
        """<P> of every word of a group on every vector, (vectors, words) complex128 in
        device memory: no synchronisation. The words without letters give the norm."""
        if not bits:
            norms = self._cp.empty((state.shape[0], 1), dtype=np.float64)
            self._calls.abs2sum(state, (), norms)
            return self._cp.concatenate([norms.astype(np.complex128)] * len(members), axis=1)
        matrices = np.stack([pauli_word_matrix(word) for _, word in members])
        values = self._cp.empty((state.shape[0], len(members)), dtype=np.complex128)
        self._calls.expectations(state, matrices, bits, values)
        return values

    @_on_device
    def expval_matrix(self, state, matrix, targets) -> np.ndarray:
        matrix = np.ascontiguousarray(matrix, dtype=np.complex128)[None]
        out = np.empty(state.shape[0], dtype=np.complex128)
        self._calls.expectations(state, matrix, targets, out)
        return out

    @_on_device
    def braket(self, bra, kets) -> np.ndarray:
        """<bra_b|kets_b> (one ket serves every bra); ``kets`` is scratch: it is conjugated
        in place so that one matrix product, <a|b> = conj(a . conj(b)), needs no copy of
        the bras."""
        cp = self._cp
        cp.conj(kets, out=kets)
        if kets.shape[0] == 1:
            products = cp.matmul(bra, kets[0])
        else:
            products = cp.matmul(bra[:, None, :], kets[:, :, None])[:, 0, 0]
        return np.conj(cp.asnumpy(products).astype(np.complex128))

    @_on_device
    def gram(self, bras, kets):
        """G = conj(bras) kets^T, one matrix product left on the device (a conjugated copy
        of the bras is its temporary)."""
        return self._cp.matmul(self._cp.conj(bras), kets.T).astype(np.complex128, copy=False)

    def gram_scratch_vectors(self, bras: int, kets: int) -> int:
        return bras  # the conjugated copy of the bras

    @_on_device
    def adjoint_block_step(self, phi, bras, matrices, targets):
        matrices = np.ascontiguousarray(matrices, dtype=np.complex128)
        batch = phi.shape[0]
        rows = bra_rows(phi, bras, matrices.shape[0])
        # The bras before the step, target bits first: a temporary copy of all B*R bras (the
        # step's largest allocation), conjugated in place for the reduction below.
        before = self._target_major(bras, targets, copy=True)
        self._cp.conj(before, out=before)
        if len(targets):
            self._calls.apply_matrices(phi, matrices, targets, adjoint=True)
            self._calls.apply_matrices(
                bras, matrices, targets, adjoint=True, vectors_per_matrix=rows
            )
        else:  # a 1 x 1 block is a factor (no zero-target matrix call)
            factors = np.conj(matrices[:, 0, 0])
            self.scale(phi, factors)
            self.scale(bras, np.repeat(factors, rows if len(factors) > 1 else 1))
        after = self._target_major(phi, targets, copy=False)
        d = 1 << len(targets)
        # T[b, r, a, c] = sum_rest conj(bra_{b,r}[a, rest]) phi_b[c, rest]: one batched
        # product (B, R*d, rest) @ (B, rest, d), left on the device (no synchronisation).
        products = self._cp.matmul(before.reshape(batch, rows * d, -1), after.swapaxes(1, 2))
        return products.reshape(batch, rows, d, d).astype(np.complex128, copy=False)

    def _target_major(self, state, targets, copy: bool):
        """The batch as (vectors, d, rest): the block's matrix index a (bit j of a is state
        bit targets[j]) then the other bits; a new C-contiguous array if ``copy``, else
        a view where the layout allows one."""
        n_svs, n_index_bits, _ = batch_layout(state)
        shape, axis_of, rest = split_at_bits(n_index_bits, targets)
        front = [axis_of[int(bit)] for bit in reversed(targets)]  # a's top bit first
        tensor = state.reshape((n_svs,) + shape).transpose([0] + front + rest)
        if copy:
            tensor = tensor.copy(order="C")
        return tensor.reshape(n_svs, 1 << len(targets), -1)

    @_on_device
    def gather(self, arrays) -> list[np.ndarray]:
        arrays = list(arrays)
        # host arrays (the base class's default steps) pass through
        fetched = iter(self._to_host_at_once([a for a in arrays if not on_host(a)]))
        return [array if on_host(array) else next(fetched) for array in arrays]

    def _to_host_at_once(self, arrays: list) -> list[np.ndarray]:
        """Device arrays as numpy arrays, in one transfer."""
        if not arrays:
            return []
        # Each array's bytes, one after the other, in one device buffer: one transfer for
        # any mix of shapes and dtypes, split on the host.
        raw = [array.ravel().view(np.uint8) for array in arrays]
        flat = raw[0] if len(raw) == 1 else self._cp.concatenate(raw)
        host = self._cp.asnumpy(flat)
        ends = np.cumsum([part.size for part in raw])
        return [
            piece.view(array.dtype).reshape(array.shape)
            for piece, array in zip(np.split(host, ends[:-1]), arrays, strict=True)
        ]

    @_on_device
    def concatenate(self, states) -> StateBatch:
        states = list(states)
        amplitudes = states[0].shape[1]
        if padded_stride(amplitudes, self.dtype) == amplitudes:
            return self._cp.concatenate(states)
        joined = self._batch(sum(s.shape[0] for s in states), amplitudes, zeroed=False)
        start = 0
        for part in states:
            joined[start : start + part.shape[0]] = part
            start += part.shape[0]
        return joined

    @_on_device
    def add_scaled(self, dst, src, factors) -> None:
        factors = np.asarray(factors, dtype=self.dtype).reshape(-1, 1)
        dst += self._cp.asarray(factors) * src

    # --- measurements ------------------------------------------------------------------

    @_on_device
    def probabilities(self, state, bits) -> np.ndarray:
        out = np.empty((state.shape[0], 1 << len(bits)), dtype=np.float64)
        self._calls.abs2sum(state, bits, out)  # host output: one wait for the stream
        return out

    @_on_device
    def sample(self, state, bits, shots, rng) -> np.ndarray:
        """A batch: the marginal of ``bits`` of every vector (``abs2sum_array_batched``
        into device memory), its cumulative sums scaled by each vector's squared norm, one
        ``searchsorted`` of the caller's uniform draws per vector, one transfer at the end
        (no synchronisation before it); wider marginals (``BATCHED_SAMPLING_BITS``) and a
        lone vector: the library's sampler, one vector at a time."""
        n_svs, n_index_bits, _ = batch_layout(state)
        # One uniform number per shot from the caller's Generator: a seed fixes the samples.
        randnums = rng.random((n_svs, shots))
        out = np.zeros((n_svs, shots), dtype=np.int64)
        if not len(bits) or not shots:
            return out
        if n_svs > 1 and len(bits) <= BATCHED_SAMPLING_BITS:
            return self._sample_marginals(state, bits, randnums)
        for vector, pointer in enumerate(vector_pointers(state)):
            self._calls.sample_vector(pointer, n_index_bits, bits, randnums[vector], out[vector])
        return out

    def _sample_marginals(self, state, bits, randnums: np.ndarray) -> np.ndarray:
        """Outcome r of vector b for draw u: the first r whose cumulative marginal exceeds
        u times the vector's squared norm (as the library's sampler scales its draws)."""
        cp = self._cp
        outcomes = 1 << len(bits)
        cumulative = cp.empty((state.shape[0], outcomes), dtype=np.float64)
        self._calls.abs2sum(state, bits, cumulative)
        cumulative = cp.cumsum(cumulative, axis=1)
        draws = cp.multiply(cp.asarray(randnums), cumulative[:, -1:])
        samples = cp.empty(randnums.shape, dtype=np.int64)
        for vector in range(state.shape[0]):
            samples[vector] = cp.searchsorted(cumulative[vector], draws[vector], side="right")
        return cp.asnumpy(cp.minimum(samples, outcomes - 1))
