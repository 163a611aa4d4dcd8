"""The batching module: one group-by (first-appearance order, exact keys) and one
chunk-by-memory (consecutive items whose tally fits a budget), and that the forward pass
and the deferred sweep both batch through it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pennylane as qml
import pytest
from conftest import DEVICE, stable_seed
from pennylane.devices import ExecutionConfig

from pennylane_custatevec import batching, direct, exact, simulate
from pennylane_custatevec.batching import Budget, Chunk, Group, Sum
from pennylane_custatevec.gradients.deferred import SweepKey

ATOL = 1e-10


class FreeMemory:
    """A backend that only reports its free memory, and counts the queries."""

    def __init__(self, free: int | None):
        self.free = free
        self.queries = 0

    def available_bytes(self) -> int:
        self.queries += 1
        if self.free is None:
            raise AssertionError("free memory was queried")
        return self.free


def refuse(_item):
    raise AssertionError("an item was looked at")


@pytest.fixture
def checked(monkeypatch):
    """Every group is chunked against its budget, however small."""
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)


def chunk_indices(chunks: list[Chunk]) -> list[tuple[int, ...]]:
    return [chunk.indices for chunk in chunks]


def whole(items) -> Group:
    return Group("key", tuple(range(len(items))))


# ---------------------------------------------------------------------------------------
# Group-by


def test_groups_in_first_appearance_order():
    groups = batching.group_by(["b", "a", "b", "c", "a"], lambda item: item)
    assert groups == [Group("b", (0, 2)), Group("a", (1, 4)), Group("c", (3,))]


def test_groups_of_the_indices_given():
    groups = batching.group_by(["b", "a", "b", "c", "a"], lambda item: item, [1, 2, 4])
    assert groups == [Group("a", (1, 4)), Group("b", (2,))]


@pytest.mark.parametrize("indices", [None, [2]], ids=["one_item", "one_index"])
def test_a_lone_item_builds_no_key(indices):
    items = ["only"] if indices is None else ["a", "b", "c"]
    expected = (0,) if indices is None else (2,)
    assert batching.group_by(items, refuse, indices) == [Group(None, expected)]


def test_no_items_no_groups():
    assert batching.group_by([], refuse) == []


def test_groups_by_exact_measurement_keys():
    """Equal observables in other arrays group together; one bit of difference in a
    matrix, or another wire, does not."""
    rng = np.random.default_rng(stable_seed("batching-exact"))
    matrix = rng.normal(size=(4, 4))
    matrix = matrix + matrix.T
    nudged = matrix.copy()
    nudged[1, 2] = nudged[2, 1] = np.nextafter(nudged[1, 2], np.inf)
    measurements = [
        [qml.expval(qml.Hermitian(matrix, wires=[0, 1]))],
        [qml.expval(qml.Hermitian(nudged, wires=[0, 1]))],
        [qml.expval(qml.Hermitian(matrix.copy(), wires=[0, 1]))],
        [qml.expval(qml.Hermitian(matrix, wires=[1, 0]))],
    ]
    groups = batching.group_by(measurements, exact.measurements_key)
    assert [group.indices for group in groups] == [(0, 2), (1,), (3,)]


# ---------------------------------------------------------------------------------------
# Chunk-by-memory


@pytest.mark.parametrize(
    "limit, expected",
    [(349, [(0, 1), (2, 3)]), (350, [(0, 1, 2), (3,)]), (351, [(0, 1, 2), (3,)])],
    ids=["just_under", "exactly_at", "just_over"],
)
@pytest.mark.parametrize("source", ["cap", "free_memory"])
def test_chunks_at_the_budget_boundary(limit, expected, source, checked):
    """Items of 100 bytes and a chunk overhead of 50: three take 350 bytes."""
    items = [100] * 4
    tally = Sum(lambda size: size, overhead=50)
    if source == "cap":
        backend, budget = FreeMemory(None), Budget(cap=limit, free_memory=False)
    else:
        backend, budget = FreeMemory(limit), Budget()
    chunks = batching.chunk_by_memory(backend, whole(items), items, tally, budget)
    assert chunk_indices(chunks) == expected
    assert backend.queries == (source == "free_memory")  # asked once for the group


def test_an_item_over_the_budget_runs_alone(checked):
    items = [100, 500, 100, 100, 400]
    chunks = batching.chunk_by_memory(
        FreeMemory(300), whole(items), items, Sum(lambda size: size), Budget()
    )
    assert chunk_indices(chunks) == [(0,), (1,), (2, 3), (4,)]


def test_chunks_keep_the_group_order(checked):
    """A group's indices need not be consecutive: chunks are consecutive runs of them."""
    items = [100, 999, 100, 999, 100, 100]
    group = Group("key", (0, 2, 4, 5))
    chunks = batching.chunk_by_memory(
        FreeMemory(250), group, items, Sum(lambda size: size), Budget()
    )
    assert chunk_indices(chunks) == [(0, 2), (4, 5)]


