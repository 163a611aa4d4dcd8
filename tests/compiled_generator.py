"""Random quantum functions for checking ``pennylane_custatevec.compile`` against the QNode.

``generate(seed)`` builds one quantum function as Python SOURCE TEXT (so that a failure
prints the function it failed on) from a seeded ``numpy`` generator: random chains of torch
operations on the arguments (arithmetic with constants and with each other, sin, cos, exp,
tanh, sigmoid, indexing ``x[i]`` and ``w[i, j]``, slices, reshapes, transposes, sum, mean,
prod, norm, stack, cat, where, clamp, matmul), mixed with deterministic factories
(``torch.tensor`` of Python and numpy scalars, zeros, ones, arange, linspace, full, eye),
random draws (rand, randn, randint, rand_like, randn_like, normal, bernoulli, multinomial,
poisson, dropout with ``training=True``; with ``generator=`` a global ``torch.Generator``
or torch's default one; numpy's global generator through ``torch.tensor(np.random.rand())``),
globals (tensors, Python floats, numpy scalars and arrays that the function reads, changed
between calls by rebinding or in place) and Python control flow (on an argument's value,
on a global, on an integer argument, on a random draw), feeding the parameters of RX, RY,
RZ, PhaseShift, Rot, CRX, IsingZZ, PauliRot, AngleEmbedding and StronglyEntanglingLayers
on 2-4 wires (any number where asked), and returning expectation values, probabilities or
several measurements.

Its arguments: a vector ``x`` and/or a matrix ``w`` requiring grad, sometimes the same
tensor twice (``x`` and ``y``) or views of one leaf, sometimes a tensor ``c`` without
grad, a Python int ``k`` or a numpy array ``a``, positionally or by keyword in varying
order. Between calls (``plan_calls``): new values, optimizer-like updates in place
(``x -= 0.1 * x.grad`` under ``no_grad``), ``x.data.add_``, float32 instead of float64
(another signature key), another keyword order, another ``k`` or ``a`` (another key),
globals changed.

``check(spec)`` calls the compiled QNode and the QNode (each on its own device) with the
same arguments and torch, numpy and explicit generators seeded alike before each call,
and asserts, per call: the same results (``compiled_support.assert_same_result``), the
same gradients of ``compiled_support.weighted_loss`` for every leaf that requires grad
(1e-10 in float64; ``FLOAT32_TOLERANCE`` for float32 calls), and the same states of
torch's default generator, the function's own ``torch.Generator``s and numpy's global
generator afterwards (exactly: the compiled call consumes them as the QNode does).
``check_batched(spec)`` compares ``torch.func.vmap`` of the compiled QNode with the QNode
row by row and the batched cotangents (``jacobian(..., vectorize=True)``,
``torch.func.jacrev``) with the QNode's plain Jacobian, for functions that draw no random
numbers (and, for vmap, whose control flow reads no argument's value: torch's vmap
refuses that).

The compiled path's "trust then verify" contract: a key's call 2 traces the quantum
function, call 3 traces it again and the key replays only where both traces are the same
bit for bit; a replaying key is traced and compared again at its verification calls (4, 8,
16, ..., ``verify_every``, then every ``verify_every``-th; none with ``verify_every=None``)
and is exact (re-records) from a difference on. So a global that changes after call 3 may be
replayed stale until the key's next verification call. ``plan_calls`` simulates this per key
(``_stale_allowed``) from what the traces can see of the globals (``GlobalSpec.seen``: a
global that only an ``if`` reads is seen by the branch it picks), and ``check`` skips its
comparisons at those calls only (the calls are still made: they count).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence

import numpy as np
import pennylane as qml
import torch
from compiled_support import assert_same_result, tensors_in, weighted_loss

import pennylane_custatevec

ATOL = 1e-10
"""Values and gradients of float64 calls."""

FLOAT32_TOLERANCE = 1e-5
"""Absolute and relative tolerance of values and gradients of float32 calls. The device
computes in double precision whatever the inputs' dtype, so the compiled path and the QNode
differ there only by the float32 classical processing from the arguments to the gate
angles. Both run torch's CPU kernels on the same inputs, but a replay may legitimately
evaluate a recorded chain another way (another kernel, a reordered reduction), which moves
an angle by a few float32 ulps: eps = 1.2e-7 relative, about 1e-6 for the angles of up to
~10 that the generated chains reach. Expectation values and probabilities move by at most
the angles' change (they are 1-Lipschitz in each angle, a few angles per value); gradients
are that times the chains' derivatives (of order 1-10), hence relative too."""

DEFAULT = object()
"""``verify_every`` left to ``compile``'s default (``settings.VERIFY_EVERY``; 256 before it
existed)."""

DEFAULT_VERIFY_EVERY = getattr(pennylane_custatevec.settings, "VERIFY_EVERY", 256)

MAX_WIRES_IN_TESTS = 4


def compile_qnode(qnode: qml.QNode, verify_every=DEFAULT):
    """``pennylane_custatevec.compile(qnode, verify_every=...)`` where ``compile`` takes
    that option, else ``compile(qnode)`` (the option did not exist before the fix of issue
    45; the checks then assume the verification schedule asked for)."""
    if verify_every is DEFAULT:
        return pennylane_custatevec.compile(qnode)
    try:
        parameters = inspect.signature(pennylane_custatevec.compile).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        parameters = {}
    if "verify_every" in parameters:
        return pennylane_custatevec.compile(qnode, verify_every=verify_every)
    return pennylane_custatevec.compile(qnode)


def verification_calls(verify_every, up_to: int) -> list[int]:
    """The key's call numbers (1-based, at most ``up_to``) at which the compiled path
    verifies a replay against the quantum function: 4, 8, 16, ... up to ``verify_every``,
    then every ``verify_every``-th call; none for ``verify_every=None``."""
    every = DEFAULT_VERIFY_EVERY if verify_every is DEFAULT else verify_every
    if every is None:
        return []
    calls, call = [], 4
    while call <= min(every, up_to):
        calls.append(call)
        call *= 2
    call = every * 2
    while call <= up_to:
        calls.append(call)
        call += every
    return calls


# --- the specification of one generated function -----------------------------------------


