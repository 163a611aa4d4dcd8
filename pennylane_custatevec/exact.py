"""Exact identity of values, operators, observables and measurements.

The device decides by keys which tapes run as one batch, which tapes sweep as one batch,
which kept final state belongs to a tape, and which observables a sampled tape measures
in one basis. A key built here is equal for two objects only when everything in them is
equal bit for bit: arrays by dtype, shape and bytes, sparse matrices by their CSR arrays,
floats by their bits, operators by their type, wires, hyperparameters and data, objects
of unknown kinds by identity. Such keys may tell apart two objects that are equal in
value (an array stored in another dtype, a sparse matrix stored otherwise): then two
tapes only miss a batch or a cache. PennyLane's ``hash`` (built from ``str`` of the
data, which numpy abbreviates beyond 1000 entries and rounds) and ``qml.equal`` (with
tolerances) are never used: they call different objects the same.

Arrays are compared lazily: an array's key hashes its dtype and shape only, and the
bytes are compared when two keys meet with equal dtypes and shapes (and not at all for
the same array object).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable

import numpy as np
import scipy.sparse
from pennylane import math
from pennylane.measurements import MeasurementProcess
from pennylane.operation import Operator
from pennylane.ops.op_math import Controlled
from pennylane.wires import Wires


class _ExactArray:
    """Key of an array: equal to another's when dtype, shape and bytes are equal."""

    __slots__ = ("array", "_hash")

    def __init__(self, array: np.ndarray):
        self.array = array
        self._hash = hash((array.dtype.str, array.shape))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        if not isinstance(other, _ExactArray):
            return NotImplemented
        a, b = self.array, other.array
        if a is b:
            return True
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:  # the bytes are pointers: equal objects may differ there
            return False
        return bool(np.array_equal(_raw_bytes(a), _raw_bytes(b)))

    def __repr__(self) -> str:
        return f"<array {self.array.dtype.str} {self.array.shape}>"


