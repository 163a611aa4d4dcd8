"""The benchmark workloads (W1-W7) as training steps, in torch and in jax.

Each circuit is defined once, against ``qml``, in a :class:`Problem` with its seeded
arguments as numpy arrays; the step builders turn it into a torch QNode, a jax QNode under
``jax.jit`` or a Catalyst ``qjit`` program (``Setup.framework``), so every framework runs
the same circuit on the same numbers. Every builder takes a :class:`Setup` and optional
size overrides and returns a :class:`Workload`. Its ``step`` runs the timed work once
(forward and backward) and returns the values and the gradients as numpy arrays, so the
warm-up call doubles as the cross-check between configurations.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import networkx as nx
import numpy as np
import pennylane as qml
import torch

SEED = 1234
Arrays = tuple[np.ndarray, np.ndarray]
FRAMEWORKS = ("torch", "jax.jit", "qjit")
"""What drives a step: a torch QNode (``interface="torch"``); a jax QNode whose step is
``jax.jit`` of ``jax.value_and_grad``; Catalyst's ``qml.qjit`` of ``catalyst.value_and_grad``."""
ANY_FRAMEWORK = frozenset({"W3", "W4", "W4F", "W5"})
"""The workloads the jax columns run; the others are torch workloads (a torch Jacobian,
torchjd, W6's memory figure on two devices only), and W1, whose circuit ``jax.jit``
compiles too slowly: 20 s at n=8 and 85 s at n=12 on 2 cores (2026-12-01), growing about
4x per 4 wires (W5 at full size: 89 s, W3: 24 s)."""


class Unavailable(Exception):
    """A configuration cannot be built here: a package or an entry point it needs is missing."""


@dataclass(frozen=True)
class Setup:
    """How a workload's QNode is built and driven.

    ``device`` and ``diff_method`` make the QNode; ``device_vjp`` asks a torch QNode for the
    device's VJPs; ``framework`` (one of :data:`FRAMEWORKS`) says what runs the step;
    ``compiled`` wraps the torch QNode with ``pennylane_custatevec.compile``.
    """

    device: str
    diff_method: str
    device_vjp: bool = False
    framework: str = "torch"
    compiled: bool = False

    def __post_init__(self):
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"unknown framework {self.framework!r}; choose from {FRAMEWORKS}")
        if self.compiled and self.framework != "torch":
            raise ValueError("compiled=True wraps a torch QNode: it needs framework='torch'")


@dataclass(frozen=True)
class Workload:
    """One benchmark step and its estimated cost under parameter-shift.

    ``shift_work`` counts amplitude updates (circuit executions x gates x 2**n x batch)
    that one step would take if the device differentiated it by parameter-shift. ``check``,
    where set, gives the cross-check's arrays in place of the warm-up step's: Catalyst's
    ``value_and_grad`` returns the loss, not every output.
    """

    step: Callable[[], Arrays]
    shift_work: float
    check: Callable[[], Arrays] | None = None


@dataclass(frozen=True)
class Problem:
    """A circuit and its seeded arguments, the same numbers for every framework.

    ``circuit`` is a quantum function written against ``qml`` on wires ``0..n_wires-1``.
    ``calls`` holds the positional arguments of each call one step makes in sequence (W4
    makes 20, the others one); ``trainable`` the positions of the differentiated arguments;
    ``broadcast`` those whose leading axis is a batch: PennyLane broadcasts the QNode over it
    (torch, jax.jit), Catalyst needs ``catalyst.vmap`` (qjit traces one circuit).
    """

    circuit: Callable
    n_wires: int
    calls: tuple[tuple[np.ndarray, ...], ...]
    trainable: tuple[int, ...]
    broadcast: tuple[int, ...] = ()


def _shift_work(n_wires: int, n_gates: int, n_params: int, batch: int = 1, passes: int = 1):
    """Amplitude updates of ``passes`` parameter-shift Jacobians (2 executions per param)."""
    return float(passes * 2 * n_params * (n_gates + 1) * batch * 2**n_wires)


# --- the circuits and their arguments --------------------------------------------------


def _sel_weights(n_layers: int, n_wires: int) -> np.ndarray:
    shape = qml.StronglyEntanglingLayers.shape(n_layers=n_layers, n_wires=n_wires)
    return np.random.default_rng(SEED).uniform(0.0, 2 * np.pi, size=shape)