@dataclasses.dataclass(frozen=True)
class GlobalSpec:
    """A global that the quantum function reads: its name, its kind (``tensor``, ``float``,
    ``numpy_scalar``, ``numpy_array``), its shape, how it changes (``rebind`` or
    ``inplace``) and when: the global call numbers before which it takes a new value
    (``every``: before every call from the second on). A ``condition`` global is read by
    ``if NAME > 0:`` only: what a trace can see of it is which branch runs."""

    name: str
    kind: str
    shape: tuple[int, ...]
    how: str
    schedule: str
    changes: tuple[int, ...]
    every: bool
    condition: bool = False

    def changes_before(self, call: int) -> bool:
        """Whether the global takes a new value before call ``call`` (1-based)."""
        return (self.every and call >= 2) or call in self.changes

    def value(self, seed: int, version: int):
        """The global's value after ``version`` changes (seeded: both QNodes see it)."""
        rng = np.random.default_rng([seed, version, sum(map(ord, self.name))])
        if self.kind == "float":
            return float(np.round(rng.uniform(-1.5, 1.5), 6))
        if self.kind == "numpy_scalar":
            return np.float64(np.round(rng.uniform(-1.5, 1.5), 6))
        values = rng.uniform(-1.5, 1.5, self.shape)
        if self.kind == "numpy_array":
            return values
        return torch.tensor(values, dtype=torch.float64)

    def seen(self, seed: int, version: int):
        """What the compiled path's traces can see of the global after ``version``
        changes: the version itself (every change is a new value, which the traces compare
        bit for bit), or for a ``condition`` global the branch it picks (its value is
        read by Python's ``if`` only, which no trace records)."""
        return bool(self.value(seed, version) > 0) if self.condition else version


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
    """One generated quantum function and how ``check`` calls it (module docstring)."""

    seed: int
    n_wires: int
    source: str
    """The generated source: a comment on the globals and calls, then ``def circuit``."""
    arguments: tuple[str, ...]
    """The signature's parameters in order: of ``x`` (vector), ``w`` (matrix), ``y``
    (a vector, the same tensor as ``x`` where aliased), ``c`` (no grad), ``k`` (int), ``a``
    (numpy array)."""
    shapes: dict
    """The tensor arguments' shapes (``x``, ``w``, ``y``, ``c``)."""
    globals_: tuple[GlobalSpec, ...]
    generators: tuple[str, ...]
    """The names of the global ``torch.Generator``s the function draws from."""
    random: bool
    """Whether the function draws random numbers (torch's or numpy's)."""
    value_flow: bool
    """Whether its Python control flow reads an argument's value (refused by vmap)."""
    aliasing: str
    """``none``, ``same`` (``y`` is ``x``) or ``views`` (``x`` and ``w`` views of one leaf,
    ``strided``: every other element)."""
    updates: str
    """Between calls: ``fresh`` values, ``optimizer`` steps, ``data`` edits, ``fixed``, or
    ``mixed`` (a choice per call)."""
    dtypes: str
    """``float64``, or ``alternate`` / ``block``: float32 at some calls (another key)."""
    keyword_orders: tuple[tuple[str, ...], ...]
    """The orders in which the parameters after the first are passed by keyword; empty:
    positionally."""
    k_values: tuple[int, ...]
    a_values: tuple[tuple[float, ...], ...]
    verify_every: object
    """``DEFAULT`` or None (see ``compile_qnode``)."""

    @property
    def vmappable(self) -> bool:
        """torch.func.vmap applies: no random draws, no control flow on argument values."""
        return not self.random and not self.value_flow and self.batch_argument is not None

    @property
    def differentiable_batches(self) -> bool:
        """Batched cotangents apply: no random draws."""
        return not self.random and self.batch_argument is not None

    @property
    def batch_argument(self) -> str | None:
        """The argument that the batched checks batch or differentiate: ``x``, else ``w``."""
        for name in ("x", "w"):
            if name in self.arguments:
                return name
        return None

    def function(self, namespace: dict | None = None) -> tuple[Callable, dict]:
        """(the quantum function exec'd from ``source``, its globals' namespace with the
        globals at their first values and the generators)."""
        namespace = {"torch": torch, "qml": qml, "np": np} if namespace is None else namespace
        for spec in self.globals_:
            namespace[spec.name] = spec.value(self.seed, 0)
        for name in self.generators:
            namespace[name] = torch.Generator().manual_seed(0)
        code = compile(self.source, f"<generated function {self.seed}>", "exec")
        exec(code, namespace)  # the generated source: a failure prints it
        return namespace["circuit"], namespace


# --- generation ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Value:
    """A tensor the generated body holds: its source name, its shape and whether it is
    computed from the arguments."""

    name: str
    shape: tuple[int, ...]
    from_args: bool


_UNARY = (
    "torch.sin({v})",
    "torch.cos({v})",
    "torch.tanh({v})",
    "torch.sigmoid({v})",
    "torch.exp(0.5 * torch.tanh({v}))",
    "{v} * {c}",
    "{v} + {c}",
    "{c} - {v}",
    "{v} / {c}",
    "{v} ** 2",
    "torch.clamp({v}, -1.0, 1.0)",
    "torch.where({v} > 0, {v}, {c} * {v})",
)
_FACTORY_VECTORS = (
    "{v} + torch.linspace(-1.0, 1.0, {n})",
    "{v} * torch.arange({n})",
    "{v} + torch.ones({n})",
    "{v} - torch.zeros({n})",
    "{v} * torch.full(({n},), 0.25)",
    "torch.eye({n}, dtype={v}.dtype) @ {v}",
)
_FACTORY_SCALARS = (
    "torch.tensor({c})",
    "torch.tensor(np.float64({c}))",
    "torch.tensor({c}).double()",
)
_ROTATIONS = ("RX", "RY", "RZ", "PhaseShift")


