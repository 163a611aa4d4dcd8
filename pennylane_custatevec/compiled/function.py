"""The torch.autograd.Function that runs a compiled call's circuits on the device.

``apply(Circuits, call, layout, *trainable)`` runs ``call.plan.structures`` on
``call.plan.device`` (``execute_structures``) with the gate parameters of ``call`` and the
trainable ones given as tensors, and returns the results as flat torch tensors on the
inputs' torch device; its backward is the device's adjoint VJP (``vjp_structures``, with
the execution config of the forward pass, so the options in force at the forward pass).

Torch's cotangents follow the dL/dz* convention for complex outputs, PennyLane's the dL/dz
one: the backward conjugates them, as PennyLane's torch interface does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from pennylane.devices import ExecutionConfig
from torch._C import _functorch
from torch._functorch.utils import unwrap_dead_wrappers

from .. import direct
from ..queuing import without_queuing
from ..structures import Structure, StructureRun
from .vmap import unbatch_legacy


@dataclasses.dataclass(frozen=True)
class CircuitsPlan:
    """What every call of one batch of structures runs on the device (built once per
    signature key that replays, once per call that records)."""

    device: object
    """The ``custatevec.qubit`` device."""
    structures: tuple[Structure, ...]
    """One per device tape of the call."""
    trainable: tuple[tuple[int, ...], ...]
    """Per structure, the positions of its trainable parameters (``trainable_params``)."""
    config: ExecutionConfig
    """The execution config of the calls (the options in force at their forward pass)."""
    sources: tuple[tuple[int, tuple | None], ...]
    """Per trainable parameter (the structures in order, each one's ``trainable`` in
    order): ``(k, index)``, the parameter is the Function's input ``k`` itself (index None)
    or its view ``input[index]`` (an index of ints and a trailing Ellipsis: what
    ``input[i]`` gives, also in numpy). A view's gradient is scattered into its input's."""
    gathers: tuple[_Gather, ...] | None
    """Per input, which parameters' gradients make its gradient; None: every input is one
    parameter itself (its gradient is the parameter's)."""

    @classmethod
    def of(cls, device, structures, config, sources=None) -> CircuitsPlan:
        """The plan of ``structures``; ``sources`` None: each trainable parameter its own
        input."""
        trainable = tuple(tuple(s.template.trainable_params) for s in structures)
        if sources is None:
            sources = tuple((k, None) for k in range(sum(map(len, trainable))))
        sources = tuple(sources)
        gathers = None
        if any(index is not None for _, index in sources):
            gathers = _Gather.of_inputs(sources)
        return cls(device, tuple(structures), trainable, config, sources, gathers)


@dataclasses.dataclass(frozen=True)
class _Gather:
    """How one input's gradient comes from the trainable parameters' gradients."""

    parameters: tuple[int, ...]
    """The numbers of the parameters that are this input or its views."""
    indices: tuple[tuple, ...] | None
    """Their indices into the input (None: the input is the one parameter itself)."""
    in_order: bool
    """Whether the views are ``input[0], input[1], ...`` in that order, each once: the
    gradient is then the parameters' gradients stacked (where they are all of them)."""

    @classmethod
    def of_inputs(cls, sources: tuple) -> tuple[_Gather, ...]:
        """Per input of ``sources`` (``CircuitsPlan.sources``), its gather."""
        inputs: dict[int, list] = {}
        for number, (k, index) in enumerate(sources):
            inputs.setdefault(k, []).append((number, index))
        gathers = []
        for k in range(len(inputs)):
            numbers = tuple(number for number, _ in inputs[k])
            indices = tuple(index for _, index in inputs[k])
            if indices == (None,):
                gathers.append(cls(numbers, None, False))
                continue
            in_order = all(index == (i, Ellipsis) for i, index in enumerate(indices))
            gathers.append(cls(numbers, indices, in_order))
        return tuple(gathers)


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
    ``fold`` and ``_input_gradients``, as a backward pass takes the columns; only the
    positions that a column reaches are kept."""
    columns = circuit.n_columns
    reached: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[] for _ in input_shapes]
    for column in range(columns):
        unit = np.zeros(columns)
        unit[column] = 1.0
        parameters = [np.asarray(value) for value in circuit.fold(unit)]
        gradients = _input_gradients(plan, parameters, input_shapes, False)
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
        parameters = _bound_parameters(call, self.host)
        structure = call.plan.structures[0]
        run = self.direct_run.with_parameters(parameters)
        return StructureRun((self.result,), (structure.template,), [direct.DirectKept(run, 0)])


@dataclasses.dataclass
class ResultsLayout:
    """Filled by the forward pass of one call: how its flat outputs nest into each
    structure's results (``nesting``: per structure, its number of outputs and their
    nesting, see ``flatten``) and the device's run, for the backward pass."""

    nesting: tuple = ()
    run: StructureRun | None = None
    input_shapes: tuple = ()
    """The shapes of the Function's inputs (the gradients' shapes)."""


