"""The hand-offs of compilation: ``Register``, ``Step``, ``Compilation``, ``Program``.

Three typed hand-offs, each a frozen dataclass: a ``Register`` (the wires, the batch of
state vectors, the initial state), a ``Compilation`` (the register and the tape's steps:
each operation with its instructions and its origin in the tape; what the adjoint sweeps
and fusion read) and a ``Program`` (the register and the flat instruction list the
forward pass runs, with its ``kernel_key``).

This is the one place where wire labels become bit positions. The register holds the
tape's wires in device order; the wire at position ``p`` of that order is state bit
``n - 1 - p`` (PennyLane's wire 0 is the most significant bit of the state index,
cuStateVec's bit 0 the least significant). Targets are listed little-endian
(``targets[j]`` becomes bit ``j`` of a matrix index), so an operation on wires
``(w0, ..., wk-1)`` whose PennyLane matrix has ``w0`` most significant gets targets
``[bit(wk-1), ..., bit(w0)]``.

A tape becomes a ``Compilation`` and a ``Program`` in ``compile_tapes``; each of its
operations becomes instructions in ``compile_ops``. Here: the hand-offs, their merge and
flattening, the wires of a tape, and what decides broadcasting.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
import pennylane as qml
from pennylane.exceptions import WireError
from pennylane.operation import Operator
from pennylane.ops.op_math import Controlled
from pennylane.tape import QuantumScript
from pennylane.wires import Wires

from .instructions import Instruction, Kind
from .rotations import PauliRotations
from .templates import is_native_template


@dataclasses.dataclass(frozen=True, eq=False)
class Register:
    """The state vectors a tape runs on: its qubits and the batch that holds them.

    The one place where wire labels become state bits: the wire at position ``p`` of
    ``wires`` is bit ``n - 1 - p`` (``bits``), and an operator's targets are its wires'
    bits little-endian (``targets``). Compared by identity, never by value."""

    wires: Wires
    """The tape's wires in device order."""
    batch_size: int = 1
    """State vectors per run: the broadcast size, else 1."""
    broadcast: bool = False
    """Whether the tape is broadcast (a broadcast of one entry has batch_size 1 too)."""
    initial_state: np.ndarray | None = None
    """The prepared state (1 or batch_size, 2**n) of a leading state preparation, or None
    for |0...0>."""
    single_precision_data: bool = False
    """Whether an operation's data are single precision (float32, complex64): the gates
    made from them (a QubitUnitary of a jax array with jax's float64 off, a pulse's
    evolution) are unitary to single precision only, and so is the state's norm
    (``simulate.require_normalised``)."""

    @functools.cached_property
    def num_qubits(self) -> int:
        return len(self.wires)  # cached: PennyLane's Wires.__len__ costs a call per ask

    @functools.cached_property
    def _bit_of(self) -> dict:
        n = len(self.wires)
        return {wire: n - 1 - position for position, wire in enumerate(self.wires)}

    def bits(self, wires: Sequence) -> tuple[int, ...]:
        """State bits of ``wires``, in the order given."""
        return tuple(map(self._bit_of.__getitem__, wires))

    def targets(self, wires: Sequence) -> tuple[int, ...]:
        """Little-endian targets of an operator on ``wires`` (first wire most significant)."""
        return self.bits(wires)[::-1]


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a step of a compilation comes from in its tape."""

    operation: int
    """The index of the tape operation."""
    parameter: int | None
    """The position among that operation's parameters of the one the step depends on
    (None for none)."""
    element: int
    """The flat index into that parameter of the element the step reads (0 but for a
    native template's rotations)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One operation of a tape with the instructions it compiled to (a native template or
    a run of rotations: one step per gate, the gate with its one instruction)."""

    operation: Operator
    """The tape's operation, or the gate of a template or run that the step stands for
    (what the derivative reads: its generator, wires and hyperparameters)."""
    instructions: tuple[Instruction, ...]
    """What applies it, in order (none for an identity)."""
    origin: Origin
    """Where it comes from in the tape (which trainable parameter it reads)."""


@dataclasses.dataclass(frozen=True, eq=False)
class Compilation:
    """A tape compiled step by step (``compile_steps``): what the adjoint sweeps walk back
    and fusion plans over; ``flatten`` makes it a Program. Compared by identity: a fused
    plan belongs to one compilation object (``fused_units.FusedPlan.fits``)."""

    register: Register
    """The wires and the batch of state vectors."""
    steps: tuple[Step, ...]
    """The operations after the initial state preparation, in circuit order."""
    memo: dict | None = dataclasses.field(default=None, repr=False)
    """What the algorithms derive from the compilation's structure alone, shared by the
    compilations of one ``structures.Structure`` (they differ only in their
    instructions' data), so that each is derived once per structure; each key starts
    with the name of the module that owns it: ``("fusion", width, traits)`` the fusion
    planner's units, ``("measure", "pauli")`` the Pauli words measured,
    ``("gradients", "layout")`` the columns of the trainable gates. None: derived for
    this compilation alone."""


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """What the backend runs for one tape (or a merged batch of tapes): the register and
    the flat instruction list. Compared through ``kernel_key``."""

    register: Register
    """The wires and the batch of state vectors."""
    instructions: tuple[Instruction, ...]
    """The kernel calls, in order: the steps' (``flatten``) or fused ones."""

    @property
    def has_mid_measurements(self) -> bool:
        return any(ins.kind is Kind.MID_MEASURE for ins in self.instructions)

    @functools.cached_property
    def kernel_key(self) -> tuple:
        """Equal for programs that run the same kernels on the same bits with other data:
        the forward pass may run such programs as one batch of state vectors (see
        ``merge``)."""
        return (
            tuple(self.register.wires),
            self.register.initial_state is not None,
            tuple(
                (ins.call, None if ins.data is None else ins.data.shape[1:])
                for ins in self.instructions
            ),
        )


def merge(compilations: Sequence[Compilation]) -> Compilation:
    """One compilation whose batch is the concatenation of the batches of
    ``compilations``: tapes whose programs share a kernel key and have no mid-circuit
    measurements. The steps are the first compilation's (its operations, origins and
    grouping of instructions); the kernel key makes the flat instruction lists alike, not
    the steps (a step that compiles to nothing in one tape, as qml.cut_circuit's
    preparations do, shifts the others), so the data are joined instruction by
    instruction."""
    if len(compilations) == 1:
        return compilations[0]
    registers = [compilation.register for compilation in compilations]
    sizes = [register.batch_size for register in registers]
    flat = (flatten(compilation).instructions for compilation in compilations)
    joined = iter(
        [
            dataclasses.replace(parts[0], data=_concatenate_data([i.data for i in parts], sizes))
            for parts in zip(*flat, strict=True)
        ]
    )
    steps = tuple(
        Step(step.operation, tuple(next(joined) for _ in step.instructions), step.origin)
        for step in compilations[0].steps
    )
    initial_state = None
    if registers[0].initial_state is not None:
        initial_state = _concatenate_data([r.initial_state for r in registers], sizes)
    register = dataclasses.replace(
        registers[0],
        batch_size=sum(sizes),
        initial_state=initial_state,
        single_precision_data=any(r.single_precision_data for r in registers),
    )
    return Compilation(register, steps)


def _concatenate_data(data: list, sizes: list[int]):
    """Per-vector data of a merged batch; data the programs share stays shared."""
    if data[0] is None:
        return None
    if all(d.shape[0] == 1 and np.array_equal(d, data[0]) for d in data):
        return data[0]
    return np.concatenate(
        [np.broadcast_to(d, (size,) + d.shape[1:]) for d, size in zip(data, sizes, strict=True)]
    )


def wire_labels(op: Operator) -> Sequence:
    """The labels of ``op.wires``; for a controlled operation, without the Wires object
    PennyLane builds from its control and target wires on every access (microseconds,
    many times per circuit)."""
    if isinstance(op, Controlled):
        return (*op.hyperparameters["control_wires"], *op.base.wires)
    return op.wires


def register_wires(tape: QuantumScript, device_wires: Wires | None) -> Wires:
    """The wires the simulation needs, in device order. A device without wires (None, or
    none given: ``wires=0`` or ``[]``) takes each circuit's, ordered as default.qubit and
    lightning.qubit order them (``circuit_wires``)."""
    if not device_wires:
        return circuit_wires(tape)
    used = set(tape.wires)
    unknown = used.difference(device_wires)
    if unknown:
        # Tapes that skip the preprocessing (dev.execute directly) reach here unchecked.
        raise WireError(
            "Cannot run circuit(s) on custatevec.qubit as they contain wires not found on "
            f"the device: {sorted(unknown, key=str)}; the device's wires are "
            f"{device_wires.tolist()}"
        )
    return Wires([w for w in device_wires if w in used])


def circuit_wires(tape: QuantumScript) -> Wires:
    """A circuit's wires in the order a device without wires gives them (the order of
    ``state()``, ``probs()`` and ``sample()`` of every wire), PennyLane's rule
    (``QuantumScript.map_to_standard_wires``, which default.qubit simulates): the
    operations' wires, then the wires only measured. Where these are the integers 0..n-1,
    each group a run that continues the last (and so are the work wires that operations
    only name, ``work_wires``, after them), wire k is position k, whatever order the
    circuit uses them in; otherwise the wires take positions in that order, each group in
    the order PennyLane iterates it (the operations' by first use, the measured ones as a
    set). Work wires that no operation acts on take no position: the device does not
    simulate them, and default.qubit's results of every wire leave them out."""
    op_wires = Wires.all_wires(op.wires for op in tape.operations)
    work_wires = Wires.all_wires(getattr(op, "work_wires", None) or [] for op in tape.operations)
    measured = Wires.all_wires(mp.wires for mp in tape.measurements)
    measured_only = set(measured) - set(op_wires)
    work_only = set(work_wires) - set(op_wires) - measured_only
    n_ops, n_measured = len(op_wires), len(measured_only)
    if (
        set(op_wires) == set(range(n_ops))
        and measured_only == set(range(n_ops, n_ops + n_measured))
        and work_only == set(range(n_ops + n_measured, n_ops + n_measured + len(work_only)))
    ):
        return Wires(range(n_ops + n_measured))
    return op_wires + measured_only


def flatten(compilation: Compilation) -> Program:
    """The register of ``compilation`` with the instructions of its steps, in order."""
    instructions = tuple(ins for step in compilation.steps for ins in step.instructions)
    return Program(compilation.register, instructions)


def tape_batch_size(tape: QuantumScript) -> int | None:
    """``tape.batch_size``, asking PennyLane only about operations that can be broadcast:
    its check of every operation takes milliseconds on a tape of a few hundred gates."""
    sizes = {op.batch_size for op in tape.operations if not scalar_parameters(op)}
    sizes.discard(None)
    if len(sizes) > 1:
        return tape.batch_size  # PennyLane's error names the sizes that do not match
    return sizes.pop() if sizes else None


def is_broadcast(op: Operator) -> bool:
    """``op.batch_size is not None``, without PennyLane's check where every parameter is a
    scalar (such an operation cannot be broadcast)."""
    return not scalar_parameters(op) and op.batch_size is not None


def is_broadcast_power(op: Operator) -> bool:
    """Whether ``op`` is a power broadcast over its exponent (``qml.pow(op, z=[1, 2])``):
    the exponent is a hyperparameter, not one of the operator's parameters."""
    return isinstance(op, qml.ops.Pow) and np.ndim(op.z) != 0


def is_broadcast_in_time(op: Operator) -> bool:
    """Whether ``op`` is a pulse evolution broadcast over its intermediate times
    (``qml.evolve(H)(params, t, return_intermediate=True)``, as ``stoch_pulse_grad`` with
    ``use_broadcasting=True`` builds it): scalar parameters, one matrix per time."""
    return (
        isinstance(op, qml.pulse.ParametrizedEvolution)
        and bool(op.hyperparameters.get("return_intermediate"))
        and op.batch_size is not None
    )


def is_broadcast_by_hyperparameters(op: Operator) -> bool:
    """Whether ``op`` is broadcast by what is not one of its parameters: a power's
    exponent (``is_broadcast_power``) or a pulse's times (``is_broadcast_in_time``)."""
    return is_broadcast_power(op) or is_broadcast_in_time(op)


def scalar_parameters(op: Operator) -> bool:
    """Whether every parameter of ``op`` is a scalar and nothing else broadcasts it (so
    ``op`` is not broadcast): see ``is_broadcast_by_hyperparameters``."""
    if is_broadcast_by_hyperparameters(op):
        return False
    return all(
        isinstance(d, (int, float, complex)) or getattr(d, "ndim", None) == 0 for d in op.data
    )


def initial_state_of(preparation: Operator, wires: Wires) -> np.ndarray:
    """The state (1 or B, 2**n) that a leading state preparation prepares on ``wires``."""
    vector = preparation.state_vector(wire_order=wires)
    return np.asarray(vector, dtype=np.complex128).reshape(-1, 2 ** len(wires))


def compiles_by_gate(op: Operator) -> bool:
    """Whether ``op`` compiles to one step per gate it holds: a native template
    (templates.py) or a run of rotations (rotations.py)."""
    return isinstance(op, PauliRotations) or is_native_template(op)


def plain_rotation(op: Operator, instructions: list[Instruction]) -> Instruction | None:
    """The instruction of ``op`` when it is one Pauli rotation exp(-i theta/2 P) without
    controls compiled from ``op`` itself (RX, IsingZZ, PauliRot, MultiRZ, ...): its
    generator is -P/2, known without building it."""
    if len(instructions) != 1:
        return None
    (instruction,) = instructions
    if (
        instruction.kind is Kind.PAULI_ROTATION
        and instruction.source is op
        and not instruction.controls
    ):
        return instruction
    return None
