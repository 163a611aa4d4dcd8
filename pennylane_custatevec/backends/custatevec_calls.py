"""cuStateVec's calls as the cuStateVec backend makes them: ``custatevec.py`` decides what
to call for each operation on a batch, this module how.

One :class:`LibraryCalls` per backend holds the binding, the GPU's shared handle and the
data types; each method is one library call (or the single / batched pair of one),
following NVIDIA's Python samples: positional arguments in the C API's order, pointers as
Python ints (``array.data.ptr`` on the device, ``array.ctypes.data`` on the host), ``0``
for NULL, ``0, 0`` for a workspace (the handle's memory handler provides it). Matrices,
diagonals and expectation values are complex128 on the host, valid with either state type.
Outputs may be host memory (the call waits for the stream) or device memory (it does not),
where the library allows both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .custatevec_args import NULL, batch_layout, bit_list, control_arguments, on_host


def address(array) -> int:
    """The pointer of a host (numpy) or device (cupy) array."""
    return array.ctypes.data if on_host(array) else array.data.ptr


class LibraryCalls:
    """The library's calls on one handle, for state vectors of one dtype."""

    def __init__(self, cusv: Any, handle: int, data_types: Any, single: bool):
        self.cusv, self.handle = cusv, handle
        self.sv_type = data_types.CUDA_C_32F if single else data_types.CUDA_C_64F
        self.compute_type = cusv.ComputeType.COMPUTE_32F if single else cusv.ComputeType.COMPUTE_64F
        self.complex128 = data_types.CUDA_C_64F

    def _batch(self, state) -> tuple:
        """The leading arguments of a batched call: the handle, the batch, its data type,
        index bits, number of vectors and stride (elements; padded: see custatevec_args)."""
        n_svs, n_index_bits, stride = batch_layout(state)
        return self.handle, state.data.ptr, self.sv_type, n_index_bits, n_svs, stride

    def apply_matrices(
        self,
        state,
        matrices: np.ndarray,
        targets: Sequence[int],
        controls: Sequence[int] = (),
        control_values: Sequence[int] = (),
        *,
        adjoint: bool = False,
        vectors_per_matrix: int = 1,
    ) -> None:
        """psi <- M psi (``adjoint``: M^dagger psi, the library conjugates and transposes
        the M it reads) with ``matrices`` C-contiguous complex128 of shape (1 or m, d, d):
        one shared matrix, or matrix i for vectors i*vectors_per_matrix onwards (m *
        vectors_per_matrix vectors); a batch in one ``apply_matrix_batched``."""
        cusv = self.cusv
        n_svs, n_index_bits, _ = batch_layout(state)
        controls_arg, values_arg = control_arguments(controls, control_values)
        where = (bit_list(targets), len(targets), controls_arg, values_arg, len(controls))
        if n_svs == 1:
            cusv.apply_matrix(
                self.handle,
                state.data.ptr,
                self.sv_type,
                n_index_bits,
                matrices.ctypes.data,
                self.complex128,
                cusv.MatrixLayout.ROW,
                int(adjoint),  # adjoint: 1 applies the conjugate transpose of the matrix
                *where,
                self.compute_type,
                NULL,  # workspace: from the handle's memory handler
                0,
            )
            return
        shared = matrices.shape[0] == 1
        indices = NULL  # BROADCAST: every vector gets the one matrix
        if not shared:  # MATRIX_INDEXED: vector i gets matrix i // vectors_per_matrix
            indices = np.repeat(np.arange(matrices.shape[0], dtype=np.int32), vectors_per_matrix)
        cusv.apply_matrix_batched(
            *self._batch(state),
            cusv.MatrixMapType.BROADCAST if shared else cusv.MatrixMapType.MATRIX_INDEXED,
            indices,  # matrix_indices: int32 on the host, one per vector
            matrices.ctypes.data,
            self.complex128,
            cusv.MatrixLayout.ROW,
            int(adjoint),  # adjoint: 1 applies the conjugate transpose of each matrix
            matrices.shape[0],  # n_matrices
            *where,
            self.compute_type,
            NULL,
            0,
        )

    def generalized_permutation(
        self, pointer: int, n_bits: int, permutation, diagonal, targets, controls, values
    ) -> None:
        """D P on the vector of ``n_bits`` index bits at ``pointer`` (``permutation`` an
        int64 table, or NULL: D alone)."""
        controls_arg, values_arg = control_arguments(controls, values)
        self.cusv.apply_generalized_permutation_matrix(
            self.handle,
            pointer,
            self.sv_type,
            n_bits,
            permutation,
            diagonal.ctypes.data,
            self.complex128,
            0,  # adjoint: no
            bit_list(targets),
            len(targets),
            controls_arg,
            values_arg,
            len(controls),
            NULL,
            0,
        )

    def pauli_rotation(
        self, pointer: int, n_bits: int, angle: float, letters: str, bits, controls, values
    ) -> None:
        """exp(-i angle/2 P) on the vector of ``n_bits`` index bits at ``pointer``."""
        controls_arg, values_arg = control_arguments(controls, values)
        self.cusv.apply_pauli_rotation(
            self.handle,
            pointer,
            self.sv_type,
            n_bits,
            -0.5 * angle,  # theta: cuStateVec applies exp(+i theta P)
            [self.cusv.Pauli[letter] for letter in letters],
            bit_list(bits),
            len(bits),
            controls_arg,
            values_arg,
            len(controls),
        )

    def expvals_on_pauli_basis(
        self, pointer: int, n_bits: int, words: Sequence[tuple[str, list[int]]], out
    ) -> None:
        """<P> of each of ``words`` (letters without I, bits) on one vector into ``out``
        (host float64: the call waits for the stream)."""
        self.cusv.compute_expectations_on_pauli_basis(
            self.handle,
            pointer,
            self.sv_type,
            n_bits,
            out.ctypes.data,
            [[self.cusv.Pauli[letter] for letter in letters] for letters, _ in words],
            len(words),  # number of Pauli words
            [bits for _, bits in words],
            [len(bits) for _, bits in words],
        )

    def expectations(self, state, matrices: np.ndarray, bits: Sequence[int], out) -> None:
        """<psi_b|M_m|psi_b> of every matrix on every vector into ``out`` (complex128,
        element [b * m + matrix]; host or, for a batch, device memory): one
        ``compute_expectation``, or one ``compute_expectation_batched``."""
        n_svs, n_index_bits, _ = batch_layout(state)
        where = (bit_list(bits), len(bits), self.compute_type, NULL, 0)
        if n_svs == 1 and matrices.shape[0] == 1 and on_host(out):
            self.cusv.compute_expectation(
                self.handle,
                state.data.ptr,
                self.sv_type,
                n_index_bits,
                out.ctypes.data,  # the value is written here; the return value is not it
                self.complex128,  # complex: a matrix that is not Hermitian has a complex value
                matrices.ctypes.data,
                self.complex128,
                self.cusv.MatrixLayout.ROW,
                *where,
            )
            return
        self.cusv.compute_expectation_batched(
            *self._batch(state),
            address(out),
            matrices.ctypes.data,
            self.complex128,
            self.cusv.MatrixLayout.ROW,
            matrices.shape[0],  # n_matrices
            *where,
        )

    def abs2sum(self, state, bits: Sequence[int], out) -> None:
        """Marginal probabilities of ``bits`` of every vector into ``out`` (vectors, 2**k)
        float64, host or device memory; no bits: the squared norm."""
        n_svs, n_index_bits, _ = batch_layout(state)
        ordering = bit_list(bits) if len(bits) else NULL  # empty ordering: the norm
        if n_svs == 1:
            self.cusv.abs2sum_array(
                self.handle,
                state.data.ptr,
                self.sv_type,
                n_index_bits,
                address(out),
                ordering,
                len(bits),
                NULL,  # mask_bit_string: no mask
                NULL,  # mask_ordering
                0,  # mask_len
            )
            return
        self.cusv.abs2sum_array_batched(
            *self._batch(state),
            address(out),
            out.shape[1],  # abs2sum_array_stride
            ordering,
            len(bits),
            NULL,  # mask_bit_strings: no mask
            NULL,
            0,
        )

    def sample_vector(
        self, pointer: int, n_bits: int, bits: Sequence[int], randnums: np.ndarray, out
    ) -> None:
        """Samples of ``bits`` of one vector, one per uniform draw of ``randnums``
        (float64), into ``out`` (host int64: the call waits for the stream), through a
        sampler made and destroyed here."""
        cusv, shots = self.cusv, len(randnums)
        sampler, _workspace_size = cusv.sampler_create(
            self.handle, pointer, self.sv_type, n_bits, shots
        )
        try:
            # Workspace NULL: the memory handler provides it for the sampler's lifetime.
            cusv.sampler_preprocess(self.handle, sampler, NULL, 0)
            cusv.sampler_sample(
                self.handle,
                sampler,
                out.ctypes.data,  # host output, int64 bit strings
                bit_list(bits),
                len(bits),
                randnums,  # float64, in [0, 1)
                shots,
                cusv.SamplerOutput.RANDNUM_ORDER,
            )
        finally:
            cusv.sampler_destroy(sampler)
