"""The smoke test of ``scripts/fuzz.py``: one small random circuit per mode agrees with
default.qubit, and a difference above the tolerance is reported and fails the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import fuzz  # noqa: E402


@pytest.mark.parametrize(
    "mode",
    [
        [],
        ["--broadcast"],
        ["--mid-measurements"],
        ["--shots"],
        ["--shared-device"],
        ["--jax"],
        ["--constants"],
        ["--matrices"],
        ["--compiled", "--calls", "20"],
    ],
)
def test_a_small_random_circuit_agrees(mode, capsys):
    argv = ["--first-seed", "3", "--count", "1", "--min-wires", "4", "--max-wires", "5"]
    assert fuzz.main(argv + mode) == 0
    output = capsys.readouterr().out
    noun = "functions" if "--compiled" in mode else "circuits"
    assert f"1 {noun}, 0 with a mismatch" in output
    assert "MISMATCH" not in output


def test_a_difference_above_the_tolerance_fails_the_run(monkeypatch, capsys):
    monkeypatch.setattr(fuzz, "TOLERANCE", -1.0)  # every difference is above it
    assert fuzz.main(["--count", "1", "--min-wires", "3", "--max-wires", "3"]) == 1
    output = capsys.readouterr().out
    assert "MISMATCH seed 0" in output
    assert "1 circuits, 1 with a mismatch" in output


def test_too_few_wires_are_refused():
    with pytest.raises(SystemExit):
        fuzz.main(["--min-wires", "2"])


# seed 0 postselects, 1 takes the adjoint method, 6 parameter-shift
@pytest.mark.parametrize("seed", [0, 1, 6])
def test_mid_measurement_circuits_agree_and_refuse(seed, capsys):
    argv = ["--mid-measurements", "--first-seed", str(seed), "--count", "1"]
    assert fuzz.main([*argv, "--min-wires", "4", "--max-wires", "5"]) == 0
    assert "1 circuits, 0 with a mismatch" in capsys.readouterr().out


def test_mid_measurements_need_four_wires():
    with pytest.raises(SystemExit):
        fuzz.main(["--mid-measurements", "--min-wires", "3"])


def test_a_sampled_result_beyond_its_errors_fails_the_run(monkeypatch, capsys):
    monkeypatch.setattr(fuzz, "SIGMAS", 0.0)  # every sampling error is beyond the bound
    assert fuzz.main(["--shots", "--count", "1", "--min-wires", "3", "--max-wires", "3"]) == 1
    assert "MISMATCH seed 0" in capsys.readouterr().out


def test_a_compiled_mismatch_prints_the_source_and_fails_the_run(monkeypatch, capsys):
    """``--compiled``: a generated function whose compiled calls differ from the QNode's
    (here: the compiled QNode replaced by one that is off by 1e-6) prints MISMATCH with
    its seed and source, and the run fails."""
    import compiled_generator

    def shifted(result):
        if isinstance(result, (tuple, list)):
            return type(result)(shifted(item) for item in result)
        return result + 1e-6

    def off(qnode, _verify_every):
        return lambda *args, **kwargs: shifted(qnode(*args, **kwargs))

    monkeypatch.setattr(compiled_generator, "compile_qnode", off)
    argv = ["--compiled", "--first-seed", "4", "--count", "1", "--min-wires", "3"]
    assert fuzz.main([*argv, "--max-wires", "3", "--calls", "4"]) == 1
    output = capsys.readouterr().out
    assert "MISMATCH seed 4 n 3: generated function 4" in output
    assert "def circuit(" in output
    assert "1 functions, 1 with a mismatch" in output


@pytest.mark.parametrize("mode", [[], ["--broadcast"]])
def test_a_circuit_without_parameters_is_checked(mode, capsys):
    """Seed 7018 (3 to 11 wires) draws 4 wires and gates without parameters: the run
    compares its values (and, broadcast, the minibatch's gradient) instead of failing on
    an empty Jacobian or a backward pass of nothing trainable."""
    rng = fuzz.np.random.default_rng([7018, 1])
    n = int(rng.integers(3, 12))
    gates = fuzz.random_gates(fuzz.np.random.default_rng(7018), n, int(rng.integers(2, 5)))
    assert sum(fuzz.n_parameters(name) for name, _ in gates) == 0
    argv = ["--first-seed", "7018", "--count", "1", "--min-wires", "3", "--max-wires", "11"]
    assert fuzz.main(argv + mode) == 0
    assert "1 circuits, 0 with a mismatch" in capsys.readouterr().out
