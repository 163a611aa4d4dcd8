"""Trainable unitary matrices and prepared states as operators whose parameters are their
entries.

A QNode's value is a polynomial in the entries of a ``QubitUnitary``'s matrix U and their
conjugates, so its derivative by U is well defined everywhere, and default.qubit's
backpropagation gives it. PennyLane's gradient transforms and default.qubit's adjoint
method instead decompose U into rotations whose angles are functions of U (ZYZ angles by
``one_qubit_decomposition``): those functions are not differentiable where the
decomposition is degenerate (U diagonal, U the identity), and there the derivative comes
out wrong even along the unitary directions (zero at U = I, where the value is not
stationary).

The device's adjoint method takes such a gate by its entries instead: the device's
preprocessing, which runs inside the ML framework, replaces a trainable ``QubitUnitary``
(or ``ControlledQubitUnitary``, by its whole controlled matrix, or ``BlockEncode``) by an
``EntrywiseUnitary`` whose parameters are the real and imaginary parts of the matrix's
entries, real scalars taken from the matrix by the framework (``entrywise_unitary``).
The framework differentiates that linear map exactly (and applies its own convention for
complex parameters: torch's gradient is the conjugate of jax's and autograd's); the
device differentiates by each real scalar. With T[a, c] = sum_r conj(lambda[a, r])
phi[c, r] (the bra after the gate, the state before it; ``gradients.eager``):

    d/d Re U_ac  Re <lambda|psi> = Re T[a, c]
    d/d Im U_ac  Re <lambda|psi> = Re(i T[a, c]) = -Im T[a, c]

which are the derivatives that backpropagation through the matrix product gives.

A trainable state preparation that opens the circuit (``StatePrep``, ``AmplitudeEmbedding``)
is taken the same way, by its amplitudes (``EntrywiseState``): the Mottonen decomposition
that the others differentiate gives NaN where the state has zero amplitudes (a basis
state). With lambda_0 the bra carried back to the start and i_k where amplitude k sits,

    d/d Re v_k = Re lambda_0[i_k],    d/d Im v_k = Im lambda_0[i_k].

The MAX_ constants below bound what PennyLane carries (2 real parameters per entry).
"""

from __future__ import annotations

import numpy as np
import pennylane as qml
from pennylane import math
from pennylane.exceptions import DeviceError
from pennylane.operation import Operation, Operator, StatePrepBase
from pennylane.ops.functions import bind_new_parameters
from pennylane.queuing import QueuingManager

from .queuing import recording_elsewhere

ENTRYWISE_SOURCES = (
    qml.QubitUnitary,
    qml.ControlledQubitUnitary,
    qml.BlockEncode,
    qml.pulse.ParametrizedEvolution,
)
"""The operations that the adjoint method differentiates by their matrix's entries where
they are trainable (a block encoding's matrix and a pulse's evolution are functions of
their data that the framework differentiates, as default.qubit's backpropagation does)."""

MAX_ENTRYWISE_STATE_QUBITS = 12
"""The widest prepared state taken amplitude by amplitude (2 * 2**12 = 8192 real
parameters, as many as a unitary on ``MAX_ENTRYWISE_QUBITS`` wires)."""

MAX_ENTRYWISE_QUBITS = 6
"""The widest matrix (controls included) taken entry by entry: 2 * 4**6 = 8192 real
parameters for PennyLane to carry, and a 64 x 64 reduction per bra. A wider trainable
unitary is refused by name (its parameter count grows as 4**k)."""


class _ByEntries:
    """What both operators taken by their entries share: 2 * ``entries_per_wire``**k real
    scalar parts on k wires (an array is a broadcast), the ``source`` operation's name, and
    queuing in this thread's own recording only (as ``rotations.PauliRotations``)."""

    grad_method = None
    entries_per_wire = 1

    def __init__(self, parts: tuple, wires, source: str, id):
        entries = self.entries_per_wire ** len(qml.wires.Wires(wires))
        if len(parts) != 2 * entries:
            raise ValueError(
                f"{type(self).__name__} on {len(qml.wires.Wires(wires))} wires takes "
                f"{2 * entries} real parts, not {len(parts)}."
            )
        self._hyperparameters = {"source": source}
        super().__init__(*parts, wires=wires, id=id)

    @property
    def ndim_params(self) -> tuple[int, ...]:
        """Every part is a scalar: an array is a broadcast (``batch_size``)."""
        return (0,) * len(self.data)

    def queue(self, context=QueuingManager):
        if recording_elsewhere():
            return self
        return super().queue(context)


class EntrywiseUnitary(_ByEntries, Operation):
    """The matrix U on ``wires`` (first wire most significant) given by its entries:
    ``parts`` are Re U_00, Im U_00, Re U_01, Im U_01, ... (row by row), 2 * 4**k real
    scalars (each an array of the batch where broadcast). ``source`` names the operation
    it stands for (in messages)."""

    entries_per_wire = 4

    def __init__(self, *parts, wires, source: str = "QubitUnitary", id=None):
        _ByEntries.__init__(self, parts, wires, source, id)

    @staticmethod
    def compute_matrix(*parts, source: str = "QubitUnitary"):  # noqa: ARG004
        dimension = int(round(np.sqrt(len(parts) / 2)))
        stacked = math.stack(parts, axis=-1)  # (..., 2 * d * d)
        pairs = math.reshape(stacked, math.shape(stacked)[:-1] + (dimension, dimension, 2))
        return pairs[..., 0] + 1j * pairs[..., 1]

    def adjoint(self) -> Operator:
        return qml.QubitUnitary(math.conj(math.swapaxes(self.matrix(), -1, -2)), self.wires)


