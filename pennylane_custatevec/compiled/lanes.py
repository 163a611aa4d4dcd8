"""One call of a compiled QNode (``CircuitCall``: its plan and parameters) and the direct
lane it may run through (``DirectLane``: angles gathered from the inputs, ``run_direct`` /
``vjp_direct``, the Jacobian taken on the forward pass where it is cheap, ``LaneRun``: what
the forward pass hands the backward pass); the parameters bound to the inputs' data
(``bound_parameters``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch._C import _functorch

from .. import direct
from ..structures import StructureRun
from .plans import CircuitsPlan, as_numpy, input_gradients


@dataclasses.dataclass(frozen=True)
class CircuitCall:
    """What one call of a compiled QNode runs on the device: its plan with its parameters."""

    plan: CircuitsPlan
    parameters: tuple[list, ...]
    """Per structure, its operation parameters as the device takes them (numpy arrays or
    Python numbers); the entries at ``plan.trainable`` (None here) are filled with the
    trainable tensors' data in the forward pass."""
    torch_device: torch.device | None
    """Where the results go: the torch device of the first CUDA parameter, else the CPU
    (as PennyLane's torch interface decides)."""
    lane: DirectLane | None = None
    """Where set, the call runs through it (``DirectLane``; the CPU, ``parameters`` as
    ``bind`` gives them)."""
    jacobian_on_forward: bool = False
    """Whether the lane's forward pass takes the Jacobian (the lane's
    ``jacobian_on_forward``, and the call records for a backward pass)."""


JACOBIAN_ON_FORWARD_WORK = 2**16
"""The most amplitude updates (2^n amplitudes x M measurements x gates) of a lane's
Jacobian sweep for its forward pass to take the Jacobian (``DirectLane.
jacobian_on_forward``): what a forward pass that is never followed by a backward pass
may spend on it. Measured with ``benchmarks/lane_jacobian.py`` (2 cores): the sweep adds
2-5 ns per update from 8 qubits on, so at most ~130-330 us. It also bounds the
Jacobians' size, M x the inputs' elements (the memory a call holds for them)."""

JACOBIAN_ON_FORWARD_EXTRA_WORK = 2**13
"""The most amplitude updates that the Jacobian's M - 1 bras beyond a VJP's one add
(2^n x (M - 1) x gates): below it they cost less than the backward pass that the
Jacobian saves (the forward's Jacobian made W4's forward + backward about 24 us
shorter, 165 -> 141 us, measured with ``benchmarks/lane_jacobian.py``)."""