def as_numpy(value):
    """A gate parameter as the device takes it: a torch tensor's data as numpy (no copy on
    the CPU), anything else as it is."""
    if isinstance(value, torch.Tensor):
        try:
            if value.is_cpu and not value.is_conj():  # the usual case: the data as they are
                return value.detach().numpy()
            return value.detach().cpu().resolve_conj().numpy()
        except RuntimeError:  # torch.func's wrappers have no storage of their own
            if not _functorch.is_functorch_wrapped_tensor(value):
                raise
        return _wrapped_data(value)
    return value


def _wrapped_data(value: torch.Tensor) -> np.ndarray:
    """The data of a tensor wrapped by torch.func's gradient transforms (``torch.func.vjp``
    and ``jacrev`` wrap every argument, those they do not differentiate too), read below
    the transforms. A tensor batched by a vmap below them (``vmap(jacrev(compiled))`` over
    an argument) would give its whole batch for one row's parameter: refused."""
    inner = value
    while _functorch.is_functorch_wrapped_tensor(inner):
        if _functorch.is_batchedtensor(inner):
            raise RuntimeError(
                "pennylane_custatevec.compile: a gate parameter is batched by a "
                "torch.func.vmap outside another torch.func transform (vmap over jacrev or "
                "vjp of the compiled QNode); pass the batch as a broadcast input (a leading "
                "batch axis on the gate parameters), or vmap the compiled QNode itself."
            )
        inner = _functorch.get_unwrapped(inner)
    with torch._C._DisableFuncTorch():
        return value.detach().cpu().resolve_conj().numpy()


def flatten(result) -> tuple[list, object]:
    """(leaves, nesting) of a result: tuples and lists nest, anything else is a leaf."""
    if isinstance(result, (tuple, list)):
        leaves, children = [], []
        for item in result:
            item_leaves, nesting = flatten(item)
            leaves.extend(item_leaves)
            children.append((len(item_leaves), nesting))
        return leaves, (type(result), tuple(children))
    return [result], None


def unflatten(leaves: Sequence, nesting):
    """The inverse of ``flatten``."""
    if nesting is None:
        (leaf,) = leaves
        return leaf
    kind, children = nesting
    items, start = [], 0
    for count, child in children:
        items.append(unflatten(leaves[start : start + count], child))
        start += count
    return kind(items)


def _bound_parameters(call: CircuitCall, inputs: Sequence[torch.Tensor]) -> list[list]:
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


def _input_gradients(
    plan: CircuitsPlan, gradients: list, shapes: tuple, batched: bool
) -> list[np.ndarray]:
    """The gradients of the Function's inputs from those of the trainable parameters
    (``gradients``, flat, a leading batch axis where ``batched``): an input that is a
    parameter itself takes its gradient; an input whose views are parameters the sum of
    theirs, each at its index (zeros elsewhere: what torch's indexing backward gives)."""
    if plan.gathers is None:
        return gradients
    out = []
    for gather, shape in zip(plan.gathers, shapes, strict=True):
        own = [gradients[number] for number in gather.parameters]
        if gather.indices is None:
            out.append(own[0])
        elif gather.in_order and len(own) == shape[0]:  # x[0], x[1], ...: all of x
            stacked = np.array(own)
            out.append(np.moveaxis(stacked, 0, 1) if batched else stacked)
        else:
            lead = own[0].shape[:1] if batched else ()
            total = np.zeros(lead + tuple(shape), dtype=np.result_type(*own))
            for index, gradient in zip(gather.indices, own, strict=True):
                total[(slice(None), *index) if batched else index] += gradient
            out.append(total)
    return out


