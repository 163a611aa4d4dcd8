"""Runs of rotation gates as one operation.

PennyLane's cost per call grows with the number of operations in a tape: each is rebuilt
when its parameters are converted for the device (twice per training step, forward and
backward), validated and compiled. A QAOA layer or a hardware-efficient ansatz is a long
run of one-parameter Pauli rotations exp(-i theta/2 P) (RX, RY, RZ, IsingXX, IsingYY,
IsingZZ, MultiRZ, PauliRot); the device's preprocessing gathers each run of two or more
such gates into one ``PauliRotations`` operation whose parameters are the gates' angles,
in order. The device compiles it back to its gates, so results and gradients are those
of the gates; PennyLane then handles one operation per run. Its resources (``qml.specs``,
the tracker) count the gates it holds.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pennylane as qml
from pennylane.exceptions import DeviceError
from pennylane.operation import Operation, Operator
from pennylane.ops.functions import bind_new_parameters
from pennylane.queuing import QueuingManager
from pennylane.resource import Resources, ResourcesOperation

from .queuing import recording_elsewhere, without_queuing

_FIXED_WORDS = {
    qml.RX: "X",
    qml.RY: "Y",
    qml.RZ: "Z",
    qml.IsingXX: "XX",
    qml.IsingYY: "YY",
    qml.IsingZZ: "ZZ",
}
ROTATION_GATES = (*_FIXED_WORDS, qml.MultiRZ, qml.PauliRot)

RunGate = tuple[type, tuple, str]
"""A gate of a run of rotations (``PauliRotations``), without its angle: its class, its
wires, and its Pauli word (one letter per wire). Not a template's gate
(``templates.TemplateGate``)."""


def rotation_word(op: Operator) -> str:
    """The Pauli word P of a rotation gate exp(-i theta/2 P) of ROTATION_GATES, or of a
    subclass of one (which runs as its gate, as on default.qubit)."""
    word = _FIXED_WORDS.get(type(op))
    if word is not None:
        return word
    for gate, fixed in _FIXED_WORDS.items():
        if isinstance(op, gate):
            return fixed
    if isinstance(op, qml.MultiRZ):
        return "Z" * len(op.wires)
    return op.hyperparameters["pauli_word"]


def real_angles(values, name: str) -> np.ndarray:
    """``values`` as float64 angles. A complex angle with a zero imaginary part (PennyLane
    casts parameters to complex to differentiate a state) is taken as real."""
    angles = np.asarray(values)
    if np.iscomplexobj(angles):
        if np.any(angles.imag != 0):
            raise DeviceError(f"{name} got a complex angle; angles must be real.")
        angles = angles.real
    return angles.astype(np.float64)


def gate_of(op: Operator) -> RunGate:
    return (type(op), tuple(op.wires), rotation_word(op))


class PauliRotations(ResourcesOperation):
    """exp(-i theta_J/2 P_J) ... exp(-i theta_1/2 P_1): the rotation gates ``gates`` (see
    ``RunGate``) applied in order, gate j with the angle ``angles[j]``."""

    grad_method = None

    def __init__(self, *angles, gates: tuple[RunGate, ...], id=None):
        if len(angles) != len(gates):
            raise ValueError(f"PauliRotations got {len(angles)} angles for {len(gates)} gates.")
        wires = list(dict.fromkeys(w for _, gate_wires, _ in gates for w in gate_wires))
        self._hyperparameters = {"gates": tuple(gates)}
        super().__init__(*angles, wires=wires, id=id)

    @property
    def ndim_params(self) -> tuple[int, ...]:
        """Every angle is a scalar: an angle array is a broadcast (``batch_size``), as for
        the gates. Without this PennyLane takes the first parameters' dimensions as the
        angles' own, and a run rebound to broadcast angles (``bind_new_parameters``, as
        jax's vmap does to a preprocessed tape) would claim to be unbatched."""
        return (0,) * len(self.data)

    @staticmethod
    def compute_decomposition(*angles, wires=None, gates=()):  # noqa: ARG004
        return [_build(gate, angle) for gate, angle in zip(gates, angles, strict=True)]

    def queue(self, context=QueuingManager):
        """Queued only in this thread's own recording. The device builds these operations
        ``without_queuing``; PennyLane rebuilds them when it converts parameters (its ML
        interfaces) while another thread may be recording a QNode, which must not get them."""
        if recording_elsewhere():
            return self
        return super().queue(context)

    @property
    def hash(self) -> int:
        """The hash of the gates' sequence, each gate hashed by PennyLane as it hashes the
        gate (``Operator.hash`` rounds the angles of RX, RY and RZ modulo 2 pi to 10
        digits, and no other gate's): PennyLane's cache then finds a run where it would
        find its gates. Only PennyLane decides by it; the device compares exact data."""
        with without_queuing():
            gates = self.decomposition()
        return hash((self.name, tuple(gate.hash for gate in gates)))

    def resources(self) -> Resources:
        gates = self.hyperparameters["gates"]
        return Resources(
            num_wires=len(self.wires),
            num_gates=len(gates),
            gate_types=dict(Counter(cls.__name__ for cls, _, _ in gates)),
            gate_sizes=dict(Counter(len(wires) for _, wires, _ in gates)),
            depth=_depth(gates),
        )


@bind_new_parameters.register
def _(op: PauliRotations, params) -> PauliRotations:
    # PennyLane's generic binding deep-copies the hyperparameters (the gates: immutable)
    return PauliRotations(*params, gates=op.hyperparameters["gates"])


def _build(gate: RunGate, angle) -> Operation:
    cls, wires, word = gate
    if cls is qml.PauliRot:
        return qml.PauliRot(angle, word, wires=wires)
    return cls(angle, wires=wires)


def _depth(gates: tuple[RunGate, ...]) -> int:
    """Layers of the run: each gate one layer after the last gate on any of its wires."""
    layer: dict = {}
    for _, wires, _ in gates:
        depth = 1 + max(layer.get(w, 0) for w in wires)
        layer.update(dict.fromkeys(wires, depth))
    return max(layer.values(), default=0)


@functools.lru_cache(maxsize=256)
def structure(gates: tuple[RunGate, ...]) -> tuple[Operation, ...]:
    """One operator per gate of a run, standing for the gate's structure (its name, wires
    and generator) when the run is compiled; the angles live in the instructions."""
    with without_queuing():
        return tuple(_build(gate, 0.0) for gate in gates)


PauliRotations._primitive = None  # plain Python under program capture (device.eval_jaxpr)