def sel_problem(n_wires: int, n_layers: int, n_outputs: int | None = None) -> Problem:
    """StronglyEntanglingLayers; expval(Z_i) on the first ``n_outputs`` wires (default all)."""
    outputs = range(n_wires if n_outputs is None else n_outputs)

    def circuit(weights):
        qml.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return [qml.expval(qml.Z(w)) for w in outputs]

    return Problem(circuit, n_wires, ((_sel_weights(n_layers, n_wires),),), (0,))


def minibatch_problem(n_wires: int, n_layers: int, batch: int) -> Problem:
    """AngleEmbedding of a broadcast minibatch x (batch, n_wires), then SEL; expval(Z0)."""

    def circuit(x, weights):
        qml.AngleEmbedding(x, wires=range(n_wires))
        qml.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return qml.expval(qml.Z(0))

    x = np.random.default_rng(SEED + 1).uniform(0.0, np.pi, size=(batch, n_wires))
    return Problem(circuit, n_wires, ((x, _sel_weights(n_layers, n_wires)),), (1,), (0,))


def chain_problem(n_wires: int, calls: int) -> Problem:
    """RX on each wire, a CNOT chain; expval(Z of the last wire); ``calls`` angle rows."""

    def circuit(angles):
        for w in range(n_wires):
            qml.RX(angles[w], wires=w)
        for w in range(n_wires - 1):
            qml.CNOT(wires=[w, w + 1])
        return qml.expval(qml.Z(n_wires - 1))

    rows = np.random.default_rng(SEED + 2).uniform(0.0, np.pi, size=(calls, n_wires))
    return Problem(circuit, n_wires, tuple((row,) for row in rows), (0,))


def qaoa_problem(n_wires: int, depth: int) -> tuple[Problem, int]:
    """QAOA MaxCut on a random 3-regular graph (networkx seed 7): Hadamards, then ``depth``
    layers of IsingZZ(2 gamma) on the edges and RX(2 beta); expval of sum of Z_i Z_j over
    the edges. Also returns the number of edges."""
    edges = list(nx.random_regular_graph(3, n_wires, seed=7).edges)
    cost = qml.Hamiltonian([1.0] * len(edges), [qml.Z(i) @ qml.Z(j) for i, j in edges])

    def circuit(gammas, betas):
        for w in range(n_wires):
            qml.Hadamard(wires=w)
        for gamma, beta in zip(gammas, betas, strict=True):
            for i, j in edges:
                qml.IsingZZ(2 * gamma, wires=[i, j])
            for w in range(n_wires):
                qml.RX(2 * beta, wires=w)
        return qml.expval(cost)

    rng = np.random.default_rng(SEED + 3)
    angles = (rng.uniform(0.0, 1.0, size=depth), rng.uniform(0.0, 1.0, size=depth))
    return Problem(circuit, n_wires, (angles,), (0, 1)), len(edges)


# --- QNodes and steps, per framework ----------------------------------------------------


def _stacked(result, stack: Callable):
    """One array of a QNode's result: a sequence of expectation values is stacked."""
    return stack(list(result)) if isinstance(result, (list, tuple)) else result


def _flat(arrays: Sequence) -> np.ndarray:
    """The gradients of every trainable argument, flattened and concatenated (numpy)."""
    return np.concatenate([np.ravel(np.asarray(a)) for a in arrays])


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def _require_torch(setup: Setup, workload: str) -> None:
    if setup.framework != "torch":
        raise ValueError(f"{workload} is a torch workload: framework {setup.framework!r} given")


def _torch_qnode(problem: Problem, setup: Setup) -> Callable:
    """The torch QNode, wrapped by ``pennylane_custatevec.compile`` when ``setup.compiled``."""
    device = qml.device(setup.device, wires=problem.n_wires)
    qnode = qml.QNode(
        problem.circuit,
        device,
        interface="torch",
        diff_method=setup.diff_method,
        device_vjp=setup.device_vjp,
    )
    if not setup.compiled:
        return qnode
    import pennylane_custatevec

    if not hasattr(pennylane_custatevec, "compile"):
        raise Unavailable("no pennylane_custatevec.compile")
    return pennylane_custatevec.compile(qnode)


