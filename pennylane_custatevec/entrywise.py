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
(or ``ControlledQubitUnitary``, by its base's entries, or ``BlockEncode``) by an
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

The MAX_ constants below bound what PennyLane carries (2 real parameters per entry) and
the width of the dense block the sweep applies.
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
"""The widest matrix taken entry by entry (a controlled unitary's target wires): 2 * 4**6 =
8192 real parameters for PennyLane to carry. A wider trainable unitary is refused by name
(its parameter count grows as 4**k)."""

MAX_ENTRYWISE_CONTROLLED_QUBITS = 8
"""The most wires (controls and targets) of a trainable controlled unitary taken by its
base's entries: the sweep applies and reduces its whole matrix as one dense block on those
wires (a 256 x 256 reduction per bra at 8), so its controls count there, not among the
parameters."""


MAX_JIT_ENTRYWISE_QUBITS = 4
"""The widest matrix (target wires) taken entry by entry when ``jax.jit`` traces it and no
derivative is being taken yet (a forward ``jax.jit``, or ``jax.grad(jax.jit(f))``, whose
derivative reaches the device later): every part is an operand of PennyLane's callback,
and XLA compiles a callback's operands in superlinear time. Measured here (2 cores,
jaxlib 0.7.1): the first call of a jitted QNode with a traced controlled unitary took 0.6 s
at 3 target wires, 2.4 s at 4 and 11 s at 5; a bare ``pure_callback`` compiled in 9 s with
2048 scalar operands and in 79 s with 8192. A wider one is left whole
(``left_whole_under_jit``): it runs, and a derivative of it is refused by name."""


def left_whole_under_jit(op: Operator) -> bool:
    """Whether ``op``, a unitary given by its matrix, is traced by ``jax.jit`` alone (no
    derivative being taken of it: ``jax.jit``'s tracer, not one of differentiation) and
    wider than ``MAX_JIT_ENTRYWISE_QUBITS``: the device's preprocessing leaves it whole,
    and its derivative is refused where it is asked for (``jit_whole_matrix_reason``)."""
    return (
        isinstance(op, (qml.QubitUnitary, qml.ControlledQubitUnitary))
        and type(op.data[0]).__name__ == "DynamicJaxprTracer"
        and _target_width(op) > MAX_JIT_ENTRYWISE_QUBITS
    )


def jit_whole_matrix_reason(op: Operator) -> str:
    """Why the adjoint method does not differentiate a unitary that
    ``left_whole_under_jit`` left whole (a phrase)."""
    return (
        f"the matrix of {op.name} on wires {op.wires.tolist()} was traced by jax.jit with no "
        "derivative being taken when the device's preprocessing ran (a forward jax.jit, or "
        "jax.grad(jax.jit(f))); a matrix on more than "
        f"{MAX_JIT_ENTRYWISE_QUBITS} target wires is then left whole, because its "
        f"2 * 4**k entries as operands of PennyLane's callback take XLA minutes to compile. "
        "Take the derivative inside the jitted function (jax.jit(jax.grad(f))), which takes "
        f"it by its entries (up to {MAX_ENTRYWISE_QUBITS} target wires), or call the QNode "
        "without jax.jit"
    )


def _target_width(op: Operator) -> int:
    if isinstance(op, qml.ControlledQubitUnitary):
        return len(op.target_wires)
    return len(op.wires)


def too_wide(op: Operator) -> bool:
    """Whether a trainable ``op`` of ``ENTRYWISE_SOURCES`` is wider than the adjoint method
    takes by its entries (the MAX_ constants)."""
    return _target_width(op) > MAX_ENTRYWISE_QUBITS or (
        len(op.wires) > MAX_ENTRYWISE_CONTROLLED_QUBITS
    )


class _ByEntries:
    """What both operators taken by their entries share: 2 * ``entries_per_wire``**k real
    scalar parts on k wires (an array is a broadcast), the ``source`` operation's name, and
    queuing in this thread's own recording only (as ``rotations.PauliRotations``)."""

    grad_method = None
    entries_per_wire = 1

    def __init__(self, parts: tuple, wires, source: str, id, control_values: tuple = ()):
        entries = self.entries_per_wire ** (len(qml.wires.Wires(wires)) - len(control_values))
        if len(parts) != 2 * entries:
            raise ValueError(
                f"{type(self).__name__} on {len(qml.wires.Wires(wires))} wires "
                f"({len(control_values)} of them controls) takes {2 * entries} real parts, "
                f"not {len(parts)}."
            )
        self._hyperparameters = {"source": source}
        if control_values:
            self._hyperparameters["control_values"] = tuple(control_values)
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
    it stands for (in messages).

    With ``control_values`` (one bit per leading wire), the first wires are controls and
    U acts on the others where the controls have those values: the operator's matrix is
    the identity with U in the diagonal block that the control values select
    (``selected_block``), and its parts are U's entries alone."""

    entries_per_wire = 4

    def __init__(self, *parts, wires, source: str = "QubitUnitary", control_values=(), id=None):
        _ByEntries.__init__(self, parts, wires, source, id, control_values)

    @property
    def control_values(self) -> tuple:
        return self._hyperparameters.get("control_values", ())

    @staticmethod
    def compute_matrix(*parts, source: str = "QubitUnitary", control_values=()):  # noqa: ARG004
        dimension = int(round(np.sqrt(len(parts) / 2)))
        stacked = math.stack(parts, axis=-1)  # (..., 2 * d * d)
        pairs = math.reshape(stacked, math.shape(stacked)[:-1] + (dimension, dimension, 2))
        block = pairs[..., 0] + 1j * pairs[..., 1]
        if not control_values:
            return block
        # I + E (U - I) E^T, E the columns of the selected block: the identity elsewhere
        full = dimension * 2 ** len(control_values)
        offset = selected_block(control_values, dimension)
        embedding = np.zeros((full, dimension))
        embedding[offset + np.arange(dimension), np.arange(dimension)] = 1.0
        embedding = math.convert_like(embedding, block)
        change = block - math.convert_like(np.eye(dimension), block)
        return math.convert_like(np.eye(full), block) + math.einsum(
            "ai,...ij,bj->...ab", embedding, change, embedding
        )

    def adjoint(self) -> Operator:
        return qml.QubitUnitary(math.conj(math.swapaxes(self.matrix(), -1, -2)), self.wires)


def selected_block(control_values: tuple, dimension: int) -> int:
    """Where the block of a controlled matrix that ``control_values`` select starts (its
    row and column offset; ``dimension``: the block's size): the control bits are the
    index's leading bits."""
    selected = int("".join(str(int(v)) for v in control_values), 2) if control_values else 0
    return selected * dimension


@bind_new_parameters.register
def _(op: EntrywiseUnitary, params) -> EntrywiseUnitary:
    return EntrywiseUnitary(
        *params,
        wires=op.wires,
        source=op.hyperparameters["source"],
        control_values=op.control_values,
    )


def entrywise_unitary(op: Operator) -> EntrywiseUnitary:
    """``op`` (of ``ENTRYWISE_SOURCES``) as an ``EntrywiseUnitary`` whose parts the ML
    framework takes from its matrix (call it where the framework records): a
    ``QubitUnitary``'s parameter, a block encoding's or a pulse's ``matrix()``. A controlled
    unitary by its base's entries, its control values kept (the whole matrix's other
    entries are the identity's, constants)."""
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
    dimension = math.shape(matrix)[-1]
    parts = []
    for a in range(dimension):
        for c in range(dimension):
            parts.extend((real[..., a, c], imaginary[..., a, c]))
    control_values = ()
    if isinstance(op, qml.ControlledQubitUnitary):
        control_values = tuple(int(v) for v in op.control_values)
    return EntrywiseUnitary(*parts, wires=op.wires, source=op.name, control_values=control_values)


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
