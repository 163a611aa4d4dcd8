"""The ``custatevec.qubit`` PennyLane device: options, preprocessing, execution."""

from __future__ import annotations

import collections
import dataclasses
import functools
import sys
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pennylane as qml
from autograd.tracer import Box
from pennylane import math
from pennylane.devices import Device, ExecutionConfig
from pennylane.devices.capabilities import validate_mcm_method
from pennylane.devices.modifiers import simulator_tracking, single_tape_support
from pennylane.devices.preprocess import (
    validate_device_wires,
    validate_measurements,
    validate_observables,
)
from pennylane.exceptions import DeviceError, QuantumFunctionError, WireError
from pennylane.math import Interface
from pennylane.measurements import SampleMeasurement, Shots, StateMeasurement
from pennylane.tape import QuantumScript
from pennylane.transforms import defer_measurements, dynamic_one_shot

from . import direct, settings, simulate
from .backends import BACKEND_CHOICES, distributed, messages, select_backend
from .entrywise import EntrywiseState, EntrywiseUnitary, jit_whole_matrix_reason
from .execution import PreparedTape, run_tapes
from .gradients import deferred, eager, jvp
from .gradients.validation import has_a_generator, require_adjoint_serves
from .kept import KeptState
from .measure import SHADOW_MEASUREMENTS, measurable
from .program import compiles_by_gate, is_broadcast, tape_batch_size
from .queuing import PipelineWithoutQueuing, without_queuing
from .rotations import PauliRotations
from .structures import (
    Structure,
    StructureCache,
    StructureKey,
    StructureRun,
    adjoint_serve_key,
)
from .templates import NATIVE_TEMPLATES, is_native_template
from .transforms import (
    SecondDerivativesError,
    TracedDecompositionError,
    allocate_dynamic_wires,
    complex_parameters_for_state,
    decompose_late_state_preps,
    decompose_templates_for_gradients,
    decompose_traced,
    entrywise_trainable_operators,
    expand_broadcasts,
    exponential_of_an_angle,
    gather_rotations,
    measure_in_computational_bases,
    measure_mid_circuit_values_on_their_wires,
    one_shot_where_sampled,
    real_parameters_for_real_results,
    refuse_autograd_hessians_of_alike_measurements,
    refuse_complex_parameters_under_gradient_transforms,
    refuse_differentiated_measurement_bases,
    refuse_differentiated_shares,
    refuse_higher_derivatives,
    refuse_postselection_under_gradient_transforms,
    refuse_purity_under_gradient_transforms,
    refuse_shot_noise_fallback,
    refuse_traced_pulse_times,
    results_off_the_jit_root,
    rotate_sampled_measurements,
    sampled_apart,
    snapshots_as_circuits,
    split_state_from_real_results,
    validate_adjoint_differentiation,
)


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


def _capture_paused(method):
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


_DTYPE_CHOICES = (np.complex128, np.complex64)
_MATRIX_DEFINED_OPS = (
    qml.QubitUnitary,
    qml.ControlledQubitUnitary,
    qml.BlockEncode,
    qml.operation.StatePrepBase,
)
"""Operations whose parameters are matrices or states: never decomposed for the adjoint
method (the rotation angles of a general unitary's decomposition are not differentiable
everywhere). A trainable QubitUnitary, ControlledQubitUnitary or BlockEncode is then
taken by its matrix's entries (``transforms.entrywise_trainable_operators``); any other
trainable one, or a wider one, is refused by name rather than silently expanded. A
trainable DiagonalQubitUnitary decomposes, as default.qubit's adjoint method takes it:
into RZ, SelectPauliRot and GlobalPhase gates whose angles are differences of its
entries' phases, smooth functions of unit-modulus entries, which the interface
differentiates."""


ADJOINT_VALIDATED_IN_PREPROCESSING = "adjoint_validated_in_preprocessing"
"""The key of ``ExecutionConfig.device_options`` that ``setup_execution_config`` sets (True)
in a config for the adjoint method: the preprocessing of that config
(``preprocess_transforms``) ends with ``validate_adjoint_differentiation``, so the
derivative entry points given it (``compute_derivatives``, ``compute_vjp``,
``compute_jvp``, ``execute_and_compute_*``) take its tapes as validated. Without it (a
direct call with a config of one's own, or none) they validate each tape themselves
(``gradients.common.require_adjoint_serves``): a clear DeviceError, never a wrong number."""
MAX_SERVE_ANSWERS = 256
"""How many ``adjoint_serve_key`` answers a device keeps (least recently used out)."""
_SERVE_LOCK = threading.Lock()
"""Guards every device's answers (module-level: a device stays copyable and picklable)."""
TORCH_RECORDS_GRADIENTS = "torch_records_gradients"
"""device_options key: whether torch recorded gradients where the call was set up. PennyLane
runs the preprocessing inside its ``torch.autograd.Function``'s forward, where torch never
records, so a refusal there asks this instead of ``torch.is_grad_enabled()``."""


class UnknownOptionError(ValueError, TypeError):
    """A keyword the device does not take (a TypeError for Python, a ValueError for users)."""


GLOBAL_SEED_HIGH = 10_000_000
"""``seed="global"`` draws ``numpy.random.randint(0, high=GLOBAL_SEED_HIGH)``: default.qubit's
draw, so that a script's later ``numpy.random`` values do not depend on the device it builds."""

_SEED_CHOICES = (
    "use an int >= 0 (or a sequence of them), None (a seed from the OS), 'global' (a seed "
    "drawn from numpy's global random state), a numpy.random.Generator (or a SeedSequence "
    "or BitGenerator), or a jax PRNG key"
)


def _rng_from_seed(seed) -> np.random.Generator:
    """The device's Generator for ``seed``, which is checked first (numpy's own messages do
    not name the option)."""
    if isinstance(seed, str):
        if seed != "global":
            raise ValueError(f"seed={seed!r} is not valid; {_SEED_CHOICES}.")
        return np.random.default_rng(np.random.randint(0, high=GLOBAL_SEED_HIGH))
    if seed is None or isinstance(
        seed, (np.random.Generator, np.random.SeedSequence, np.random.BitGenerator)
    ):
        return np.random.default_rng(seed)
    key_words = _jax_key_words(seed)
    if key_words is not None:
        seed = key_words
    if not (_is_natural(seed) or _is_natural_sequence(seed)):
        raise ValueError(f"seed={seed!r} is not valid; {_SEED_CHOICES}.")
    return np.random.default_rng(seed)


def _jax_key_words(seed) -> list[int] | None:
    """The words of a jax PRNG key (``jax.random.PRNGKey``'s uint32 array or a typed
    ``jax.random.key``), numpy's entropy for it, or None where ``seed`` is not a jax array
    (jax is imported only for one). default.qubit samples with jax under such a key: the
    same key gives the same samples here (on every execution, as there), not
    default.qubit's."""
    if not type(seed).__module__.startswith(("jax", "jaxlib")):
        return None
    import jax  # noqa: PLC0415 - only for a seed that is a jax array

    if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
        seed = jax.random.key_data(seed)
    if isinstance(seed, jax.core.Tracer):
        # a device built inside jax.jit from a traced key (default.qubit samples with jax
        # there); its words exist only when the compiled function runs
        raise ValueError(
            "seed is a jax PRNG key traced by jax.jit: custatevec.qubit samples on the host "
            "and needs the key's words when the device is built. Build the device outside "
            "the jitted function (a concrete key, or an int seed), or pass the key to "
            f"default.qubit; otherwise {_SEED_CHOICES}."
        )
    return np.asarray(seed).ravel().tolist()


def _is_natural(value) -> bool:
    """An int >= 0 (numpy's entropy), not a bool."""
    return (
        isinstance(value, (int, np.integer))
        and not isinstance(value, (bool, np.bool_))
        and value >= 0
    )


def _is_natural_sequence(value) -> bool:
    """A non-empty flat sequence (list, tuple, 1-d array) of ints >= 0."""
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else None
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(map(_is_natural, value))