@pytest.mark.parametrize("free, expected", [(200, [(0, 1), (2, 3)]), (1000, [(0, 1, 2), (3,)])])
def test_the_smaller_of_cap_and_free_memory(free, expected, checked):
    items = [100] * 4
    chunks = batching.chunk_by_memory(
        FreeMemory(free), whole(items), items, Sum(lambda size: size), Budget(cap=300)
    )
    assert chunk_indices(chunks) == expected


@dataclasses.dataclass(frozen=True)
class Widest:
    """A tally that is not a sum: every item of a chunk takes as much as its largest."""

    count: int = 0
    largest: int = 0

    def add(self, size: int) -> Widest:
        return Widest(self.count + 1, max(self.largest, size))

    def bytes(self) -> int:
        return self.count * self.largest


def test_chunks_by_the_running_tally(checked):
    """Two items of 10 take 20; a third of 40 would make the chunk 120 > 80, so it starts
    the next chunk, where one more of 10 makes 2 * 40 = 80, at the budget."""
    items = [10, 10, 40, 10, 10]
    chunks = batching.chunk_by_memory(FreeMemory(80), whole(items), items, Widest(), Budget())
    assert chunk_indices(chunks) == [(0, 1), (2, 3), (4,)]


def test_small_groups_skip_the_memory_query(monkeypatch):
    """A group of at most simulate.UNCHECKED_BYTES is one chunk, whatever the budget, and
    free memory is not asked."""
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 400)
    items = [100] * 4
    chunks = batching.chunk_by_memory(
        FreeMemory(None), whole(items), items, Sum(lambda size: size), Budget(cap=150)
    )
    assert chunk_indices(chunks) == [(0, 1, 2, 3)]
    items = [100] * 5  # 500 bytes: checked
    chunks = batching.chunk_by_memory(
        FreeMemory(1000), whole(items), items, Sum(lambda size: size), Budget(cap=150)
    )
    assert chunk_indices(chunks) == [(0,), (1,), (2,), (3,), (4,)]


def test_a_lone_item_is_one_chunk_unlooked_at(checked):
    group = Group(None, (3,))
    chunks = batching.chunk_by_memory(FreeMemory(None), group, [0] * 4, Sum(refuse), Budget())
    assert chunk_indices(chunks) == [(3,)]


def test_no_limit_one_chunk(checked):
    items = [10**12] * 3
    budget = Budget(cap=None, free_memory=False)
    chunks = batching.chunk_by_memory(
        FreeMemory(None), whole(items), items, Sum(lambda size: size), budget
    )
    assert chunk_indices(chunks) == [(0, 1, 2)]


def test_forward_budgets(checked):
    """The forward pass: at most BATCH_BYTES, and at most the free memory unless its kept
    states were checked to fit together (then free memory is not asked)."""
    half = batching.BATCH_BYTES // 2
    items = [half] * 3
    tally = Sum(lambda size: size)
    kept = batching.chunk_by_memory(
        FreeMemory(None), whole(items), items, tally, batching.FORWARD_KEPT
    )
    assert chunk_indices(kept) == [(0, 1), (2,)]
    roomy = batching.chunk_by_memory(
        FreeMemory(8 * half), whole(items), items, tally, batching.FORWARD
    )
    assert chunk_indices(roomy) == [(0, 1), (2,)]
    tight = batching.chunk_by_memory(FreeMemory(half), whole(items), items, tally, batching.FORWARD)
    assert chunk_indices(tight) == [(0,), (1,), (2,)]
    assert batching.SWEEP == Budget(cap=None, free_memory=True)


def test_sum_tally():
    tally = batching.tally_of(Sum(lambda size: 2 * size, overhead=5), [1, 2, 3], [0, 2])
    assert tally.bytes() == 5 + 2 + 6


# ---------------------------------------------------------------------------------------
# The forward pass and the deferred sweep batch through this module


def returned_indices(spy) -> list[list[tuple[int, ...]]]:
    """Per call of a spied group_by or chunk_by_memory: the indices of what it returned."""
    return [[part.indices for part in returned] for returned in spy.spy_return_list]


def lookalike_tapes() -> list[qml.tape.QuantumScript]:
    """IsingXY and SingleExcitation compile to the same kernels (one 4x4 matrix each) and
    differ in their generators."""
    prep = [qml.Hadamard(0), qml.RY(0.4, wires=1)]
    measured = [qml.expval(qml.Z(0) @ qml.X(1))]
    gates = [qml.IsingXY(0.1, [0, 1]), qml.SingleExcitation(0.2, [0, 1]), qml.IsingXY(0.3, [0, 1])]
    tapes = [qml.tape.QuantumScript(prep + [gate], measured) for gate in gates]
    for tape in tapes:
        tape.trainable_params = [1]
    return tapes