def _to_torch(value, device) -> torch.Tensor:
    """A device result (or gradient) as a torch tensor on ``device`` (None: the CPU),
    as ``torch.as_tensor`` makes it; numpy data on the CPU are shared, not copied
    (``torch.from_numpy``: the dtype and the memory that ``as_tensor`` gives)."""
    if device is None and isinstance(value, (np.ndarray, np.generic)):
        return torch.from_numpy(np.asarray(value))
    return torch.as_tensor(value, device=device)


def _host_cotangent(cotangent: torch.Tensor) -> np.ndarray:
    """A torch cotangent (dL/dz*) as the device takes it: PennyLane's dL/dz, numpy."""
    if cotangent.is_cpu and not cotangent.is_complex():  # real: its conjugate is itself
        return cotangent.detach().numpy()
    return np.asarray(torch.conj(cotangent).detach().cpu().resolve_conj().numpy())


def apply(function: type[torch.autograd.Function], *args):
    """``function.apply(*args)``. Where no torch.func transform is active, torch's own
    ``Function.apply`` binds the arguments to ``forward``'s signature on every call
    (``inspect.signature``, for functions with ``setup_context``), which is most of its
    cost; the arguments here are positional without defaults, so the binding changes
    nothing and the C-level apply that it ends in is called directly (after the same
    unwrapping of dead torch.func wrappers). Under a torch.func transform: torch's
    ``apply`` (``custom_function_call``, the vmap rules)."""
    if torch._C._are_functorch_transforms_active():
        return function.apply(*args)
    return super(torch.autograd.Function, function).apply(*unwrap_dead_wrappers(args))


class Circuits(torch.autograd.Function):
    """The circuits of one call (module docstring). Written in torch's ``setup_context``
    form so that torch.func transforms (``torch.func.vjp``) can run it; its backward is
    ``CircuitsVJP``, whose vmap rule takes a batch of cotangents in one sweep."""

    @staticmethod
    def forward(call: CircuitCall, layout: ResultsLayout, *trainable: torch.Tensor):
        plan = call.plan
        layout.input_shapes = tuple(tensor.shape for tensor in trainable)
        if call.lane is not None:
            host = [as_numpy(tensor) for tensor in trainable]
            lane, angles = call.lane, call.lane.angles(host, call.parameters)
            jacobians = None
            if call.jacobian_on_forward:
                result, direct_run, jacobian = plan.device.run_direct_jacobian(
                    lane.direct_plan, angles
                )
                jacobians = tuple(map(torch.from_numpy, lane.input_jacobians(jacobian)))
            else:
                result, direct_run = plan.device.run_direct(lane.direct_plan, angles)
            leaves, nesting = flatten(result)
            layout.nesting = ((len(leaves), nesting),)
            layout.run = LaneRun(direct_run, host, result, jacobians)
            return tuple(_to_torch(leaf, None) for leaf in leaves)
        with without_queuing():  # the device may build operators: never into a recording
            run = plan.device.execute_structures(
                plan.structures, _bound_parameters(call, trainable), plan.config
            )
        leaves, nestings = [], []
        for result in run.results:
            result_leaves, nesting = flatten(result)
            leaves.extend(result_leaves)
            nestings.append((len(result_leaves), nesting))
        layout.nesting, layout.run = tuple(nestings), run
        return tuple(_to_torch(leaf, call.torch_device) for leaf in leaves)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.call, ctx.layout = inputs[0], inputs[1]
        ctx.save_for_backward(*inputs[2:])  # for CircuitsVJP with create_graph=True

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        """The VJP. As a ``CircuitsVJP`` Function where its own rules matter: under a
        torch.func transform (its vmap rule) and with ``create_graph=True`` (grad mode on:
        its backward refuses a second derivative); else (a plain backward pass, grad mode
        off, nothing records) ``vjp`` itself, which is what that Function's forward runs.

        The gradients depend on the forward's inputs (through the final states), so
        ``CircuitsVJP`` takes them as inputs as well: a second derivative then reaches its
        backward, which refuses it, instead of torch taking the gradients for constants of
        the inputs (a Hessian without the circuit's second derivatives: a wrong number)."""
        return (None, None, *_backward(ctx.call, ctx.layout, cotangents, ctx.saved_tensors))


