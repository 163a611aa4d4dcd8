"""Programs captured with ``qml.capture.enable()``: the device's entry points for them
(``eval_jaxpr``, ``jaxpr_jvp``) and its entry points run with capture paused.

A captured program becomes a tape (PennyLane's ``plxpr_to_tape``) that runs through
PennyLane's workflow with capture paused, so that the device's whole preprocessing
applies; its mid-circuit measurements are deferred on the program first where they
must be (``program_transforms``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import pennylane as qml
from pennylane import math
from pennylane.devices import Device, ExecutionConfig
from pennylane.exceptions import DeviceError
from pennylane.measurements import Shots
from pennylane.tape import QuantumScript

from .queuing import PipelineWithoutQueuing, without_queuing


def _measures_mid_circuit(jaxpr) -> bool:
    """Whether a captured program (or a branch or body in it) measures mid-circuit."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "measure":
            return True
        for value in eqn.params.values():
            inner = value if isinstance(value, (tuple, list)) else (value,)
            for item in inner:
                item = getattr(item, "jaxpr", item)  # a ClosedJaxpr's jaxpr
                if hasattr(item, "eqns") and _measures_mid_circuit(item):
                    return True
    return False


def capture_paused(method):
    """Run a device entry point with PennyLane's program capture paused: a captured
    program under ``jax.jit`` reaches the device through PennyLane's pure callbacks,
    which run while the user's ``qml.capture.enable()`` is in force, and the device's
    operators and transforms are plain Python there (``eval_jaxpr``)."""

    @functools.wraps(method)
    def paused(*args, **kwargs):
        if not qml.capture.enabled():
            return method(*args, **kwargs)
        with qml.capture.pause():
            return method(*args, **kwargs)

    return paused


def traced_shots(shots) -> bool:
    """Whether a number of shots of ``shots`` (a ``Shots``, or what makes one) is a jax
    tracer (PennyLane's captured QNode under ``jax.jit``)."""
    counts = shots.shot_vector if isinstance(shots, Shots) else [shots]
    return any(
        math.is_abstract(getattr(count, "shots", count))
        or math.is_abstract(getattr(count, "copies", 1))
        for count in counts
    )


def _flat_results(result, tape: QuantumScript) -> list:
    """A tape's results as the flat list that ``eval_jaxpr`` returns: one entry per
    measurement, per shot copy first for a shot vector (the order of PennyLane's captured
    QNode, ``_capture_qnode._get_shapes_for``); none for a tape without measurements."""
    count = len(tape.measurements)
    if count == 0:
        return []
    copies = result if tape.shots.has_partitioned_shots else (result,)
    return [value for copy in copies for value in (copy if count > 1 else (copy,))]


def program_transforms(device: Device, config: ExecutionConfig) -> PipelineWithoutQueuing:
    """A captured program's preprocessing, on the program itself: with
    ``mcm_method="deferred"`` (the default there, as on default.qubit) PennyLane's
    ``defer_measurements`` for programs, which needs the number of wires (the device's)
    and turns a measurement's value used by classical processing (arithmetic,
    jax.numpy functions, a gate parameter) into controlled operations on the wires of
    the deferred measurements: ``plxpr_to_tape`` (``eval_jaxpr``) cannot rebuild such
    processing around a mid-circuit measurement. Without device wires, and with the
    other methods, the program reaches ``eval_jaxpr`` as it was captured."""
    pipeline = PipelineWithoutQueuing()
    if config.mcm_config.mcm_method in (None, "deferred") and device.wires is not None:
        pipeline.add_transform(qml.transforms.defer_measurements, num_wires=len(device.wires))
    return pipeline


def eval_jaxpr(
    device: Device,
    jaxpr,
    consts: list,
    *args,
    execution_config: ExecutionConfig | None = None,
    shots=None,
) -> list:
    """A program captured with ``qml.capture.enable()``: PennyLane's ``plxpr_to_tape``
    makes it a tape, which runs through PennyLane's workflow with capture paused, so
    that the device's whole preprocessing applies (``preprocess_transforms`` gives
    captured programs none). Values jax traces (``jax.jit``, differentiation) reach
    the device as in a jax QNode: ``jax.jit`` through a pure callback, derivatives by
    the method of ``execution_config`` ("best": adjoint)."""
    config = execution_config or ExecutionConfig()
    if shots is not None and traced_shots(shots):
        raise DeviceError(
            "custatevec.qubit cannot run a captured program whose numbers of shots are "
            "traced by jax (a QNode with shots under jax.jit with qml.capture enabled: "
            "PennyLane passes its shots as traced values, and a tape needs them as "
            "numbers). Call it without jax.jit, or build the QNode and call it with "
            "program capture disabled (qml.capture.disable()): jax.jit then runs it "
            "with its shots."
        )
    with without_queuing():
        # PennyLane's interpreter turns capture on as it evaluates: pause it after
        tape = qml.tape.plxpr_to_tape(jaxpr, consts, *args, shots=shots)
    with qml.capture.pause(), without_queuing():
        method = config.gradient_method
        result = qml.execute(
            [tape],
            device,
            # each tape's own choice (parameter-shift with shots) unless one is set
            diff_method="best" if method in (None, "backprop", "adjoint") else method,
            gradient_kwargs=config.gradient_keyword_arguments,
            mcm_method=config.mcm_config.mcm_method,
            postselect_mode=config.mcm_config.postselect_mode,
        )[0]
    return _flat_results(result, tape)


def jaxpr_jvp(
    device: Device, jaxpr, args: Sequence, tangents: Sequence, execution_config=None
) -> tuple[list, list]:
    """The results of a captured program and their JVP: jax differentiates
    ``eval_jaxpr``, whose workflow takes the device's derivatives (adjoint)."""
    import jax  # noqa: PLC0415 - program capture is jax's

    consts: list = []
    if _measures_mid_circuit(jaxpr):
        # PennyLane hands this method the program without the device's preprocessing
        pipeline = program_transforms(device, execution_config or ExecutionConfig())
        if not len(pipeline):
            raise DeviceError(
                "custatevec.qubit differentiates a captured program with mid-circuit "
                "measurements by deferring them (mcm_method='deferred', on a device "
                "with wires: qml.device('custatevec.qubit', wires=n)); PennyLane's "
                "plxpr_to_tape cannot rebuild conditional operations from traced "
                "values. Or differentiate it with capture disabled "
                "(qml.capture.disable())."
            )
        deferred = pipeline(jaxpr, [], *args)
        jaxpr, consts = deferred.jaxpr, deferred.consts

    def run(*values):
        return device.eval_jaxpr(jaxpr, consts, *values, execution_config=execution_config)

    zeros = [
        jax.numpy.zeros_like(a) if type(t).__name__ == "Zero" else t
        for a, t in zip(args, tangents, strict=True)
    ]
    results, jvps = jax.jvp(run, tuple(args), tuple(zeros))
    return list(results), list(jvps)
