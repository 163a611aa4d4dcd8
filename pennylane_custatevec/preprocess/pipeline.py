"""The device's preprocessing pipeline (``preprocess_transforms``) as a list of named
stages: the boundary (jax.jit's root, ``qml.snapshots``), the refusals, the mid-circuit
measurements' bases, the decomposition, PennyLane's validation, and last the adjoint
method's stage or the sampling stage. Each stage adds its transforms, in order, to the
pipeline, reading the execution config and what the device is (``Target``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pennylane.devices import ExecutionConfig
from pennylane.devices.preprocess import (
    validate_device_wires,
    validate_measurements,
    validate_observables,
)
from pennylane.math import Interface
from pennylane.measurements import SampleMeasurement, StateMeasurement
from pennylane.transforms import defer_measurements, dynamic_one_shot
from pennylane.wires import Wires

from ..measure import SHADOW_MEASUREMENTS
from ..queuing import PipelineWithoutQueuing
from ..settings import DifferentiationOptions
from .adjoint import (
    entrywise_trainable_operators,
    refuse_differentiated_shares,
    validate_adjoint_differentiation,
)
from .broadcast import expand_broadcasts
from .config import JAX_INTERFACES, TORCH_RECORDS_GRADIENTS
from .decompose import (
    allocate_dynamic_wires,
    decompose_late_state_preps,
    decompose_templates_for_gradients,
    decompose_traced,
    gather_rotations,
)
from .gate_set import GateSet
from .interfaces import (
    complex_parameters_for_state,
    real_parameters_for_real_results,
    results_off_the_jit_root,
    split_state_from_real_results,
)
from .mid_circuit import (
    measure_in_computational_bases,
    measure_mid_circuit_values_on_their_wires,
    one_shot_where_sampled,
    snapshots_as_circuits,
)
from .refusals import (
    refuse_autograd_hessians_of_alike_measurements,
    refuse_channels,
    refuse_complex_parameters_under_gradient_transforms,
    refuse_differentiated_measurement_bases,
    refuse_higher_derivatives,
    refuse_postselection_under_gradient_transforms,
    refuse_purity_under_gradient_transforms,
)
from .sampled import rotate_sampled_measurements

TRACING_INTERFACES = JAX_INTERFACES | {Interface.AUTOGRAD}
"""Where a second derivative shows in the parameters the device's preprocessing sees
(nested autograd boxes or jax tracers: ``refusals.refuse_higher_derivatives``); torch's
shows in its backward pass (``framework_values.refuse_differentiable_backward``)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What the preprocessing reads of the device it prepares tapes for."""

    name: str
    wires: Wires | None
    gate_set: GateSet
    debugger: object | None
    """``qml.snapshots``' debugger (PennyLane sets the device's ``_debugger``), or None."""
    gather_results: bool
    """Whether every MPI rank gets whole states and probabilities (``mpi_gather``)."""
    options_in_force: Callable[[ExecutionConfig], DifferentiationOptions]


Stage = Callable[[PipelineWithoutQueuing, ExecutionConfig, Target], None]


def preprocessing(config: ExecutionConfig, target: Target) -> PipelineWithoutQueuing:
    """The device's preprocessing of ``config``: the ``STAGES``, then ``adjoint`` where the
    adjoint method differentiates, else ``sampling``."""
    pipeline = PipelineWithoutQueuing()  # operators built here are queued nowhere
    for stage in STAGES:
        stage(pipeline, config, target)
    last = adjoint if config.gradient_method == "adjoint" else sampling
    last(pipeline, config, target)
    return pipeline


def adjoint_serving(config: ExecutionConfig, target: Target) -> PipelineWithoutQueuing:
    """The stages whose refusals decide whether the adjoint method serves a circuit
    (``ADJOINT_SERVING_STAGES``, for ``config.adjoint_serves``: what ``"best"`` and
    ``supports_derivatives`` ask), ``config`` being an adjoint one."""
    pipeline = PipelineWithoutQueuing()
    for stage in ADJOINT_SERVING_STAGES:
        stage(pipeline, config, target)
    return pipeline


def boundary(pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target) -> None:
    """What wraps the whole run: under jax, results leave jax.jit's program through an
    identity (first: its post-processing comes last); under ``qml.snapshots``, each
    snapshot becomes a circuit of its own."""
    if config.interface in JAX_INTERFACES:  # first: its post-processing comes last
        pipeline.add_transform(results_off_the_jit_root)
    if target.debugger is not None and target.debugger.active:  # under qml.snapshots
        deferred = config.mcm_config.mcm_method == "deferred"
        pipeline.add_transform(snapshots_as_circuits, target.debugger, deferred=deferred)


def refusals(pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target) -> None:
    """Refusals by name of what PennyLane's gradient transforms and interfaces would
    differentiate wrongly (or as zeros), on the user's operations before any rewriting;
    for the adjoint method under jax, complex parameters cast to real, whose refusal
    names the user's gates too."""
    method = config.gradient_method
    name = getattr(method, "__name__", str(method))
    if method is not None and method != "adjoint":  # a PennyLane gradient transform
        torch_records = config.device_options.get(TORCH_RECORDS_GRADIENTS, True)
        pipeline.add_transform(
            refuse_postselection_under_gradient_transforms, name, torch_records=torch_records
        )
        pipeline.add_transform(
            refuse_complex_parameters_under_gradient_transforms,
            name,
            torch_records=torch_records,
        )
        pipeline.add_transform(
            refuse_purity_under_gradient_transforms, name, torch_records=torch_records
        )
        pipeline.add_transform(refuse_differentiated_measurement_bases, name)
    if method is not None and config.interface in TRACING_INTERFACES:
        # a gradient transform's pipeline runs inside the interface: jax's hides levels
        hides = method != "adjoint" and config.interface == Interface.JAX
        pipeline.add_transform(
            refuse_higher_derivatives,
            name,
            config.derivative_order,
            autograd=config.interface == Interface.AUTOGRAD,
            hidden=config.derivative_order if hides else 0,
        )
    if (
        method not in (None, "adjoint")
        and config.derivative_order > 1
        and config.interface == Interface.AUTOGRAD
    ):
        pipeline.add_transform(refuse_autograd_hessians_of_alike_measurements, name)
    if method == "adjoint" and config.interface in JAX_INTERFACES:
        pipeline.add_transform(real_parameters_for_real_results)  # the user's gates named


