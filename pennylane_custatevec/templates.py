"""Native templates: StronglyEntanglingLayers, BasicEntanglerLayers and AngleEmbedding
compile straight to their gates.

PennyLane would decompose such a template into dozens of gate objects on every call, and
then convert and differentiate each gate's parameter one by one. Compiled here, the
template keeps its one array parameter: its gates' angles are read from the array in one
step, and a VJP comes back with the array's shape.

A template's gates are rotations exp(-i theta/2 P) on one wire (P = X, Y or Z) whose
angle theta is one element of the template's parameter, and entangling Pauli gates
(CNOT, CZ, CY) without parameters:

- StronglyEntanglingLayers, weights (L, n, 3): per layer l, on each wire i, the gate
  Rot(w[l,i,0], w[l,i,1], w[l,i,2]) = RZ(w[l,i,2]) RY(w[l,i,1]) RZ(w[l,i,0]), then the
  entangler on (wire i, wire i + r_l mod n) for every i (n > 1);
- BasicEntanglerLayers, weights (L, n): per layer, the rotation R(w[l,i]) on each wire i,
  then CNOT(i, i+1 mod n) for every i (n > 2), or one CNOT (n = 2);
- AngleEmbedding, features (m,) on the first m wires: R(x[i]) on wire i.

The element of a rotation is its angle's flat index into the (unbatched) parameter; a
broadcast parameter (a leading batch axis) gives each gate one angle per state vector.
The gates are PennyLane operators built once per template structure; the angles live in
the instructions, so a gate here stands for its structure (name, wires, generator), not
for its parameter.
"""

from __future__ import annotations

import functools

import numpy as np
import pennylane as qml
from pennylane.operation import Operator

from .queuing import without_queuing
from .rotations import real_angles

_UNBATCHED_NDIM = {
    qml.StronglyEntanglingLayers: 3,
    qml.BasicEntanglerLayers: 2,
    qml.AngleEmbedding: 1,
}
NATIVE_TEMPLATES = tuple(_UNBATCHED_NDIM)

_ROTATIONS = (qml.RX, qml.RY, qml.RZ)
_ENTANGLERS = (qml.CNOT, qml.CZ, qml.CY)

TemplateGate = tuple[Operator, int | None]
"""A native template's gate and, for a rotation, the flat index of its angle in the
template's parameter. Not a gate of a run of rotations (``rotations.RunGate``)."""


def is_native_template(op: Operator) -> bool:
    """Whether ``op`` is a template this module compiles: exactly one of NATIVE_TEMPLATES
    (a subclass may define other gates; it is decomposed, as on other devices) whose
    rotations are RX, RY or RZ, whose entangler is CNOT, CZ or CY, whose parameter is one
    array of numbers (not an array of objects: a sequence of separately trainable scalars
    holds the ML framework's objects, each needing its own gradient), and whose parameter
    is broadcast only where PennyLane knows it (its ``batch_size``: for AngleEmbedding, not
    for the layer templates, whose broadcasting PennyLane sees only in their gates)."""
    ndim = _UNBATCHED_NDIM.get(type(op))
    if ndim is None:
        return False
    parameter = op.data[0]
    if isinstance(parameter, np.ndarray) and parameter.dtype == np.dtype(object):
        return False
    if qml.math.ndim(parameter) - (op.batch_size is not None) != ndim:
        return False
    hyperparameters = op.hyperparameters
    if "rotation" in hyperparameters and hyperparameters["rotation"] not in _ROTATIONS:
        return False
    return hyperparameters.get("imprimitive", qml.CNOT) in _ENTANGLERS


def template_gates(op: Operator) -> tuple[TemplateGate, ...]:
    """The gates of the native template ``op``, in the order they act."""
    wires = tuple(op.wires)
    shape = qml.math.shape(op.data[0])
    with without_queuing():  # the gates are built once per structure
        if isinstance(op, qml.StronglyEntanglingLayers):
            hyperparameters = op.hyperparameters
            return _strongly_entangling(
                wires, shape[-3], hyperparameters["ranges"], hyperparameters["imprimitive"]
            )
        if isinstance(op, qml.BasicEntanglerLayers):
            return _basic_entangler(wires, shape[-2], op.hyperparameters["rotation"])
        return _angle_embedding(wires, op.hyperparameters["rotation"])


def template_operations(op: Operator) -> list[Operator]:
    """The native template ``op`` as the gates it compiles to, each rotation's angle the
    element of the parameter it reads (indexed in the ML framework, so differentiable as
    the parameter is): one-parameter gates, as PennyLane's decomposition of the template
    would become once its Rot gates are decomposed."""
    parameter = op.data[0]
    flat = qml.math.reshape(parameter, (op.batch_size, -1) if op.batch_size else (-1,))
    with without_queuing():
        return [
            type(gate)(wires=gate.wires)
            if element is None
            else type(gate)(flat[..., element], wires=gate.wires)
            for gate, element in template_gates(op)
        ]


@functools.lru_cache(maxsize=256)
def _strongly_entangling(wires: tuple, n_layers: int, ranges: tuple, entangler) -> tuple:
    n = len(wires)
    gates: list[TemplateGate] = []
    for layer in range(n_layers):
        for i, wire in enumerate(wires):
            first = (layer * n + i) * 3
            gates += [
                (qml.RZ(0.0, wires=wire), first),
                (qml.RY(0.0, wires=wire), first + 1),
                (qml.RZ(0.0, wires=wire), first + 2),
            ]
        if n > 1:
            gates += [
                (entangler(wires=[wires[i], wires[(i + ranges[layer]) % n]]), None)
                for i in range(n)
            ]
    return tuple(gates)


@functools.lru_cache(maxsize=256)
def _basic_entangler(wires: tuple, n_layers: int, rotation) -> tuple:
    n = len(wires)
    ring = [(wires[i], wires[(i + 1) % n]) for i in range(n)] if n > 2 else [wires] * (n == 2)
    gates: list[TemplateGate] = []
    for layer in range(n_layers):
        gates += [(rotation(0.0, wires=wire), layer * n + i) for i, wire in enumerate(wires)]
        gates += [(qml.CNOT(wires=pair), None) for pair in ring]
    return tuple(gates)


@functools.lru_cache(maxsize=256)
def _angle_embedding(wires: tuple, rotation) -> tuple:
    return tuple((rotation(0.0, wires=wire), i) for i, wire in enumerate(wires))


def angles_by_element(op: Operator) -> np.ndarray:
    """The native template's parameter as float64 (elements, 1 or B): row e holds the
    angles of element e, one per state vector."""
    value = real_angles(op.data[0], op.name)
    unbatched = value.ndim - (op.batch_size is not None)
    rows = value.reshape((-1, int(np.prod(value.shape[-unbatched:]))))
    return np.ascontiguousarray(rows.T)
