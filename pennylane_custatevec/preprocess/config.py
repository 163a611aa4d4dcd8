"""The device's execution configs: ``setup_execution_config``'s logic (the gradient and
mid-circuit measurement methods a config resolves to, the refusals that must run where
jax.jit traces the QNode's tape, the device options the preprocessing and the derivatives
read), and the answer, kept per ``adjoint_serve_key``, to whether the adjoint method
serves a circuit (what ``"best"`` asks on every call)."""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
from typing import Protocol

from pennylane.devices import ExecutionConfig
from pennylane.devices.capabilities import DeviceCapabilities, validate_mcm_method
from pennylane.exceptions import DeviceError, QuantumFunctionError, WireError
from pennylane.math import Interface
from pennylane.tape import QuantumScript

from ..settings import DifferentiationOptions
from ..structures import adjoint_serve_key
from .decompose import TracedDecompositionError
from .interfaces import refuse_traced_pulse_times
from .refusals import (
    SecondDerivativesError,
    refuse_differentiated_measurement_bases,
    refuse_shot_noise_fallback,
)

ADJOINT_VALIDATED_IN_PREPROCESSING = "adjoint_validated_in_preprocessing"
"""The key of ``ExecutionConfig.device_options`` that ``setup_execution_config`` sets (True)
in a config for the adjoint method: the preprocessing of that config
(``preprocess_transforms``) ends with ``validate_adjoint_differentiation``, so the
derivative entry points given it (``compute_derivatives``, ``compute_vjp``,
``compute_jvp``, ``execute_and_compute_*``) take its tapes as validated. Without it (a
direct call with a config of one's own, or none) they validate each tape themselves
(``gradients.validation.require_adjoint_serves``): a clear DeviceError, never a wrong number."""
MAX_SERVE_ANSWERS = 256
"""How many ``adjoint_serve_key`` answers a device keeps (least recently used out)."""
_SERVE_LOCK = threading.Lock()
"""Guards every device's answers (module-level: a device stays copyable and picklable)."""
TORCH_RECORDS_GRADIENTS = "torch_records_gradients"
"""device_options key: whether torch recorded gradients where the call was set up. PennyLane
runs the preprocessing inside its ``torch.autograd.Function``'s forward, where torch never
records, so a refusal there asks this instead of ``torch.is_grad_enabled()``."""

JAX_INTERFACES = frozenset({Interface.JAX, Interface.JAX_JIT})
"""Where PennyLane contracts the device Jacobian with tangents (forward mode)."""