def _backward(
    call: CircuitCall,
    layout: ResultsLayout,
    cotangents: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
) -> list[torch.Tensor]:
    """The gradients of a call's ``inputs`` for its outputs' ``cotangents`` in a backward
    pass (``Circuits.backward``)."""
    if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
        return apply(CircuitsVJP, call, layout, len(cotangents), *cotangents, *inputs)
    run = layout.run
    if type(run) is LaneRun and run.jacobians is not None:
        gradients = run.torch_gradients(cotangents)
        if gradients is not None:
            return gradients
    return vjp(call, run, layout, cotangents)


class LaneJacobian(torch.autograd.Function):
    """A lane's call whose forward pass takes the Jacobian (``DirectLane.
    jacobian_on_forward``) where grad mode is on and no torch.func transform is active:
    what ``Circuits`` runs for it, in torch's older Function form (``forward`` with a
    context, no ``setup_context``), which torch applies with less work per call, with the
    plain backward pass (one real scalar cotangent per output, grad mode off) a product
    with the Jacobian in numpy. Every other backward pass is ``Circuits``'s
    (``_backward``, on the call and layout it would have built). torch.func transforms
    need the ``setup_context`` form: under them a call is a ``Circuits`` call.

    Measured with ``benchmarks/w4_floor.py`` (2 cores, W4's step, per forward and
    backward pass): the compiled QNode took 145-149 us with its lane calls through
    ``Circuits``, 120-122 us through this Function and the bound backend call
    (``direct.ForwardJacobian``)."""

    @staticmethod
    def forward(ctx, plan: CircuitsPlan, lane: DirectLane, parameters: tuple, *trainable):
        host = [tensor.detach().numpy() for tensor in trainable]  # lane.serves: CPU float64
        result, _, jacobian = plan.device.run_direct_jacobian(
            lane.direct_plan, lane.angles(host, parameters)
        )
        ctx.plan, ctx.lane, ctx.parameters, ctx.host, ctx.result = (
            plan,
            lane,
            parameters,
            host,
            result,
        )
        ctx.jacobians = lane.input_jacobians(jacobian)
        ctx.save_for_backward(*trainable)
        leaves, ctx.nesting = flatten(result)
        return tuple(torch.from_numpy(np.asarray(leaf)) for leaf in leaves)

    @staticmethod
    def backward(ctx, *cotangents: torch.Tensor):
        if len(cotangents) == 1 and not torch.is_grad_enabled():
            (dy,) = cotangents
            if (
                type(dy) is torch.Tensor
                and dy.dtype is torch.float64
                and dy.ndim == 0
                and dy.is_cpu
                and not _functorch.is_legacy_batchedtensor(dy)
            ):
                value = dy.item()
                return (
                    None,
                    None,
                    None,
                    *(
                        torch.from_numpy(np.asarray(jacobian[0] * value))
                        for jacobian in ctx.jacobians
                    ),
                )
        call = CircuitCall(ctx.plan, ctx.parameters, None, ctx.lane, True)
        run = LaneRun(None, ctx.host, ctx.result, tuple(map(torch.from_numpy, ctx.jacobians)))
        layout = ResultsLayout(
            ((len(cotangents), ctx.nesting),), run, tuple(t.shape for t in ctx.saved_tensors)
        )
        return (None, None, None, *_backward(call, layout, cotangents, ctx.saved_tensors))


