"""Recording a QNode's quantum function for the compiled path: its tape (as
``QNode.construct`` builds it, without touching the QNode) and that tape's parameters as
numpy, and what the compiled path does not serve (``Unserved``)."""

from __future__ import annotations

import threading

import pennylane as qml
import torch
from pennylane.measurements import MidMeasureMP
from pennylane.ops import PauliMeasure
from pennylane.queuing import AnnotatedQueue
from pennylane.tape import QuantumScript
from torch._C import _functorch

from ..queuing import without_queuing
from .plans import as_numpy


class Unserved(Exception):
    """The compiled path cannot serve this call; the message is the reason."""


class _ThisThreadsQueue(AnnotatedQueue):
    """A recording of the operators that this thread builds only. PennyLane's queue is
    process-global: an operator that another thread builds outside any recording of its
    own (PennyLane's workflow converting a tape's parameters, say) would otherwise land in
    this one (the device's own operators are kept out by ``queuing.without_queuing``)."""

    def __init__(self):
        super().__init__()
        self._owner = threading.get_ident()

    def append(self, obj, **kwargs):
        if threading.get_ident() == self._owner:
            super().append(obj, **kwargs)

    def remove(self, obj):
        if threading.get_ident() == self._owner:
            super().remove(obj)

    def update_info(self, obj, **kwargs):
        if threading.get_ident() == self._owner:
            super().update_info(obj, **kwargs)


def numeric_tape(tape: QuantumScript) -> QuantumScript:
    """``tape`` with numpy parameters. Rebinding builds operators (a product observable's
    factors): ``without_queuing``, never into another thread's recording. Parameters that
    torch.func's transforms wrap (a first call under ``jacrev``: PennyLane's conversion
    cannot read them) are read below the transforms (``plans.as_numpy``, which refuses
    a vmap-batched one)."""
    with without_queuing():
        values = tape.get_parameters(trainable_only=False)
        if any(
            isinstance(value, torch.Tensor) and _functorch.is_functorch_wrapped_tensor(value)
            for value in values
        ):
            return tape.bind_new_parameters(
                [as_numpy(value) for value in values], list(range(len(values)))
            )
        (numeric,), _ = qml.transforms.convert_to_numpy_parameters(tape)
    return numeric


def record_call(qnode: qml.QNode, args, kwargs) -> tuple[QuantumScript, object]:
    """The QNode's tape for ``args``, ``kwargs`` and what its quantum function returned
    (as ``QNode.construct``, without touching the QNode). PennyLane's recording holds its
    queue's lock: two threads never record into one queue."""
    with _ThisThreadsQueue() as queue:
        output = qnode.func(*args, **kwargs)
    tape = QuantumScript.from_queue(queue, qnode.shots)
    if any(isinstance(op, (MidMeasureMP, PauliMeasure)) for op in tape.operations):
        raise Unserved("the circuit has mid-circuit measurements")
    if any(isinstance(op, qml.Projector) for op in tape.operations):
        # its derivative: the eager sweep, which the compiled lanes do not run
        raise Unserved("the circuit postselects (a Projector gate)")
    tape.trainable_params = qml.math.get_trainable_indices(
        tape.get_parameters(trainable_only=False)
    )
    return tape, output
