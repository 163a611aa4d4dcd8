"""The ``custatevec.qubit`` PennyLane device: options, preprocessing, execution."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pennylane as qml
from pennylane import math
from pennylane.devices import Device, ExecutionConfig
from pennylane.devices.capabilities import validate_mcm_method
from pennylane.devices.modifiers import simulator_tracking, single_tape_support
from pennylane.devices.preprocess import (
    decompose,
    validate_device_wires,
    validate_measurements,
    validate_observables,
)
from pennylane.exceptions import DeviceError, QuantumFunctionError
from pennylane.measurements import (
    ClassicalShadowMP,
    SampleMeasurement,
    ShadowExpvalMP,
    StateMeasurement,
)
from pennylane.tape import QuantumScript
from pennylane.transforms import defer_measurements, dynamic_one_shot
from pennylane.transforms.core import CompilePipeline

from . import adjoint, deferred, settings
from .backends import BACKEND_CHOICES, select_backend
from .execution import run_tapes
from .program import compiles_by_gate, wire_labels
from .rotations import PauliRotations
from .templates import NATIVE_TEMPLATES, is_native_template
from .transforms import (
    complex_parameters_for_state,
    decompose_late_state_preps,
    decompose_templates_for_gradients,
    expand_broadcasts,
    gather_rotations,
    rotate_sampled_measurements,
    validate_adjoint_differentiation,
)

_DTYPE_CHOICES = (np.complex128, np.complex64)
_MATRIX_DEFINED_OPS = (
    qml.QubitUnitary,
    qml.ControlledQubitUnitary,
    qml.DiagonalQubitUnitary,
    qml.BlockEncode,
    qml.operation.StatePrepBase,
)
"""Operations whose parameters are matrices or states: never decomposed for the adjoint
method, so that a trainable one is refused by name rather than silently expanded."""


DEFAULT_FUSION_QUBITS = {"cpu": 2, "custatevec": 4}
"""The largest fused block per backend when the device does not set it: what the
benchmarks chose (doc/options.md)."""


class UnknownOptionError(ValueError, TypeError):
    """A keyword the device does not take (a TypeError for Python, a ValueError for users)."""


def _rng_from_seed(seed) -> np.random.Generator:
    if isinstance(seed, str):
        if seed != "global":
            raise ValueError(
                f"seed={seed!r} is not valid: use an int, None, 'global' or a Generator."
            )
        seed = np.random.randint(0, 2**31 - 1)
    return np.random.default_rng(seed)


@simulator_tracking
@single_tape_support
class CuStateVecDevice(Device):
    """State-vector simulator on NVIDIA GPUs through cuStateVec, with a compiled CPU backend.

    Args:
        wires (int, Iterable): number of wires or their labels; ``None`` takes the
            wires of each circuit.
        shots (int, Sequence[int], None): default shots (deprecated on devices in
            PennyLane 0.45; prefer ``qml.set_shots``).
        seed (int, None, "global", numpy.random.Generator): seeds sampling and
            mid-circuit measurements; ``"global"`` draws the seed from numpy's global state.
        c_dtype (numpy.complex128, numpy.complex64): amplitude precision.
        backend ("auto", "cpu", "custatevec"): where state vectors live; "auto" is
            "custatevec" when cupy, cuQuantum and a GPU are usable, else "cpu" (with a
            warning saying why).
        device_id (int, None): the GPU of the custatevec backend; ``None`` takes
            $LOCAL_RANK when set (one process per GPU under torch.distributed), else the
            current CUDA device. Ignored by the CPU backend.
        grad_accumulation ("deferred", "eager"): how the adjoint method accumulates
            gradient contributions: "deferred" (fused blocks, one reduction per block,
            batched tapes, one transfer per batch) or "eager" (the textbook sweep).
        fusion_qubits (int, None): the largest block of fused gates, 0 to 6 (0 or 1: no
            fusion); ``None`` takes the backend's default.

    ``grad_accumulation`` and ``fusion_qubits`` can be overridden for a block of code or a
    function with :func:`pennylane_custatevec.options`.
    """

    config_filepath = Path(__file__).parent / "capabilities.toml"

    def __init__(
        self,
        wires=None,
        shots=None,
        *,
        seed="global",
        c_dtype=np.complex128,
        backend: str = "auto",
        device_id: int | None = None,
        grad_accumulation: str = "deferred",
        fusion_qubits: int | None = None,
        **unknown,
    ):
        if unknown:
            raise UnknownOptionError(
                f"custatevec.qubit got unknown option(s) {sorted(unknown)}; valid options are "
                "wires, shots, seed, c_dtype, backend, device_id, grad_accumulation, "
                "fusion_qubits."
            )
        settings.validate(grad_accumulation=grad_accumulation)
        if fusion_qubits is not None:
            settings.validate(fusion_qubits=fusion_qubits)
        if np.dtype(c_dtype) not in {np.dtype(d) for d in _DTYPE_CHOICES}:
            raise ValueError(
                f"c_dtype={c_dtype!r} is not supported; choose numpy.complex128 or numpy.complex64."
            )
        if backend not in BACKEND_CHOICES:
            raise ValueError(
                f"backend={backend!r} is not valid; choose one of {', '.join(BACKEND_CHOICES)}."
            )
        if device_id is not None and (
            isinstance(device_id, bool)
            or not isinstance(device_id, (int, np.integer))
            or device_id < 0
        ):
            raise ValueError(
                f"device_id={device_id!r} is not valid; use a GPU index (0, 1, ...) or None "
                "(LOCAL_RANK if set, else the current CUDA device)."
            )
        super().__init__(wires=wires, shots=shots)
        self._backend = select_backend(
            backend, np.dtype(c_dtype), None if device_id is None else int(device_id)
        )
        self._rng = _rng_from_seed(seed)
        self._final_states = _FinalStates()
        self._options = settings.DifferentiationOptions(
            grad_accumulation=grad_accumulation,
            fusion_qubits=(
                DEFAULT_FUSION_QUBITS[self._backend.name]
                if fusion_qubits is None
                else int(fusion_qubits)
            ),
        )

    @property
    def name(self) -> str:
        return "custatevec.qubit"

    @property
    def backend_name(self) -> str:
        """The backend in use: ``"cpu"`` or ``"custatevec"``."""
        return self._backend.name

    @property
    def c_dtype(self) -> np.dtype:
        return self._backend.dtype

    def options_in_force(self, config: ExecutionConfig | None = None):
        """The differentiation options of an execution: ``config.device_options`` (set by
        ``setup_execution_config``) over the context's overrides over the device's own."""
        return settings.resolve(self._options, config.device_options if config else None)

    def __repr__(self) -> str:
        wires = len(self.wires) if self.wires is not None else None
        gpu = getattr(self._backend, "device_id", None)
        where = self.backend_name if gpu is None else f"{self.backend_name}, device_id={gpu}"
        return f"<CuStateVecDevice: wires={wires}, backend={where}, c_dtype={self.c_dtype.name}>"

    def supports_derivatives(
        self, execution_config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> bool:
        """Adjoint differentiation. An explicit ``diff_method="adjoint"`` is always taken, so
        that a circuit it cannot serve gets an error naming the reason; ``"best"`` and
        ``"device"`` take it only for circuits it serves (else PennyLane's parameter-shift)."""
        if execution_config is None:
            return True
        method = execution_config.gradient_method
        if method == "adjoint":
            return True
        if method in ("best", "device"):
            return circuit is None or self._adjoint_serves(circuit, execution_config)
        return False

    def supports_vjp(
        self, execution_config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> bool:
        return self.supports_derivatives(execution_config, circuit)

    def _adjoint_serves(self, circuit: QuantumScript, config: ExecutionConfig) -> bool:
        try:
            config = self.setup_execution_config(
                dataclasses.replace(config, gradient_method="adjoint"), circuit
            )
            self.preprocess_transforms(config)((circuit,))
        except (DeviceError, QuantumFunctionError, ValueError):
            return False
        return True

    def setup_execution_config(
        self, config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> ExecutionConfig:
        """ "best" and "device" become "adjoint", which computes device gradients and VJPs
        (Jacobians on execution) unless the user chose otherwise; the mid-circuit
        measurement method defaults to "one-shot" with shots, else "deferred"."""
        config = config or ExecutionConfig()
        updates: dict = {}
        if config.gradient_method in ("best", "device"):
            updates["gradient_method"] = "adjoint"
        if updates.get("gradient_method", config.gradient_method) == "adjoint":
            for field in (
                "use_device_gradient",
                "use_device_jacobian_product",
                "grad_on_execution",
            ):
                if getattr(config, field) is None:
                    updates[field] = True
        shots_present = circuit is not None and bool(circuit.shots)
        mcm_method = config.mcm_config.mcm_method
        if mcm_method == "one-shot" and circuit is not None and not shots_present:
            raise ValueError(
                "Cannot use mcm_method='one-shot' for mid-circuit measurements without shots; "
                "set shots, or use mcm_method='deferred' for analytic results."
            )
        validate_mcm_method(self.capabilities, mcm_method, shots_present)
        if mcm_method is None:
            default = "one-shot" if shots_present else "deferred"
            updates["mcm_config"] = dataclasses.replace(config.mcm_config, mcm_method=default)
        # the options of the context in force now, for the backward pass that may run later
        in_force = self.options_in_force(config).as_device_options()
        updates["device_options"] = {**config.device_options, **in_force}
        return dataclasses.replace(config, **updates)

    def preprocess_transforms(self, execution_config: ExecutionConfig | None = None):
        config = execution_config or ExecutionConfig()
        mcm_method = config.mcm_config.mcm_method
        differentiating = config.gradient_method == "adjoint"
        pipeline = CompilePipeline()
        if mcm_method == "deferred":
            pipeline.add_transform(defer_measurements, allow_postselect=True)
        pipeline.add_transform(decompose_late_state_preps)
        array_gradients = config.gradient_method is None or (
            differentiating and config.use_device_jacobian_product
        )
        pipeline.add_transform(decompose_templates_for_gradients, array_gradients)
        # gathered before decomposing (fewer operations to inspect) and after (runs that
        # decompositions made, e.g. trainable Rot gates)
        pipeline.add_transform(gather_rotations)
        pipeline.add_transform(
            decompose,
            stopping_condition=self._stops_adjoint if differentiating else self._runs_natively,
            target_gates=self._target_gates,
            device_wires=self.wires,
            name=self.name,
        )
        pipeline.add_transform(gather_rotations)
        pipeline.add_transform(validate_device_wires, self.wires, name=self.name)
        pipeline.add_transform(
            validate_measurements,
            analytic_measurements=lambda mp: isinstance(mp, StateMeasurement),
            sample_measurements=_is_sampled_measurement,
            name=self.name,
        )
        pipeline.add_transform(
            validate_observables, stopping_condition=self._observable_supported, name=self.name
        )
        if differentiating:
            batched = self.options_in_force(config).grad_accumulation == "deferred"
            pipeline.add_transform(expand_broadcasts, trainable_only=batched)
            # measures through the state what the sweep does not differentiate (before
            # the state's complex parameters, which that may call for), then validates
            pipeline.add_transform(
                validate_adjoint_differentiation,
                batched=batched,
                through_state=True,
                device_wires=self.wires,
                array_gradients=bool(config.use_device_jacobian_product),
            )
            if not config.use_device_jacobian_product:
                pipeline.add_transform(complex_parameters_for_state)
            return pipeline
        pipeline.add_transform(rotate_sampled_measurements)
        if mcm_method == "one-shot":
            pipeline.add_transform(
                dynamic_one_shot, postselect_mode=config.mcm_config.postselect_mode
            )
        return pipeline

    @functools.cached_property
    def _target_gates(self) -> frozenset:
        """What decomposition aims at: the native gates and mid-circuit measurements."""
        return frozenset(self.capabilities.gate_set() | _MCM_OPS)

    def _runs_natively(self, op: qml.operation.Operator) -> bool:
        if isinstance(op, (qml.ops.MidMeasure, qml.ops.Conditional)):
            return True
        if isinstance(op, NATIVE_TEMPLATES):
            return is_native_template(op)
        if isinstance(op, PauliRotations):
            return True
        return self.capabilities.supports_operation(op)

    def _stops_adjoint(self, op: qml.operation.Operator) -> bool:
        """Native, and differentiable as it stands: trainable gates with several parameters
        (Rot, U3, CRot, ...) decompose into gates with one parameter and a generator. Native
        templates differentiate by their gates (decompose_templates_for_gradients decided
        which stay whole)."""
        if not self._runs_natively(op):
            return False
        if (
            isinstance(op, _MATRIX_DEFINED_OPS)
            or compiles_by_gate(op)
            or not any(math.requires_grad(d) for d in op.data)
        ):
            return True
        return op.num_params == 1 and op.has_generator

    def _observable_supported(self, obs: qml.operation.Operator) -> bool:
        return self.capabilities.supports_observable(obs.name)

    def execute(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        return self._execute(circuits, execution_config or ExecutionConfig())

    def _execute(self, circuits: Sequence[QuantumScript], config: ExecutionConfig):
        """Results; with adjoint differentiation, the final states are kept for the
        derivatives that usually follow (replacing, and so freeing, the previous ones)."""
        keep = {} if config.gradient_method == "adjoint" else None
        results = run_tapes(
            self._backend,
            circuits,
            self.wires,
            self._rng,
            config.mcm_config.postselect_mode,
            final_states=keep,
            fusion_qubits=self.options_in_force(config).fusion_qubits,
        )
        self._final_states.replace(circuits, keep or {})
        return results

    def compute_derivatives(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        in_force = self.options_in_force(execution_config)
        kept = [self._final_states.pop(tape) for tape in circuits]
        if in_force.grad_accumulation == "deferred":
            return deferred.jacobians(
                self._backend, circuits, self.wires, kept, in_force.fusion_qubits
            )
        return tuple(
            adjoint.jacobian(self._backend, tape, self.wires, *entry)
            for tape, entry in zip(circuits, kept, strict=True)
        )

    def execute_and_compute_derivatives(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self.compute_derivatives(circuits, config)

    def compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        in_force = self.options_in_force(execution_config)
        kept = [self._final_states.pop(tape) for tape in circuits]
        if in_force.grad_accumulation == "deferred":
            return deferred.vjps(
                self._backend, circuits, cotangents, self.wires, kept, in_force.fusion_qubits
            )
        return tuple(
            adjoint.vjp(self._backend, tape, dy, self.wires, *entry)
            for tape, dy, entry in zip(circuits, cotangents, kept, strict=True)
        )

    def execute_and_compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self.compute_vjp(circuits, cotangents, config)


def _adjoint_config(config: ExecutionConfig | None) -> ExecutionConfig:
    return dataclasses.replace(config or ExecutionConfig(), gradient_method="adjoint")


class _FinalStates:
    """The final states of the last batch executed for adjoint differentiation, with the
    tapes' compilations, so that the VJP or Jacobian that follows neither simulates nor
    compiles the circuits again. Each is handed out once (the sweep consumes the state)
    and only for a tape with the same operations and the same parameters, bit for bit."""

    def __init__(self):
        self._entries: dict = {}

    def replace(self, tapes: Sequence[QuantumScript], states: dict) -> None:
        """``states``: {tape index: (final state, compilation)}, as run_tapes fills it."""
        self._entries = {}
        for i, entry in states.items():
            self._entries.setdefault(_key(tapes[i]), []).append(entry)

    def pop(self, tape: QuantumScript) -> tuple:
        """(final state, compilation) of ``tape``, or (None, None)."""
        kept = self._entries.get(_key(tape)) if self._entries else None
        return kept.pop(0) if kept else (None, None)


def _key(tape: QuantumScript) -> tuple:
    """All that a tape's final state depends on: the gates' names, wires and
    hyperparameters, and their parameters bit for bit (``tape.hash`` rounds every
    parameter, and costs milliseconds on circuits of a few hundred gates)."""
    gates = tuple(
        (op.name, tuple(wire_labels(op)), str(op.hyperparameters) if op.hyperparameters else "")
        for op in tape.operations
    )
    parameters = tuple(
        (value.dtype.str, value.shape, value.tobytes())
        for value in map(
            np.asarray, tape.get_parameters(trainable_only=False, operations_only=True)
        )
    )
    return gates, parameters


_MCM_OPS = frozenset({"MidMeasure", "Conditional"})


def _is_sampled_measurement(mp) -> bool:
    return isinstance(mp, SampleMeasurement) and not isinstance(
        mp, (ClassicalShadowMP, ShadowExpvalMP)
    )