def measurement_bases(
    pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target
) -> None:
    """``qml.ftqc``'s measurements in other bases (and Pauli product measurements) as
    Z-basis measurements, before any method sees measurements; then, with
    ``mcm_method="deferred"``, the measurements deferred."""
    pipeline.add_transform(measure_in_computational_bases)
    if config.mcm_config.mcm_method == "deferred":
        pipeline.add_transform(defer_measurements, allow_postselect=True)


def decomposition(
    pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target
) -> None:
    """Decomposition to the gate set (``GateSet.stops_adjoint`` for the adjoint method,
    else ``runs_natively``), with what it makes and needs around it: late state
    preparations, gathered rotations, entrywise matrices, native templates, work wires.
    Noise channels are refused first, by name."""
    differentiating = config.gradient_method == "adjoint"
    pipeline.add_transform(refuse_channels)  # before decomposing: names default.mixed
    pipeline.add_transform(decompose_late_state_preps)
    # gathered before decomposing (fewer operations to inspect) and after (runs that
    # decompositions made, e.g. trainable Rot gates)
    pipeline.add_transform(gather_rotations)
    gate_set = target.gate_set
    pipeline.add_transform(
        decompose_traced,
        stopping_condition=gate_set.stops_adjoint if differentiating else gate_set.runs_natively,
        target_gates=gate_set.target_gates,
        device_wires=target.wires,
        name=target.name,
    )
    if differentiating:  # after decomposing: an adjoint's decomposition may make one
        pipeline.add_transform(entrywise_trainable_operators)
    # after decomposing: a decomposition may make a native template (a subclass's does)
    array_gradients = config.gradient_method is None or (
        differentiating and vjps_reach_the_device(config)
    )
    pipeline.add_transform(decompose_templates_for_gradients, array_gradients)
    pipeline.add_transform(gather_rotations)
    # work wires that decompositions allocate (qml.allocate, TemporaryAnd) take the
    # device's free wires, reused after a reset where mid-circuit measurements can reset
    pipeline.add_transform(
        allocate_dynamic_wires,
        target.wires,
        allow_resets=config.mcm_config.mcm_method != "deferred",
    )