class ConfiguredDevice(Protocol):
    """What the config logic reads of the device (``CuStateVecDevice``)."""

    capabilities: DeviceCapabilities

    def options_in_force(self, config: ExecutionConfig | None = None) -> DifferentiationOptions: ...

    def setup_execution_config(
        self, config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> ExecutionConfig: ...

    def adjoint_serving_transforms(self, config: ExecutionConfig): ...


def adjoint_serves(
    device: ConfiguredDevice,
    circuit: QuantumScript,
    config: ExecutionConfig,
    answers: collections.OrderedDict,
) -> bool:
    """Whether the adjoint method serves ``circuit``: the device's preprocessing for it
    (its ``setup_execution_config`` with ``gradient_method="adjoint"``, then the stages
    whose refusals decide, ``adjoint_serving_transforms``: ``pipeline.adjoint_serving``)
    runs without a refusal. Answered once per
    ``adjoint_serve_key`` and kept in ``answers`` (the device's; least recently used out
    past ``MAX_SERVE_ANSWERS``): the preprocessing ran on every call with "best"
    (``benchmarks/best_resolution.py``, W4: "best" over "adjoint" about 300 us per call
    before, 70 us after). The adjoint stage runs with the stages before it, as
    default.qubit's adjoint answer runs its decomposition and validation: they refuse
    circuits too."""
    key = adjoint_serve_key(circuit, config, device.options_in_force(config))
    if key is not None:
        with _SERVE_LOCK:  # threads may share a device
            answer = answers.get(key)
            if answer is not None:
                answers.move_to_end(key)
                return answer
    try:
        config = device.setup_execution_config(
            dataclasses.replace(config, gradient_method="adjoint"), circuit
        )
        device.adjoint_serving_transforms(config)((circuit,))
        answer = True
    except (SecondDerivativesError, TracedDecompositionError):
        raise  # every method but backpropagation would give zeros or fail: say so
    except (DeviceError, QuantumFunctionError, ValueError, WireError):
        # a circuit on wires the device lacks is refused when it runs, not here:
        # qml.draw and qml.specs resolve "best" without running it (as on default.qubit)
        answer = False
    if key is not None:
        with _SERVE_LOCK:
            if len(answers) >= MAX_SERVE_ANSWERS:
                answers.popitem(last=False)
            answers[key] = answer
    return answer


def execution_config(
    device: ConfiguredDevice,
    config: ExecutionConfig | None = None,
    circuit: QuantumScript | None = None,
) -> ExecutionConfig:
    """The device's ``setup_execution_config`` (see there): "best" and "device" become
    "adjoint" with device derivatives unless the user chose otherwise, the mid-circuit
    measurement method gets its default, the refusals that must see the QNode's own tape
    run, and the device options carry the options in force, whether the preprocessing
    validates for the adjoint method (``ADJOINT_VALIDATED_IN_PREPROCESSING``) and torch's
    grad mode (``TORCH_RECORDS_GRADIENTS``)."""
    config = config or ExecutionConfig()
    updates: dict = {}
    if config.gradient_method == "device" or (
        config.gradient_method == "best" and config.derivative_order == 1
    ):
        updates["gradient_method"] = "adjoint"
    if updates.get("gradient_method", config.gradient_method) == "adjoint":
        _require_first_derivatives(config)
        for field in (
            "use_device_gradient",
            "use_device_jacobian_product",
            "grad_on_execution",
        ):
            if getattr(config, field) is None:
                updates[field] = True
        if config.grad_on_execution is None and config.interface is Interface.TORCH:
            # the Jacobian in torch's backward pass, where a second derivative shows
            # (framework_values.refuse_differentiable_backward); from the state the forward kept
            updates["grad_on_execution"] = False
    method = updates.get("gradient_method", config.gradient_method)
    if circuit is not None and config.interface in JAX_INTERFACES:
        # here, where jax.jit traces, not in its callback
        refuse_traced_pulse_times(circuit, adjoint=method == "adjoint")
    if circuit is not None and method not in (None, "adjoint"):
        # here, before PennyLane's torch and jax interfaces fail on such an angle
        name = getattr(method, "__name__", str(method))
        refuse_differentiated_measurement_bases(circuit, name)
        if name == "param_shift":
            fallback_given = "fallback_fn" in config.gradient_keyword_arguments
            refuse_shot_noise_fallback(circuit, fallback_given)
    if config.interface is Interface.JAX and circuit is not None and _vmapped(circuit):
        # PennyLane's jax boundary without jit reads the values as numpy, which a
        # vmap's batch cannot be; its jit boundary (a pure callback) takes the batch
        # whole, as a broadcast: what default.qubit gives by tracing
        updates["interface"] = Interface.JAX_JIT
    shots_present = circuit is not None and bool(circuit.shots)
    mcm_method = config.mcm_config.mcm_method
    if mcm_method == "one-shot" and circuit is not None and not shots_present:
        raise ValueError(
            "Cannot use mcm_method='one-shot' for mid-circuit measurements without shots; "
            "set shots, or use mcm_method='deferred' for analytic results."
        )
    validate_mcm_method(device.capabilities, mcm_method, shots_present)
    if mcm_method is None:
        default = "one-shot" if shots_present else "deferred"
        updates["mcm_config"] = dataclasses.replace(config.mcm_config, mcm_method=default)
    # the options of the context in force now, for the backward pass that may run later
    device_options = dict(config.device_options)
    device_options.update(device.options_in_force(config).as_device_options())
    # decided here, never inherited: the preprocessing of this config validates or not
    device_options.pop(ADJOINT_VALIDATED_IN_PREPROCESSING, None)
    if updates.get("gradient_method", config.gradient_method) == "adjoint":
        device_options[ADJOINT_VALIDATED_IN_PREPROCESSING] = True
    device_options.pop(TORCH_RECORDS_GRADIENTS, None)
    if config.interface is Interface.TORCH:
        device_options[TORCH_RECORDS_GRADIENTS] = _torch_records_gradients()
    updates["device_options"] = device_options
    return dataclasses.replace(config, **updates)


def _require_first_derivatives(config: ExecutionConfig) -> None:
    """The adjoint method gives first derivatives only; PennyLane's own devices return zeros
    for the higher ones (``max_diff > 1``), this one refuses."""
    if config.derivative_order > 1:
        raise QuantumFunctionError(
            f"diff_method={config.gradient_method!r} (the adjoint method) computes first "
            f"derivatives only, but max_diff={config.derivative_order} asks for derivatives "
            "of higher order (a Hessian would be zero). Use diff_method='parameter-shift' "
            "(or 'best', which picks it when max_diff > 1), or max_diff=1."
        )


def _vmapped(circuit: QuantumScript) -> bool:
    """Whether a parameter of ``circuit`` is batched by ``jax.vmap`` (a batch tracer, or a
    tracer of differentiation whose primal values are one: ``jax.vmap(jax.grad(f))``)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return False
    for value in circuit.get_parameters(trainable_only=False):
        while isinstance(value, jax.core.Tracer):
            if type(value).__name__ == "BatchTracer":  # jax deprecates its public name
                return True
            value = getattr(value, "primal", None)  # JVPTracer, LinearizeTracer
    return False


def _torch_records_gradients() -> bool:
    """torch's grad mode here (False where torch was never imported: nothing records)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled()