@dataclasses.dataclass(frozen=True, eq=False)
class DirectLane:
    """A plan whose one structure runs directly (``CuStateVecDevice.direct_plan``) on one
    vector: a call gathers the rotation angles that are elements of trainable inputs from
    the inputs' data by index, takes the constant ones as they are and reads the others
    (data the call gives, without grad) from its parameters (no ``call_data``), runs in
    one backend call (``run_direct``), and a plain backward pass
    (one cotangent per output, no batch) takes the direct VJP (``vjp_direct``). Any other
    backward (a batch of cotangents, a second VJP under torch.func) gets the general
    path's run, built then (``LaneRun.general``). Built once per plan (``of``)."""

    direct_plan: object
    """The structure's ``direct.DirectPlan``."""
    gathers: tuple[tuple[int, np.ndarray, np.ndarray], ...]
    """Per input that feeds angles: ``(k, slots, positions)``, slot ``slots[i]`` takes
    element ``positions[i]`` of input k's data, flattened."""
    constants: np.ndarray
    """(1, slots): the angles of the slots that read neither an input nor a parameter that
    varies (zero elsewhere)."""
    per_call: tuple[tuple[int, int, object], ...]
    """``(slot, position, source)`` of each slot that reads a parameter the call gives
    (``varying`` in ``of``): read from the call's parameters (``direct.slot_angle``)."""
    jacobian_on_forward: bool = False
    """Whether a forward pass that records for a backward pass takes the Jacobian of the
    outputs at once (``CuStateVecDevice.run_direct_jacobian``), so that the backward pass
    is a product with it: for structures whose Jacobian sweep is cheaper than the
    backward pass's own overhead (``JACOBIAN_ON_FORWARD_WORK``,
    ``JACOBIAN_ON_FORWARD_EXTRA_WORK``). The sweep is the VJP's with M bras instead of
    one, run in the forward's backend call; its Jacobian also serves batched cotangents
    (jacobian with ``vectorize=True``, ``torch.func.jacrev``) and a second backward
    pass."""
    gradient_maps: tuple[_GradientMap, ...] = ()
    """Where ``jacobian_on_forward``: per Function input, how the gradient columns of
    the sweep make the input's gradient."""
    input_shapes: tuple = ()
    """The shapes of the Function's inputs (of the calls the lane was built for)."""

    @classmethod
    def of(
        cls,
        plan: CircuitsPlan,
        parameters: tuple,
        input_shapes: tuple,
        varying: frozenset = frozenset(),
    ) -> DirectLane | None:
        """The lane of ``plan`` for calls with ``parameters`` (``CircuitCall.
        parameters``: None at the trainable positions) and inputs of ``input_shapes``, or
        None where its calls take the general path; ``varying``: the positions of the
        parameters whose values each call gives (the others are constants)."""
        if len(plan.structures) != 1:
            return None
        direct_plan = plan.device.direct_plan(plan.structures[0], plan.config)
        if direct_plan is None:
            return None
        positions = {position: n for n, position in enumerate(plan.trainable[0])}
        flat_indices = [np.arange(int(np.prod(shape))).reshape(shape) for shape in input_shapes]
        constants = np.zeros((1, len(direct_plan.sources)))
        per_input: dict[int, list[tuple[int, int]]] = {}
        per_call = []
        for slot, source in enumerate(direct_plan.sources):
            if source.constant is not None:
                constants[0, slot] = source.constant.reshape(-1)[0]
                continue
            if source.broadcast:
                return None
            if source.parameter in varying:
                per_call.append((slot, source.parameter, source))
                continue
            if source.parameter not in positions:  # a constant of the structure's calls
                value = parameters[0][source.parameter]
                constants[0, slot] = direct.slot_angle(value, source)
                continue
            k, index = plan.sources[positions[source.parameter]]
            value = flat_indices[k] if index is None else flat_indices[k][index]
            per_input.setdefault(k, []).append((slot, int(value.reshape(-1)[source.element])))
        gathers = tuple(
            (k, np.array([s for s, _ in pairs]), np.array([p for _, p in pairs]))
            for k, pairs in sorted(per_input.items())
        )
        circuit = direct_plan.circuit
        compilation = direct_plan.structure.compilation
        per_bra = 2**compilation.register.num_qubits * len(compilation.steps)
        bras = len(direct_plan.pauli.terms)
        input_elements = sum(int(np.prod(shape)) for shape in input_shapes)
        if (
            circuit.n_params == 0
            or per_bra * bras > JACOBIAN_ON_FORWARD_WORK
            or per_bra * (bras - 1) > JACOBIAN_ON_FORWARD_EXTRA_WORK
            or input_elements * bras > JACOBIAN_ON_FORWARD_WORK  # the Jacobians' size
        ):
            return cls(direct_plan, gathers, constants, tuple(per_call))
        return cls(
            direct_plan,
            gathers,
            constants,
            tuple(per_call),
            True,
            _gradient_maps(plan, circuit, input_shapes),
            tuple(input_shapes),
        )

    @property
    def nesting(self):
        """How the flat outputs of a call nest into the structure's result (``flatten``):
        a scalar per measurement (expectation values, one vector), bare for one."""
        measurements = len(self.direct_plan.pauli.terms)
        return None if measurements == 1 else (tuple, ((1, None),) * measurements)

    def angles(self, host: Sequence[np.ndarray], parameters: tuple) -> np.ndarray:
        """(1, slots): each rotation's angle for the inputs' data ``host`` and the call's
        ``parameters``."""
        angles = self.constants.copy()
        for k, slots, positions in self.gathers:
            angles[0, slots] = host[k].reshape(-1)[positions]
        for slot, position, source in self.per_call:
            angles[0, slot] = direct.slot_angle(parameters[0][position], source)
        return angles

    def input_jacobians(self, jacobian: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per Function input, (M, *its shape) float64: the Jacobian of the M outputs by
        the input's elements, from the sweep's (M, gradient columns) ``jacobian``."""
        return tuple(
            gradient_map.input_jacobian(jacobian).reshape((-1, *shape))
            for gradient_map, shape in zip(self.gradient_maps, self.input_shapes, strict=True)
        )

    def serves(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether the call's inputs are what the lane takes: real float64 CPU tensors (the
        angles' type; other dtypes take the general path, which converts them)."""
        return all(t.dtype is torch.float64 and t.is_cpu and not t.is_conj() for t in inputs)


@dataclasses.dataclass(frozen=True, eq=False)
class _GradientMap:
    """How the gradient columns of a lane's sweep make one input's gradient (``fold`` of
    the columns into the trainable parameters, their gathers into the input: linear):
    gradient[positions] = columns @ matrix."""

    size: int
    """The input's number of elements."""
    positions: np.ndarray | None
    """The flat positions of the input that some column reaches, in order; None: all of
    them."""
    matrix: np.ndarray
    """(columns, len(positions))."""

    def input_jacobian(self, jacobian: np.ndarray) -> np.ndarray:
        """(M, size): the input's Jacobian from the sweep's (M, columns) ``jacobian``."""
        if self.positions is None:
            return jacobian @ self.matrix
        out = np.zeros((jacobian.shape[0], self.size))
        out[:, self.positions] = jacobian @ self.matrix
        return out


def _gradient_maps(plan: CircuitsPlan, circuit, input_shapes: tuple) -> tuple[_GradientMap, ...]:
    """``DirectLane.gradient_maps``: each gradient column's unit vector taken through
    ``fold`` and ``input_gradients``, as a backward pass takes the columns; only the
    positions that a column reaches are kept."""
    columns = circuit.n_columns
    reached: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[] for _ in input_shapes]
    for column in range(columns):
        unit = np.zeros(columns)
        unit[column] = 1.0
        parameters = [np.asarray(value) for value in circuit.fold(unit)]
        gradients = input_gradients(plan, parameters, input_shapes, False)
        for per_input, gradient in zip(reached, gradients, strict=True):
            flat = np.asarray(gradient, dtype=np.float64).reshape(-1)
            where = np.flatnonzero(flat)
            per_input.append((column, where, flat[where]))
    maps = []
    for per_input, shape in zip(reached, input_shapes, strict=True):
        size = int(np.prod(shape))
        positions = np.unique(np.concatenate([where for _, where, _ in per_input]))
        matrix = np.zeros((columns, positions.size))
        for column, where, values in per_input:
            matrix[column, np.searchsorted(positions, where)] = values
        whole = positions.size == size
        maps.append(_GradientMap(size, None if whole else positions, matrix))
    return tuple(maps)


