"""Circuit structures: what a preprocessed tape's parameter values do not decide.

A ``Structure`` stands for every tape that differs from its template tape only in the
values of its operations' parameters: the same gate types, wires and hyperparameters, the
same parameter shapes and dtypes, the same trainable parameters and the same measurements
(exactly, observables' data included). The device's compiled path
(``pennylane_custatevec.compiled``) records a quantum function once, preprocesses its
tape, and then runs the structure with new parameter values on every call
(``CuStateVecDevice.execute_structures``), without building tapes or operators.

``StructureKey`` decides which tapes share a structure: it compares exactly (``exact``),
never by ``hash``.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
from collections.abc import Sequence

import numpy as np
import pennylane as qml
from autograd.tracer import Box
from pennylane.ops.functions import bind_new_parameters
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .compile_tapes import compile_steps, operation_steps
from .exact import gate_key, generator_key, measurements_key
from .instructions import Kind
from .program import Compilation, Step, compiles_by_gate, flatten, initial_state_of
from .queuing import without_queuing
from .rotations import real_angles


@dataclasses.dataclass(frozen=True)
class StructureKey:
    """Equal for tapes that differ at most in the values of their operations'
    parameters (module docstring)."""

    wires: tuple
    """The tape's wire labels, in tape order."""
    gates: tuple
    """Per operation: its type, wires and hyperparameters exactly, the data its generator
    depends on (``_operation_key``: none for PennyLane's qubit gates), and the dtypes and
    shapes of its parameters."""
    measurements: tuple
    """The measurements exactly (``exact.measurements_key``)."""
    trainable: tuple[int, ...]
    """``tape.trainable_params``."""

    @classmethod
    def of(cls, tape: QuantumScript) -> StructureKey:
        return cls(
            wires=tuple(tape.wires.labels),
            gates=tuple(
                (_operation_key(op), tuple(map(_value_shape, op.data))) for op in tape.operations
            ),
            measurements=measurements_key(tape.measurements),
            trainable=tuple(tape.trainable_params),
        )


def _operation_key(op) -> tuple:
    """What of an operation its structure holds: its ``generator_key``; for a native
    template or a run of rotations, whose steps are its gates (each a rotation with a
    generator fixed by its type), its ``gate_key``."""
    return gate_key(op) if compiles_by_gate(op) else generator_key(op)


def _value_shape(value) -> tuple:
    """A parameter's dtype and shape (a Python float is a float64 scalar, as numpy sees it)."""
    kind = type(value)
    if kind is float:
        return _FLOAT_SCALAR
    if kind is np.ndarray or kind is np.float64:
        return value.dtype.str, value.shape
    array = np.asarray(value)
    return array.dtype.str, array.shape


_FLOAT_SCALAR = (np.dtype(np.float64).str, ())


def adjoint_serve_key(tape: QuantumScript, config, options) -> tuple | None:
    """What decides whether the adjoint method serves a user's tape (its preprocessing
    refuses nothing: the device's ``_adjoint_serves``, asked on every call with "best"),
    parameter values apart: the gates exactly without their data (``gate_key``), the
    measurements exactly, the wires, the trainable parameters and each parameter's kind
    (``_parameter_kind``: framework, autograd nesting, dtype, shape, requires_grad), the
    shots, the execution config's fields that the preprocessing reads, the options in
    force, and the global switches (program capture, graph decompositions). None where
    values may decide (complex parameters, which the jax path checks for zero imaginary
    parts; jax tracers; types not known here; mid-circuit measurements, whose ids differ
    per call anyway): such a tape is checked every call."""
    kinds = []
    for value in tape.get_parameters(trainable_only=False):
        kind = _parameter_kind(value)
        if kind is None:
            return None
        kinds.append(kind)
    try:
        measurements = measurements_key(tape.measurements)
    except (TypeError, ValueError, RuntimeError):  # framework data the key cannot take
        return None
    return (
        tuple(gate_key(op) for op in tape.operations),
        measurements,
        tuple(tape.wires.labels),
        tuple(tape.trainable_params),
        tuple(kinds),
        tape.shots,
        config.interface,
        config.derivative_order,
        config.mcm_config,
        config.grad_on_execution,
        config.use_device_gradient,
        config.use_device_jacobian_product,
        options,
        qml.capture.enabled(),
        qml.decomposition.enabled_graph(),
    )