def _torch_calls(problem: Problem, requires_grad: bool = True) -> list[tuple[torch.Tensor, ...]]:
    """The arguments of every call as torch tensors, the trainable ones requiring grad."""
    return [
        tuple(
            torch.tensor(a, requires_grad=requires_grad and i in problem.trainable)
            for i, a in enumerate(args)
        )
        for args in problem.calls
    ]


def _sequential(calls: list[tuple], one_call: Callable) -> Callable[[], Arrays]:
    """A step that makes ``one_call(args)`` -> (outputs, gradients per trainable argument),
    numpy, for every call in turn, and stacks what they return."""

    def step() -> Arrays:
        pairs = [one_call(args) for args in calls]
        return np.stack([v for v, _ in pairs]), np.stack([_flat(g) for _, g in pairs])

    return step


def _torch_gradient_step(problem: Problem, setup: Setup) -> Callable[[], Arrays]:
    qnode = _torch_qnode(problem, setup)

    def one_call(args):
        leaves = [args[i] for i in problem.trainable]
        for leaf in leaves:
            leaf.grad = None
        outputs = _stacked(qnode(*args), torch.stack)
        (outputs if outputs.ndim == 0 else outputs.sum()).backward()
        return _numpy(outputs), [_numpy(leaf.grad) for leaf in leaves]

    return _sequential(_torch_calls(problem), one_call)


def _jax():
    """jax with float64, as the torch steps."""
    try:
        import jax
    except ImportError as exc:
        raise Unavailable(f"jax: {exc}") from exc
    jax.config.update("jax_enable_x64", True)
    return jax


def _jax_qnode(problem: Problem, setup: Setup) -> Callable:
    """The QNode for jax.jit (``interface="jax"``), or for Catalyst (``"auto"``: qjit traces
    it), there mapped by ``catalyst.vmap`` over the batch axis of ``problem.broadcast``."""
    device = qml.device(setup.device, wires=problem.n_wires)
    interface = "jax" if setup.framework == "jax.jit" else "auto"
    qnode = qml.QNode(problem.circuit, device, interface=interface, diff_method=setup.diff_method)
    if setup.framework != "qjit" or not problem.broadcast:
        return qnode
    n_args = len(problem.calls[0])
    in_axes = tuple(0 if i in problem.broadcast else None for i in range(n_args))
    return _catalyst().vmap(qnode, in_axes=in_axes)


def _jax_calls(problem: Problem) -> list[tuple]:
    jnp = _jax().numpy
    return [tuple(jnp.asarray(a) for a in args) for args in problem.calls]


def _jax_gradient_step(problem: Problem, setup: Setup) -> Callable[[], Arrays]:
    """``jax.jit(jax.value_and_grad(loss))``, loss = sum of the outputs (which ride along as
    aux); compiled on the first call, the warm-up."""
    jax = _jax()
    qnode = _jax_qnode(problem, setup)

    def loss(*args):
        outputs = _stacked(qnode(*args), jax.numpy.stack)
        return outputs.sum(), outputs

    value_and_grad = jax.jit(jax.value_and_grad(loss, argnums=problem.trainable, has_aux=True))

    def one_call(args):
        (_, outputs), gradients = value_and_grad(*args)
        return np.asarray(outputs), [np.asarray(g) for g in gradients]

    return _sequential(_jax_calls(problem), one_call)


def _catalyst():
    try:
        import catalyst
    except ImportError as exc:
        raise Unavailable(f"catalyst: {exc}") from exc
    return catalyst


def _qjit_gradient_workload(problem: Problem, setup: Setup, shift_work: float) -> Workload:
    """``qml.qjit(catalyst.value_and_grad(loss))``, loss = sum of the outputs; compiled on
    the first call, the warm-up. ``check`` adds the outputs, from a qjit forward."""
    catalyst, jnp = _catalyst(), _jax().numpy
    qnode = _jax_qnode(problem, setup)

    def loss(*args):
        return _stacked(qnode(*args), jnp.stack).sum()

    value_and_grad = qml.qjit(catalyst.value_and_grad(loss, argnums=problem.trainable))
    forward = qml.qjit(qnode)
    calls = _jax_calls(problem)

    def one_call(args):
        value, gradients = value_and_grad(*args)
        return np.asarray(value), [np.asarray(g) for g in gradients]

    step = _sequential(calls, one_call)

    def check() -> Arrays:
        values = [np.asarray(_stacked(forward(*args), jnp.stack)) for args in calls]
        return np.stack(values), step()[1]

    return Workload(step, shift_work, check)


