"""What the device runs natively, and where the adjoint method's decomposition stops: the
stopping conditions of the decomposition stage (``pipeline``), read from the device's
capabilities (``capabilities.toml``)."""

from __future__ import annotations

import functools

import pennylane as qml
from pennylane import math
from pennylane.devices.capabilities import DeviceCapabilities

from ..entrywise import EntrywiseUnitary
from ..gradients.validation import has_a_generator
from ..measure import measurable
from ..program import compiles_by_gate
from ..rotations import PauliRotations
from ..templates import NATIVE_TEMPLATES, is_native_template
from .decompose import exponential_of_an_angle

MATRIX_DEFINED_OPS = (
    qml.QubitUnitary,
    qml.ControlledQubitUnitary,
    qml.BlockEncode,
    qml.operation.StatePrepBase,
)
"""Operations whose parameters are matrices or states: never decomposed for the adjoint
method (the rotation angles of a general unitary's decomposition are not differentiable
everywhere). A trainable QubitUnitary, ControlledQubitUnitary or BlockEncode is then
taken by its matrix's entries (``adjoint.entrywise_trainable_operators``); any other
trainable one, or a wider one, is refused by name rather than silently expanded. A
trainable DiagonalQubitUnitary decomposes, as default.qubit's adjoint method takes it:
into RZ, SelectPauliRot and GlobalPhase gates whose angles are differences of its
entries' phases, smooth functions of unit-modulus entries, which the interface
differentiates."""

MCM_OPS = frozenset({"MidMeasure", "Conditional"})
"""The mid-circuit operations the device runs itself (``GateSet.target_gates``)."""


class GateSet:
    """The device's gate set, from its ``capabilities``: what runs natively (the
    decomposition's stopping condition without differentiation), what the adjoint method
    differentiates as it stands (with it), and which observables are measured."""

    def __init__(self, capabilities: DeviceCapabilities):
        self.capabilities = capabilities

    @functools.cached_property
    def target_gates(self) -> frozenset:
        """What decomposition aims at: the native gates and mid-circuit measurements."""
        return frozenset(self.capabilities.gate_set() | MCM_OPS)

    def runs_natively(self, op: qml.operation.Operator) -> bool:
        """Native gates by name; exactly the native templates (a subclass may define
        other gates: it is decomposed); and a user's subclass of a native gate, which runs
        as that gate, as default.qubit applies it (PennyLane's own subclasses, such as
        AmplitudeEmbedding, keep their names' handling). Last, an operator that only a
        matrix defines (a user's operation with ``compute_matrix`` alone, ``qml.pow`` with
        a broadcast exponent) runs as that matrix, as default.qubit applies it."""
        if isinstance(op, (qml.ops.MidMeasure, qml.ops.Conditional)):
            return True
        if isinstance(op, NATIVE_TEMPLATES):
            return is_native_template(op)
        if isinstance(op, PauliRotations) or self.capabilities.supports_operation(op):
            return True
        cls = type(op)
        if cls.__module__.partition(".")[0] != "pennylane" and any(
            self.capabilities.supports_operation(base.__name__)
            for base in cls.__mro__[1:]
            if issubclass(base, qml.operation.Operator)
        ):
            return True
        return op.has_matrix and not _has_decomposition(op)

    def stops_adjoint(self, op: qml.operation.Operator) -> bool:
        """Native, and differentiable as it stands: trainable gates with several parameters
        (Rot, U3, CRot, ...) decompose into gates with one parameter and a generator. Native
        templates differentiate by their gates (decompose_templates_for_gradients decided
        which stay whole). Trainable matrices and state preparations stay whole: the
        preprocessing takes them by their entries (``entrywise_trainable_operators``). A
        trainable operator without a generator or a decomposition stays too, and the
        validation refuses it by name."""
        if not self.runs_natively(op):
            return False
        if (
            isinstance(op, (*MATRIX_DEFINED_OPS, EntrywiseUnitary))
            or compiles_by_gate(op)
            or not any(math.requires_grad(d) for d in op.data)
        ):
            return True
        if exponential_of_an_angle(op):  # by its angle, not its complex coefficient
            return False
        try:
            if op.num_params == 1 and has_a_generator(op):
                return True
        except ValueError:  # a broadcast qml.exp (see _has_decomposition): split later
            return True
        # nothing to decompose into (an operator that only its matrix defines): the
        # validation refuses it naming the reason, not the decomposition's "not supported"
        return not _has_decomposition(op)

    def observable_supported(self, obs: qml.operation.Operator) -> bool:
        """Whether the device measures ``obs`` (``measure.measurable``)."""
        return measurable(obs, self.capabilities.supports_observable)


def _has_decomposition(op: qml.operation.Operator) -> bool:
    """``op.has_decomposition``, False where PennyLane cannot answer it: ``qml.exp`` of a
    broadcast coefficient asks ``bool`` of the coefficients' array (ValueError in 0.45),
    and runs as its matrix then, as default.qubit applies it."""
    try:
        return op.has_decomposition
    except ValueError:
        return False