class CircuitsVJP(torch.autograd.Function):
    """The gradients of a ``Circuits`` call's trainable tensors for its outputs'
    cotangents (``vjp``). Under torch.func's ``vmap`` (over a ``torch.func.vjp`` function,
    ``torch.func.jacrev``, torchjd) its vmap rule, under torch's legacy vmap
    (``is_grads_batched=True``, ``jacobian(..., vectorize=True)``, which never calls a vmap
    rule) ``unbatch_legacy`` in ``vjp``, give the batch of R cotangents to the device as one
    batch: one sweep. Its tensors: the ``n_cotangents`` cotangents, then the ``Circuits``
    call's inputs (unused: the gradients depend on them, see ``Circuits.backward``)."""

    @staticmethod
    def forward(call: CircuitCall, layout: ResultsLayout, n_cotangents: int, *tensors):
        return tuple(vjp(call, layout.run, layout, tensors[:n_cotangents]))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            "pennylane_custatevec.compile: the adjoint method gives first derivatives only; "
            "a derivative of a gradient needs the QNode with diff_method='parameter-shift'."
        )

    @staticmethod
    def vmap(info, in_dims, call: CircuitCall, layout: ResultsLayout, n_cotangents, *tensors):
        """One sweep for the batch: each cotangent with its batch axis first (a cotangent
        without one repeated), the gradients with the batch axis first."""
        rows = []
        cotangents = tensors[:n_cotangents]
        for dy, axis in zip(cotangents, in_dims[3 : 3 + n_cotangents], strict=True):
            if axis is None:
                rows.append(dy.unsqueeze(0).expand(info.batch_size, *dy.shape))
            else:
                rows.append(dy.movedim(axis, 0))
        gradients = tuple(vjp(call, layout.run, layout, rows, batched=True))
        return gradients, (0,) * len(gradients)


def vjp(
    call: CircuitCall,
    run: StructureRun,
    layout: ResultsLayout,
    cotangents: Sequence,
    batched: bool = False,
) -> list[torch.Tensor]:
    """The gradients of the Function's inputs of ``call`` for the flat ``cotangents`` of
    its outputs (torch's convention), by one ``vjp_structures`` of ``run``; ``batched``: a
    leading axis of rows on every cotangent gives gradients with that leading axis.
    Cotangents batched by torch's legacy vmap reach the device as one batch of their rows
    (``unbatch_legacy``), and the gradients go back batched as they came."""
    cotangents, legacy = unbatch_legacy(cotangents)
    host = [_host_cotangent(dy) for dy in cotangents]
    if isinstance(run, LaneRun) and run.jacobians is not None:  # the forward's Jacobian
        return _torch_gradients(call, run.gradients(host), legacy)
    per_structure, start = [], 0
    for count, nesting in layout.nesting:
        per_structure.append(unflatten(host[start : start + count], nesting))
        start += count
    plan = call.plan
    if isinstance(run, LaneRun) and not batched and legacy is None:  # one cotangent each
        gradients = (plan.device.vjp_direct(run.direct_run, per_structure[0]),)
    else:
        if isinstance(run, LaneRun):  # a batch of cotangents: the general path's run
            run = run.general(call)
        with without_queuing():
            gradients = plan.device.vjp_structures(run, per_structure, plan.config)
    flat = [
        np.asarray(structure_gradients[index])
        for structure_gradients, positions in zip(gradients, plan.trainable, strict=True)
        for index in range(len(positions))
    ]
    flat = _input_gradients(plan, flat, layout.input_shapes, batched or legacy is not None)
    return _torch_gradients(call, flat, legacy)


def _torch_gradients(call: CircuitCall, gradients: list, legacy) -> list[torch.Tensor]:
    """The inputs' ``gradients`` as torch tensors on the call's torch device, batched
    again by torch's legacy vmap where the cotangents came so (``legacy``)."""
    out = []
    for gradient in gradients:
        gradient = _to_torch(gradient, call.torch_device)
        if legacy is not None:
            gradient = legacy.batched(gradient)
        out.append(gradient)
    return out