def _validated_dtype(c_dtype) -> np.dtype:
    """``c_dtype`` as a numpy dtype, one of ``_DTYPE_CHOICES``."""
    message = f"c_dtype={c_dtype!r} is not supported; choose numpy.complex128 or numpy.complex64."
    try:
        dtype = np.dtype(c_dtype)
    except TypeError:
        raise ValueError(message) from None
    if dtype not in {np.dtype(d) for d in _DTYPE_CHOICES}:
        raise ValueError(message)
    return dtype


def _validate_wires(wires) -> None:
    """A number of wires must be an int >= 0: PennyLane takes ``range(-1)`` (no wires) and
    fails on a float with Python's message, which names neither the option nor the choices.
    No wires (``0`` or ``[]``) is a device that takes each circuit's wires, as with None
    (default.qubit's behaviour)."""
    choices = (
        "use a number of wires (an int >= 0), an iterable of wire labels (ints, strings, any "
        "hashable), or None (the wires of each circuit)"
    )
    if isinstance(wires, (bool, float, complex, np.bool_, np.floating, np.complexfloating)):
        raise ValueError(f"wires={wires!r} is not valid; {choices}.")
    if isinstance(wires, (int, np.integer)) and wires < 0:
        raise ValueError(f"wires={wires!r} is not valid: a negative number of wires; {choices}.")