@bind_new_parameters.register
def _(op: EntrywiseUnitary, params) -> EntrywiseUnitary:
    return EntrywiseUnitary(*params, wires=op.wires, source=op.hyperparameters["source"])


def entrywise_unitary(op: Operator) -> EntrywiseUnitary:
    """``op`` (of ``ENTRYWISE_SOURCES``) as an ``EntrywiseUnitary`` whose parts the ML
    framework takes from its matrix (call it where the framework records): a
    ``QubitUnitary``'s parameter, a block encoding's or a pulse's ``matrix()``. A controlled
    unitary's whole matrix on controls and targets: the entries outside the controlled
    block are constants (not trainable), the block's come from the base matrix."""
    if isinstance(op, qml.BlockEncode) and math.get_interface(op.data[0]) == "torch":
        raise DeviceError(
            "custatevec.qubit cannot differentiate a trainable BlockEncode of torch data: "
            "PennyLane 0.45 builds its matrix from copies of the data that torch does not "
            "differentiate (the derivative comes out 0; default.qubit's backpropagation "
            "gives that 0 too); use autograd or jax, or a QubitUnitary of the "
            "block-encoding matrix built with torch operations"
        )
    matrix = op.data[0] if isinstance(op, ENTRYWISE_SOURCES[:2]) else op.matrix()
    dtype = math.get_dtype_name(matrix)
    if "complex" not in dtype:  # a real matrix: its imaginary parts are zeros
        matrix = math.cast(matrix, "complex64" if dtype == "float32" else "complex128")
    real, imaginary = math.real(matrix), math.imag(matrix)
    if isinstance(op, qml.ControlledQubitUnitary):
        return _controlled(op, real, imaginary)
    dimension = 2 ** len(op.wires)
    parts = []
    for a in range(dimension):
        for c in range(dimension):
            parts.extend((real[..., a, c], imaginary[..., a, c]))
    return EntrywiseUnitary(*parts, wires=op.wires, source=op.name)


def _controlled(op: qml.ControlledQubitUnitary, real, imaginary) -> EntrywiseUnitary:
    """The whole matrix of a controlled unitary: the base's entries where every control
    wire has its control value, the identity elsewhere."""
    controls, targets = len(op.control_wires), len(op.target_wires)
    block = 2**targets
    selected = int("".join(str(int(v)) for v in op.control_values), 2) if controls else 0
    offset = selected * block
    # constants, never trainable: of the batch's shape where the matrix is broadcast
    batch = math.shape(real)[:-2]
    one, zero = (np.full(batch, value) if batch else value for value in (1.0, 0.0))
    dimension = 2 ** (controls + targets)
    parts = []
    for a in range(dimension):
        for c in range(dimension):
            if offset <= a < offset + block and offset <= c < offset + block:
                entry = (..., a - offset, c - offset)
                parts.extend((real[entry], imaginary[entry]))
            else:
                parts.extend((one if a == c else zero, zero))
    return EntrywiseUnitary(*parts, wires=op.wires, source=op.name)


class EntrywiseState(_ByEntries, StatePrepBase):
    """The state prepared on ``wires`` (first wire most significant; the device's other
    wires in |0>) given by its amplitudes: ``parts`` are Re v_0, Im v_0, Re v_1, ...,
    2 * 2**k real scalars. Only the first operation of a circuit, as every state
    preparation the device runs."""

    entries_per_wire = 2

    def __init__(self, *parts, wires, source: str = "StatePrep", id=None):
        _ByEntries.__init__(self, parts, wires, source, id)

    def state_vector(self, wire_order=None):
        stacked = math.stack(self.data, axis=-1)  # (..., 2 * d)
        pairs = math.reshape(stacked, math.shape(stacked)[:-1] + (-1, 2))
        vector = pairs[..., 0] + 1j * pairs[..., 1]
        preparation = qml.StatePrep(vector, wires=self.wires, validate_norm=False)
        return preparation.state_vector(wire_order=wire_order)


@bind_new_parameters.register
def _(op: EntrywiseState, params) -> EntrywiseState:
    return EntrywiseState(*params, wires=op.wires, source=op.hyperparameters["source"])


def entrywise_state(op: StatePrepBase) -> EntrywiseState:
    """A state preparation (the first operation of a circuit) as an ``EntrywiseState`` whose
    parts the ML framework takes from its state vector on its own wires (call it where the
    framework records: a ``normalize=True`` preparation's normalisation, an embedding's
    padding, are differentiated there)."""
    vector = op.state_vector(wire_order=op.wires)
    dimension = 2 ** len(op.wires)
    vector = math.reshape(
        vector, math.shape(vector)[: math.ndim(vector) - len(op.wires)] + (dimension,)
    )
    dtype = math.get_dtype_name(vector)
    if "complex" not in dtype:
        vector = math.cast(vector, "complex64" if dtype == "float32" else "complex128")
    real, imaginary = math.real(vector), math.imag(vector)
    parts = []
    for k in range(dimension):
        parts.extend((real[..., k], imaginary[..., k]))
    return EntrywiseState(*parts, wires=op.wires, source=op.name)
