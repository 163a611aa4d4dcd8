"""Generated quantum functions (``tests/compiled_generator.py``) through
``pennylane_custatevec.compile`` against the plain QNode: every call gives the QNode's
results and gradients and consumes the random generators as the QNode does, whatever the
function draws, reads from globals, branches on, and however it is called (issue 45: a
function that mixed a tensor not computed from its arguments into a gate parameter was
replayed with the second call's tensor from the third call on). The calls that the
"trust then verify" contract lets stay stale (a global changed at a call that is not a
verification call) are made but not compared (``compiled_generator._stale_allowed``).

200 functions over 20 calls each, in both accumulation modes, in 20 cases of 10 functions
(``pytest -n 2`` spreads them); vmap and batched cotangents for 24 functions without random
draws; the issue's examples; the generator's determinism and the checker's own findings."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import compiled_generator
import pytest
import torch
from compiled_generator import (
    DEFAULT,
    CallPlan,
    GlobalSpec,
    _stale_allowed,
    check,
    check_batched,
    from_source,
    generate,
    plan_calls,
    verification_calls,
)

CASES = 20
FUNCTIONS_PER_CASE = 10
CALLS = 20
ACCUMULATIONS = ("deferred", "eager")


def _failures_of(seeds, run) -> list[str]:
    failures = []
    for seed in seeds:
        for accumulation in ACCUMULATIONS:
            try:
                run(seed, accumulation)
            except AssertionError as error:
                failures.append(str(error))
    return failures


def _report(failures: list[str], checked: int) -> str:
    return f"{len(failures)} of {checked} checks failed:\n\n" + "\n\n".join(failures)


@pytest.mark.parametrize("case", range(CASES))
def test_generated_functions_give_the_qnodes_numbers(case):
    seeds = range(case * FUNCTIONS_PER_CASE, (case + 1) * FUNCTIONS_PER_CASE)
    failures = _failures_of(
        seeds, lambda seed, accumulation: check(generate(seed), CALLS, accumulation)
    )
    assert not failures, _report(failures, len(seeds) * len(ACCUMULATIONS))


BATCHED_CASES = 4
BATCHED_PER_CASE = 6
BATCHED_FIRST_SEED = 100_000


def _batched_seeds(case: int) -> list[int]:
    """The seeds of the case's functions without random draws (vmap and batched
    cotangents apply)."""
    seeds, seed = [], BATCHED_FIRST_SEED + 1000 * case
    while len(seeds) < BATCHED_PER_CASE:
        if generate(seed).differentiable_batches:
            seeds.append(seed)
        seed += 1
    return seeds


@pytest.mark.parametrize("case", range(BATCHED_CASES))
def test_generated_functions_batched(case):
    """``torch.func.vmap`` (functions whose control flow reads no argument's value),
    ``jacobian(vectorize=True)`` and ``torch.func.jacrev`` of the compiled QNode against
    the QNode row by row and its plain Jacobian, over three calls of a key."""
    seeds = _batched_seeds(case)
    assert any(generate(seed).vmappable for seed in seeds)
    failures = _failures_of(
        seeds, lambda seed, accumulation: check_batched(generate(seed), accumulation)
    )
    assert not failures, _report(failures, len(seeds) * len(ACCUMULATIONS))


# --- the issue's examples -------------------------------------------------------------------

_CHANGING_G = GlobalSpec("g", "tensor", (), "rebind", "every", (), every=True)
_G_EDITED_IN_PLACE = GlobalSpec("g", "tensor", (), "inplace", "every", (), every=True)

ISSUE_EXAMPLES = {
    "x + torch.rand(())": ("qml.RX(x + torch.rand(()), 0)", ()),
    "x * torch.randn(())": ("qml.RX(x * torch.randn(()), 0)", ()),
    "x + torch.rand(1)[0]": ("qml.RX(x + torch.rand(1)[0], 0)", ()),
    "x * torch.stack([g, g])[0], g rebound": (
        "qml.RX(x * torch.stack([g, g])[0], 0)",
        (_CHANGING_G,),
    ),
    "x * torch.stack([g, g])[0], g edited in place": (
        "qml.RX(x * torch.stack([g, g])[0], 0)",
        (_G_EDITED_IN_PLACE,),
    ),
    "x + torch.tensor(np.random.rand())": ("qml.RX(x + torch.tensor(np.random.rand()), 0)", ()),
}


@pytest.mark.parametrize("accumulation", ACCUMULATIONS)
@pytest.mark.parametrize("name", list(ISSUE_EXAMPLES))
def test_the_issues_examples(name, accumulation):
    """Each example of issue 45 over 10 calls (new values of ``x`` each call, torch and
    numpy seeded alike before the compiled call and the QNode's): the QNode's values,
    gradients and generator states at every call."""
    gate, globals_ = ISSUE_EXAMPLES[name]
    source = f"def circuit(x):\n    {gate}\n    return qml.expval(qml.Z(0))\n"
    spec = from_source(source, 1, {"x": ()}, globals_=globals_, random=not globals_, seed=45)
    report = check(spec, calls=10, grad_accumulation=accumulation)
    assert report.compared == 10


# --- the generator and the checker ----------------------------------------------------------


def _fingerprint(first: int, count: int) -> str:
    digest = hashlib.sha256()
    for seed in range(first, first + count):
        spec = generate(seed)
        digest.update(spec.source.encode())
        digest.update(repr(plan_calls(spec, CALLS)).encode())
    return digest.hexdigest()


def test_the_generator_is_deterministic():
    """The same seed gives the same function and calls, in this process and in another
    one with another hash seed; other seeds give other functions."""
    for seed in range(20):
        assert generate(seed) == generate(seed)
        assert plan_calls(generate(seed), CALLS) == plan_calls(generate(seed), CALLS)
    assert len({generate(seed).source for seed in range(50)}) == 50
    tests = Path(__file__).resolve().parents[1]
    script = (
        f"import sys; sys.path[:0] = [{str(tests / 'compiled')!r}, {str(tests)!r}]; "
        "from test_compiled_generator import _fingerprint; print(_fingerprint(0, 40))"
    )
    environment = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == _fingerprint(0, 40)


def test_the_generator_covers_its_features():
    """The first 200 functions (the parametrized cases') hold every feature the module
    docstring names."""
    specs = [generate(seed) for seed in range(CASES * FUNCTIONS_PER_CASE)]
    sources = "\n".join(spec.source for spec in specs)
    for text in (
        "torch.rand(", "torch.randn(", "torch.randint(", "torch.rand_like(", "torch.randn_like(",
        "torch.normal(", "torch.bernoulli(", "torch.multinomial(", "torch.poisson(",
        "dropout(", "generator=GEN", "np.random.rand()", "torch.tensor(np.float64(",
        "torch.zeros(", "torch.ones(", "torch.arange(", "torch.linspace(", "torch.full(",
        "torch.eye(", "torch.stack([G", "torch.cat([", "torch.where(", "torch.clamp(",
        ".reshape(", ".T", ".sum()", ".mean()", ".prod()", "float(", ".item()", "range(k)",
        "qml.RX(", "qml.RY(", "qml.RZ(", "qml.Rot(", "qml.CRX(", "qml.IsingZZ(",
        "qml.PhaseShift(", "qml.PauliRot(", "qml.AngleEmbedding(", "qml.StronglyEntanglingLayers(",
        "qml.probs(", "qml.expval(", "torch.as_tensor(", "torch.from_numpy(",
    ):  # fmt: skip
        assert text in sources, text
    assert {spec.n_wires for spec in specs} == {2, 3, 4}
    assert {spec.aliasing for spec in specs} == {"none", "same", "views", "strided"}
    assert {spec.updates for spec in specs} >= {"fresh", "optimizer", "data", "fixed", "mixed"}
    assert {spec.dtypes for spec in specs} == {"float64", "alternate", "block"}
    assert any(spec.keyword_orders and len(spec.keyword_orders) > 1 for spec in specs)
    assert any(spec.k_values for spec in specs) and any(spec.a_values for spec in specs)
    kinds = {(g.kind, g.how) for spec in specs for g in spec.globals_}
    assert kinds >= {("tensor", "rebind"), ("tensor", "inplace"), ("float", "rebind")}
    assert kinds >= {("numpy_scalar", "rebind"), ("numpy_array", "inplace")}
    assert any(spec.verify_every is None for spec in specs)
    assert sum(not all(p.exact for p in plan_calls(spec, CALLS)) for spec in specs) >= 5


def _plans(seen: list, keys=None) -> list[CallPlan]:
    """Plans of calls whose globals the traces see as ``seen`` (one entry per call);
    ``keys``: per call the dtype (another dtype: another key)."""
    plans = []
    for index, state in enumerate(seen, start=1):
        dtype = keys[index - 1] if keys else torch.float64
        plans.append(CallPlan(index, dtype, -1, None, None, "fixed", (), (state,)))
    return plans


def _stale(changes, verify_every=DEFAULT, calls: int = 20, keys=None) -> list[int]:
    """The calls that may be stale where one global changes before the calls ``changes``."""
    seen = [sum(c <= index for c in changes) for index in range(1, calls + 1)]
    planned = _stale_allowed(_plans(seen, keys), verify_every, calls)
    return [plan.index for plan in planned if not plan.exact]


def test_the_calls_the_contract_lets_stay_stale():
    """A change at the key's call 3 (the proving trace), at a verification call (4, 8, 16)
    or at every call is exact from then on; one at call 2 is trusted by the trace (a later
    one may be stale); at call 5 it may stay stale until call 8, at call 17 until call 32;
    without verification for good; another key (float32 at every other call) counts its
    own calls; a global that only an ``if`` reads changes what the traces see where the
    branch changes."""
    assert verification_calls(DEFAULT, 600) == [4, 8, 16, 32, 64, 128, 256, 512]
    assert verification_calls(None, 600) == []
    for changes in ((2,), (3,), (4,), (8,), (16,), (3, 9), tuple(range(2, 21))):
        assert _stale(changes) == [], changes
    assert _stale((2, 9)) == [9, 10, 11, 12, 13, 14, 15]
    assert _stale((5,)) == [5, 6, 7]
    assert _stale((5, 6)) == [5, 6, 7]
    assert _stale((17,)) == [17, 18, 19, 20]
    assert _stale((5,), verify_every=None) == list(range(5, 21))
    assert _stale((3, 9), verify_every=None) == []
    alternating = [torch.float32 if i % 2 == 0 else torch.float64 for i in range(1, 21)]
    # call 9 is the float64 key's call 5, call 10 the float32 key's call 5
    assert _stale((9,), keys=alternating) == [9, 10, 11, 12, 13, 14]
    branch = GlobalSpec("S", "float", (), "rebind", "every", (), every=True, condition=True)
    seen = [branch.seen(3, version) for version in range(20)]
    # S > 0 at calls 6, 8, 9, 10, ... only: call 6 may be stale, call 8 verifies
    assert seen[:8] == [False] * 5 + [True, False, True]
    assert [p.index for p in _stale_allowed(_plans(seen), DEFAULT, 20) if not p.exact] == [6]


class _Perturbed:
    """The QNode, its result off by 1e-7 at call ``off_at`` and drawing one extra random
    number at call ``draws_at``: what ``check`` must report."""

    def __init__(self, qnode, off_at: int, draws_at: int):
        self.qnode, self.off_at, self.draws_at, self.calls = qnode, off_at, draws_at, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        result = self.qnode(*args, **kwargs)
        if self.calls == self.draws_at:
            torch.rand(())
        return result + 1e-7 if self.calls == self.off_at else result


@pytest.mark.parametrize(
    ("off_at", "draws_at", "expected"),
    [
        (7, 0, "at call 7 (call 7 of its key"),
        (0, 4, "random generator states after the calls differ: torch's default generator"),
    ],
    ids=["a value", "a draw"],
)
def test_the_check_reports_what_differs_with_the_source(monkeypatch, off_at, draws_at, expected):
    source = "def circuit(x):\n    qml.RY(torch.sin(x) * 2, 0)\n    return qml.expval(qml.Z(0))\n"
    spec = from_source(source, 1, {"x": ()})
    monkeypatch.setattr(
        compiled_generator, "compile_qnode", lambda qnode, _: _Perturbed(qnode, off_at, draws_at)
    )
    with pytest.raises(AssertionError) as raised:
        check(spec, calls=10)
    message = str(raised.value)
    assert expected in message
    assert source in message
    if off_at:
        assert "results differ" in message
