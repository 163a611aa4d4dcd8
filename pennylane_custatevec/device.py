"""The ``custatevec.qubit`` PennyLane device: options, preprocessing, execution."""

from __future__ import annotations

import collections
import dataclasses
import functools
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pennylane as qml
from pennylane.devices import Device, ExecutionConfig
from pennylane.devices.modifiers import simulator_tracking, single_tape_support
from pennylane.math import Interface
from pennylane.tape import QuantumScript

from . import advice, capture, device_metric, direct, settings, simulate
from .backends import distributed, messages, select_backend
from .capture import capture_paused
from .device_options import (
    UnknownOptionError,
    check_placement,
    jax_key_words,
    rng_from_seed,
    validate_wires,
    validated_dtype,
)
from .framework_values import (
    execute_through_workflow,
    holds_differentiated_values,
    refuse_differentiable_backward,
)
from .preprocess import pipeline
from .preprocess.broadcast import expand_broadcasts
from .preprocess.config import adjoint_serves, execution_config
from .preprocess.gate_set import GateSet
from .preprocess.sampled import sampled_apart
from .rebroadcast import broadcast_entries, broadcast_vjp, each_rebound_expanded, stacked
from .runs import RunOptions, Runs, require_served
from .structures import Structure, StructureCache, StructureRun


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
            raise UnknownOptionError(advice.unknown_options(sorted(unknown), list(advice.OPTIONS)))
        settings.validate(grad_accumulation=grad_accumulation)
        if fusion_qubits is not None:
            settings.validate(fusion_qubits=fusion_qubits)
        dtype = validated_dtype(c_dtype)
        validate_wires(wires)
        check_placement(backend, device_id, mpi, mpi_gather)
        comm = None if mpi is False else messages.communicator(mpi)
        if mpi is True and (warning := advice.single_rank_warning(comm.Get_size())):
            warnings.warn(warning, UserWarning, stacklevel=3)  # qml.device's caller
        # with mpi, a rank takes the GPU of its index on its node, modulo the visible GPUs
        on_node = messages.node_rank(comm) if comm is not None and device_id is None else None
        super().__init__(wires=wires, shots=shots)
        self._rng = rng_from_seed(seed)
        # a jax key seeds every execution afresh: the same samples on every call, as
        # default.qubit samples under a key that it never advances
        self._execution_key = jax_key_words(seed)
        self._backend = select_backend(
            backend, dtype, None if device_id is None else int(device_id), on_node
        )
        if comm is not None:
            self._backend = distributed.DistributedBackend(self._backend, comm)
            self._backend.gather_results = bool(mpi_gather)
            self._rng = messages.shared_generator(self._rng, comm)
            self._execution_key = messages.rank_zero_value(self._execution_key, comm)
        self._structures = StructureCache(self.wires)
        self._runs = Runs(self._backend, self.wires, self._structures)
        # qml.snapshots' debugger while one is active (PennyLane sets it; its presence
        # tells PennyLane that the device records snapshots: snapshots_as_circuits)
        self._debugger = None
        # adjoint_serve_key -> whether the adjoint method serves such circuits
        self._serve_answers: collections.OrderedDict = collections.OrderedDict()
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
        """Whether the adjoint method serves ``circuit`` (``preprocess.config.adjoint_serves``:
        its preprocessing runs without a refusal), answered once per ``adjoint_serve_key``."""
        return adjoint_serves(self, circuit, config, self._serve_answers)

    def setup_execution_config(
        self, config: ExecutionConfig | None = None, circuit: QuantumScript | None = None
    ) -> ExecutionConfig:
        """ "best" and "device" become "adjoint", which computes device gradients and VJPs
        (Jacobians on execution) unless the user chose otherwise; the mid-circuit
        measurement method defaults to "one-shot" with shots, else "deferred".

        "best" with ``derivative_order > 1`` stays as it is (PennyLane resolves it to
        parameter-shift, see ``supports_derivatives``); the adjoint method with
        ``derivative_order > 1`` raises QuantumFunctionError naming the choices."""
        return execution_config(self, config, circuit)

    def preprocess_transforms(self, execution_config: ExecutionConfig | None = None):
        """The device's preprocessing (``preprocess.pipeline``), from named stages; a
        captured program's (``capture.program_transforms``) under program capture."""
        config = execution_config or ExecutionConfig()
        if qml.capture.enabled():  # captured programs become tapes in eval_jaxpr
            return capture.program_transforms(self, config)
        return pipeline.preprocessing(config, self._target())

    def adjoint_serving_transforms(self, config: ExecutionConfig):
        """The stages of the adjoint method's preprocessing whose refusals decide whether it
        serves a circuit (``preprocess.pipeline.adjoint_serving``): what
        ``supports_derivatives`` and ``"best"`` run."""
        if qml.capture.enabled():
            return capture.program_transforms(self, config)
        return pipeline.adjoint_serving(config, self._target())

    def _target(self) -> pipeline.Target:
        return pipeline.Target(
            name=self.name,
            wires=self.wires,
            gate_set=self._gate_set,
            debugger=self._debugger,
            gather_results=self._backend.gather_results,
            options_in_force=self.options_in_force,
        )

    @functools.cached_property
    def _gate_set(self) -> GateSet:
        """What runs natively and what stops the adjoint method's decomposition."""
        return GateSet(self.capabilities)

    @capture_paused
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
            refuse_differentiable_backward()
        if holds_differentiated_values(circuits):
            return execute_through_workflow(self, circuits, config)
        apart = sampled_apart(circuits)
        if apart is not None:
            tapes, recombine = apart
            return recombine(self._execute(tapes, config))
        return self._execute(circuits, config)

    def eval_jaxpr(
        self,
        jaxpr,
        consts: list,
        *args,
        execution_config: ExecutionConfig | None = None,
        shots=None,
    ) -> list:
        """A program captured with ``qml.capture.enable()`` (``capture.eval_jaxpr``)."""
        return capture.eval_jaxpr(
            self, jaxpr, consts, *args, execution_config=execution_config, shots=shots
        )

    def jaxpr_jvp(
        self, jaxpr, args: Sequence, tangents: Sequence, execution_config=None
    ) -> tuple[list, list]:
        """The results of a captured program and their JVP (``capture.jaxpr_jvp``)."""
        return capture.jaxpr_jvp(self, jaxpr, args, tangents, execution_config)

    def _execute(self, circuits: Sequence[QuantumScript], config: ExecutionConfig):
        """Results; with adjoint differentiation, the final states are kept for the
        derivatives that usually follow (``runs.Runs.execute``)."""
        return self._runs.execute(circuits, self._run_options(config))

    def _run_options(self, config: ExecutionConfig) -> RunOptions:
        """How an execution of ``config`` runs: its states kept with the adjoint method; the
        device's generator, or one made afresh from the seed's jax key (the same samples on
        every call)."""
        key = self._execution_key
        return RunOptions(
            keep=config.gradient_method == "adjoint",
            rng=self._rng if key is None else np.random.default_rng(key),
            postselect_mode=config.mcm_config.postselect_mode,
            fusion_qubits=self.options_in_force(config).fusion_qubits,
        )

    # The public entry points are counted by ``simulator_tracking`` (wrapped at class
    # creation). Each one that executes as well calls the untracked implementations
    # (``_execute``, ``_compute_derivatives``, ``_compute_vjp``), never another public
    # method, so that qml.Tracker counts every call once, as default.qubit does.

    @capture_paused
    def compute_derivatives(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        refuse_differentiable_backward()
        return self._compute_derivatives(circuits, execution_config)

    def _compute_derivatives(
        self, circuits: Sequence[QuantumScript], execution_config: ExecutionConfig | None
    ):
        in_force = self.options_in_force(execution_config)
        expanded = each_rebound_expanded(
            circuits,
            [None] * len(circuits),
            in_force,
            lambda tape, _: stacked(
                self._compute_derivatives(expand_broadcasts(tape)[0], execution_config)
            ),
            lambda tape, _: self._compute_derivatives([tape], execution_config)[0],
        )
        if expanded is not None:
            return expanded
        kept = self._runs.take_kept(circuits)
        require_served(circuits, kept, execution_config, in_force)
        return self._runs.jacobians(circuits, kept, in_force)

    @capture_paused
    def execute_and_compute_derivatives(
        self,
        circuits: Sequence[QuantumScript],
        execution_config: ExecutionConfig | None = None,
    ):
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self._compute_derivatives(circuits, config)

    @capture_paused
    def compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        refuse_differentiable_backward()
        return self._compute_vjp(circuits, cotangents, execution_config)

    def _compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None,
    ):
        in_force = self.options_in_force(execution_config)
        expanded = each_rebound_expanded(
            circuits,
            cotangents,
            in_force,
            lambda tape, dy: broadcast_vjp(
                tape, dy, lambda t, c: self._compute_vjp(t, c, execution_config)
            ),
            lambda tape, dy: self._compute_vjp([tape], [dy], execution_config)[0],
        )
        if expanded is not None:
            return expanded
        kept = self._runs.take_kept(circuits)
        require_served(circuits, kept, execution_config, in_force)
        return self._runs.vjps(circuits, cotangents, kept, in_force)

    @capture_paused
    def execute_and_compute_vjp(
        self,
        circuits: Sequence[QuantumScript],
        cotangents: Sequence,
        execution_config: ExecutionConfig | None = None,
    ):
        config = _adjoint_config(execution_config)
        results = self._execute(circuits, config)
        return results, self._compute_vjp(circuits, cotangents, config)

    @capture_paused
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

    @capture_paused
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
        expanded = each_rebound_expanded(
            circuits,
            tangents,
            in_force,
            lambda tape, t: stacked(self._compute_jvp(*broadcast_entries(tape, t), config)),
            lambda tape, t: self._compute_jvp([tape], [t], config)[0],
        )
        if expanded is not None:
            return expanded
        return self._runs.jvps(
            circuits,
            tangents,
            self._runs.take_kept(circuits),
            in_force,
            validate=lambda tapes, kept: require_served(tapes, kept, config, in_force),
        )

    def compute_metric_tensor(
        self, tape: QuantumScript, approx: str | None = None, layers=None
    ) -> np.ndarray:
        """The Fubini-Study metric tensor of ``tape``'s trainable gate parameters (float64,
        p x p; ``approx``: None, "block-diag" or "diag", whose parametrized ``layers``
        are lists of trainable-parameter positions), computed on this device after its
        own preprocessing for the adjoint method (``device_metric``); see
        :func:`pennylane_custatevec.metric_tensor`."""
        config = self.setup_execution_config(ExecutionConfig(gradient_method="adjoint"))
        return device_metric.metric_tensor(
            self._backend,
            self.wires,
            tape,
            self.preprocess_transforms(config),
            approx,
            layers,
            self.options_in_force(config),
        )

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
        run = self._runs.execute_structures(structures, parameters, self._run_options(config))
        self._track_structures(run.tapes)
        return run

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
        require_served(run.tapes, kept, config, in_force)
        self._track_vjps(len(run.tapes))
        return self._runs.vjps(run.tapes, cotangents, kept, in_force)


def _adjoint_config(config: ExecutionConfig | None) -> ExecutionConfig:
    return dataclasses.replace(config or ExecutionConfig(), gradient_method="adjoint")