@dataclasses.dataclass(eq=False)
class LaneRun:
    """What a ``DirectLane`` call hands to its backward pass: the direct run, the inputs'
    data and the result (for the general path's run, ``general``)."""

    direct_run: object
    host: list
    result: object
    jacobians: tuple[torch.Tensor, ...] | None = None
    """Where the forward pass took the Jacobian (``DirectLane.jacobian_on_forward``):
    per Function input, (M, *its shape) float64 on the CPU, the Jacobian of the M
    outputs by its elements; the backward passes contract the cotangents with it
    (``torch_gradients``, ``gradients``)."""

    def torch_gradients(self, cotangents: Sequence[torch.Tensor]) -> list | None:
        """``gradients`` for one plain real CPU cotangent per output (a plain backward
        pass, torch's usual case), in torch: sum_m dy_m J_m; None for any other
        cotangents (``vjp`` reads them)."""
        if not all(type(dy) is torch.Tensor and dy.is_cpu and dy.ndim == 0 for dy in cotangents):
            return None
        if any(
            dy.dtype != torch.float64 or _functorch.is_legacy_batchedtensor(dy) for dy in cotangents
        ):
            return None
        if len(cotangents) == 1:
            (dy,) = cotangents
            return [dy * jacobian[0] for jacobian in self.jacobians]
        dy = torch.stack(cotangents)
        return [torch.tensordot(dy, jacobian, dims=1) for jacobian in self.jacobians]

    def gradients(self, cotangents: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Per input, its gradient for the M outputs' ``cotangents`` (each a scalar, or
        (R,) for a batch of R rows: then the gradients have that leading axis):
        sum_m dy_m J_m."""
        rows = np.stack([np.asarray(dy, dtype=np.float64) for dy in cotangents], axis=-1)
        return [np.tensordot(rows, jacobian.numpy(), axes=1) for jacobian in self.jacobians]

    def general(self, call: CircuitCall) -> StructureRun:
        """The general path's run of this call (the parameters bound now)."""
        parameters = bound_parameters(call, self.host)
        structure = call.plan.structures[0]
        run = self.direct_run.with_parameters(parameters)
        return StructureRun((self.result,), (structure.template,), [direct.DirectKept(run, 0)])


def bound_parameters(call: CircuitCall, inputs: Sequence[torch.Tensor]) -> list[list]:
    """Per structure, its parameter values with the trainable ones' data in place (the
    inputs' data, or views of them: ``plan.sources``)."""
    host = [as_numpy(tensor) for tensor in inputs]
    sources = iter(call.plan.sources)
    values = []
    for parameters, positions in zip(call.parameters, call.plan.trainable, strict=True):
        bound = list(parameters)
        for position in positions:
            k, index = next(sources)
            bound[position] = host[k] if index is None else host[k][index]
        values.append(bound)
    return values