def validation(pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target) -> None:
    """PennyLane's validation of the wires, measurements and observables."""
    pipeline.add_transform(validate_device_wires, target.wires, name=target.name)
    pipeline.add_transform(
        validate_measurements,
        analytic_measurements=lambda mp: isinstance(mp, StateMeasurement),
        sample_measurements=_is_sampled_measurement,
        name=target.name,
    )
    pipeline.add_transform(
        validate_observables,
        stopping_condition=target.gate_set.observable_supported,
        name=target.name,
    )


STAGES: tuple[Stage, ...] = (boundary, refusals, measurement_bases, decomposition, validation)
"""The stages every config runs, in order (``preprocessing``)."""


def adjoint(pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target) -> None:
    """The adjoint method's last stage: shares refused, measured values on their wires,
    broadcasts expanded where the sweep of the mode in force cannot take them whole, what
    the sweep does not differentiate measured through the state and then validated, and,
    for a Jacobian boundary, the state's parameters made complex."""
    vjp_boundary = vjps_reach_the_device(config)
    if not target.gather_results:
        pipeline.add_transform(refuse_differentiated_shares, target.wires)
    batched = target.options_in_force(config).grad_accumulation == "deferred"
    pipeline.add_transform(measure_mid_circuit_values_on_their_wires)
    pipeline.add_transform(expand_broadcasts, trainable_only=batched)
    # measures through the state what the sweep does not differentiate (before
    # the state's complex parameters, which that may call for), then validates
    pipeline.add_transform(
        validate_adjoint_differentiation,
        batched=batched,
        through_state=True,
        device_wires=target.wires,
        array_gradients=vjp_boundary,
    )
    if not vjp_boundary:
        if config.interface in JAX_INTERFACES:
            pipeline.add_transform(split_state_from_real_results)
        pipeline.add_transform(complex_parameters_for_state)


ADJOINT_SERVING_STAGES: tuple[Stage, ...] = (
    refusals,
    measurement_bases,
    decomposition,
    validation,
    adjoint,
)
"""The adjoint method's preprocessing without its ``boundary``, which refuses nothing
(an identity under jax.jit; snapshots split into circuits while ``qml.snapshots`` is
active, which ``adjoint_serve_key`` does not hold: without it the answer is one per key)."""


def sampling(pipeline: PipelineWithoutQueuing, config: ExecutionConfig, target: Target) -> None:
    """The last stage without the adjoint method: observables rotated where the device
    samples, and the mid-circuit measurement method's transforms."""
    mcm_method = config.mcm_config.mcm_method
    pipeline.add_transform(rotate_sampled_measurements)
    if mcm_method == "tree-traversal":
        # without shots every branch of one state (branches.py); with shots the
        # one-shot method, which samples the same distribution shot by shot
        pipeline.add_transform(expand_broadcasts, mid_measurements_only=True)
        pipeline.add_transform(
            one_shot_where_sampled, postselect_mode=config.mcm_config.postselect_mode
        )
    if mcm_method == "one-shot":
        pipeline.add_transform(dynamic_one_shot, postselect_mode=config.mcm_config.postselect_mode)


def vjps_reach_the_device(config: ExecutionConfig) -> bool:
    """Whether PennyLane's ML boundary asks the device for VJPs (``device_vjp=True``) rather
    than Jacobians: under ``jax.jit`` it always takes the Jacobian (its JVP contracts it,
    with the result's shape per scalar parameter), whatever ``device_vjp`` says, so the
    preprocessing must give it scalar parameters (no native template's weight arrays) and
    the dtypes a Jacobian boundary needs."""
    return bool(config.use_device_jacobian_product) and config.interface != Interface.JAX_JIT


def _is_sampled_measurement(mp) -> bool:
    return isinstance(mp, (SampleMeasurement, *SHADOW_MEASUREMENTS))