def _parameter_kind(value) -> tuple | None:
    """A parameter's framework, autograd nesting depth, dtype, shape and requires_grad; None
    for a complex value, a jax tracer or an unknown type."""
    depth = 0
    while isinstance(value, Box):
        depth += 1
        value = value._value
    kind = type(value)
    if kind is float or kind is int:
        return (kind.__name__, depth)
    if isinstance(value, (np.ndarray, np.generic)):  # pennylane.numpy's tensor too
        if value.dtype.kind not in "biuf":
            return None
        trainable = bool(getattr(value, "requires_grad", False))
        return ("numpy", depth, value.dtype.str, value.shape, trainable)
    if kind.__module__.startswith("torch"):
        if value.is_complex():
            return None
        return ("torch", depth, str(value.dtype), tuple(value.shape), bool(value.requires_grad))
    if kind.__name__ == "ArrayImpl" and kind.__module__.startswith("jax"):
        if np.dtype(value.dtype).kind not in "biuf":
            return None
        return ("jax", depth, str(value.dtype), tuple(value.shape))
    return None


class Structure:
    """What the tapes of one ``StructureKey`` share, built once from the first of them
    (the template): its compilation with a rule per step for the step's data, so that
    ``compile`` makes a tape's compilation from its parameter values alone; and the
    fusion planner's units, the Pauli words measured and the columns of the trainable gates,
    derived once (``program.Compilation.memo``).

    A step's data follow from the parameters by one of two rules, chosen when the
    structure is built and checked there on the template's own values: a rotation reads
    its angle from an element of one parameter (``_AngleRule``: RX, IsingZZ, the gates of
    native templates and of runs of rotations); any other operation with parameters is
    rebuilt with its new parameters and compiled again (``_RebuiltOperation``), and its
    instructions must agree with the template's in everything but their data, else the
    tape is compiled on its own (``compile`` never returns another structure's
    instructions)."""

    def __init__(self, key: StructureKey, template: QuantumScript, device_wires: Wires | None):
        self.key = key
        self.template = template
        self.device_wires = device_wires
        operations = template.operations
        starts = [0]
        for op in operations:
            starts.append(starts[-1] + len(op.data))
        self.n_parameters = starts[-1]
        self._starts = tuple(starts)
        compiled = compile_steps(template, device_wires)
        self._memo: dict = {}
        self.compilation = Compilation(compiled.register, compiled.steps, self._memo)
        program = flatten(compiled)
        self.has_mid_measurements = program.has_mid_measurements
        self.batch_key = (program.kernel_key, measurements_key(template.measurements))
        """What its tapes share with those that may run in one forward batch with them
        (``execution.PreparedTape.batch_key``): the kernel key and the measurements."""
        values = template.get_parameters(trainable_only=False, operations_only=True)
        angles: dict[int, _AngleRule] = {}
        steps_of: dict[int, list[int]] = {}  # operation -> its steps
        rebuilt: set[int] = set()  # operations rebuilt whole
        for index, step in enumerate(compiled.steps):
            origin = step.origin
            op = operations[origin.operation]
            steps_of.setdefault(origin.operation, []).append(index)
            if not op.data or origin.parameter is None:
                continue  # no parameter, or a template's fixed gate (an entangler)
            parameter = starts[origin.operation] + origin.parameter
            rule = _AngleRule.of(step, parameter, op.batch_size is not None)
            if rule is not None and rule.matches(step, values):
                angles[index] = rule
            else:
                rebuilt.add(origin.operation)
        self._angles = tuple(
            (index, rule)
            for index, rule in angles.items()
            if compiled.steps[index].origin.operation not in rebuilt
        )
        self._rebuilt = tuple(
            (operation, tuple(steps_of[operation])) for operation in sorted(rebuilt)
        )
        self._prepares_state = compiled.register.initial_state is not None

    @functools.cached_property
    def replayable(self) -> bool:
        """Whether ``compile`` can rebuild, from parameter values alone, every operation
        that it rebuilds (``execute_structures`` runs only such structures; a tape's own
        operations serve ``compile`` otherwise). Asked by the compiled path only: a
        device's tapes never pay for the check."""
        operations = self.template.operations
        rebuilt = [operation for operation, _ in self._rebuilt]
        if self._prepares_state:
            rebuilt.append(0)
        return all(_rebinds_exactly(operations[i]) for i in rebuilt)

    @classmethod
    def of(cls, tape: QuantumScript, device_wires: Wires | None) -> Structure:
        """The structure of an analytic tape whose trainable parameters are its
        operations' (ValueError otherwise: such a tape runs through the QNode)."""
        if tape.shots:
            raise ValueError(
                "a Structure is analytic: the tape has shots; run it through the QNode."
            )
        observable_trainable = _trainable_observable_data(tape)
        if observable_trainable:
            raise ValueError(
                "a Structure differentiates gate parameters only; the tape's trainable "
                f"parameters {observable_trainable} belong to its observables."
            )
        return cls(StructureKey.of(tape), tape, device_wires)

    def parameters_of(self, tape: QuantumScript) -> list:
        """The values ``compile`` takes for ``tape`` (a tape of this structure)."""
        return tape.get_parameters(trainable_only=False, operations_only=True)

    @property
    def angle_rules(self) -> dict[int, _AngleRule]:
        """{step index: its angle rule} of the steps whose data a rule reads."""
        return dict(self._angles)

    @property
    def rebuilt_operations(self) -> tuple[int, ...]:
        """The operations that ``compile`` rebuilds from their parameters (no angle rule
        covers them)."""
        return tuple(operation for operation, _ in self._rebuilt)

    def check_count(self, parameters: Sequence) -> None:
        """Refuse ``parameters`` that are not one value per operation parameter."""
        if len(parameters) != self.n_parameters:
            raise ValueError(
                f"the structure takes {self.n_parameters} operation parameters, got "
                f"{len(parameters)}."
            )

    def compile(self, parameters: Sequence, tape: QuantumScript | None = None) -> Compilation:
        """The compilation of the tape of this structure with ``parameters`` (one per
        operation parameter, in tape order): the template's steps with their data from
        ``parameters``; equal to ``compile_tapes.compile_steps`` of that tape. The operations
        that the angle rules do not cover are ``tape``'s own where given, else the
        template's rebuilt with their parameters (a structure that is ``replayable``)."""
        self.check_count(parameters)
        template = self.compilation
        steps = list(template.steps)
        for index, rule in self._angles:
            step = steps[index]
            (instruction,) = step.instructions
            data = rule.data(parameters)
            steps[index] = Step(step.operation, (instruction.with_data(data),), step.origin)
        register = template.register
        if self._prepares_state:
            preparation = self._operation(0, parameters, tape)
            register = dataclasses.replace(
                register, initial_state=initial_state_of(preparation, register.wires)
            )
        if not self._rebuilt:
            return Compilation(register, tuple(steps), self._memo)
        with without_queuing():
            for operation, indices in self._rebuilt:
                fresh = operation_steps(
                    self._operation(operation, parameters, tape), operation, template.register
                )
                if not _same_but_data(fresh, [template.steps[i] for i in indices]):
                    if tape is not None:
                        return compile_steps(tape, self.device_wires)
                    raise RuntimeError(
                        "custatevec.qubit internal error: an operation rebuilt with new "
                        f"parameters compiled otherwise than its structure's "
                        f"({self.template.operations[operation]!r})."
                    )
                for index, new in zip(indices, fresh, strict=True):
                    old = steps[index]
                    instructions = tuple(
                        mine.with_data(theirs.data)
                        for mine, theirs in zip(old.instructions, new.instructions, strict=True)
                    )
                    steps[index] = Step(old.operation, instructions, old.origin)
        return Compilation(register, tuple(steps), self._memo)

    def _operation(self, operation: int, parameters: Sequence, tape: QuantumScript | None):
        """Operation ``operation`` with ``parameters``: ``tape``'s, else the template's
        rebuilt (checked to keep its type, wires and hyperparameters exactly)."""
        if tape is not None:
            return tape.operations[operation]
        if not self.replayable:
            raise ValueError(
                "this structure's operations cannot be rebuilt from parameter values "
                "exactly; run its tapes through execute."
            )
        op = self.template.operations[operation]
        data = parameters[self._starts[operation] : self._starts[operation + 1]]
        with without_queuing():
            return bind_new_parameters(op, list(data))