class _Builder:
    """The state of one generation: the lines of the body, the tensors it holds and the
    globals, generators and random draws it has used."""

    def __init__(self, rng: np.random.Generator, n_wires: int, layers: int):
        self.rng = rng
        self.n = n_wires
        self.layers = layers
        self.lines: list[str] = []
        self.indent = 1
        self.pool: list[_Value] = []
        self.globals: list[GlobalSpec] = []
        self.generators: list[str] = []
        self.random = False
        self.numpy_random = False
        self.value_flow = False
        self.counter = 0
        self.use_random = rng.random() < 0.35
        self.use_globals = rng.random() < 0.4
        self.use_factories = rng.random() < 0.5
        self.use_numpy_random = self.use_random and rng.random() < 0.15

    # helpers --------------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def pick(self, items: Sequence):
        return items[int(self.rng.integers(len(items)))]

    def constant(self) -> str:
        magnitude = self.rng.uniform(0.2, 1.5) * (1 if self.chance(0.7) else -1)
        return f"{magnitude:.3f}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def assign(self, expression: str, shape: tuple[int, ...], from_args: bool) -> _Value:
        value = _Value(f"t{self.counter}", shape, from_args)
        self.counter += 1
        self.emit(f"{value.name} = {expression}")
        self.pool.append(value)
        return value

    def tensors(self, ndim: int | None = None, from_args: bool | None = None) -> list[_Value]:
        return [
            v
            for v in self.pool
            if (ndim is None or len(v.shape) == ndim)
            and (from_args is None or v.from_args == from_args)
        ]

    def recent(self, values: list[_Value]) -> _Value:
        """A value, the later ones more likely (so that chains grow)."""
        weights = np.arange(1, len(values) + 1, dtype=float) ** 1.5
        return values[int(self.rng.choice(len(values), p=weights / weights.sum()))]

    def generator(self) -> str:
        """``, generator=GENi`` (a global generator, new or one already used) or ``""``."""
        if not self.chance(0.4):
            return ""
        if not self.generators or self.chance(0.3):
            self.generators.append(f"GEN{len(self.generators)}")
        return f", generator={self.pick(self.generators)}"

    def global_of(self, kind: str, shape: tuple[int, ...], condition: bool = False) -> str:
        """The name of a global of ``kind`` and ``shape``: one already used, or a new one
        with a random schedule of changes (always a new one for a ``condition``, which
        nothing else reads: ``GlobalSpec``)."""
        for spec in self.globals:
            if condition:
                break
            if spec.kind == kind and spec.shape == shape and not spec.condition:
                if self.chance(0.6):
                    return spec.name
        prefix = {"tensor": "G", "float": "S", "numpy_scalar": "N", "numpy_array": "A"}[kind]
        name = f"{prefix}{len(self.globals)}"
        schedule = self.pick(_SCHEDULES)
        changes: tuple[int, ...] = ()
        if schedule.startswith("at "):
            changes = tuple(int(c) for c in schedule[3:].split(","))
        elif schedule == "later":  # a change that the contract lets stay stale a while
            later = [c for c in range(5, 20) if c not in (8, 16)]
            changes = (int(self.pick(later)),)
        elif schedule == "early and later":
            changes = (int(self.pick((2, 3))), int(self.rng.integers(5, 20)))
        how = "inplace" if kind in ("tensor", "numpy_array") and self.chance(0.4) else "rebind"
        every = schedule == "every"
        self.globals.append(GlobalSpec(name, kind, shape, how, schedule, changes, every, condition))
        return name

    # the body -------------------------------------------------------------------------

    def statement(self) -> None:
        """One assignment ``tK = ...`` of a random template."""
        vectors = self.tensors(1)
        matrices = self.tensors(2)
        roll = self.rng.random()
        if self.use_random and roll < 0.15:
            self.random_statement()
            return
        if self.use_globals and roll < 0.3:
            self.global_statement()
            return
        if self.use_factories and roll < 0.42 and vectors:
            v = self.recent(vectors)
            template = self.pick(_FACTORY_VECTORS)
            self.assign(template.format(v=v.name, n=v.shape[0]), v.shape, v.from_args)
            return
        if matrices and roll < 0.58:
            self.matrix_statement(self.recent(matrices))
            return
        if roll < 0.72 and len(vectors) >= 1:
            self.vector_combination(vectors)
            return
        value = self.recent(vectors + matrices)
        template = self.pick(_UNARY)
        self.assign(template.format(v=value.name, c=self.constant()), value.shape, value.from_args)

    def vector_combination(self, vectors: list[_Value]) -> None:
        v = self.recent(vectors)
        n = v.shape[0]
        same = [u for u in vectors if u.shape == v.shape and u is not v]
        kind = int(self.rng.integers(9))
        if kind == 0 and same:
            u = self.pick(same)
            op = self.pick(("*", "+", "-"))
            self.assign(f"{v.name} {op} {u.name}", v.shape, v.from_args or u.from_args)
        elif kind == 1 and n >= 3:
            self.assign(f"{v.name}[1:]", (n - 1,), v.from_args)
        elif kind == 2 and n >= 3:
            self.assign(f"{v.name}[::2]", ((n + 1) // 2,), v.from_args)
        elif kind == 3:
            u = self.pick(vectors)
            if n + u.shape[0] <= 10:
                self.assign(
                    f"torch.cat([{v.name}, {u.name}])",
                    (n + u.shape[0],),
                    v.from_args or u.from_args,
                )
            else:
                self.assign(f"{v.name}.flip(0)", v.shape, v.from_args)
        elif kind == 4:
            parts = [self.scalar(1, tensor=True) for _ in range(int(self.rng.integers(2, 4)))]
            self.assign(f"torch.stack([{', '.join(parts)}])", (len(parts),), True)
        elif kind == 5 and n % 2 == 0 and n >= 4:
            self.assign(f"{v.name}.reshape(2, -1)", (2, n // 2), v.from_args)
        elif kind == 6:
            self.assign(self.pick(("torch.roll({v}, 1)", "{v}.cumsum(0)")).format(v=v.name),
                        v.shape, v.from_args)  # fmt: skip
        elif kind == 7 and self.chance(0.3):  # an in-place edit of a clone
            value = self.assign(f"{v.name}.clone()", v.shape, v.from_args)
            self.emit(f"{value.name}[0] = {value.name}[-1] * {self.constant()}")
        else:
            s = self.scalar(1, tensor=True)
            self.assign(f"{v.name} * {s}", v.shape, True)

    def matrix_statement(self, m: _Value) -> None:
        r, c = m.shape
        kind = int(self.rng.integers(8))
        if kind == 0:
            self.assign(f"{m.name}.T", (c, r), m.from_args)
        elif kind == 1:
            self.assign(f"{m.name}.reshape(-1)", (r * c,), m.from_args)
        elif kind == 2:
            self.assign(f"{m.name}[{int(self.rng.integers(-r, r))}]", (c,), m.from_args)
        elif kind == 3:
            self.assign(f"{m.name}[:, {int(self.rng.integers(c))}]", (r,), m.from_args)
        elif kind == 4:
            op, shape = self.pick((("sum(0)", (c,)), ("mean(1)", (r,))))
            self.assign(f"{m.name}.{op}", shape, m.from_args)
        elif kind == 5 and (vs := [v for v in self.tensors(1) if v.shape == (c,)]):
            v = self.pick(vs)
            self.assign(f"{m.name} @ {v.name}.to({m.name}.dtype)", (r,), True)
        elif kind == 6:
            self.assign(f"{m.name}.transpose(0, 1).flatten()", (r * c,), m.from_args)
        else:
            template = self.pick(_UNARY)
            self.assign(template.format(v=m.name, c=self.constant()), m.shape, m.from_args)

    def random_statement(self) -> None:
        """A statement that mixes a random draw into a value from the arguments."""
        values = self.tensors(1, from_args=True) or self.tensors(1)
        v = self.recent(values)
        n = v.shape[0]
        g = self.generator()
        self.random = True
        kind = int(self.rng.integers(10))
        if kind == 0:
            draw = f"torch.randn({n}{g})"
            self.assign(f"{v.name} * (1.0 + 0.2 * {draw})", v.shape, True)
        elif kind == 1:
            self.assign(f"{v.name} + torch.rand_like({v.name}{g})", v.shape, True)
        elif kind == 2:
            self.assign(f"{v.name} * torch.randn_like({v.name}{g})", v.shape, True)
        elif kind == 3:
            self.assign(f"{v.name} + 0.1 * torch.randint(0, 3, ({n},){g})", v.shape, True)
        elif kind == 4:
            self.assign(f"{v.name} + torch.normal(0.0, 0.5, size=({n},){g})", v.shape, True)
        elif kind == 5:
            self.assign(f"torch.normal({v.name}, 0.1{g}) * {v.name}", v.shape, True)
        elif kind == 6:
            draw = f"torch.bernoulli(torch.full(({n},), 0.5){g})"
            self.assign(f"{v.name} * (0.5 + {draw})", v.shape, True)
        elif kind == 7:
            draw = f"torch.poisson(torch.full(({n},), 1.5){g})"
            self.assign(f"{v.name} + 0.1 * {draw}", v.shape, True)
        elif kind == 8 and n >= 2:
            index = f"torch.multinomial(torch.ones({n}), 2{g})"
            self.assign(f"{v.name}[{index}]", (2,), True)
        else:
            self.assign(
                f"torch.nn.functional.dropout({v.name}, p=0.3, training=True)", v.shape, True
            )

    def global_statement(self) -> None:
        """A statement that mixes a global into a value from the arguments."""
        values = self.tensors(1, from_args=True) or self.tensors(1)
        v = self.recent(values)
        n = v.shape[0]
        kind = int(self.rng.integers(7))
        if kind == 0:
            self.assign(f"{v.name} * {self.global_of('tensor', (n,))}", v.shape, True)
        elif kind == 1:
            g = self.global_of("tensor", (n,))
            self.assign(f"{v.name} + torch.stack([{g}, {g}])[0]", v.shape, True)
        elif kind == 2:
            self.assign(f"{v.name} + {self.global_of('float', ())}", v.shape, True)
        elif kind == 3:
            s = self.global_of("numpy_scalar", ())
            self.assign(f"{v.name} * torch.tensor({s})", v.shape, True)
        elif kind == 4:
            a = self.global_of("numpy_array", (n,))
            wrap = self.pick(("torch.tensor", "torch.as_tensor", "torch.from_numpy"))
            self.assign(f"{v.name} * {wrap}({a})", v.shape, True)
        elif kind == 5:
            g = self.global_of("tensor", ())
            self.assign(f"{v.name} - {g}", v.shape, True)
        else:
            g = self.global_of("tensor", (n,))
            self.assign(f"torch.cat([{g}, {v.name}])[{n}:] * 0.5", v.shape, True)

    def scalar(self, depth: int = 0, tensor: bool = False) -> str:
        """A 0-d expression for a gate parameter (where not ``tensor``, a Python float
        now and then)."""
        roll = self.rng.random()
        if depth == 0 and roll < 0.2:
            a, b = self.scalar(1, tensor=True), self.scalar(1)
            return self.pick(("{a} * {b}", "{a} + {b}", "torch.sin({a}) * {b}")).format(a=a, b=b)
        if self.use_random and roll < 0.3:
            return self.random_scalar()
        if self.use_globals and roll < 0.38:
            return self.global_scalar(tensor)
        if self.use_factories and roll < 0.44:
            factory = self.pick(_FACTORY_SCALARS).format(c=self.constant())
            return f"{self.element()} * {factory}"
        if roll < 0.5:
            v = self.recent(self.tensors())
            numel = math.prod(v.shape)
            ops = ["sum()", "mean()", "norm()"] + (["prod()"] if numel <= 4 else [])
            return f"{v.name}.{self.pick(ops)}"
        if roll < 0.53 and not tensor:
            return self.constant()
        return self.element()

    def element(self) -> str:
        """An element of a tensor of the body: ``t[i]``, ``t[i, j]``, ``t[i][j]``."""
        v = self.recent(self.tensors(1) + self.tensors(2))
        if len(v.shape) == 1:
            return f"{v.name}[{int(self.rng.integers(-v.shape[0], v.shape[0]))}]"
        i, j = (int(self.rng.integers(size)) for size in v.shape)
        return f"{v.name}[{i}, {j}]" if self.chance(0.7) else f"{v.name}[{i}][{j}]"

    def random_scalar(self) -> str:
        self.random = True
        element = self.element()
        if self.use_numpy_random and self.chance(0.3):
            self.numpy_random = True
            return f"{element} + torch.tensor(np.random.rand())"
        g = self.generator()
        return self.pick(
            (
                f"{element} + torch.rand((){g})",
                f"{element} * torch.randn((){g})",
                f"{element} + torch.rand(1{g})[0]",
                f"{element} * (1.0 + torch.randint(0, 2, (){g}))",
            )
        )

    def global_scalar(self, tensor: bool = False) -> str:
        element = self.element()
        kind = int(self.rng.integers(3 if tensor else 4))
        if kind == 0:
            g = self.global_of("tensor", (2,))
            return f"{element} * torch.stack([{g}, {g}])[0][1]"
        if kind == 1:
            return f"{element} + {self.global_of('float', ())}"
        if kind == 2:
            return f"{element} * torch.tensor({self.global_of('numpy_scalar', ())})"
        return self.global_of("float", ())  # a constant parameter from a global

    def gate(self) -> None:
        """One gate (or template) of random parameters on random wires."""
        n = self.n
        roll = self.rng.random()
        wires = [int(w) for w in self.rng.permutation(n)]
        if roll < 0.4:
            self.emit(f"qml.{self.pick(_ROTATIONS)}({self.scalar()}, wires={wires[0]})")
        elif roll < 0.5:
            params = ", ".join(self.scalar() for _ in range(3))
            self.emit(f"qml.Rot({params}, wires={wires[0]})")
        elif roll < 0.62:
            name = self.pick(("CRX", "IsingZZ"))
            self.emit(f"qml.{name}({self.scalar()}, wires=[{wires[0]}, {wires[1]}])")
        elif roll < 0.7:
            width = int(self.rng.integers(1, min(n, 3) + 1))
            word = "".join(self.pick("XYZ") for _ in range(width))
            self.emit(f"qml.PauliRot({self.scalar()}, {word!r}, wires={wires[:width]})")
        elif roll < 0.8:
            self.angle_embedding()
        elif roll < 0.87:
            self.entangling_layers()
        else:
            self.emit(
                self.pick(
                    (f"qml.CNOT(wires=[{wires[0]}, {wires[1]}])", f"qml.Hadamard({wires[0]})")
                )
            )

    def angle_embedding(self) -> None:
        v = self.recent(self.tensors(1))
        size = v.shape[0]
        features = f"{v.name}[:{self.n}]" if size > self.n else v.name
        rotation = self.pick("XYZ")
        wires = min(size, self.n)
        self.emit(f"qml.AngleEmbedding({features}, wires=range({wires}), rotation={rotation!r})")

    def entangling_layers(self) -> None:
        n = self.n
        shaped = [m for m in self.tensors(2) if m.shape in ((n, 3), (3, n))]
        if shaped:
            m = self.pick(shaped)
            weights = m.name if m.shape == (n, 3) else f"{m.name}.T"
        else:
            vectors = self.tensors(1)
            v = self.pick([u for u in vectors if u.shape[0] >= n] or vectors)
            u = self.pick([t for t in vectors if t.shape[0] >= 3] or vectors)
            # torch.outer of slices; a short vector repeats its elements
            left = f"{v.name}[:{n}]" if v.shape[0] >= n else f"{v.name}.repeat({n})[:{n}]"
            right = f"{u.name}[:3]" if u.shape[0] >= 3 else f"{u.name}.repeat(3)[:3]"
            weights = f"torch.outer({left}, {right})"
        if self.chance(0.5):
            weights = f"({weights}).reshape(1, {n}, 3)"
        else:
            weights = f"torch.stack([{weights}, 0.5 * {weights}])"
        self.emit(f"qml.StronglyEntanglingLayers({weights}, wires=range({n}))")

    def block(self, count: int) -> None:
        for _ in range(count):
            self.gate()

    def control_flow(self, arguments: Sequence[str]) -> None:
        """A Python ``if`` or ``for`` around gates: on an argument's value, a global, the
        integer argument or a random draw."""
        options = ["value"]
        if "k" in arguments:
            options.append("int")
        if self.use_globals:
            options.append("global")
        if self.use_random:
            options.append("random")
        kind = self.pick(options)
        if kind == "int":
            v = self.recent(self.tensors(1))
            self.emit("for layer in range(k):")
            self.indent += 1
            self.emit(
                f"qml.RY({v.name}[layer % {v.shape[0]}] * {self.constant()}, "
                f"wires=layer % {self.n})"
            )
            self.block(int(self.rng.integers(0, 2)))
            self.indent -= 1
            return
        if kind == "global":
            condition = f"{self.global_of('float', (), condition=True)} > 0"
        elif kind == "random":
            self.random = True
            condition = f"float(torch.rand((){self.generator()})) > 0.5"
        else:
            self.value_flow = True
            v = self.recent(self.tensors(from_args=True) or self.tensors())
            element = f"{v.name}[0]" if len(v.shape) == 1 else f"{v.name}[0, 0]"
            if self.chance(0.3):
                self.emit(f"for _ in range(1 + int(float({element}) > 0)):")
                self.indent += 1
                self.block(int(self.rng.integers(1, 3)))
                self.indent -= 1
                return
            condition = self.pick(
                (f"float({element}) > 0", f"{element}.item() < 0.5", f"bool({v.name}.sum() > 0)")
            )
        self.emit(f"if {condition}:")
        self.indent += 1
        self.block(int(self.rng.integers(1, 3)))
        self.indent -= 1
        if self.chance(0.6):
            self.emit("else:")
            self.indent += 1
            self.block(int(self.rng.integers(1, 3)))
            self.indent -= 1

    def measurements(self) -> str:
        n = self.n
        wires = [int(w) for w in self.rng.permutation(n)]

        def one() -> str:
            kind = int(self.rng.integers(5))
            if kind == 0:
                return f"qml.expval(qml.Z({wires[0]}))"
            if kind == 1:
                return f"qml.expval(qml.X({wires[0]}) @ qml.Y({wires[1]}))"
            if kind == 2:
                return (
                    f"qml.expval({self.constant()} * qml.Z({wires[0]}) @ qml.Z({wires[1]})"
                    f" + {self.constant()} * qml.X({wires[1]}))"
                )
            if kind == 3:
                return f"qml.probs(wires=[{wires[0]}, {wires[1]}])"
            return f"qml.expval(qml.Y({wires[-1]}))"

        roll = self.rng.random()
        if roll < 0.45:
            return one()
        if roll < 0.75:
            return ", ".join(one() for _ in range(int(self.rng.integers(2, 4))))
        if roll < 0.9:
            return f"[qml.expval(qml.Z(i)) for i in range({n})]"
        return f"[{one()}, {one()}]"


_SCHEDULES = (
    ("fixed",) * 3
    + ("every",) * 2
    + ("at 2", "at 3", "at 4", "at 8", "at 16", "at 3,8", "later", "later", "early and later")
)
"""When a global changes (``GlobalSpec``); "later": a change that the contract allows
to stay stale until the next verification call."""


def generate(seed: int, n_wires: int | None = None, layers: int | None = None) -> FunctionSpec:
    """The quantum function of ``seed`` (deterministic: the same seed gives the same
    source and the same calls), on ``n_wires`` (default: 2-4) with about ``layers`` (default
    1-3) statements and gates per wire."""
    rng = np.random.default_rng([seed, 45])
    n = int(rng.integers(2, MAX_WIRES_IN_TESTS + 1)) if n_wires is None else n_wires
    layers = int(rng.integers(1, 4)) if layers is None else layers
    builder = _Builder(rng, n, layers)

    has_x = builder.chance(0.85)
    has_w = not has_x or builder.chance(0.55)
    m = max(n, 3) + int(rng.integers(0, 3))
    rows = int(builder.pick((n, 2, 3)))
    shapes: dict = {}
    arguments: list[str] = []
    aliasing = "none"
    if has_x:
        arguments.append("x")
        shapes["x"] = (m,)
        builder.pool.append(_Value("x", (m,), True))
    if has_w:
        arguments.append("w")
        shapes["w"] = (rows, 3)
        builder.pool.append(_Value("w", (rows, 3), True))
    if has_x and builder.chance(0.1):
        aliasing = "same"
        arguments.append("y")
        shapes["y"] = (m,)
        builder.pool.append(_Value("y", (m,), True))
    elif has_x and has_w and builder.chance(0.2):
        aliasing = builder.pick(("views", "strided"))
    if builder.chance(0.25):
        arguments.append("c")
        shapes["c"] = (m,)
        builder.pool.append(_Value("c", (m,), False))
    k_values: tuple[int, ...] = ()
    if builder.chance(0.2):
        arguments.append("k")
        k_values = (1, 2) if builder.chance(0.7) else (2,)
    a_values: tuple[tuple[float, ...], ...] = ()
    if builder.chance(0.15):
        arguments.append("a")
        a_values = tuple(
            tuple(float(np.round(v, 4)) for v in rng.uniform(-1, 1, 2))
            for _ in range(int(rng.integers(1, 3)))
        )

    if not has_x:  # the templates take vectors: one of w's first
        vector, size = builder.pick(
            (("w.reshape(-1)", rows * 3), ("w[0]", 3), ("w.sum(0)", 3), ("w[:, 1]", rows))
        )
        builder.assign(vector, (size,), True)
    for _ in range(int(rng.integers(1, 3)) + layers):
        builder.statement()
    if "a" in arguments:
        v = builder.recent(builder.tensors(1))
        if builder.chance(0.5):
            builder.assign(f"{v.name}[:2] * torch.tensor(a)", (2,), True)
        else:
            builder.emit(f"qml.RZ(float(a[0]) + {builder.scalar(1)}, wires=0)")
    for _ in range(n * layers):
        builder.gate()
        if builder.chance(0.06):
            builder.control_flow(arguments)
    if "k" in arguments and not any("range(k)" in line for line in builder.lines):
        builder.emit(f"qml.RX({builder.element()} * k, wires=0)")
    if builder.use_random and not builder.random:
        builder.emit(f"qml.RY({builder.random_scalar()}, wires=0)")
    if builder.use_globals and not builder.globals:
        builder.emit(f"qml.RY({builder.global_scalar()}, wires={n - 1})")
    if "c" in arguments:
        builder.emit(f"qml.RX(c[0] * {builder.element()}, wires={n - 1})")
    body = "\n".join(builder.lines)
    for name in ("x", "w", "y"):  # every argument that requires grad reaches a gate
        if name in arguments and f"{name}[" not in body and f"{name}." not in body:
            element = f"{name}[0]" if name != "w" else "w[0, 1]"
            builder.emit(f"qml.RY({element} * {builder.constant()}, wires={n - 1})")
    builder.emit(f"return {builder.measurements()}")

    keyword_orders: tuple[tuple[str, ...], ...] = ()
    rest = arguments[1:]
    if rest and builder.chance(0.3):
        orders = {tuple(rest), tuple(rng.permutation(rest).tolist())}
        keyword_orders = tuple(sorted(orders))
    updates = builder.pick(("fresh", "fresh", "optimizer", "data", "fixed", "mixed"))
    dtypes = builder.pick(("float64",) * 4 + ("alternate", "block"))
    verify_every = None if builder.chance(0.1) else DEFAULT

    header = [
        f"# generated function {seed}: {n} wires; arguments {', '.join(arguments)}; "
        f"aliasing {aliasing}; updates {updates}; dtypes {dtypes}",
        f"# keyword orders {list(keyword_orders) or 'none (positional)'}; k in {k_values}; "
        f"a in {a_values}; verify_every {'default' if verify_every is DEFAULT else None}",
    ]
    for spec in builder.globals:
        header.append(
            f"# global {spec.name}: {spec.kind} {spec.shape}, {spec.how}, changes {spec.schedule}"
            f" {list(spec.changes) if spec.changes else ''}".rstrip()
        )
    source = "\n".join([*header, f"def circuit({', '.join(arguments)}):", *builder.lines, ""])
    return FunctionSpec(
        seed=seed,
        n_wires=n,
        source=source,
        arguments=tuple(arguments),
        shapes=shapes,
        globals_=tuple(builder.globals),
        generators=tuple(builder.generators),
        random=builder.random or builder.numpy_random,
        value_flow=builder.value_flow,
        aliasing=aliasing,
        updates=updates,
        dtypes=dtypes,
        keyword_orders=keyword_orders,
        k_values=k_values,
        a_values=a_values,
        verify_every=verify_every,
    )


def from_source(
    source: str,
    n_wires: int,
    shapes: dict,
    *,
    arguments: Sequence[str] | None = None,
    globals_: Sequence[GlobalSpec] = (),
    generators: Sequence[str] = (),
    random: bool = False,
    seed: int = 0,
    updates: str = "fresh",
) -> FunctionSpec:
    """A spec of a hand-written ``source`` (``def circuit(...)``) for ``check``: its
    tensor arguments of ``shapes`` (in the signature's order unless ``arguments``)."""
    return FunctionSpec(
        seed=seed,
        n_wires=n_wires,
        source=source,
        arguments=tuple(arguments if arguments is not None else shapes),
        shapes=dict(shapes),
        globals_=tuple(globals_),
        generators=tuple(generators),
        random=random,
        value_flow=False,
        aliasing="none",
        updates=updates,
        dtypes="float64",
        keyword_orders=(),
        k_values=(),
        a_values=(),
        verify_every=DEFAULT,
    )


# --- the calls ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CallPlan:
    """One call of ``check``: its number (1-based), the arguments' dtype, the keyword
    order (an index into ``keyword_orders``; -1: positional), ``k`` and ``a`` (an index into
    ``a_values``), the update of the arguments before it, the globals changed before it,
    what the traces can see of the globals then (``GlobalSpec.seen``), and whether the
    contract asks for the QNode's numbers (``exact``) or lets the call be stale (a global's
    change not yet verified)."""

    index: int
    dtype: torch.dtype
    order: int
    k: int | None
    a: int | None
    update: str
    changes: tuple[str, ...]
    seen: tuple
    exact: bool = True
    key_call: int = 0
    """The call's number among the calls of its signature key."""

    @property
    def key(self) -> tuple:
        return (self.dtype, self.order, self.k, self.a)


def plan_calls(spec: FunctionSpec, calls: int) -> list[CallPlan]:
    """The ``calls`` calls of ``check`` (deterministic from the spec's seed)."""
    rng = np.random.default_rng([spec.seed, calls, 7])
    block = set(range(6, 12))
    plans = []
    versions = dict.fromkeys((g.name for g in spec.globals_), 0)
    for index in range(1, calls + 1):
        if spec.dtypes == "alternate":
            dtype = torch.float32 if index % 2 == 0 else torch.float64
        elif spec.dtypes == "block":
            dtype = torch.float32 if index in block else torch.float64
        else:
            dtype = torch.float64
        order = -1
        if spec.keyword_orders:
            order = (index // 2) % len(spec.keyword_orders)
        k = spec.k_values[(index // 3) % len(spec.k_values)] if spec.k_values else None
        a = (index // 5) % len(spec.a_values) if spec.a_values else None
        update = spec.updates
        if update == "mixed":
            update = str(rng.choice(["fresh", "optimizer", "data", "fixed"]))
        if index == 1:
            update = "fresh"
        changes = tuple(g.name for g in spec.globals_ if g.changes_before(index))
        for name in changes:
            versions[name] += 1
        seen = tuple(g.seen(spec.seed, versions[g.name]) for g in spec.globals_)
        plans.append(CallPlan(index, dtype, order, k, a, update, changes, seen))
    return _stale_allowed(plans, spec.verify_every, calls)


@dataclasses.dataclass
class _KeyHistory:
    """What ``_stale_allowed`` knows of one key: its calls so far, what its trace (its
    second call) saw of each global, and the globals whose change a trace has seen."""

    calls: int = 0
    traced: tuple = ()
    detected: set = dataclasses.field(default_factory=set)


def _stale_allowed(plans: list[CallPlan], verify_every, calls: int) -> list[CallPlan]:
    """``plans`` with ``exact`` False at the calls where the trust-then-verify contract
    lets the compiled path replay a global's old value, and with each call's number within
    its key. Per key, as the compiled path runs it: call 1 records; call 2 traces (what it
    sees of the globals is trusted from then on); call 3 traces again, and so does each
    verification call (``verification_calls``); a global seen otherwise than at call 2 at
    one of those is detected (the key re-records: exact from then on); at any other call,
    a global seen otherwise than at call 2 and not detected may be stale.

    Per global, not per key: a change that a trace compares may still not show in it (a
    global that reaches no gate, here: in an untaken branch), so one global's detected
    change says nothing of another's. Call 2 compares its circuit with call 1's too,
    which catches some changes; a change before call 2 counts as unseen here. Both skip
    more calls than the compiled path may need, never fewer."""
    verifications = set(verification_calls(verify_every, calls))
    histories: dict[tuple, _KeyHistory] = {}
    out = []
    for plan in plans:
        history = histories.setdefault(plan.key, _KeyHistory())
        history.calls += 1
        exact = True
        if history.calls == 2:
            history.traced = plan.seen
        elif history.calls > 2:
            pairs = enumerate(zip(plan.seen, history.traced, strict=True))
            changed = {i for i, (now, traced) in pairs if now != traced}
            if history.calls == 3 or history.calls in verifications:
                history.detected |= changed
            else:
                exact = changed <= history.detected
        out.append(dataclasses.replace(plan, exact=exact, key_call=history.calls))
    return out


# --- the check ----------------------------------------------------------------------------


@dataclasses.dataclass
class CheckReport:
    """What ``check`` compared: the calls compared and skipped (stale allowed) and the
    largest difference of values and gradients seen."""

    compared: int = 0
    skipped: int = 0
    worst: float = 0.0


def _device(spec: FunctionSpec, grad_accumulation: str):
    return qml.device(
        "custatevec.qubit", wires=spec.n_wires, backend="cpu", grad_accumulation=grad_accumulation
    )


def make_pair(spec: FunctionSpec, grad_accumulation: str = "deferred", verify_every=DEFAULT):
    """(the compiled QNode, the QNode, the namespace of their shared quantum function),
    each QNode on its own device."""
    function, namespace = spec.function()
    verify = spec.verify_every if verify_every is DEFAULT else verify_every

    def qnode():
        return qml.QNode(
            function, _device(spec, grad_accumulation), interface="torch", diff_method="adjoint"
        )

    return compile_qnode(qnode(), verify), qnode(), namespace


class _Arguments:
    """The tensors ``check`` passes, per dtype: the leaves (which keep their identity across
    calls except where updated ``fresh``) and their last QNode gradients."""

    def __init__(self, spec: FunctionSpec):
        self.spec = spec
        self.leaves: dict[torch.dtype, dict[str, torch.Tensor]] = {}
        self.grads: dict[tuple[torch.dtype, str], torch.Tensor] = {}
        """The QNode's last gradient per (dtype, leaf name): the optimizer's step."""

    def _fresh(self, dtype: torch.dtype, call: int) -> dict[str, torch.Tensor]:
        spec = self.spec
        rng = np.random.default_rng([spec.seed, call, 3])
        leaves = {}
        if spec.aliasing in ("views", "strided"):
            m, (rows, cols) = spec.shapes["x"][0], spec.shapes["w"]
            step = 2 if spec.aliasing == "strided" else 1
            values = rng.uniform(-2, 2, m * step + rows * cols)
            leaves["base"] = torch.tensor(values, dtype=dtype, requires_grad=True)
        for name, shape in spec.shapes.items():
            if (name == "y" and spec.aliasing == "same") or (
                name in ("x", "w") and spec.aliasing in ("views", "strided")
            ):
                continue
            values = rng.uniform(-2, 2, shape)
            leaves[name] = torch.tensor(values, dtype=dtype, requires_grad=name != "c")
        return leaves

    def update(self, plan: CallPlan) -> None:
        leaves = self.leaves.get(plan.dtype)
        if leaves is None or plan.update == "fresh":
            self.leaves[plan.dtype] = self._fresh(plan.dtype, plan.index)
            for name in self.leaves[plan.dtype]:
                self.grads.pop((plan.dtype, name), None)
            return
        with torch.no_grad():
            for name, leaf in leaves.items():
                if plan.update == "optimizer" and (plan.dtype, name) in self.grads:
                    leaf -= 0.1 * self.grads[plan.dtype, name]
                elif plan.update == "data":
                    leaf.data.add_(0.05 * (1 + len(name)))
                elif plan.update == "optimizer" and name == "c":
                    leaf.mul_(0.9)

    def call_arguments(self, plan: CallPlan) -> tuple[tuple, dict, dict[str, torch.Tensor]]:
        """(args, kwargs, the leaves that require grad by name) of the call ``plan``."""
        spec = self.spec
        leaves = self.leaves[plan.dtype]
        values: dict = {}
        if spec.aliasing in ("views", "strided"):
            m, (rows, cols) = spec.shapes["x"][0], spec.shapes["w"]
            base = leaves["base"]
            step = 2 if spec.aliasing == "strided" else 1
            values["x"] = base[: m * step : step]
            values["w"] = base[m * step :].view(rows, cols)
        for name in ("x", "w", "c"):
            if name in spec.shapes and name not in values:
                values[name] = leaves[name]
        if "y" in spec.shapes:
            values["y"] = values["x"] if spec.aliasing == "same" else leaves["y"]
        if plan.k is not None:
            values["k"] = plan.k
        if plan.a is not None:
            values["a"] = np.array(spec.a_values[plan.a])
        names = spec.arguments
        if plan.order < 0:
            args, kwargs = tuple(values[n] for n in names), {}
        else:
            args = (values[names[0]],)
            kwargs = {n: values[n] for n in spec.keyword_orders[plan.order]}
        grad_leaves = {name: leaf for name, leaf in leaves.items() if leaf.requires_grad}
        return args, kwargs, grad_leaves


def _seed_all(seed: int, namespace: dict, generators: Sequence[str]) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    for i, name in enumerate(generators):
        namespace[name].manual_seed(seed + 1 + i)


def _random_states(namespace: dict, generators: Sequence[str]) -> list:
    states = [("torch's default generator", torch.default_generator.get_state())]
    states += [(name, namespace[name].get_state()) for name in generators]
    states.append(("numpy's global generator", np.random.get_state()))
    return states


def _states_differ(got: list, want: list) -> list[str]:
    differ = []
    for (name, g), (_, w) in zip(got, want, strict=True):
        if isinstance(g, torch.Tensor):
            same = torch.equal(g, w)
        else:
            same = all(np.array_equal(a, b) for a, b in zip(g, w, strict=True))
        if not same:
            differ.append(name)
    return differ


def _change_global(spec: GlobalSpec, namespace: dict, seed: int, version: int) -> None:
    new = spec.value(seed, version)
    if spec.how == "inplace" and spec.kind == "tensor":
        namespace[spec.name].copy_(new)
    elif spec.how == "inplace" and spec.kind == "numpy_array":
        namespace[spec.name][...] = new
    else:
        namespace[spec.name] = new


def _largest_difference(got, want) -> float:
    worst = 0.0
    for g, w in zip(tensors_in(got), tensors_in(want), strict=False):
        if g.shape == w.shape:
            difference = (g.detach().double() - w.detach().double()).abs()
            worst = max(worst, float(difference.max()) if difference.numel() else 0.0)
    return worst


def _assert_close_result(got, want, tolerance: float, path: str = "result") -> None:
    """``assert_same_result`` with ``tolerance`` (absolute and relative) for the values."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_close_result(g, w, tolerance, f"{path}[{i}]")
        return
    assert isinstance(want, torch.Tensor), f"{path}: {type(want).__name__}"
    assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
    np.testing.assert_allclose(
        got.detach().numpy(), want.detach().numpy(), atol=tolerance, rtol=tolerance, err_msg=path
    )


def _gradients(result, leaves: list[torch.Tensor], backward: bool) -> list:
    """The gradients of ``weighted_loss(result)`` for ``leaves`` (None where unused):
    ``torch.autograd.grad``, or ``backward()`` and the leaves' ``.grad`` (then reset)."""
    loss = weighted_loss(result)
    if not loss.requires_grad:
        return [None] * len(leaves)
    if not backward:
        return list(torch.autograd.grad(loss, leaves, allow_unused=True))
    for leaf in leaves:
        leaf.grad = None
    loss.backward()
    grads = [leaf.grad for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    return grads


def _failure(spec: FunctionSpec, accumulation: str, plan: CallPlan | None, what: str) -> str:
    where = "" if plan is None else (
        f" at call {plan.index} (call {plan.key_call} of its key: dtype "
        f"{str(plan.dtype).removeprefix('torch.')}, keyword order {plan.order}, k {plan.k}, "
        f"a {plan.a}; update {plan.update}; globals changed before it: "
        f"{list(plan.changes) or 'none'})"
    )  # fmt: skip
    return (
        f"generated function {spec.seed} ({accumulation}){where}: {what}\n"
        f"--- source ---\n{spec.source}"
    )


def check(
    spec: FunctionSpec,
    calls: int = 20,
    grad_accumulation: str = "deferred",
    *,
    verify_every=DEFAULT,
    report: CheckReport | None = None,
) -> CheckReport:
    """Call the compiled QNode and the QNode of ``spec`` ``calls`` times (``plan_calls``)
    and compare results, gradients and random generator states (module docstring); raise
    AssertionError with the source, the call and what differed at the first difference.
    ``verify_every``: the spec's own unless given; ``report``: the one to fill (so that
    a caller has the differences seen up to a failure too)."""
    verify = spec.verify_every if verify_every is DEFAULT else verify_every
    compiled, qnode, namespace = make_pair(spec, grad_accumulation, verify)
    arguments = _Arguments(spec)
    report = CheckReport() if report is None else report
    versions = {g.name: 0 for g in spec.globals_}
    for plan in _stale_allowed(plan_calls(spec, calls), verify, calls):
        for g in spec.globals_:
            if g.name in plan.changes:
                versions[g.name] += 1
                _change_global(g, namespace, spec.seed, versions[g.name])
        arguments.update(plan)
        args, kwargs, named = arguments.call_arguments(plan)
        leaves = list(named.values())
        seed = spec.seed * 1000 + plan.index
        _seed_all(seed, namespace, spec.generators)
        try:
            got = compiled(*args, **kwargs)
        except Exception as error:  # every crash is a finding
            raise AssertionError(
                _failure(spec, grad_accumulation, plan, f"the compiled call raised {error!r}")
            ) from error
        got_states = _random_states(namespace, spec.generators)
        _seed_all(seed, namespace, spec.generators)
        want = qnode(*args, **kwargs)
        want_states = _random_states(namespace, spec.generators)
        try:
            got_grads = _gradients(got, leaves, backward=False)
        except Exception as error:
            raise AssertionError(
                _failure(spec, grad_accumulation, plan, f"the compiled backward raised {error!r}")
            ) from error
        want_grads = _gradients(want, leaves, backward=True)
        for name, grad in zip(named, want_grads, strict=True):
            if grad is not None:
                arguments.grads[plan.dtype, name] = grad
        if not plan.exact:
            report.skipped += 1
            continue
        report.compared += 1
        problems = _differences(got, want, got_grads, want_grads, list(named), plan, report)
        differ = _states_differ(got_states, want_states)
        if differ:
            problems.append(f"random generator states after the calls differ: {', '.join(differ)}")
        if problems:
            raise AssertionError(_failure(spec, grad_accumulation, plan, "; ".join(problems)))
    return report


def _differences(
    got, want, got_grads: list, want_grads: list, names: list, plan: CallPlan, report: CheckReport
) -> list[str]:
    """What differs between the compiled call's results and gradients and the QNode's
    (float64: ``assert_same_result`` and ATOL; float32: FLOAT32_TOLERANCE); updates the
    report's largest difference."""
    problems = []
    float32 = plan.dtype == torch.float32
    difference = _largest_difference(got, want)
    report.worst = max(report.worst, difference)
    try:
        if float32:
            _assert_close_result(got, want, FLOAT32_TOLERANCE)
        else:
            assert_same_result(got, want)
    except AssertionError as error:
        detail = " ".join(str(error).split())[:300]
        problems.append(f"results differ (by up to {difference:.3e}: {detail})")
    tolerance = FLOAT32_TOLERANCE if float32 else ATOL
    for name, g, w in zip(names, got_grads, want_grads, strict=True):
        what = f"the gradient of {name}"
        if w is None or g is None:
            other = g if w is None else w
            if other is not None and other.abs().max() > 0:
                side = "the QNode's" if w is None else "the compiled call's"
                problems.append(f"{what}: {side} is None, the other {other.tolist()}")
            continue
        gap = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
        report.worst = max(report.worst, gap)
        bound = tolerance * (1 + (float(w.abs().max()) if float32 and w.numel() else 0.0))
        if not gap <= bound:
            problems.append(f"{what} differs by {gap:.3e}")
    return problems


# --- batched paths ------------------------------------------------------------------------


def _flat(result) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors_in(result)])


def check_batched(
    spec: FunctionSpec,
    grad_accumulation: str = "deferred",
    calls: int = 3,
    batch: int = 3,
    report: CheckReport | None = None,
) -> CheckReport:
    """For a function without random draws: per call, ``torch.func.vmap`` of the compiled
    QNode over a batch of the first tensor argument (where the function's control flow
    reads no argument's value) against the QNode's results row by row, with the gradient
    of a weighted sum of the rows; ``jacobian(..., vectorize=True)`` and
    ``torch.func.jacrev`` of the compiled QNode against the QNode's plain Jacobian. The
    other arguments fixed (float64, positional; ``y`` is the batched ``x`` where aliased),
    the globals at their first values."""
    assert spec.differentiable_batches, "check_batched takes functions without random draws"
    compiled, qnode, _ = make_pair(spec, grad_accumulation)
    report = CheckReport() if report is None else report
    for call in range(1, calls + 1):
        _check_batched_call(spec, compiled, qnode, call, batch, grad_accumulation, report)
    return report


def _with_argument(spec: FunctionSpec, function: Callable, fixed: dict) -> Callable:
    """``v -> the flattened results of function`` with the batched argument ``v`` and the
    others ``fixed``."""
    name = spec.batch_argument

    def flat(v):
        values = dict(fixed, **{name: v})
        if spec.aliasing == "same":
            values["y"] = v
        return _flat(function(*(values[n] for n in spec.arguments)))

    return flat


def _check_batched_call(
    spec: FunctionSpec, compiled, qnode, call: int, batch: int, accumulation: str, report
) -> None:
    """One call of ``check_batched``: each transform checked (a crash is a finding), then
    an AssertionError naming every one that failed."""
    rng = np.random.default_rng([spec.seed, call, 11])
    fixed: dict = {
        n: torch.tensor(rng.uniform(-2, 2, spec.shapes[n]), dtype=torch.float64)
        for n in spec.shapes
    }
    if spec.k_values:
        fixed["k"] = spec.k_values[0]
    if spec.a_values:
        fixed["a"] = np.array(spec.a_values[0])
    ours, theirs = _with_argument(spec, compiled, fixed), _with_argument(spec, qnode, fixed)
    shape = spec.shapes[spec.batch_argument]
    rows = torch.tensor(rng.uniform(-2, 2, (batch, *shape)), requires_grad=True)
    point = rows[0].detach().clone().requires_grad_()
    problems = []

    def vmapped() -> None:
        got = torch.func.vmap(ours)(rows)
        want = torch.stack([theirs(row) for row in rows])
        _compare(got, want, report, "vmap's results")
        weights = torch.as_tensor(np.random.default_rng(call).uniform(-1, 1, want.shape))
        (g,) = torch.autograd.grad((got * weights).sum(), rows)
        (w,) = torch.autograd.grad((want * weights).sum(), rows)
        _compare(g, w, report, "the gradient of vmap's results")

    jacobian = torch.autograd.functional.jacobian(theirs, point)
    transforms = {
        "jacobian(vectorize=True)": lambda: _compare(
            torch.autograd.functional.jacobian(ours, point, vectorize=True), jacobian, report, ""
        ),
        "torch.func.jacrev": lambda: _compare(
            torch.func.jacrev(ours)(point.detach()), jacobian, report, ""
        ),
    }
    if spec.vmappable:
        transforms = {"torch.func.vmap": vmapped, **transforms}
    for what, transform in transforms.items():
        try:
            transform()
        except AssertionError as error:
            problems.append(f"{what}: {error}")
        except Exception as error:  # a crash is a finding
            problems.append(f"{what} of the compiled QNode raised {error!r}")
    if problems:
        what = f"batched call {call}: " + "; ".join(problems)
        raise AssertionError(_failure(spec, accumulation, None, what))


def _compare(got, want, report: CheckReport, what: str) -> None:
    report.compared += 1
    if got.shape != want.shape:
        raise AssertionError(f"{what} shape {tuple(got.shape)} != {tuple(want.shape)}")
    difference = float((got.detach() - want.detach()).abs().max()) if want.numel() else 0.0
    report.worst = max(report.worst, difference)
    if not difference <= ATOL:
        raise AssertionError(f"{what} differ by {difference:.3e}".strip())


# --- the fuzz script's entry point ---------------------------------------------------------


def fuzz_one(seed: int, n_wires: int, layers: int, calls: int) -> tuple[float, str | None]:
    """``scripts/fuzz.py --compiled``: the function of ``seed`` on ``n_wires`` checked over
    ``calls`` calls in both accumulation modes, and its batched paths where they apply;
    (the largest difference seen, the first failure's message or None)."""
    spec = generate(seed, n_wires=n_wires, layers=layers)
    report = CheckReport()
    try:
        for accumulation in ("deferred", "eager"):
            check(spec, calls, accumulation, report=report)
        if spec.differentiable_batches:
            check_batched(spec, report=report)
    except AssertionError as error:
        return report.worst, str(error)
    return report.worst, None
