"""Operators built by the device, kept out of every recording.

PennyLane records the operators of a quantum function into one process-global queue
(``qml.QueuingManager``): any operator constructed while a queue is active is appended
to it, whichever thread constructs it. The device builds operators while it prepares
and runs circuits (gathered rotations, decompositions, a template's gates, generators,
diagonalizing gates, ...). Built while another thread records a QNode, they would land
in that thread's tape; and ``QueuingManager.stop_recording()`` alone hides the queue
from every thread, so that thread's own operators would be dropped meanwhile.

A recording holds the lock of its queue class for as long as it records (PennyLane's
``AnnotatedQueue`` and ``QuantumTape`` each take their class's lock on entry), so the
device takes those locks, waiting for any other thread's recording to end, and then
stops recording in its own thread (a QNode may call the device while it records). Both
locks are re-entrant: a thread that records and calls the device does not wait on itself.
"""

from __future__ import annotations

import functools

import pennylane as qml
from pennylane.operation import Operator
from pennylane.queuing import AnnotatedQueue, QueuingManager
from pennylane.tape import QuantumTape
from pennylane.transforms.core import CompilePipeline, Transform

_RECORDING_QUEUES = (AnnotatedQueue, QuantumTape)
"""The queue classes whose ``_lock`` a recording holds (QuantumTape has its own)."""


class without_queuing:  # lower case: used as a function, ``with without_queuing():``
    """Operators constructed inside are queued nowhere: no other thread is recording
    (its recording ends first), and this thread's recording, if any, is paused. A class
    rather than a generator: it runs around every transform of the preprocessing."""

    __slots__ = ("_locks", "_paused")

    def __enter__(self) -> None:
        self._locks = [queue._lock for queue in _RECORDING_QUEUES]  # now: tests swap them
        _acquire_all(self._locks)
        # with the locks held no other thread records: only this thread's can be active
        self._paused = QueuingManager.stop_recording() if QueuingManager.recording() else None
        if self._paused is not None:
            self._paused.__enter__()

    def __exit__(self, *exc) -> None:
        try:
            if self._paused is not None:
                self._paused.__exit__(*exc)
        finally:
            for lock in reversed(self._locks):
                lock.release()


def recording_elsewhere() -> bool:
    """Whether the active recording belongs to another thread: its queue class's lock,
    which the recording thread holds, is not held by this one."""
    active = QueuingManager.active_context()
    if active is None:
        return False
    lock = getattr(type(active), "_lock", None)
    is_owned = getattr(lock, "_is_owned", None)  # what threading.Condition asks an RLock
    return is_owned is not None and not is_owned()


def generator_of(op: Operator) -> Operator:
    """``op.generator()``, built ``without_queuing``."""
    with without_queuing():
        return op.generator()


def diagonalizing_gates_of(obs: Operator) -> list[Operator]:
    """``obs.diagonalizing_gates()``, built ``without_queuing``."""
    with without_queuing():
        return obs.diagonalizing_gates()


def matrix_of(op: Operator, wire_order=None):
    """``qml.matrix(op, wire_order)``, whose decompositions are built ``without_queuing``."""
    with without_queuing():
        return qml.matrix(op, wire_order=wire_order)


def _acquire_all(locks: list) -> None:
    """Take every lock without holding one while waiting for another, so that a thread
    that takes them in the other order (a QNode recorded inside a tape's recording, or a
    tape inside a QNode's) cannot deadlock with this one."""
    while True:
        locks[0].acquire()
        for i in range(1, len(locks)):
            if not locks[i].acquire(blocking=False):
                for held in reversed(locks[:i]):
                    held.release()
                locks[i].acquire()  # wait for the recording that holds it to end
                locks[i].release()
                break
        else:
            return


@functools.cache
def transform_without_queuing(pennylane_transform: Transform) -> Transform:
    """``pennylane_transform`` with its tape transform and its expansion run
    ``without_queuing`` (the rest of it as it is)."""
    expand = pennylane_transform.expand_transform
    return Transform(
        _unqueued(pennylane_transform.tape_transform),
        setup_inputs=pennylane_transform.setup_inputs,
        expand_transform=None if expand is None else _unqueued(expand),
        classical_cotransform=pennylane_transform.classical_cotransform,
        is_informative=pennylane_transform.is_informative,
        final_transform=pennylane_transform.is_final_transform,
        plxpr_transform=pennylane_transform.plxpr_transform,
    )


def _unqueued(function):
    @functools.wraps(function)
    def unqueued(*args, **kwargs):
        with without_queuing():
            return function(*args, **kwargs)

    return unqueued


class PipelineWithoutQueuing(CompilePipeline):
    """A CompilePipeline whose transforms run ``without_queuing`` (see
    ``transform_without_queuing``): the device's preprocessing."""

    def add_transform(self, transform: Transform, *targs, **tkwargs):
        super().add_transform(transform_without_queuing(transform), *targs, **tkwargs)
