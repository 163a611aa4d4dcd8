"""Under ``jax.jit`` PennyLane's pure callback is kept off the compiled program's root.

jaxlib 0.7.1 aborts the Python process when XLA compiles a program whose root is a callback
fed by a matrix-vector product ("Could not convert JSON string to proto ...
xla.cpu.BackendConfig"). Decompositions that multiply matrices under ``jax.jit``
(``SelectPauliRot``, a trainable ``DiagonalQubitUnitary``, ``MultiplexerStatePreparation``,
``MottonenStatePreparation``), a ``BlockEncode`` of traced data, a pulse's ODE solver and a
user's ``qnode(M @ v)`` all met it with the adjoint method and "best" (PennyLane's
``templates/subroutines/test_select_pauli_rot.py::test_jax_jit`` crashed its worker).
``preprocess.interfaces.results_off_the_jit_root`` passes each result through an identity XLA keeps.

The end-to-end cases run in a subprocess: before the fix they aborted it, and an abort
inside the test process would take the pytest worker with it rather than fail the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pennylane as qml
import pytest

from pennylane_custatevec.preprocess.interfaces import results_off_the_jit_root

jax = pytest.importorskip("jax")
jnp = jax.numpy

pytestmark = pytest.mark.usefixtures("jax_float64")

_CASES = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import jax, jax.numpy as jnp, numpy as np, pennylane as qml
    jax.config.update("jax_enable_x64", True)

    case = sys.argv[1]
    x = jnp.array([0.3, 0.5, 0.9, 1.3])
    M = jnp.array([[1.0, 0.5, 0.0, 0.2], [0.2, 1.1, 0.3, 0.0],
                   [0.0, 0.4, 0.9, 0.1], [0.3, 0.0, 0.2, 1.2]])
    observable = qml.Z(2) @ qml.X(0) + 0.4 * qml.Y(1) + 0.3 * qml.X(2)
    H = (qml.pulse.pwc((1, 6)) * qml.X(0) + qml.pulse.pwc((0.5, 3)) * qml.Y(1)
         + 0.3 * qml.Z(0) @ qml.Z(1))

    def gates(v):
        qml.RX(0.4, 0); qml.RY(0.7, 1); qml.Hadamard(2)
        if case == "select_pauli_rot":
            qml.SelectPauliRot(v, control_wires=[0, 1], target_wire=2, rot_axis="Y")
        elif case == "diagonal":
            qml.DiagonalQubitUnitary(jnp.exp(1j * v), wires=[0, 2])
        elif case == "multiplexer":
            amplitudes = jnp.concatenate([v, 0.5 * v[::-1]])
            qml.MultiplexerStatePreparation(amplitudes / jnp.linalg.norm(amplitudes),
                                            wires=[0, 1, 2])
            qml.RX(0.3, 1)
        elif case == "mottonen":
            amplitudes = jnp.concatenate([v, 0.5 * v[::-1]])
            qml.MottonenStatePreparation(amplitudes / jnp.linalg.norm(amplitudes),
                                         wires=[0, 1, 2])
            qml.RX(0.3, 1)
        elif case == "block_encode":
            qml.BlockEncode(0.4 * jnp.diag(v[:2]) + 0.1 * v[2], wires=[0, 1])
        elif case == "user_matvec":  # the product is the user's, before the circuit
            w = M @ v
            qml.RX(w[0], 0); qml.RY(w[1], 1); qml.CRZ(w[2], [1, 2]); qml.RX(w[3], 2)
        elif case == "pulse":
            qml.evolve(H, atol=1e-13, rtol=1e-13)(params=[v[:2], v[2:]], t=(0, 4))
            qml.CNOT([0, 2])

    for name, diff_method in [("default.qubit", "backprop"), ("custatevec.qubit", "best"),
                              ("custatevec.qubit", "adjoint")]:
        dev = qml.device(name, wires=3)

        @qml.qnode(dev, diff_method=diff_method)
        def expval(v):
            gates(v)
            return qml.expval(observable)

        @qml.qnode(dev, diff_method=diff_method)
        def state(v):
            gates(v)
            return qml.state()

        out = {"value": float(jax.jit(expval)(x)),
               "grad": np.asarray(jax.jit(jax.grad(expval))(x)).tolist()}
        if case != "pulse":
            s = np.asarray(jax.jit(state)(x))
            out["state"] = [s.real.tolist(), s.imag.tolist()]
        print("RESULT " + diff_method + " " + json.dumps(out), flush=True)
    """
)

