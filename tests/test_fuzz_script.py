"""The smoke test of ``scripts/fuzz.py``: one small random circuit per mode agrees with
default.qubit, and a difference above the tolerance is reported and fails the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import fuzz  # noqa: E402


@pytest.mark.parametrize("broadcast", [False, True])
def test_a_small_random_circuit_agrees(broadcast, capsys):
    argv = ["--first-seed", "3", "--count", "1", "--min-wires", "3", "--max-wires", "4"]
    assert fuzz.main(argv + (["--broadcast"] if broadcast else [])) == 0
    output = capsys.readouterr().out
    assert "1 circuits, 0 with a mismatch" in output
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