def _rebinds_exactly(op) -> bool:
    """Whether PennyLane's ``bind_new_parameters`` rebuilds ``op`` with its type, wires and
    hyperparameters (``exact.gate_key``; it does not for every operator: some lose their
    control values)."""
    with without_queuing():
        try:
            rebuilt = bind_new_parameters(op, list(op.data))
        except Exception:  # noqa: BLE001  (any failure: not rebuildable)
            return False
    return type(rebuilt) is type(op) and gate_key(rebuilt) == gate_key(op)


@dataclasses.dataclass(frozen=True)
class _AngleRule:
    """A step of one Pauli rotation whose angle is element ``element`` of parameter
    ``parameter`` (flat, in tape order), per state vector: (1 or B,) float64."""

    parameter: int
    element: int
    broadcast: bool
    name: str

    @classmethod
    def of(cls, step: Step, parameter: int, broadcast: bool) -> _AngleRule | None:
        if len(step.instructions) != 1:
            return None
        (instruction,) = step.instructions
        if instruction.kind is not Kind.PAULI_ROTATION:
            return None
        return cls(parameter, step.origin.element, broadcast, step.operation.name)

    def data(self, parameters: Sequence) -> np.ndarray:
        angles = real_angles(parameters[self.parameter], self.name)
        rows = angles.reshape((angles.shape[0], -1) if self.broadcast else (1, -1))
        return np.ascontiguousarray(rows[:, self.element])

    def matches(self, step: Step, values: Sequence) -> bool:
        """Whether the rule gives the step's own data from the template's values (so that
        it reads the parameter as the compilation does), bit for bit: an adjoint rotation's
        step holds the negated angle, which equals the parameter as a number where the
        template's angle is zero (-0.0 == 0.0) but not in its sign bit."""
        expected = step.instructions[0].data
        try:
            got = self.data(values)
        except (ValueError, IndexError):
            return False
        return (
            got.dtype == expected.dtype
            and got.shape == expected.shape
            and got.tobytes() == np.ascontiguousarray(expected).tobytes()
        )