@simulator_tracking
@single_tape_support
class CuStateVecDevice(Device):
    """State-vector simulator on NVIDIA GPUs through cuStateVec, with a compiled CPU backend.

    Args:
        wires (int, Iterable): number of wires or their labels; ``None`` takes the
            wires of each circuit.
        shots (int, Sequence[int], None): default shots (deprecated on devices in
            PennyLane 0.45; prefer ``qml.set_shots``).
        seed (int, None, "global", numpy.random.Generator, jax PRNG key): seeds sampling
            and mid-circuit measurements; ``"global"`` draws the seed from numpy's global
            state; a jax key gives the same samples on every execution (default.qubit's
            convention).
        c_dtype (numpy.complex128, numpy.complex64): amplitude precision.
        backend ("auto", "cpu", "custatevec"): where state vectors live; "auto" is
            "custatevec" when cupy, cuQuantum and a GPU are usable, else "cpu" (with a
            warning saying why).
        device_id (int, None): the GPU of the custatevec backend; ``None`` takes, with
            ``mpi``, the rank's index among the ranks of its node modulo the visible GPUs,
            else $LOCAL_RANK when set (one process per GPU under torch.distributed), else
            the current CUDA device. Ignored by the CPU backend.
        grad_accumulation ("deferred", "eager"): how the adjoint method accumulates
            gradient contributions: "deferred" (fused blocks, one reduction per block,
            batched tapes, one transfer per batch) or "eager" (the textbook sweep).
        fusion_qubits (int, None): the largest block of fused gates, 0 to 6 (0 or 1: no
            fusion); ``None`` takes the backend's default.
        mpi (bool, mpi4py communicator): split each state vector over the ranks of an MPI
            job (``True``: MPI.COMM_WORLD), a power-of-two number of them, launched with
            ``mpiexec``; every rank runs the same program and gets the same results.
        mpi_gather (bool): with ``mpi``, whether ``qml.state()`` and ``qml.probs()`` of
            every wire return the whole vector on every rank (``True``) or each rank's
            share, the entries whose first log2(P) wires spell the rank (``False``; not
            differentiable).

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
        mpi=False,
        mpi_gather: bool = True,
        **unknown,
    ):
        if unknown:
            raise UnknownOptionError(
                f"custatevec.qubit got unknown option(s) {sorted(unknown)}; valid options are "
                "wires, shots, seed, c_dtype, backend, device_id, grad_accumulation, "
                "fusion_qubits, mpi, mpi_gather."
            )
        settings.validate(grad_accumulation=grad_accumulation)
        if fusion_qubits is not None:
            settings.validate(fusion_qubits=fusion_qubits)
        dtype = _validated_dtype(c_dtype)
        _validate_wires(wires)
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
        if not isinstance(mpi_gather, (bool, np.bool_)):
            raise ValueError(
                f"mpi_gather={mpi_gather!r} is not valid; use True (state() and probs() "
                "whole on every rank) or False (each rank's share)."
            )
        if mpi is False and not mpi_gather:
            raise ValueError("mpi_gather=False needs mpi=True (it says what each rank returns).")
        comm = None if mpi is False else messages.communicator(mpi)
        # with mpi, a rank takes the GPU of its index on its node, modulo the visible GPUs
        on_node = messages.node_rank(comm) if comm is not None and device_id is None else None
        super().__init__(wires=wires, shots=shots)
        self._rng = _rng_from_seed(seed)
        # a jax key seeds every execution afresh: the same samples on every call, as
        # default.qubit samples under a key that it never advances
        self._execution_key = _jax_key_words(seed)
        self._backend = select_backend(
            backend, dtype, None if device_id is None else int(device_id), on_node
        )
        if comm is not None:
            self._backend = distributed.DistributedBackend(self._backend, comm)
            self._backend.gather_results = bool(mpi_gather)
            self._rng = messages.shared_generator(self._rng, comm)
            self._execution_key = messages.rank_zero_value(self._execution_key, comm)
        self._kept = _KeptStates()
        # qml.snapshots' debugger while one is active (PennyLane sets it; its presence
        # tells PennyLane that the device records snapshots: snapshots_as_circuits)
        self._debugger = None
        # adjoint_serve_key -> whether the adjoint method serves such circuits
        self._serve_answers: collections.OrderedDict = collections.OrderedDict()
        self._structures = StructureCache(self.wires)
        self._options = settings.DifferentiationOptions(
            grad_accumulation=grad_accumulation,
            fusion_qubits=(
                self._backend.fusion_traits.default_width
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
        ranks = getattr(self._backend, "ranks", None)
        if ranks is not None:
            where = f"{where}, mpi ranks={ranks}, swaps via {self._backend.swap_route}"
        return f"<CuStateVecDevice: wires={wires}, backend={where}, c_dtype={self.c_dtype.name}>"

    def supports_derivatives(
        self, execution_config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> bool:
        """Adjoint differentiation. An explicit ``diff_method="adjoint"`` is always taken, so
        that a circuit it cannot serve gets an error naming the reason; ``"best"`` and
        ``"device"`` take it only for circuits it serves (else PennyLane's parameter-shift).

        The adjoint method gives first derivatives only: with ``max_diff > 1``
        (``derivative_order``) "best" declines, so that PennyLane picks parameter-shift and
        differentiates it again, and "adjoint" or "device" is taken so that
        ``setup_execution_config`` refuses it by name (rather than a zero Hessian)."""
        if execution_config is None:
            return True
        method = execution_config.gradient_method
        higher_order = execution_config.derivative_order > 1
        if method == "adjoint" or (method == "device" and higher_order):
            return True
        if method == "best" and higher_order:
            return False
        if method in ("best", "device"):
            return circuit is None or self._adjoint_serves(circuit, execution_config)
        return False

    def supports_vjp(
        self, execution_config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> bool:
        return self.supports_derivatives(execution_config, circuit)

    def supports_jvp(
        self, execution_config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> bool:
        """As ``supports_derivatives``: the JVP contracts the adjoint Jacobian."""
        return self.supports_derivatives(execution_config, circuit)

    def _adjoint_serves(self, circuit: QuantumScript, config: ExecutionConfig) -> bool:
        """Whether the adjoint method serves ``circuit``: its preprocessing runs without a
        refusal. Answered once per ``adjoint_serve_key``: the preprocessing ran on every
        call with "best" (``benchmarks/best_resolution.py``, W4: "best" over "adjoint"
        about 300 us per call before, 70 us after)."""
        key = adjoint_serve_key(circuit, config, self.options_in_force(config))
        if key is not None:
            with _SERVE_LOCK:  # threads may share a device
                answer = self._serve_answers.get(key)
                if answer is not None:
                    self._serve_answers.move_to_end(key)
                    return answer
        try:
            config = self.setup_execution_config(
                dataclasses.replace(config, gradient_method="adjoint"), circuit
            )
            self.preprocess_transforms(config)((circuit,))
            answer = True
        except (SecondDerivativesError, TracedDecompositionError):
            raise  # every method but backpropagation would give zeros or fail: say so
        except (DeviceError, QuantumFunctionError, ValueError, WireError):
            # a circuit on wires the device lacks is refused when it runs, not here:
            # qml.draw and qml.specs resolve "best" without running it (as on default.qubit)
            answer = False
        if key is not None:
            with _SERVE_LOCK:
                if len(self._serve_answers) >= MAX_SERVE_ANSWERS:
                    self._serve_answers.popitem(last=False)
                self._serve_answers[key] = answer
        return answer

    def setup_execution_config(
        self, config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> ExecutionConfig:
        """ "best" and "device" become "adjoint", which computes device gradients and VJPs
        (Jacobians on execution) unless the user chose otherwise; the mid-circuit
        measurement method defaults to "one-shot" with shots, else "deferred".

        "best" with ``derivative_order > 1`` stays as it is (PennyLane resolves it to
        parameter-shift, see ``supports_derivatives``); the adjoint method with
        ``derivative_order > 1`` raises QuantumFunctionError naming the choices."""
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
                # (_refuse_differentiable_backward); from the state the forward kept
                updates["grad_on_execution"] = False
        method = updates.get("gradient_method", config.gradient_method)
        if circuit is not None and config.interface in _JAX_INTERFACES:
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
        validate_mcm_method(self.capabilities, mcm_method, shots_present)
        if mcm_method is None:
            default = "one-shot" if shots_present else "deferred"
            updates["mcm_config"] = dataclasses.replace(config.mcm_config, mcm_method=default)
        # the options of the context in force now, for the backward pass that may run later
        device_options = dict(config.device_options)
        device_options.update(self.options_in_force(config).as_device_options())
        # decided here, never inherited: the preprocessing of this config validates or not
        device_options.pop(ADJOINT_VALIDATED_IN_PREPROCESSING, None)
        if updates.get("gradient_method", config.gradient_method) == "adjoint":
            device_options[ADJOINT_VALIDATED_IN_PREPROCESSING] = True
        device_options.pop(TORCH_RECORDS_GRADIENTS, None)
        if config.interface is Interface.TORCH:
            device_options[TORCH_RECORDS_GRADIENTS] = _torch_records_gradients()
        updates["device_options"] = device_options
        return dataclasses.replace(config, **updates)

    def preprocess_transforms(self, execution_config: ExecutionConfig | None = None):
        config = execution_config or ExecutionConfig()
        if qml.capture.enabled():  # captured programs become tapes in eval_jaxpr
            return self._capture_preprocess_transforms(config)
        mcm_method = config.mcm_config.mcm_method
        differentiating = config.gradient_method == "adjoint"
        pipeline = PipelineWithoutQueuing()  # operators built here are queued nowhere
        if config.interface in _JAX_INTERFACES:  # first: its post-processing comes last
            pipeline.add_transform(results_off_the_jit_root)
        if self._debugger is not None and self._debugger.active:  # under qml.snapshots
            pipeline.add_transform(
                snapshots_as_circuits, self._debugger, deferred=mcm_method == "deferred"
            )
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
        if method is not None and config.interface in _TRACING_INTERFACES:
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
        if differentiating and config.interface in _JAX_INTERFACES:
            pipeline.add_transform(real_parameters_for_real_results)  # the user's gates named
        # qml.ftqc's measurements in other bases (and Pauli product measurements), before
        # any method sees measurements
        pipeline.add_transform(measure_in_computational_bases)
        if mcm_method == "deferred":
            pipeline.add_transform(defer_measurements, allow_postselect=True)
        pipeline.add_transform(decompose_late_state_preps)
        # gathered before decomposing (fewer operations to inspect) and after (runs that
        # decompositions made, e.g. trainable Rot gates)
        pipeline.add_transform(gather_rotations)
        pipeline.add_transform(
            decompose_traced,
            stopping_condition=self._stops_adjoint if differentiating else self._runs_natively,
            target_gates=self._target_gates,
            device_wires=self.wires,
            name=self.name,
        )
        if differentiating:  # after decomposing: an adjoint's decomposition may make one
            pipeline.add_transform(entrywise_trainable_operators)
        # after decomposing: a decomposition may make a native template (a subclass's does)
        vjp_boundary = _vjps_reach_the_device(config)
        array_gradients = config.gradient_method is None or (differentiating and vjp_boundary)
        pipeline.add_transform(decompose_templates_for_gradients, array_gradients)
        pipeline.add_transform(gather_rotations)
        # work wires that decompositions allocate (qml.allocate, TemporaryAnd) take the
        # device's free wires, reused after a reset where mid-circuit measurements can reset
        pipeline.add_transform(
            allocate_dynamic_wires, self.wires, allow_resets=mcm_method != "deferred"
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
        if differentiating:
            if not self._backend.gather_results:
                pipeline.add_transform(refuse_differentiated_shares, self.wires)
            batched = self.options_in_force(config).grad_accumulation == "deferred"
            pipeline.add_transform(measure_mid_circuit_values_on_their_wires)
            pipeline.add_transform(expand_broadcasts, trainable_only=batched)
            # measures through the state what the sweep does not differentiate (before
            # the state's complex parameters, which that may call for), then validates
            pipeline.add_transform(
                validate_adjoint_differentiation,
                batched=batched,
                through_state=True,
                device_wires=self.wires,
                array_gradients=vjp_boundary,
            )
            if not vjp_boundary:
                if config.interface in _JAX_INTERFACES:
                    pipeline.add_transform(split_state_from_real_results)
                pipeline.add_transform(complex_parameters_for_state)
            return pipeline
        pipeline.add_transform(rotate_sampled_measurements)
        if mcm_method == "tree-traversal":
            # without shots every branch of one state (branches.py); with shots the
            # one-shot method, which samples the same distribution shot by shot
            pipeline.add_transform(expand_broadcasts, mid_measurements_only=True)
            pipeline.add_transform(
                one_shot_where_sampled, postselect_mode=config.mcm_config.postselect_mode
            )
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
        """Native gates by name; exactly the native templates (a subclass may define
        other gates: it is decomposed); and a user's subclass of a native gate, which runs
        as that gate, as default.qubit applies it (PennyLane's own subclasses, such as
        AmplitudeEmbedding, keep their names' handling). Last, an operator that only a
        matrix defines (a user's operation with ``compute_matrix`` alone, ``qml.pow`` with
        a broadcast exponent) runs as that matrix, as default.qubit applies it."""
        if isinstance(op, (qml.ops.MidMeasure, qml.ops.Conditional)):
            return True
        if isinstance(op, NATIVE_TEMPLATES):
            return is_native_template(op)
        if isinstance(op, PauliRotations) or self.capabilities.supports_operation(op):
            return True
        cls = type(op)
        if cls.__module__.partition(".")[0] != "pennylane" and any(
            self.capabilities.supports_operation(base.__name__)
            for base in cls.__mro__[1:]
            if issubclass(base, qml.operation.Operator)
        ):
            return True
        return op.has_matrix and not _has_decomposition(op)

    def _stops_adjoint(self, op: qml.operation.Operator) -> bool:
        """Native, and differentiable as it stands: trainable gates with several parameters
        (Rot, U3, CRot, ...) decompose into gates with one parameter and a generator. Native
        templates differentiate by their gates (decompose_templates_for_gradients decided
        which stay whole). Trainable matrices and state preparations stay whole: the
        preprocessing takes them by their entries (``entrywise_trainable_operators``). A
        trainable operator without a generator or a decomposition stays too, and the
        validation refuses it by name."""
        if not self._runs_natively(op):
            return False
        if (
            isinstance(op, (*_MATRIX_DEFINED_OPS, EntrywiseUnitary))
            or compiles_by_gate(op)
            or not any(math.requires_grad(d) for d in op.data)
        ):
            return True
        if exponential_of_an_angle(op):  # by its angle, not its complex coefficient
            return False
        try:
            if op.num_params == 1 and has_a_generator(op):
                return True
        except ValueError:  # a broadcast qml.exp (see _has_decomposition): split later
            return True
        # nothing to decompose into (an operator that only its matrix defines): the
        # validation refuses it naming the reason, not the decomposition's "not supported"
        return not _has_decomposition(op)

    def _observable_supported(self, obs: qml.operation.Operator) -> bool:
        return measurable(obs, self.capabilities.supports_observable)

    @_capture_paused
    def execute(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        config = execution_config or ExecutionConfig()
        if (
            config.interface == Interface.TORCH
            and config.derivative_order == 1
            and config.gradient_method not in (None, "adjoint")
        ):  # a gradient transform's tapes run in torch's backward pass: refused with a graph
            _refuse_differentiable_backward()
        if _holds_differentiated_values(circuits):
            return self._execute_through_workflow(circuits, config)
        apart = sampled_apart(circuits)
        if apart is not None:
            tapes, recombine = apart
            return recombine(self._execute(tapes, config))
        return self._execute(circuits, config)

    def _capture_preprocess_transforms(self, config: ExecutionConfig):
        """A captured program's preprocessing, on the program itself: with
        ``mcm_method="deferred"`` (the default there, as on default.qubit) PennyLane's
        ``defer_measurements`` for programs, which needs the number of wires (the device's)
        and turns a measurement's value used by classical processing (arithmetic,
        jax.numpy functions, a gate parameter) into controlled operations on the wires of
        the deferred measurements: ``plxpr_to_tape`` (``eval_jaxpr``) cannot rebuild such
        processing around a mid-circuit measurement. Without device wires, and with the
        other methods, the program reaches ``eval_jaxpr`` as it was captured."""
        pipeline = PipelineWithoutQueuing()
        if config.mcm_config.mcm_method in (None, "deferred") and self.wires is not None:
            pipeline.add_transform(qml.transforms.defer_measurements, num_wires=len(self.wires))
        return pipeline

    def eval_jaxpr(
        self,
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
        if shots is not None and _traced_shots(shots):
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
                self,
                # each tape's own choice (parameter-shift with shots) unless one is set
                diff_method="best" if method in (None, "backprop", "adjoint") else method,
                gradient_kwargs=config.gradient_keyword_arguments,
                mcm_method=config.mcm_config.mcm_method,
                postselect_mode=config.mcm_config.postselect_mode,
            )[0]
        return _flat_results(result, tape)

    def jaxpr_jvp(
        self, jaxpr, args: Sequence, tangents: Sequence, execution_config=None
    ) -> tuple[list, list]:
        """The results of a captured program and their JVP: jax differentiates
        ``eval_jaxpr``, whose workflow takes the device's derivatives (adjoint)."""
        import jax  # noqa: PLC0415 - program capture is jax's

        consts: list = []
        if _measures_mid_circuit(jaxpr):
            # PennyLane hands this method the program without the device's preprocessing
            pipeline = self._capture_preprocess_transforms(execution_config or ExecutionConfig())
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
            return self.eval_jaxpr(jaxpr, consts, *values, execution_config=execution_config)

        zeros = [
            jax.numpy.zeros_like(a) if type(t).__name__ == "Zero" else t
            for a, t in zip(args, tangents, strict=True)
        ]
        results, jvps = jax.jvp(run, tuple(args), tuple(zeros))
        return list(results), list(jvps)

    def _execute_through_workflow(self, circuits: Sequence[QuantumScript], config):
        """Circuits whose parameters a framework differentiates
        (``_holds_differentiated_values``) that reached the device without PennyLane's
        interface for it (default.qubit is traced by the framework; this device is not):
        executed again through PennyLane's workflow, which now finds their interface, so
        that the framework differentiates them by the gradient method of ``config``. The
        tracker counts them once; other threads' recordings wait for this execution
        (``without_queuing``)."""
        if config.mcm_config.mcm_method == "one-shot" and any(
            isinstance(op, qml.ops.MidMeasure) for c in circuits for op in c.operations
        ):
            raise DeviceError(
                "custatevec.qubit cannot differentiate, with mcm_method='one-shot', a "
                "circuit that reached it with differentiated values outside PennyLane's "
                "interface (an array of autograd values such as a tuple of trainable "
                "scalars, or dev.execute called inside torch or jax differentiation); "
                "stack the values into one array (qml.numpy.stack), run a QNode, or use "
                "mcm_method='deferred'."
            )
        tracking, self.tracker.active = self.tracker.active, False
        try:
            with without_queuing():  # a rare path: PennyLane's workflow builds operators
                return qml.execute(
                    [_with_differentiated_parameters(circuit) for circuit in circuits],
                    self,
                    diff_method=config.gradient_method or "best",
                    device_vjp=bool(config.use_device_jacobian_product),
                    max_diff=config.derivative_order,
                    gradient_kwargs=config.gradient_keyword_arguments,
                    postselect_mode=config.mcm_config.postselect_mode,
                    mcm_method=config.mcm_config.mcm_method,
                )
        finally:
            self.tracker.active = tracking

    def _execute(self, circuits: Sequence[QuantumScript], config: ExecutionConfig):
        """Results; with adjoint differentiation, the final states are kept for the
        derivatives that usually follow (replacing, and so freeing, the previous ones)."""
        # the previous batch's states go first: the new ones would replace them anyway,
        # and the memory checks of this run see the memory they held as free
        self._kept.clear()
        preparations = [self._preparation(tape) for tape in circuits]
        ran_directly = [i for i, p in enumerate(preparations) if p.direct is not None]
        keep = config.gradient_method == "adjoint"
        if (
            ran_directly
            and keep
            and not simulate.fits(
                self._backend,
                direct.state_bytes(self._backend, [preparations[i].direct for i in ran_directly]),
            )
        ):  # their final states do not fit together: the general path chunks them
            for i in ran_directly:
                preparations[i] = preparations[i].compiled(circuits[i])
            ran_directly = []
        if not ran_directly:
            run = self._run_tapes(circuits, config, [p.prepared for p in preparations])
            self._kept.replace([p.kept_key for p in preparations], run.kept, circuits)
            return run.results
        # small structures of Pauli expvals (``direct``): a few backend calls each
        results: list = [None] * len(circuits)
        direct_results, direct_run = direct.forward(
            self._backend,
            [preparations[i].direct for i in ran_directly],
            [preparations[i].call for i in ran_directly],
            keep,
        )
        kept: dict = {}
        for position, i in enumerate(ran_directly):
            results[i] = direct_results[position]
            if keep:
                kept[i] = direct.DirectKept(direct_run, position)
        others = [i for i, p in enumerate(preparations) if p.direct is None]
        if others:
            run = self._run_tapes(
                [circuits[i] for i in others], config, [preparations[i].prepared for i in others]
            )
            for position, i in enumerate(others):
                results[i] = run.results[position]
                if position in run.kept:
                    kept[i] = run.kept[position]
        self._kept.replace([p.kept_key for p in preparations], kept, circuits)
        return tuple(results)

    def _run_tapes(
        self,
        circuits: Sequence[QuantumScript],
        config: ExecutionConfig,
        prepared: Sequence[PreparedTape] | None = None,
    ):
        """``execution.run_tapes`` on this device's backend, wires and options; the final
        states kept with the adjoint method."""
        key = self._execution_key
        return run_tapes(
            self._backend,
            circuits,
            self.wires,
            self._rng if key is None else np.random.default_rng(key),
            config.mcm_config.postselect_mode,
            keep=config.gradient_method == "adjoint",
            fusion_qubits=self.options_in_force(config).fusion_qubits,
            prepared=prepared,
        )

    def _preparation(self, tape: QuantumScript) -> _Preparation:
        """The tape compiled by its structure (``structures.Structure``, cached on the
        device) if it has one (analytic, without mid-circuit measurements, its trainable
        parameters its gates', its key seen before), and the key of its kept state."""
        key, structure = self._structures.lookup(tape)
        parameters = tape.get_parameters(trainable_only=False, operations_only=True)
        kept_key = (key, _parameter_bytes(parameters))
        if structure is None or structure.has_mid_measurements:
            return _Preparation(None, kept_key)
        plan = direct.plan_of(self._backend, structure)
        call = direct.call_data(plan, parameters, tape) if plan is not None else None
        if call is not None:
            return _Preparation(None, kept_key, plan, call)
        prepared = PreparedTape(structure.compile(parameters, tape), structure.batch_key)
        return _Preparation(prepared, kept_key)

    def _pop_kept(self, tape: QuantumScript, direct_ok: bool = False):
        """The state kept of ``tape`` by the last execution, by its key (``_preparation``):
        a ``KeptState``, or None; with ``direct_ok``, a ``direct.DirectKept`` where the
        tape ran directly (else that one as a KeptState)."""
        if not self._kept:
            return None
        parameters = tape.get_parameters(trainable_only=False, operations_only=True)
        key = self._kept.structure_key_of(tape) or StructureKey.of(tape)
        entry = self._kept.pop((key, _parameter_bytes(parameters)))
        if isinstance(entry, direct.DirectKept) and not direct_ok:
            return entry.kept_state()
        return entry

    # The public entry points are counted by ``simulator_tracking`` (wrapped at class
    # creation). Each one that executes as well calls the untracked implementations
    # (``_execute``, ``_compute_derivatives``, ``_compute_vjp``), never another public
    # method, so that qml.Tracker counts every call once, as default.qubit does.

    @_capture_paused
    def compute_derivatives(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        _refuse_differentiable_backward()
        return self._compute_derivatives(circuits, execution_config)

    def _compute_derivatives(
        self, circuits: Sequence[QuantumScript], execution_config: ExecutionConfig | None
    ):
        in_force = self.options_in_force(execution_config)
        expanded = _each_rebound_expanded(
            circuits,
            [None] * len(circuits),
            in_force,
            lambda tape, _: _stacked(
                self._compute_derivatives(expand_broadcasts(tape)[0], execution_config)
            ),
            lambda tape, _: self._compute_derivatives([tape], execution_config)[0],
        )
        if expanded is not None:
            return expanded
        kept = [self._pop_kept(tape) for tape in circuits]
        _require_adjoint_serves(circuits, kept, execution_config, in_force)
        return _adjoint_jacobians(self._backend, circuits, self.wires, kept, in_force)

    @_capture_paused
    def execute_and_compute_derivatives(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self._compute_derivatives(circuits, config)

    @_capture_paused
    def compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        _refuse_differentiable_backward()
        return self._compute_vjp(circuits, cotangents, execution_config)

    def _compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None,
    ):
        in_force = self.options_in_force(execution_config)
        expanded = _each_rebound_expanded(
            circuits,
            cotangents,
            in_force,
            lambda tape, dy: _broadcast_vjp(
                tape, dy, lambda t, c: self._compute_vjp(t, c, execution_config)
            ),
            lambda tape, dy: self._compute_vjp([tape], [dy], execution_config)[0],
        )
        if expanded is not None:
            return expanded
        kept = [self._pop_kept(tape, direct_ok=True) for tape in circuits]
        _require_adjoint_serves(circuits, kept, execution_config, in_force)
        return self._vjps(circuits, cotangents, kept, in_force)

    def _vjps(self, circuits, cotangents, kept, in_force: settings.DifferentiationOptions):
        """The VJPs of validated tapes by the accumulation mode in force, from what the
        forward pass kept (``kept[i]``: tape i's KeptState, its ``direct.DirectKept``
        where it ran directly, or None), untracked. A direct tape's deferred VJP is the
        direct one where its sweep is one gate sequence; the others go together through
        the general path."""
        gradients: list = [None] * len(circuits)
        if in_force.grad_accumulation == "deferred":  # the direct sweep is the deferred one
            for i, entry in enumerate(kept):
                if isinstance(entry, direct.DirectKept):
                    gradients[i] = entry.vjp(self._backend, cotangents[i])
        general = [i for i, value in enumerate(gradients) if value is None]
        if general:
            entries = [kept[i] for i in general]
            swept = self._general_vjps(
                [circuits[i] for i in general],
                [cotangents[i] for i in general],
                [e.kept_state() if isinstance(e, direct.DirectKept) else e for e in entries],
                in_force,
            )
            for i, value in zip(general, swept, strict=True):
                gradients[i] = value
        return tuple(gradients)

    def _general_vjps(
        self, circuits, cotangents, kept, in_force: settings.DifferentiationOptions
    ) -> tuple:
        """``_vjps`` on the general path: from KeptStates (or None). A tape with an
        ``EntrywiseUnitary`` takes the eager sweep in either mode (``_swept_eagerly``)."""
        eagerly = [
            i
            for i, tape in enumerate(circuits)
            if in_force.grad_accumulation != "deferred" or _swept_eagerly(tape)
        ]
        gradients: list = [None] * len(circuits)
        for i in eagerly:
            gradients[i] = eager.vjp(self._backend, circuits[i], cotangents[i], self.wires, kept[i])
        rest = [i for i in range(len(circuits)) if gradients[i] is None]
        if rest:
            swept = deferred.vjps(
                self._backend,
                [circuits[i] for i in rest],
                [cotangents[i] for i in rest],
                self.wires,
                [kept[i] for i in rest],
                in_force.fusion_qubits,
            )
            for i, value in zip(rest, swept, strict=True):
                gradients[i] = value
        return tuple(gradients)

    @_capture_paused
    def execute_and_compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self._compute_vjp(circuits, cotangents, config)

    @_capture_paused
    def compute_jvp(
        self,
        circuits: Sequence[QuantumScript],
        tangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        """The Jacobian-vector product of each tape: ``tangents`` holds one tuple per tape,
        one tangent per trainable parameter (an array of the parameter's shape for a native
        template's weights; zero or None: not differentiated). Per tape, one JVP per
        measurement shaped like its result (bare for one measurement),
        JVP_m = sum_j J_mj t_j with the adjoint Jacobian J of the mode in force
        (see ``pennylane_custatevec.gradients.jvp``)."""
        return self._compute_jvp(circuits, tangents, execution_config)

    @_capture_paused
    def execute_and_compute_jvp(
        self,
        circuits: Sequence[QuantumScript],
        tangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        """The results and the JVPs (as ``compute_jvp``); the sweeps start from the final
        states of this execution."""
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self._compute_jvp(circuits, tangents, config)

    def _compute_jvp(
        self, circuits: Sequence[QuantumScript], tangents: Sequence, config: ExecutionConfig | None
    ) -> tuple:
        """``compute_jvp`` without the tracker's count (``execute_and_compute_jvp`` counts
        its JVPs itself)."""
        in_force = self.options_in_force(config)
        expanded = _each_rebound_expanded(
            circuits,
            tangents,
            in_force,
            lambda tape, t: _stacked(self._compute_jvp(*_broadcast_entries(tape, t), config)),
            lambda tape, t: self._compute_jvp([tape], [t], config)[0],
        )
        if expanded is not None:
            return expanded
        kept = [self._pop_kept(tape) for tape in circuits]

        # the tapes differentiated (their trainable parameters reduced to those with a
        # nonzero tangent) and those that get zeros, each validated as it comes
        def jacobians(tapes: Sequence[QuantumScript], entries: Sequence[KeptState | None]):
            _require_adjoint_serves(tapes, entries, config, in_force)
            return _adjoint_jacobians(self._backend, tapes, self.wires, entries, in_force)

        def zero_jvp(tape: QuantumScript, entry: KeptState | None):
            _require_adjoint_serves([tape], [entry], config, in_force)
            return jvp.zeros(tape, self.wires, entry.compilation if entry else None)

        return jvp.jvps(circuits, tangents, kept, jacobians=jacobians, zero_jvp=zero_jvp)

    # --- the compiled path's entry points (pennylane_custatevec.compiled) -----------------

    def structure_of(self, tape: QuantumScript) -> Structure:
        """The structure of ``tape``, an analytic tape that this device's preprocessing
        gave (``preprocess_transforms`` of the config that ``execute_structures`` and
        ``vjp_structures`` will get): what ``execute_structures`` runs with other
        parameter values. Raises ValueError for a tape with shots, mid-circuit
        measurements or trainable observable data (the compiled path runs those through
        the QNode)."""
        structure = Structure.of(tape, self.wires)  # raises for shots, trainable observables
        if structure.has_mid_measurements:
            raise ValueError(
                "a Structure has no mid-circuit measurements; run the tape through the QNode."
            )
        if not structure.replayable:
            raise ValueError(
                "the tape holds an operation that cannot be rebuilt from parameter values "
                "exactly; run the tape through the QNode."
            )
        return structure

    def execute_structures(
        self,
        structures: Sequence[Structure],
        parameters: Sequence[Sequence],
        execution_config: ExecutionConfig | None = None,
    ) -> StructureRun:
        """The results of ``structures`` with ``parameters`` (per structure, one value per
        operation parameter in tape order: numpy arrays or Python numbers), as ``execute``
        gives them for the tapes; with the adjoint method, the final states are kept in
        the returned run (not on the device: two runs never take each other's states)."""
        config = execution_config or ExecutionConfig()
        tapes = tuple(structure.template for structure in structures)
        plans = direct.plans_of(self._backend, structures)
        if plans is not None and simulate.fits(
            self._backend, direct.state_bytes(self._backend, plans)
        ):  # small circuits of Pauli expvals: a few backend calls each
            calls = [direct.call_data(p, v) for p, v in zip(plans, parameters, strict=True)]
            if None not in calls:
                results, direct_run = direct.forward(self._backend, plans, calls)
                self._track_structures(tapes)
                return StructureRun(results, tapes, [None] * len(tapes), direct_run)
        prepared = [
            PreparedTape(structure.compile(values), structure.batch_key)
            for structure, values in zip(structures, parameters, strict=True)
        ]
        run = self._run_tapes(tapes, config, prepared)
        self._track_structures(tapes)
        # a state not kept (memory) leaves its compilation: the sweep simulates from it
        kept = [run.kept.get(i) or KeptState(None, p.compilation) for i, p in enumerate(prepared)]
        return StructureRun(run.results, tapes, kept)

    def direct_plan(
        self, structure: Structure, execution_config: ExecutionConfig | None = None
    ) -> direct.DirectPlan | None:
        """The structure's ``DirectPlan`` where its calls can run through ``run_direct``
        and ``vjp_direct`` (the compiled path's lanes): it runs directly without compiling
        a call (its parametrized gates are rotations read by angle rules), on one vector,
        and its VJP in the options in force for ``execution_config`` is the direct one
        (deferred accumulation, a sweep of one gate sequence); else None."""
        if self.options_in_force(execution_config).grad_accumulation != "deferred":
            return None
        plan = direct.plan_of(self._backend, structure)
        if plan is None or plan.recompiles or plan.structure.compilation.register.broadcast:
            return None
        if plan.circuit.n_params and plan.sweep(self._backend) is None:
            return None
        if not simulate.fits(self._backend, direct.state_bytes(self._backend, (plan,))):
            return None
        return plan

    def run_direct(self, plan: direct.DirectPlan, angles: np.ndarray) -> tuple:
        """``execute_structures`` of ``plan``'s structure (a ``direct_plan``) with the
        rotation angles ``angles`` (1, slots): its result and the ``direct.DirectRun`` for
        ``vjp_direct`` (its call's parameters unset: a general VJP of the run needs them
        set first, ``direct.DirectRun.with_parameters``)."""
        results, run = direct.forward(
            self._backend, (plan,), (direct.CallData(None, angles, (), None),)
        )
        self._track_structures((plan.structure.template,))
        return results[0], run

    def vjp_direct(self, run: direct.DirectRun, cotangent) -> tuple:
        """``vjp_structures`` of a ``run_direct`` run for its tape's ``cotangent`` (one,
        not a batch): per trainable parameter its gradient."""
        self._track_vjps(1)
        return direct.vjp(self._backend, run, 0, cotangent)

    def run_direct_jacobian(self, plan: direct.DirectPlan, angles: np.ndarray) -> tuple:
        """``run_direct`` with the Jacobian of the structure's M measurements by gradient
        column, (M, columns), taken in the same backend call (``direct.forward_jacobian``;
        the VJPs of the unit cotangents, counted as M VJPs): the result, the run (holding
        no state: a VJP of it simulates again) and the Jacobian."""
        result, run, jacobian = direct.forward_jacobian(
            self._backend, plan, direct.CallData(None, angles, (), None)
        )
        self._track_structures((plan.structure.template,))
        self._track_vjps(len(plan.pauli.terms))
        return result, run, jacobian

    def _track_vjps(self, count: int) -> None:
        if self.tracker.active:
            self.tracker.update(vjp_batches=1, vjps=count)
            self.tracker.record()

    def _track_structures(self, tapes: Sequence[QuantumScript]) -> None:
        if self.tracker.active:
            self.tracker.update(executions=len(tapes), batches=1)
            self.tracker.record()

    def vjp_structures(
        self,
        run: StructureRun,
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ) -> tuple:
        """The VJP of each tape of ``run`` (as ``compute_vjp``: per tape, one gradient per
        trainable parameter; a batch of K cotangents, a leading axis K on each
        measurement's cotangent, gives gradients with a leading axis K), from the final
        states ``run`` kept (each used once: a second VJP of one run simulates again)."""
        config = execution_config or ExecutionConfig(gradient_method="adjoint")
        in_force = self.options_in_force(config)
        kept = run.take_kept()
        _require_adjoint_serves(run.tapes, kept, config, in_force)
        self._track_vjps(len(run.tapes))
        if run.direct is not None:
            kept = [direct.DirectKept(run.direct, i) for i in range(len(run.tapes))]
        return self._vjps(run.tapes, cotangents, kept, in_force)


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


def _vjps_reach_the_device(config: ExecutionConfig) -> bool:
    """Whether PennyLane's ML boundary asks the device for VJPs (``device_vjp=True``) rather
    than Jacobians: under ``jax.jit`` it always takes the Jacobian (its JVP contracts it,
    with the result's shape per scalar parameter), whatever ``device_vjp`` says, so the
    preprocessing must give it scalar parameters (no native template's weight arrays) and
    the dtypes a Jacobian boundary needs."""
    return bool(config.use_device_jacobian_product) and config.interface != Interface.JAX_JIT


def _rebound_broadcast(tape: QuantumScript, in_force: settings.DifferentiationOptions) -> bool:
    """Whether ``tape`` is broadcast where the sweep of the mode in force does not take a
    broadcast tape whole (a trainable parameter broadcast, or the eager mode): the
    preprocessing expands such tapes, but PennyLane binds broadcast parameters into
    preprocessed tapes afterwards (``jax.vmap`` over a QNode with ``device_vjp=True``)."""
    if tape_batch_size(tape) is None:
        return False
    if in_force.grad_accumulation == "eager":
        return True
    return any(is_broadcast(tape.par_info[index]["op"]) for index in tape.trainable_params)


def _each_rebound_expanded(circuits, per_tape, in_force, expanded, alone) -> tuple | None:
    """None where no tape is ``_rebound_broadcast`` (the derivative method goes on as
    usual); else each tape's derivative, ``expanded(tape, per_tape[i])`` for a rebound
    tape and ``alone(tape, per_tape[i])`` for the others. One check per tape."""
    rebound = [_rebound_broadcast(tape, in_force) for tape in circuits]
    if not any(rebound):
        return None
    return tuple(
        expanded(tape, extra) if expand else alone(tape, extra)
        for tape, extra, expand in zip(circuits, per_tape, rebound, strict=True)
    )


def _broadcast_parameters(tape: QuantumScript) -> list[bool]:
    """Per trainable parameter of a broadcast tape: whether it is broadcast (has the batch
    axis first, beyond its own dimensions)."""
    parameters = tape.get_parameters(trainable_only=False)
    flags = []
    for index in tape.trainable_params:
        info = tape.par_info[index]
        own_ndim = info["op"].ndim_params[info["p_idx"]]
        flags.append(is_broadcast(info["op"]) and np.ndim(parameters[index]) > own_ndim)
    return flags


def _broadcast_entries(tape: QuantumScript, tangents) -> tuple[list, list]:
    """The entries of a broadcast tape and the tangents of each: a broadcast parameter's
    tangent split by entry, another's the same for every entry."""
    entries, _ = expand_broadcasts(tape)
    flags = _broadcast_parameters(tape)

    def entry_tangents(b: int) -> tuple:
        return tuple(
            t[b] if broadcast and t is not None and np.ndim(t) else t
            for t, broadcast in zip(tangents, flags, strict=True)
        )

    return list(entries), [entry_tangents(b) for b in range(len(entries))]


def _stacked(per_entry: Sequence):
    """Results of the entries of a broadcast tape (nested tuples alike) stacked into the
    broadcast tape's: the batch axis first in every leaf."""
    first = per_entry[0]
    if isinstance(first, (tuple, list)):
        return tuple(_stacked([entry[i] for entry in per_entry]) for i in range(len(first)))
    return np.stack([np.asarray(entry) for entry in per_entry])


def _broadcast_vjp(tape: QuantumScript, cotangent, vjps) -> tuple:
    """The VJP of a broadcast tape from the VJPs of its entries (``vjps(tapes,
    cotangents)``), as the preprocessing's expansion would give it: a broadcast parameter's
    gradient has one entry per broadcast entry, another parameter's is their sum. The
    cotangent of each result has the batch axis first (or is a scalar or None)."""
    entries, _ = expand_broadcasts(tape)
    single = len(tape.measurements) == 1
    per_measurement = (cotangent,) if single else tuple(cotangent)

    def entry_cotangent(b: int):
        split = tuple(dy if dy is None or np.ndim(dy) == 0 else dy[b] for dy in per_measurement)
        return split[0] if single else split

    gradients = vjps(list(entries), [entry_cotangent(b) for b in range(len(entries))])
    return tuple(
        np.stack(per_entry) if broadcast else np.sum(per_entry, axis=0)
        for per_entry, broadcast in zip(
            ([np.asarray(g[k]) for g in gradients] for k in range(len(tape.trainable_params))),
            _broadcast_parameters(tape),
            strict=True,
        )
    )


def _require_adjoint_serves(
    tapes: Sequence[QuantumScript],
    kept: Sequence[KeptState | direct.DirectKept | None],
    config: ExecutionConfig | None,
    in_force: settings.DifferentiationOptions,
) -> None:
    """Refuse a tape the sweep of the mode in force cannot differentiate, as the
    preprocessing would, unless ``config`` says that the preprocessing validated the
    tapes (``ADJOINT_VALIDATED_IN_PREPROCESSING``). As the sweep reads them: the tape's
    ``trainable_params``, and whether it is broadcast from the compilation the forward
    pass kept (``kept[i]``), if any."""
    if config is not None and config.device_options.get(ADJOINT_VALIDATED_IN_PREPROCESSING):
        if config.interface is Interface.JAX_JIT:
            _refuse_matrices_left_whole(tapes)
        return
    batched = in_force.grad_accumulation == "deferred"
    for tape, entry in zip(tapes, kept, strict=True):
        broadcast = None
        if isinstance(entry, direct.DirectKept):
            broadcast = entry.broadcast
        elif entry is not None:
            broadcast = entry.compilation.register.broadcast
        require_adjoint_serves(tape, broadcast=broadcast, batched=batched)


def _refuse_matrices_left_whole(tapes: Sequence[QuantumScript]) -> None:
    """Under ``jax.jit``, the validated tapes may hold a trainable unitary matrix that the
    preprocessing left whole (``entrywise.left_whole_under_jit``: traced by jit alone, too
    wide to pass entry by entry): its derivative, asked for now, is refused by name."""
    for tape in tapes:
        for index in tape.trainable_params:
            op = tape.par_info[index]["op"]
            if isinstance(op, (qml.QubitUnitary, qml.ControlledQubitUnitary)):
                raise DeviceError(
                    "custatevec.qubit cannot differentiate this circuit by adjoint: "
                    f"{jit_whole_matrix_reason(op)}."
                )


def _adjoint_jacobians(
    backend,
    tapes: Sequence[QuantumScript],
    device_wires,
    kept: Sequence[KeptState | None],
    in_force,
) -> tuple:
    """The adjoint Jacobian of each tape by the accumulation mode in force, untracked
    (``kept[i]``: what the forward pass kept of tape i, or None)."""
    jacobians: list = [None] * len(tapes)
    for i, (tape, entry) in enumerate(zip(tapes, kept, strict=True)):
        if in_force.grad_accumulation != "deferred" or _swept_eagerly(tape):
            jacobians[i] = eager.jacobian(backend, tape, device_wires, entry)
    rest = [i for i in range(len(tapes)) if jacobians[i] is None]
    if rest:
        swept = deferred.jacobians(
            backend,
            [tapes[i] for i in rest],
            device_wires,
            [kept[i] for i in rest],
            in_force.fusion_qubits,
        )
        for i, value in zip(rest, swept, strict=True):
            jacobians[i] = value
    return tuple(jacobians)


def _has_decomposition(op: qml.operation.Operator) -> bool:
    """``op.has_decomposition``, False where PennyLane cannot answer it: ``qml.exp`` of a
    broadcast coefficient asks ``bool`` of the coefficients' array (ValueError in 0.45),
    and runs as its matrix then, as default.qubit applies it."""
    try:
        return op.has_decomposition
    except ValueError:
        return False


def _swept_eagerly(tape: QuantumScript) -> bool:
    """Whether the deferred mode hands ``tape`` to the eager sweep: an ``EntrywiseUnitary``
    or ``EntrywiseState`` (a trainable unitary or prepared state taken by its entries) is
    differentiated by the eager sweep only,
    whose step through it is one dense reduction (``gradients.eager``); the deferred
    sweep's fused blocks differentiate gates by their generators. So is a postselection
    (a Projector), which the eager sweep steps back through by simulating the state
    before it again (``eager._back_through_postselection``)."""
    return any(_is_swept_eagerly_only(type(op)) for op in tape.operations)


def _traced_shots(shots) -> bool:
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


@functools.cache
def _is_swept_eagerly_only(kind: type) -> bool:
    """Whether the deferred sweep leaves an operation of type ``kind`` to the eager sweep
    (``_swept_eagerly``): a cached lookup by type, for every operation of every tape the
    deferred mode differentiates (``isinstance`` on PennyLane's operator classes costs
    about ten times more: measured for ``transforms._is_dynamic_type``)."""
    return issubclass(kind, (EntrywiseUnitary, EntrywiseState, qml.Projector))


def _adjoint_config(config: ExecutionConfig | None) -> ExecutionConfig:
    return dataclasses.replace(config or ExecutionConfig(), gradient_method="adjoint")


_PLAIN_VALUE_TYPES = (float, int, complex, np.float64, np.complex128)


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


def _holds_differentiated_values(circuits: Sequence[QuantumScript]) -> bool:
    """Whether a parameter of ``circuits`` is one a framework differentiates
    (``_differentiated_items``). PennyLane's workflow hands the device numpy values;
    these come from code that calls ``dev.execute`` inside a differentiated function
    (PennyLane's gradient-transform tests do: ``fn(dev.execute(tapes))`` under
    ``torch.autograd.functional.jacobian`` or ``jax.jacobian``), and from a circuit whose
    interface PennyLane takes for numpy while autograd traces it: one whose parameter is
    a numpy array of autograd values, such as ``qml.AngleEmbedding((a, b), ...)`` with
    trainable scalars a and b under ``qml.grad`` (numpy builds an array of objects, and
    the gates of its decomposition get elements of it)."""
    return any(
        type(value) not in _PLAIN_VALUE_TYPES and _differentiated_items(value) is not None
        for circuit in circuits
        for op in circuit.operations
        for value in op.data
    )


def _differentiated_items(value) -> list | None:
    """``[value]`` for an autograd value, a torch tensor that requires grad or a jax
    tracer; the elements of a numpy array of objects that holds an autograd value; else
    None. Torch and jax are looked up only where already imported."""
    if isinstance(value, Box):
        return [value]
    if isinstance(value, np.ndarray):
        if value.dtype == np.dtype(object):
            items = list(value.flat)
            if any(isinstance(item, Box) for item in items):
                return items
        return None
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor) and value.requires_grad:
        return [value]
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.core.Tracer):
        return [value]
    return None


def _with_differentiated_parameters(circuit: QuantumScript) -> QuantumScript:
    """``circuit`` with each numpy array of objects that holds autograd values as one
    autograd array (so that PennyLane finds the interface), and the differentiated
    parameters marked trainable."""
    parameters = circuit.get_parameters(trainable_only=False)
    trainable = []
    for index, value in enumerate(parameters):
        items = _differentiated_items(value)
        if items is None:
            continue
        trainable.append(index)
        if isinstance(value, np.ndarray):
            stacked = math.stack([math.asarray(item, like="autograd") for item in items])
            parameters[index] = math.reshape(stacked, value.shape)
    return circuit.bind_new_parameters(parameters, list(range(len(parameters)))).copy(
        trainable_params=trainable
    )


@dataclasses.dataclass(frozen=True)
class _Preparation:
    """A tape as the device's execution takes it: compiled by its structure (or None: it
    is compiled on its own), and the key of the state kept of it."""

    prepared: PreparedTape | None
    kept_key: tuple
    """``(StructureKey, the operations' parameters' bytes)``: the key fixes everything
    but the parameters' values (their dtypes and shapes too), the bytes those (``hash``
    rounds every parameter)."""
    direct: direct.DirectPlan | None = None
    """The structure's plan where the tape runs directly (then ``prepared`` is None)."""
    call: direct.CallData | None = None
    """The tape's call data, where it runs directly."""

    def compiled(self, tape: QuantumScript) -> _Preparation:
        """This preparation of ``tape`` (one that runs directly) for the general path."""
        structure = self.direct.structure
        compilation = self.call.compilation or structure.compile(self.call.parameters, tape)
        return _Preparation(PreparedTape(compilation, structure.batch_key), self.kept_key)


class _KeptStates:
    """The KeptStates of the last batch executed for adjoint differentiation (final
    states, compilations, fused plans; a ``direct.DirectKept`` for a tape that ran
    directly), so that the VJP or Jacobian that follows neither simulates, compiles nor
    plans the circuits again. Each is handed out once (the sweep
    consumes the state) and only for a tape with the same operations and the same
    parameters, bit for bit (its key, ``_Preparation.kept_key``)."""

    def __init__(self):
        self._entries: dict[tuple, list[KeptState]] = {}
        self._executed: dict[int, _ExecutedTape] = {}

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __getstate__(self) -> dict:
        """A copied or pickled device keeps no states: they belong to the original's last
        execution, whose tapes they know by identity (and through weak references, which
        do not pickle)."""
        return {"_entries": {}, "_executed": {}}

    def clear(self) -> None:
        self._entries = {}
        self._executed = {}

    def replace(
        self,
        keys: Sequence[tuple],
        kept: Mapping[int, KeptState | direct.DirectKept],
        tapes: Sequence[QuantumScript],
    ) -> None:
        """``keys[i]``: tape i's key; ``kept``: {tape index: KeptState}, as ``run_tapes``
        returns it; ``tapes`` the tapes executed (whose structure keys the derivatives that
        follow take for the same tape objects, ``structure_key_of``)."""
        self._entries = {}
        self._executed = {}
        for i, entry in kept.items():
            self._entries.setdefault(keys[i], []).append(entry)
            self._executed[id(tapes[i])] = _ExecutedTape.of(tapes[i], keys[i][0])

    def structure_key_of(self, tape: QuantumScript) -> StructureKey | None:
        """The structure key of ``tape`` if it is a tape object that the last execution ran
        and still holds the same operations, measurements and trainable parameters (the
        PennyLane workflow hands the derivatives the tapes it executed: their key is not
        computed twice); else None."""
        executed = self._executed.get(id(tape))
        return executed.key if executed is not None and executed.holds(tape) else None

    def pop(self, key: tuple) -> KeptState | None:
        """The KeptState of the tape of ``key`` (removed), or None."""
        entries = self._entries.get(key)
        return entries.pop(0) if entries else None


@dataclasses.dataclass(frozen=True, eq=False)
class _ExecutedTape:
    """A tape object that an execution ran, by identity: its operations and
    measurements (the objects, held so that no other object takes their place), its
    trainable parameters, and its structure key. The kept state's key adds the
    parameters' bytes, read again from the tape when asked."""

    tape: weakref.ref
    operations: tuple
    measurements: tuple
    trainable: tuple[int, ...]
    key: StructureKey

    @classmethod
    def of(cls, tape: QuantumScript, key: StructureKey) -> _ExecutedTape:
        return cls(
            weakref.ref(tape),
            tuple(tape.operations),
            tuple(tape.measurements),
            tuple(tape.trainable_params),
            key,
        )

    def holds(self, tape: QuantumScript) -> bool:
        return (
            self.tape() is tape
            and _same_objects(self.operations, tape.operations)
            and _same_objects(self.measurements, tape.measurements)
            and self.trainable == tuple(tape.trainable_params)
        )


def _same_objects(held: tuple, current: Sequence) -> bool:
    return len(held) == len(current) and all(a is b for a, b in zip(held, current, strict=True))


def _parameter_bytes(parameters: Sequence) -> bytes:
    """The parameters' values bit for bit, for a key that fixes their dtypes and shapes."""
    return b"".join([np.asarray(value).tobytes() for value in parameters])


_MCM_OPS = frozenset({"MidMeasure", "Conditional"})
_JAX_INTERFACES = frozenset({Interface.JAX, Interface.JAX_JIT})
"""Where PennyLane contracts the device Jacobian with tangents (forward mode)."""

_TRACING_INTERFACES = _JAX_INTERFACES | {Interface.AUTOGRAD}
"""Where a second derivative shows in the parameters the device's preprocessing sees
(nested autograd boxes or jax tracers: ``transforms.refuse_higher_derivatives``); torch's
shows in its backward pass (``_refuse_differentiable_backward``)."""


def _refuse_differentiable_backward() -> None:
    """Refuse derivatives (a VJP, a Jacobian) asked for inside torch's backward pass with
    ``create_graph=True`` (torch enables grad mode in a backward pass only then: a
    Hessian, a gradient penalty, PennyLane's ``classical_fisher``): they are computed
    outside torch, so every derivative of them would be zero. (Tensors that raise only
    when differentiated again cannot be made here: the device does not hold the torch
    inputs they would have to depend on.) For torch the device takes the Jacobian in the
    backward pass (``grad_on_execution=False`` unless set), so that this check sees it."""
    torch = sys.modules.get("torch")  # imported by whoever runs a torch backward pass
    if torch is None or not torch.is_grad_enabled():
        return
    if torch._C._current_graph_task_id() == -1:  # not inside a backward pass
        return
    raise SecondDerivativesError(
        "custatevec.qubit's derivatives are not differentiable, and torch asked for them "
        "with create_graph=True (a Hessian, a gradient of a gradient), whose derivatives "
        "would be zero. Set max_diff=2 on the QNode with diff_method='parameter-shift' (or "
        "'best', which picks it then)."
    )


def _is_sampled_measurement(mp) -> bool:
    return isinstance(mp, (SampleMeasurement, *SHADOW_MEASUREMENTS))


def _torch_records_gradients() -> bool:
    """torch's grad mode here (False where torch was never imported: nothing records)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled()