def _raw_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class _Same:
    """Key of an object of a kind without an exact comparison here: equal only to the same
    object (it holds the object, so no other object can take its id meanwhile)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other) -> bool:
        if not isinstance(other, _Same):
            return NotImplemented
        return self.value is other.value

    def __repr__(self) -> str:
        return f"<the object {self.value!r}>"


_ATOMS = (str, int, type, enum.Enum, bytes, type(None))
"""Types whose own equality is exact (an int and a bool are told apart by the type in the
key; classes, enums and None compare by identity)."""
_FRAMEWORKS = frozenset({"torch", "jax", "jaxlib", "autograd", "tensorflow"})
_pack_float = struct.Struct("<d").pack
_pack_complex = struct.Struct("<dd").pack


def value_key(value):
    """A key of ``value`` that is equal for two values only when they are equal exactly
    (module docstring): scalars (floats by their bits), arrays (numpy and the ML
    frameworks'), sparse matrices, wires, operators (with their data), and lists, tuples
    and dicts of those; any other object is equal only to itself."""
    return _key(value, _all_data)


def identity_key(value) -> _Same:
    """A key equal only to the same object's (it holds the object)."""
    return _Same(value)


def operator_key(op: Operator) -> tuple:
    """Key of an operator with its data: type, wires, hyperparameters (nested operators
    with their data) and data, exactly."""
    return _operator_key(op, _all_data)


def gate_key(op: Operator) -> tuple:
    """Key of an operation without its parameters: type, wires and hyperparameters, with
    nested operators (a controlled gate's base) also without their data. PennyLane keeps
    a nested operator's data among the outer operation's ``data``, so gate_key and the
    data together identify the operation."""
    return _operator_key(op, _no_data)


def generator_key(op: Operator, with_wire_labels: bool = True) -> tuple:
    """Key of what an operation's generator depends on: ``gate_key``, and the data of the
    operators whose generator may depend on them. PennyLane's qubit gates have a generator
    fixed by their type, wires and hyperparameters (``_FIXED_GENERATOR_MODULES``), and so
    have controlled and adjoint forms of them (built from their base's generator); the
    data of any other operator are part of the key (an ``Evolution``'s generator is its
    base, coefficients and all). ``with_wire_labels=False``: the number of the operation's
    own wires instead of their labels (its generator's matrix on its wires)."""
    key = _operator_key(op, _data_outside_fixed_generators)
    if with_wire_labels:
        return key
    kind, wires, *rest = key
    return (kind, len(wires), *rest)


def _all_data(_: type) -> bool:
    return True


def _no_data(_: type) -> bool:
    return False


_FIXED_GENERATOR_MODULES = (
    "pennylane.ops.qubit.",
    "pennylane.ops.identity",
    "pennylane.ops.op_math.controlled",
    "pennylane.ops.op_math.adjoint",
)
_FIXED_GENERATOR_TYPES: dict[type, bool] = {}


def _data_outside_fixed_generators(kind: type) -> bool:
    fixed = _FIXED_GENERATOR_TYPES.get(kind)
    if fixed is None:
        fixed = kind.__module__.startswith(_FIXED_GENERATOR_MODULES)
        _FIXED_GENERATOR_TYPES[kind] = fixed
    return not fixed


def _key(value, with_data):
    """The key of ``value``; ``with_data(type)`` says whether the data of an operator of
    that type (at any depth) belong in the key. Dispatch is on the value's type, decided
    once per type (isinstance against PennyLane's abstract classes is slow)."""
    kind = type(value)
    build = _BUILDERS.get(kind)
    if build is None:
        build = _BUILDERS[kind] = _builder(kind)
    return build(value, with_data)


def _builder(kind: type):
    """How to build the key of a value of type ``kind``."""
    if issubclass(kind, _ATOMS):
        return _atom_key
    if issubclass(kind, float):
        return _float_key
    if issubclass(kind, complex):
        return _complex_key
    if issubclass(kind, (np.ndarray, np.generic)):
        return _array_key
    if issubclass(kind, Wires):
        return _wires_key
    if issubclass(kind, Operator):
        return _operator_key
    if issubclass(kind, (tuple, list)):
        return _sequence_key
    if issubclass(kind, dict):
        return _mapping_key
    if issubclass(kind, (scipy.sparse.spmatrix, scipy.sparse.sparray)):
        return _sparse_key
    if kind.__module__.partition(".")[0] in _FRAMEWORKS:
        return _framework_array_key
    return _same_key


_BUILDERS: dict[type, object] = {}


def _atom_key(value, _) -> tuple:
    return type(value), value


def _float_key(value, _) -> tuple:
    return float, _pack_float(value)


def _complex_key(value, _) -> tuple:
    return complex, _pack_complex(value.real, value.imag)


def _array_key(value, _) -> _ExactArray:
    return _ExactArray(np.asarray(value))


def _wires_key(value: Wires, _) -> tuple:
    return Wires, value.labels


def _sequence_key(value, with_data) -> tuple:
    return type(value), tuple([_key(item, with_data) for item in value])


def _mapping_key(value: dict, with_data) -> tuple:
    return type(value), tuple([(name, _key(item, with_data)) for name, item in value.items()])


def _sparse_key(matrix, _) -> tuple:
    csr = matrix.tocsr()
    return (
        "csr",
        csr.shape,
        _ExactArray(csr.data),
        _ExactArray(csr.indices),
        _ExactArray(csr.indptr),
    )


def _framework_array_key(value, _):
    """A torch, jax, autograd or tensorflow array by its values on the host; an abstract
    one (a jax tracer) is equal only to itself."""
    try:
        return _ExactArray(np.asarray(math.to_numpy(value)))
    except Exception:
        return _Same(value)


def _same_key(value, _) -> _Same:
    return _Same(value)


def _operator_key(op: Operator, with_data) -> tuple:
    """(type, wire labels, hyperparameters, data or None)."""
    kind = type(op)
    build = _OPERATOR_BUILDERS.get(kind)
    if build is None:
        build = _OPERATOR_BUILDERS[kind] = (
            _controlled_key if issubclass(kind, Controlled) else _general_operator_key
        )
    return build(op, with_data)


def _general_operator_key(op: Operator, with_data) -> tuple:
    kind = type(op)
    hyperparameters = op.hyperparameters
    nested = (
        tuple([(name, _key(value, with_data)) for name, value in hyperparameters.items()])
        if hyperparameters
        else ()
    )
    data = tuple([_key(value, _all_data) for value in op.data]) if with_data(kind) else None
    return kind, op.wires.labels, nested, data


_CONTROLLED_HYPERPARAMETERS = frozenset(
    {"control_wires", "control_values", "work_wires", "work_wire_type", "base"}
)


def _controlled_key(op: Controlled, with_data) -> tuple:
    """A controlled operation's key without the generic walk through its hyperparameters
    (most gates of a circuit are controlled ones: CNOT, CRX, ...); its data are its base's,
    in the base's key."""
    hyperparameters = op.hyperparameters
    if hyperparameters.keys() != _CONTROLLED_HYPERPARAMETERS:
        return _general_operator_key(op, with_data)
    controls = hyperparameters["control_wires"].labels
    base = _operator_key(hyperparameters["base"], with_data)
    nested = (
        tuple(hyperparameters["control_values"]),
        hyperparameters["work_wires"].labels,
        hyperparameters["work_wire_type"],
        base,
    )
    return type(op), controls + base[1], nested, None


_OPERATOR_BUILDERS: dict[type, object] = {}


def observable_key(obs: Operator) -> tuple:
    """Key of an observable: its wires and, for a sum of Pauli words (the common case:
    Pauli words, Hamiltonians of Pauli words), its Pauli words with their exact
    coefficients; for any other observable ``operator_key`` (Hermitian matrices,
    projectors and sparse Hamiltonians by their data)."""
    terms = obs.pauli_rep
    if terms is not None:
        return (
            "pauli",
            obs.wires.labels,
            tuple((word, value_key(coefficient)) for word, coefficient in terms.items()),
        )
    return operator_key(obs)


def measurement_key(mp: MeasurementProcess) -> tuple:
    """Key of a measurement process: its type and every attribute (observable, wires,
    eigenvalues, mid-circuit measurement values, options such as ``log_base``) but its
    ``id`` label, exactly."""
    return type(mp), tuple(
        (name, observable_key(value) if name == "obs" and value is not None else value_key(value))
        for name, value in vars(mp).items()
        if name != "id"
    )


def measurements_key(measurements: Iterable[MeasurementProcess]) -> tuple:
    """Key of a tape's measurements, in order."""
    return tuple(map(measurement_key, measurements))