def _same_but_data(fresh: Sequence[Step], template: Sequence[Step]) -> bool:
    """Whether the steps of a rebuilt operation are the template's but for their data."""
    if len(fresh) != len(template):
        return False
    for new, old in zip(fresh, template, strict=True):
        if len(new.instructions) != len(old.instructions):
            return False
        for a, b in zip(new.instructions, old.instructions, strict=True):
            if a.call != b.call or (a.data is None) != (b.data is None):
                return False
            if a.data is not None and (
                a.data.shape != b.data.shape or a.data.dtype != b.data.dtype
            ):
                return False
            if a.condition is not None or b.condition is not None:
                return False
    return True


class StructureCache:
    """A device's structures by ``StructureKey`` (at most ``MAX_STRUCTURES``, the least
    recently used go first), so that the tapes of one structure are compiled from the
    first one's steps (``Structure.compile``). A structure is made on the second tape of
    its key: a circuit seen once (a random circuit) costs its key and its compilation, no
    more."""

    MAX_STRUCTURES = 256
    """Enough for the structures of a training loop (a QNode's tape, its
    parameter-shift tapes, a few QNodes), small beside the compilations they hold."""

    def __init__(self, device_wires: Wires | None):
        self._device_wires = device_wires
        self._structures: collections.OrderedDict[StructureKey, object] = collections.OrderedDict()

    def lookup(self, tape: QuantumScript) -> tuple[StructureKey, Structure | None]:
        """The key of ``tape`` and its structure: None the first time its key is seen,
        and where the tape has none (``Structure.of`` refuses it)."""
        key = StructureKey.of(tape)
        if tape.shots:  # a structure is analytic (the key does not hold the shots)
            return key, None
        entry = self._structures.get(key, _UNSEEN)
        if entry is _UNSEEN:
            self._remember(key, _SEEN_ONCE)
            return key, None
        self._structures.move_to_end(key)
        if entry is not _SEEN_ONCE:
            return key, entry
        try:
            has_one = _has_one(tape) and not _holds_objects(key)
            structure = Structure(key, tape, self._device_wires) if has_one else None
        except ValueError:
            structure = None
        self._structures[key] = structure
        return key, structure

    def _remember(self, key: StructureKey, entry) -> None:
        if len(self._structures) >= self.MAX_STRUCTURES:
            self._structures.popitem(last=False)
        self._structures[key] = entry