def test_forward_and_sweep_group_through_batching(mocker, monkeypatch):
    """One forward batch of the three tapes (same kernel key, same measurements), and two
    sweep batches (sweep keys tell the generators apart): tapes 0 and 2, then tape 1. The
    general path's batching is tested: tape 2, of tape 0's structure, would run directly
    (direct.py), on its own."""
    monkeypatch.setattr(direct, "plan_of", lambda backend, structure: None)
    groups = mocker.spy(batching, "group_by")
    chunks = mocker.spy(batching, "chunk_by_memory")
    dev = qml.device(DEVICE, wires=2, backend="cpu", grad_accumulation="deferred")
    config = dev.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    tapes = lookalike_tapes()
    results, jacobians = dev.execute_and_compute_derivatives(tapes, config)
    assert returned_indices(groups) == [[(0, 1, 2)], [(0, 2), (1,)]]
    forward, sweep = groups.spy_return_list
    assert not isinstance(forward[0].key, SweepKey)
    assert all(isinstance(group.key, SweepKey) for group in sweep)
    assert returned_indices(chunks) == [[(0, 1, 2)], [(0, 2)], [(1,)]]
    eager = qml.device(DEVICE, wires=2, backend="cpu", grad_accumulation="eager")
    expected_results, expected = eager.execute_and_compute_derivatives(tapes, config)
    np.testing.assert_allclose(np.array(results), np.array(expected_results), atol=ATOL)
    np.testing.assert_allclose(np.array(jacobians), np.array(expected), atol=ATOL)


def test_forward_chunks_by_state_bytes(mocker, monkeypatch):
    """Four tapes of one structure, the second broadcast over three entries, with free
    memory for three state vectors: the forward chunks hold at most three vectors."""
    monkeypatch.setattr(simulate, "UNCHECKED_BYTES", 0)
    chunks = mocker.spy(batching, "chunk_by_memory")
    dev = qml.device(DEVICE, wires=2, backend="cpu")
    vector = simulate.state_bytes(dev._backend, 2, 1)
    monkeypatch.setattr(dev._backend, "available_bytes", lambda: 3 * vector)
    angles = [0.3, np.array([0.1, -0.7, 2.2]), 1.3, -0.6]
    tapes = [  # probs: Pauli expvals of a known structure would run directly, unbatched
        qml.tape.QuantumScript([qml.RX(angle, wires=0), qml.CNOT([0, 1])], [qml.probs(wires=1)])
        for angle in angles
    ]
    results = dev.execute(tapes)
    assert returned_indices(chunks) == [[(0,), (1,), (2, 3)]]
    expected = qml.device("default.qubit", wires=2).execute(tapes)
    for ours, theirs in zip(results, expected, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=ATOL)


@pytest.mark.parametrize("grad_accumulation", ["deferred", "eager"])
def test_tapes_whose_steps_differ_but_kernels_agree_run_as_one_batch(grad_accumulation):
    """An identity compiles to no instruction: [I, RX(a), H] and [RX(b), I, H] run the same
    kernels with their steps grouped differently. Merging them zipped the steps and
    crashed (qml.cut_circuit's fragment tapes met it); it joins the instructions now. Their
    derivatives (each tape's own compilation, from the kept states) are default.qubit's."""
    tapes = [
        qml.tape.QuantumScript(ops, [qml.expval(qml.Z(0) @ qml.X(1))], trainable_params=[0])
        for ops in (
            [qml.Identity(0), qml.RX(0.3, 0), qml.Hadamard(1), qml.CNOT([1, 0])],
            [qml.RX(0.5, 0), qml.Identity(0), qml.Hadamard(1), qml.CNOT([1, 0])],
            [qml.RX(0.7, 0), qml.Hadamard(1), qml.Identity(1), qml.CNOT([1, 0])],
        )
    ]
    ours = qml.device(DEVICE, wires=2, grad_accumulation=grad_accumulation)
    reference = qml.device("default.qubit", wires=2)
    np.testing.assert_allclose(ours.execute(tapes), reference.execute(tapes), atol=ATOL)
    config = ours.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
    results, jacobians = ours.execute_and_compute_derivatives(tapes, config)
    expected = [
        qml.gradients.param_shift(t)[1](reference.execute(qml.gradients.param_shift(t)[0]))
        for t in tapes
    ]
    np.testing.assert_allclose(results, reference.execute(tapes), atol=ATOL)
    np.testing.assert_allclose(np.ravel(jacobians), np.ravel(expected), atol=ATOL)
