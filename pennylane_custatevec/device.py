"""The ``custatevec.qubit`` PennyLane device: options, preprocessing, execution."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pennylane as qml
from pennylane.devices import Device, ExecutionConfig
from pennylane.devices.modifiers import simulator_tracking, single_tape_support
from pennylane.devices.preprocess import (
    decompose,
    validate_device_wires,
    validate_measurements,
    validate_observables,
)
from pennylane.measurements import (
    ClassicalShadowMP,
    SampleMeasurement,
    ShadowExpvalMP,
    StateMeasurement,
)
from pennylane.tape import QuantumScript
from pennylane.transforms import defer_measurements, dynamic_one_shot
from pennylane.transforms.core import CompilePipeline

from .backends import BACKEND_CHOICES, select_backend
from .execution import run_tapes
from .transforms import decompose_late_state_preps, rotate_sampled_measurements

_DTYPE_CHOICES = (np.complex128, np.complex64)


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
        backend ("auto", "cpu", "custatevec"): where state vectors live.
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
        **unknown,
    ):
        if unknown:
            raise UnknownOptionError(
                f"custatevec.qubit got unknown option(s) {sorted(unknown)}; valid options are "
                "wires, shots, seed, c_dtype, backend."
            )
        if np.dtype(c_dtype) not in {np.dtype(d) for d in _DTYPE_CHOICES}:
            raise ValueError(
                f"c_dtype={c_dtype!r} is not supported; choose numpy.complex128 or numpy.complex64."
            )
        if backend not in BACKEND_CHOICES:
            raise ValueError(
                f"backend={backend!r} is not valid; choose one of {', '.join(BACKEND_CHOICES)}."
            )
        super().__init__(wires=wires, shots=shots)
        self._backend = select_backend(backend, np.dtype(c_dtype))
        self._rng = _rng_from_seed(seed)

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

    def __repr__(self) -> str:
        wires = len(self.wires) if self.wires is not None else None
        return (
            f"<CuStateVecDevice: wires={wires}, backend={self.backend_name}, "
            f"c_dtype={self.c_dtype.name}>"
        )

    def preprocess_transforms(self, execution_config: ExecutionConfig | None = None):
        config = execution_config or ExecutionConfig()
        mcm_method = config.mcm_config.mcm_method
        pipeline = CompilePipeline()
        if mcm_method == "deferred":
            pipeline.add_transform(defer_measurements, allow_postselect=True)
        pipeline.add_transform(decompose_late_state_preps)
        pipeline.add_transform(
            decompose,
            stopping_condition=self._runs_natively,
            target_gates=self.capabilities.gate_set() | _MCM_OPS,
            device_wires=self.wires,
            name=self.name,
        )
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
        pipeline.add_transform(rotate_sampled_measurements)
        if mcm_method == "one-shot":
            pipeline.add_transform(
                dynamic_one_shot, postselect_mode=config.mcm_config.postselect_mode
            )
        return pipeline

    def _runs_natively(self, op: qml.operation.Operator) -> bool:
        if isinstance(op, (qml.ops.MidMeasure, qml.ops.Conditional)):
            return True
        return self.capabilities.supports_operation(op)

    def _observable_supported(self, obs: qml.operation.Operator) -> bool:
        return self.capabilities.supports_observable(obs.name)

    def execute(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        config = execution_config or ExecutionConfig()
        return run_tapes(
            self._backend, circuits, self.wires, self._rng, config.mcm_config.postselect_mode
        )


_MCM_OPS = frozenset({"MidMeasure", "Conditional"})


def _is_sampled_measurement(mp) -> bool:
    return isinstance(mp, SampleMeasurement) and not isinstance(
        mp, (ClassicalShadowMP, ShadowExpvalMP)
    )