def gradient_workload(problem: Problem, setup: Setup, shift_work: float) -> Workload:
    """Every call of ``problem`` in turn: forward, and the gradient of the sum of its outputs
    (a torch backward, or the framework's value_and_grad)."""
    if setup.framework == "qjit":
        return _qjit_gradient_workload(problem, setup, shift_work)
    if setup.framework == "jax.jit":
        return Workload(_jax_gradient_step(problem, setup), shift_work)
    return Workload(_torch_gradient_step(problem, setup), shift_work)


def forward_workload(problem: Problem, setup: Setup) -> Workload:
    """Every call of ``problem`` in turn, forward only (no argument requires grad); under
    jax.jit or qjit the QNode is compiled on the first call, the warm-up."""
    if setup.framework == "torch":
        qnode, calls = _torch_qnode(problem, setup), _torch_calls(problem, requires_grad=False)

        def one_call(args):
            return _numpy(_stacked(qnode(*args), torch.stack))
    else:
        jax = _jax()
        jit = jax.jit if setup.framework == "jax.jit" else _catalyst().qjit
        compiled, calls = jit(_jax_qnode(problem, setup)), _jax_calls(problem)

        def one_call(args):
            return np.asarray(_stacked(compiled(*args), jax.numpy.stack))

    def step() -> Arrays:
        return np.stack([one_call(args) for args in calls]), np.zeros(0)

    return Workload(step, 0.0)


# --- the workloads ----------------------------------------------------------------------


def sel_vjp(
    setup: Setup, n_wires: int = 20, n_layers: int = 4, n_outputs: int | None = None
) -> Workload:
    """W1 (and W6, W7vjp): StronglyEntanglingLayers, expval(Z_i), gradient of their sum."""
    problem = sel_problem(n_wires, n_layers, n_outputs)
    n_params = problem.calls[0][0].size
    return gradient_workload(problem, setup, _shift_work(n_wires, 2 * n_layers * n_wires, n_params))


JACOBIAN_METHODS = ("loop", "vectorize", "jacrev")
"""How W2's Jacobian is taken: ``torch.autograd.functional.jacobian`` with one backward call
per output (W2), the same with ``vectorize=True`` (W2v), ``torch.func.jacrev`` (W2jr)."""


def sel_jacobian(
    setup: Setup, n_wires: int = 16, n_layers: int = 4, method: str = "loop"
) -> Workload:
    """W2, W2v, W2jr: the full Jacobian of the n outputs of W1's circuit (``method``, one of
    :data:`JACOBIAN_METHODS`). ``vectorize``: one backward call with the n cotangents
    batched by torch's legacy vmap (``is_grads_batched``). ``jacrev``: the forward and one
    VJP under ``torch.func.vmap``; the builder makes two plain forward calls first, as a
    QNode compiled by ``pennylane_custatevec.compile`` needs (it records the first call and
    traces the second; torch.func transforms run only traced calls)."""
    if method not in JACOBIAN_METHODS:
        raise ValueError(f"unknown Jacobian method {method!r}; choose from {JACOBIAN_METHODS}")
    _require_torch(setup, {"loop": "W2", "vectorize": "W2v", "jacrev": "W2jr"}[method])
    problem = sel_problem(n_wires, n_layers)
    circuit = _torch_qnode(problem, setup)
    ((weights,),) = _torch_calls(problem)

    def forward(w):
        outputs = torch.stack(circuit(w))
        return outputs, outputs

    if method == "jacrev":
        for _ in range(2):
            circuit(weights.detach().requires_grad_())
        jacobian_of = torch.func.jacrev(forward, has_aux=True)
    else:
        vectorize = method == "vectorize"

        def jacobian_of(w):
            outputs = []

            def outputs_kept(w):
                outputs.append(forward(w)[0])
                return outputs[-1]

            jacobian = torch.autograd.functional.jacobian(outputs_kept, w, vectorize=vectorize)
            return jacobian, outputs[0]

    def step() -> Arrays:
        jacobian, outputs = jacobian_of(weights)
        return _numpy(outputs), _numpy(jacobian)

    work = _shift_work(n_wires, 2 * n_layers * n_wires, weights.numel(), passes=n_wires)
    return Workload(step, work)