CASES = [
    "select_pauli_rot",
    "diagonal",
    "multiplexer",
    "mottonen",
    "block_encode",
    "user_matvec",
    "pulse",
]


def _run(case: str) -> dict:
    """default.qubit's backpropagation, then this device's "best" and "adjoint", by method."""
    done = subprocess.run(
        [sys.executable, "-c", _CASES, case], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{case} exited with {done.returncode}:\n{done.stderr[-3000:]}"
    results = {}
    for row in done.stdout.splitlines():
        if row.startswith("RESULT "):
            _, method, data = row.split(" ", 2)
            results[method] = json.loads(data)
    return results


@pytest.mark.parametrize("case", CASES)
def test_jitted_circuits_whose_parameters_pass_a_matrix_product_run(case):
    """Values, gradients (``jax.jit(jax.grad)``) and states under ``jax.jit`` with "best"
    and "adjoint" equal default.qubit's backpropagation; before, the process aborted. A
    pulse's gradient under ``jax.jit`` was refused by name for this reason; its ODE
    solvers (the matrix's here, the state's on default.qubit) agree to their tolerance."""
    atol = 1e-8 if case == "pulse" else 1e-10
    results = _run(case)
    want = results["backprop"]
    assert np.abs(want["grad"]).max() > 0.01  # the case has a derivative to compare
    for diff_method in ("best", "adjoint"):
        got = results[diff_method]
        np.testing.assert_allclose(got["value"], want["value"], atol=atol, rtol=0)
        np.testing.assert_allclose(got["grad"], want["grad"], atol=atol, rtol=0)
        if "state" in want:
            np.testing.assert_allclose(got["state"], want["state"], atol=atol, rtol=0)


def _entry_root(hlo: str) -> str:
    entry = hlo[hlo.index("ENTRY") :]
    return next(line for line in entry.splitlines() if line.strip().startswith("ROOT"))


@pytest.mark.parametrize("measure", ["expval", "state", "tuple"])
def test_the_compiled_programs_root_is_not_the_callback(measure):
    """The program jax hands XLA (lowered, not compiled: compiling is what aborted) ends in
    the identity, not in PennyLane's callback, for real, complex and several results."""
    dev = qml.device("custatevec.qubit", wires=2)

    @qml.qnode(dev, diff_method="adjoint")
    def circuit(x):
        qml.RX(x[0], 0)
        qml.CRY(x[1], [0, 1])
        if measure == "expval":
            return qml.expval(qml.Z(1))
        if measure == "state":
            return qml.state()
        return qml.expval(qml.Z(1)), qml.probs(wires=[0, 1])

    hlo = jax.jit(circuit).lower(jnp.array([0.3, 0.7])).compiler_ir("hlo").as_hlo_text()
    assert "custom-call" in hlo  # the callback is in the program
    root = _entry_root(hlo)
    assert "custom-call" not in root
    assert "reduce-precision" in hlo


def test_outside_jit_results_pass_unchanged():
    """Arrays, jax arrays outside ``jax.jit`` and nested results come back as they are."""
    tape = qml.tape.QuantumScript([qml.RX(0.3, 0)], [qml.expval(qml.Z(0))])
    (_,), post = results_off_the_jit_root(tape)
    plain = np.array([0.25, 0.75])
    concrete = jnp.array(0.5)
    results = ((plain, concrete), {"00": 3})
    out = post([results])
    assert out[0][0] is plain
    assert out[0][1] is concrete
    assert out[1] == {"00": 3}


def test_under_jit_values_are_unchanged_bit_for_bit():
    """The identity changes no bit of a float64, float32 or complex result."""
    rng = np.random.default_rng(7)
    values = {
        "f64": rng.normal(size=8),
        "f32": rng.normal(size=8).astype(np.float32),
        "c128": rng.normal(size=8) + 1j * rng.normal(size=8),
        "tiny": np.array([5e-324, -0.0, np.inf, 1e308]),
    }
    tape = qml.tape.QuantumScript([], [qml.expval(qml.Z(0))])
    (_,), post = results_off_the_jit_root(tape)
    for value in values.values():
        got = np.asarray(jax.jit(lambda v: post([v]))(jnp.asarray(value)))
        assert got.dtype == value.dtype
        np.testing.assert_array_equal(got.view(np.uint8), value.view(np.uint8))