class _Marker(enum.Enum):
    """Markers of ``StructureCache``: a key not in it, and a key seen once (no structure
    yet). Enum members stay themselves when a device is deep-copied or pickled (plain
    ``object()`` markers came back as new objects, and a copied device took a marker for a
    structure)."""

    UNSEEN = "unseen"
    SEEN_ONCE = "seen once"


_UNSEEN = _Marker.UNSEEN
_SEEN_ONCE = _Marker.SEEN_ONCE


def _holds_objects(key: StructureKey) -> bool:
    """Whether a parameter is an array of Python objects: its bytes are pointers, which
    cannot tell its values apart (such a tape is compiled on its own)."""
    return any(dtype == "|O" for _, shapes in key.gates for dtype, _ in shapes)


def _has_one(tape: QuantumScript) -> bool:
    """Whether ``tape`` has a structure: analytic, its trainable parameters its gates'."""
    return not tape.shots and not _trainable_observable_data(tape)


def _trainable_observable_data(tape: QuantumScript) -> list[int]:
    """The tape's trainable parameters that belong to its observables (after all of its
    operations' parameters)."""
    n_operation_parameters = sum(len(op.data) for op in tape.operations)
    return [index for index in tape.trainable_params if index >= n_operation_parameters]


@dataclasses.dataclass(eq=False)
class StructureRun:
    """What ``execute_structures`` hands to ``vjp_structures``: the results, and for each
    structure the tape it ran and its kept final state (consumed by the VJP, once:
    ``take_kept``)."""

    results: tuple
    """One result per structure, as ``execute`` returns it for its tape."""
    tapes: tuple[QuantumScript, ...]
    """The tapes that ran (each structure's template with the call's parameters)."""
    kept: list
    """What the forward pass kept of each tape (``runs.Kept``: a ``KeptState``, its
    compilation with its final state, or a ``direct.DirectKept`` where the call ran
    directly), or None."""

    def take_kept(self) -> list:
        """The kept states, handed out once (a sweep consumes them); afterwards what is
        left of each (``Kept.spent``: its compilation without its state), so that a later
        VJP of the run (a second backward pass over one graph) simulates the call's
        circuit again, never the template's (whose parameters are another call's)."""
        kept = self.kept
        self.kept = [None if entry is None else entry.spent() for entry in kept]
        return kept
