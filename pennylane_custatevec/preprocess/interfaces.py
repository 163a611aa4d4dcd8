"""The boundary with the ML interfaces: results kept off the root of a ``jax.jit``
program, parameters cast to the dtypes jax's tangents need (complex for a state, real for
real results) and tapes split between the two, and pulses whose times jax.jit traces
refused where PennyLane's callback would receive them."""

from __future__ import annotations

import pennylane as qml
from pennylane import math
from pennylane.exceptions import DeviceError
from pennylane.measurements import StateMP
from pennylane.operation import StatePrepBase
from pennylane.tape import QuantumScript
from pennylane.transforms.core import transform

from ..entrywise import MAX_ENTRYWISE_QUBITS
from .adjoint import taken_by_entries
from .common import first_result
from .decompose import exponential_of_an_angle


@transform
def results_off_the_jit_root(tape: QuantumScript):
    """Under ``jax.jit``, each result leaves through one operation that does nothing to its
    value (``jax.lax.reduce_precision`` to its own precision, real and imaginary parts
    apart), so that PennyLane's pure callback is never the root of the compiled program.

    jaxlib 0.7.1 (the jax PennyLane 0.45 pins) aborts the Python process when XLA compiles
    a program whose root is a callback and in which a matrix-vector product feeds that
    callback: its CPU dot emitter reads the root's backend configuration as its own
    protobuf, and the callback's is not ("Could not convert JSON string to proto ...
    xla.cpu.BackendConfig"; measured: ``jax.jit(lambda x: jax.pure_callback(f, s, M @ x))``
    aborts, ``jax.jit(lambda x: jnp.sin(jax.pure_callback(f, s, M @ x)))`` does not). A
    decomposition that multiplies matrices under ``jax.jit`` meets it: ``SelectPauliRot``,
    a trainable ``DiagonalQubitUnitary``, ``MottonenStatePreparation``,
    ``MultiplexerStatePreparation``, a ``BlockEncode`` of traced data, and the user's own
    ``qnode(M @ v)``. ``XLA_FLAGS`` have no option that avoids it; ``optimization_barrier``,
    ``x + 0`` and ``x * 1`` are simplified away before code generation, ``reduce_precision``
    is kept. The device adds this transform where its preprocessing runs on jax's tracers
    (the adjoint method, and ``"best"``, which takes it); under a gradient transform or
    ``diff_method=None`` the preprocessing runs inside the callback, on arrays, and this
    returns the results as they are. Outside ``jax.jit`` it changes nothing either."""
    return (tape,), _result_off_the_jit_root


def _result_off_the_jit_root(results):
    return _off_the_jit_root(results[0])


def _off_the_jit_root(result):
    if isinstance(result, (tuple, list)):
        return type(result)(_off_the_jit_root(part) for part in result)
    if isinstance(result, dict):
        return {key: _off_the_jit_root(part) for key, part in result.items()}
    if not math.is_abstract(result):
        return result
    import jax  # only jax's tracers come here

    def kept_identity(part):
        bits = jax.numpy.finfo(part.dtype)
        return jax.lax.reduce_precision(part, bits.nexp, bits.nmant)

    if jax.numpy.iscomplexobj(result):
        return jax.lax.complex(kept_identity(result.real), kept_identity(result.imag))
    if jax.numpy.issubdtype(result.dtype, jax.numpy.floating):
        return kept_identity(result)
    return result  # integers and booleans: sampled results, which no adjoint method makes


class TracedPulseTimesError(DeviceError):
    """A pulse whose times ``jax.jit`` traces (``qml.evolve(H)(params, t)`` with ``t`` an
    argument of the jitted function)."""


def refuse_traced_pulse_times(tape: QuantumScript, adjoint: bool) -> None:
    """Refuse a pulse whose evolution times are traced by ``jax.jit`` where the pulse would
    reach PennyLane's jit callback: that callback hands the device concrete parameters but
    leaves the times (a hyperparameter) traced, and jax raised ``UnexpectedTracerError``
    from inside it (PennyLane's ``test_rydberg.py`` ``test_pennylane_and_exact_solution_
    correspond``, routed to this device). With the adjoint method (``adjoint``) a pulse with
    parameters is taken by its matrix's entries where jax traces
    (``entrywise_trainable_operators``; under ``jax.jit`` every parameter is trainable),
    traced times included, and never reaches the callback. Called where the trace sees the
    QNode's tape (``setup_execution_config``): from the preprocessing, which runs inside
    the callback for gradient transforms, the error would reach the user wrapped in jax's
    ``XlaRuntimeError``. One name comparison per operation."""
    for op in tape.operations:
        if op.name != "ParametrizedEvolution" or not math.is_abstract(op.t):
            continue
        if adjoint and taken_by_entries(op):
            continue
        raise TracedPulseTimesError(
            f"custatevec.qubit cannot evolve the pulse on wires {op.wires.tolist()} "
            "under jax.jit with traced times here: it computes this pulse's matrix inside "
            "PennyLane's jit callback, which receives the pulse's parameters but not its "
            "times (with diff_method='adjoint' or 'best' a pulse with parameters on at most "
            f"{MAX_ENTRYWISE_QUBITS} wires is computed where jax traces). Pass the times as "
            "constants of the jitted function (close over them), call the QNode without "
            "jax.jit, or use default.qubit, which traces the evolution."
        )


