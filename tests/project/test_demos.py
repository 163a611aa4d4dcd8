"""The scripts in demos/, each run once at a reduced size: two in this process through their
``main(argv)``, one through its command line."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

DEMOS = Path(__file__).resolve().parents[2] / "demos"

H2_FCI_ENERGY = -1.137270174660904
"""PySCF's full-CI energy of H2 in STO-3G at 0.7414 Angstrom, in Hartree."""


def load_demo(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"demos_{name}", DEMOS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # dataclasses look the defining module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_vqe_h2_reaches_chemical_accuracy():
    vqe = load_demo("vqe_h2")
    exact, hartree_fock = vqe.exact_energies(vqe.hamiltonian())
    assert abs(exact - H2_FCI_ENERGY) < 1e-9
    assert hartree_fock > exact + 0.02

    result = vqe.main(["--steps", "15", "--no-progress"])

    assert result.exact_energy == exact
    # Variational: the trained energy lies above the exact one, by less than 1.6 mHa.
    assert -1e-9 < result.error < vqe.CHEMICAL_ACCURACY
    assert result.steps_to_chemical_accuracy is not None


def test_torchlayer_classifier_learns_and_shows_progress(capsys):
    classifier = load_demo("torchlayer_classifier")

    result = classifier.main(["--samples", "80", "--epochs", "4"])

    # Chance is 0.5 on these balanced classes.
    assert result.train_accuracy >= 0.8
    assert result.test_accuracy >= 0.8
    captured = capsys.readouterr()
    assert "training: 100%" in captured.err
    assert re.search(r"train accuracy [\d.]+  test accuracy [\d.]+$", captured.out.strip())


def test_torchlayer_classifier_trains_alike_compiled_and_plain(capsys):
    """The demo compiles its QNode by default; the plain QNode trains to the same numbers."""
    classifier = load_demo("torchlayer_classifier")
    arguments = ["--samples", "40", "--epochs", "2", "--no-progress"]
    compiled = classifier.main(arguments)
    plain = classifier.main([*arguments, "--plain-qnode"])
    assert compiled.train_accuracy == plain.train_accuracy
    assert compiled.test_accuracy == plain.test_accuracy
    assert abs(compiled.final_loss - plain.final_loss) <= 1e-10
    capsys.readouterr()


def test_qaoa_maxcut_command_line_finds_the_max_cut():
    completed = subprocess.run(
        [
            sys.executable,
            str(DEMOS / "qaoa_maxcut.py"),
            *("--nodes", "8", "--layers", "2", "--steps", "30", "--shots", "200"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert completed.returncode == 0, completed.stderr
    assert "QAOA: 100%" in completed.stderr
    summary, final = completed.stdout.strip().splitlines()[-2:]
    ratio = float(re.search(r"approximation ratio ([\d.]+)", summary).group(1))
    # A random assignment cuts half the edges on average: 0.6 of this graph's max cut.
    assert ratio > 0.8
    found = re.fullmatch(
        r"most probable [01]{8} cut (\d+); best of 200 samples [01]{8} cut (\d+); "
        r"brute-force max cut (\d+)",
        final,
    )
    assert found, final
    most_probable, best_sampled, max_cut = map(int, found.groups())
    assert most_probable == best_sampled == max_cut


def test_vqe_qng_trains_with_the_devices_metric_tensor(capsys):
    vqe = load_demo("vqe_qng")
    result = vqe.main(["--wires", "4", "--layers", "2", "--steps", "8", "--no-progress"])

    hamiltonian = vqe.heisenberg_ring(4)
    assert result.exact_energy == vqe.ground_energy(hamiltonian, 4)  # seeded
    # the 4-spin Heisenberg ring's ground energy, -8 (the dense matrix's lowest eigenvalue)
    assert abs(result.exact_energy - qml_matrix_lowest(hamiltonian)) < 1e-9
    assert abs(result.exact_energy + 8) < 1e-9
    qng, adam = result.runs
    assert [run.optimiser for run in result.runs] == ["QNG (full)", "Adam"]
    for run in result.runs:
        assert len(run.energies) == 9
        assert run.energies[-1] < run.energies[0]  # both optimisers lower the energy
        assert min(run.energies) >= result.exact_energy - 1e-9  # variational
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("Heisenberg ring, 4 spins, 2 layers (16 angles)")
    assert lines[1].strip().startswith("QNG (full): energy")


def qml_matrix_lowest(hamiltonian) -> float:
    import numpy as np
    import pennylane as qml

    return float(np.linalg.eigvalsh(qml.matrix(hamiltonian, wire_order=range(4)))[0])