def minibatch(setup: Setup, n_wires: int = 8, n_layers: int = 2, batch: int = 64) -> Workload:
    """W3: AngleEmbedding of a broadcast minibatch, then StronglyEntanglingLayers; expval(Z0)."""
    problem = minibatch_problem(n_wires, n_layers, batch)
    n_params = problem.calls[0][1].size
    work = _shift_work(n_wires, (2 * n_layers + 1) * n_wires, n_params, batch=batch)
    return gradient_workload(problem, setup, work)


def latency(setup: Setup, n_wires: int = 4, calls: int = 20) -> Workload:
    """W4: ``calls`` sequential forward+backward calls of RX on each wire and a CNOT chain."""
    problem = chain_problem(n_wires, calls)
    work = calls * _shift_work(n_wires, 2 * n_wires - 1, n_wires)
    return gradient_workload(problem, setup, work)


def latency_forward(setup: Setup, n_wires: int = 4, calls: int = 20) -> Workload:
    """W4 forward only: ``calls`` sequential evaluations of W4's circuit, no gradient."""
    return forward_workload(chain_problem(n_wires, calls), setup)


def qaoa_maxcut(setup: Setup, n_wires: int = 16, depth: int = 4) -> Workload:
    """W5: QAOA MaxCut on a random 3-regular graph; expval of sum over edges of Z_i Z_j."""
    problem, n_edges = qaoa_problem(n_wires, depth)
    n_gates = n_wires + depth * (n_edges + n_wires)
    work = _shift_work(n_wires, n_gates, depth * (n_edges + n_wires))
    return gradient_workload(problem, setup, work)


def jacobian_descent(
    setup: Setup, n_wires: int = 14, n_layers: int = 4, n_outputs: int = 8
) -> Workload:
    """W7: torchjd Jacobian descent over the ``n_outputs`` losses of W1's circuit: forward,
    ``torchjd.autojac.backward`` (the Jacobian of the losses into ``weights.jac``, its
    default parallel mode: one backward call with the m cotangents batched by torch.vmap),
    then ``jac_to_grad`` with ``UPGrad``. Gradients returned: the Jacobian, then the
    aggregated gradient."""
    _require_torch(setup, "W7")
    try:
        from torchjd.aggregation import UPGrad
        from torchjd.autojac import backward, jac_to_grad
    except ImportError as exc:
        raise Unavailable(f"torchjd: {exc}") from exc
    problem = sel_problem(n_wires, n_layers, n_outputs)
    circuit = _torch_qnode(problem, setup)
    ((weights,),) = _torch_calls(problem)
    aggregator = UPGrad()

    def step() -> Arrays:
        weights.grad = None
        losses = torch.stack(circuit(weights))
        backward(losses)
        jacobian = weights.jac
        jac_to_grad([weights], aggregator)
        return _numpy(losses), _flat([_numpy(jacobian), _numpy(weights.grad)])

    work = _shift_work(n_wires, 2 * n_layers * n_wires, weights.numel(), passes=n_outputs)
    return Workload(step, work)


BUILDERS: dict[str, Callable[..., Workload]] = {
    "W1": sel_vjp,
    "W2": sel_jacobian,
    "W2v": partial(sel_jacobian, method="vectorize"),
    "W2jr": partial(sel_jacobian, method="jacrev"),
    "W3": minibatch,
    "W4": latency,
    "W4F": latency_forward,
    "W5": qaoa_maxcut,
    "W6": partial(sel_vjp, n_wires=24, n_layers=1),
    "W7": jacobian_descent,
    "W7vjp": partial(sel_vjp, n_wires=14, n_layers=4, n_outputs=8),
}
"""W6 is W1's step with one layer at 24 wires, run in a fresh process for its peak RSS.
W7vjp is one VJP of W7's QNode (the gradient of the sum of its losses): W7's yardstick."""

QUICK_SIZES: dict[str, dict[str, int]] = {
    "W1": {"n_wires": 8},
    "W2": {"n_wires": 6},
    "W2v": {"n_wires": 6},
    "W2jr": {"n_wires": 6},
    "W3": {"n_wires": 4, "batch": 16},
    "W4": {"calls": 5},
    "W4F": {"calls": 5},
    "W5": {"n_wires": 8, "depth": 2},
    "W6": {"n_wires": 12},
    "W7": {"n_wires": 8},
    "W7vjp": {"n_wires": 8},
}
"""Size overrides for ``--quick``: every workload kept, every size small."""