@transform
def complex_parameters_for_state(tape: QuantumScript):
    """Cast the trainable parameters to complex when a state is measured: its Jacobian is
    complex, and the ML framework takes the real part of a complex gradient only for a
    parameter that entered the circuit as complex (as default.qubit does)."""
    if not any(isinstance(mp, StateMP) for mp in tape.measurements):
        return (tape,), first_result
    parameters = tape.get_parameters(trainable_only=False)
    trainable = [i for i, value in enumerate(parameters) if math.requires_grad(value)]
    if not trainable:
        return (tape,), first_result
    cast = [math.cast(parameters[i], complex) for i in trainable]
    return (tape.bind_new_parameters(cast, trainable),), first_result


_JAX_DIFFERENTIATING_TRACERS = ("JVPTracer", "LinearizeTracer")
"""jax's tracers of a value being differentiated (``jax.jit`` traces with others)."""


NOT_ANGLE_PARAMETERS = (
    qml.QubitUnitary,
    qml.ControlledQubitUnitary,
    qml.DiagonalQubitUnitary,
    qml.BlockEncode,
    StatePrepBase,
)
"""Operations whose parameters are matrices, phases or amplitudes, complex by nature:
never cast to real (a trainable DiagonalQubitUnitary decomposes into gates whose real
angles are its phases' differences; the others are refused by name when trainable)."""


@transform
def real_parameters_for_real_results(tape: QuantumScript):
    """Cast the trainable parameters given as complex numbers with a zero imaginary part to
    real for a tape that measures no state. For jax, which requires a result's tangent (and
    a parameter's cotangent) to have the dtype of the result (of the parameter): PennyLane
    contracts the device's real Jacobian with complex tangents otherwise, and the device's
    VJP of a real result is real. jax differentiates through the cast back to the complex
    argument. A parameter with a nonzero imaginary part is left as it is (the device
    refuses a complex angle by name). Under ``jax.jit`` the value cannot be checked here:
    a traced complex parameter is refused where jax differentiates it (the cast could
    hide an imaginary part) and left as it is where jax only evaluates."""
    if any(isinstance(mp, StateMP) for mp in tape.measurements):
        return (tape,), first_result
    parameters = tape.get_parameters(trainable_only=False)
    cast = []
    for index in tape.trainable_params:
        value = parameters[index]
        if not math.get_dtype_name(value).startswith("complex"):
            continue
        # the operation of parameter ``index`` of all (get_operation counts trainable ones)
        operation = tape.par_info[index]["op"]
        if isinstance(operation, NOT_ANGLE_PARAMETERS) or exponential_of_an_angle(operation):
            continue  # an exponential's coefficient becomes a real angle where it decomposes
        if math.is_abstract(value):
            if type(value).__name__ in _JAX_DIFFERENTIATING_TRACERS:
                raise DeviceError(
                    f"custatevec.qubit cannot differentiate the complex-valued parameter "
                    f"{index} of {operation.name} under jax.jit: its "
                    "imaginary part cannot be checked while tracing, and the device's "
                    "angles are real. Pass real values (jnp.real(x)), or differentiate "
                    "without jax.jit."
                )
            continue
        if not math.any(math.imag(value) != 0):
            cast.append(index)
    if not cast:
        return (tape,), first_result
    real = [math.real(parameters[i]) for i in cast]
    return (tape.bind_new_parameters(real, cast),), first_result


@transform
def split_state_from_real_results(tape: QuantumScript):
    """A tape that measures a state and real results (expval, probs) becomes two tapes:
    the states, and the rest. For jax forward mode, where PennyLane contracts the device
    Jacobian with the tangents in the tangents' dtype: the state's tangents must be complex
    (``complex_parameters_for_state``), the real results' tangents real, as their results."""
    is_state = [isinstance(mp, StateMP) for mp in tape.measurements]
    if all(is_state) or not any(is_state):
        return (tape,), first_result
    parts = [
        [i for i, state in enumerate(is_state) if state],
        [i for i, state in enumerate(is_state) if not state],
    ]
    tapes = tuple(tape.copy(measurements=[tape.measurements[i] for i in part]) for part in parts)

    def recombine(results):
        merged: list = [None] * len(is_state)
        for part, result in zip(parts, results, strict=True):
            for i, value in zip(part, (result,) if len(part) == 1 else result, strict=True):
                merged[i] = value
        return tuple(merged)

    return tapes, recombine
