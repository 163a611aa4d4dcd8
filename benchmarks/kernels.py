"""Per-gate kernels: our CPU backend against lightning.qubit's, on one state vector.

    python benchmarks/kernels.py [--qubits 20] [--repeat 20]

Every gate is applied to the same logical wires on both simulators. The wires are given
in PennyLane's convention (wire 0 = most significant bit of the state index); our backend
gets bit n-1-w for wire w. Each gate is first checked: from a Hadamard layer, both apply it
at every placement and their states must agree (np.allclose). Then each placement is timed
(median of --repeat single applications, after the check as warm-up) and the table reports
the mean over the placements.
"""

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numba
import numpy as np
import pennylane_lightning.lightning_qubit_ops as lightning_ops
from scipy.stats import unitary_group

from pennylane_custatevec.backends.cpu import CPUBackend

SEED = 1234
HADAMARD = np.array([[1.0, 1.0], [1.0, -1.0]], dtype=np.complex128) / np.sqrt(2)


class Simulators:
    """Our state (shape (1, 2**n)) and lightning's, both reset to a Hadamard layer."""

    def __init__(self, n_qubits: int):
        self.n_qubits = n_qubits
        self.backend = CPUBackend(np.complex128)
        self.ours = self.backend.zero_state(n_qubits, 1)
        self.lightning = lightning_ops.StateVectorC128(n_qubits)

    def bits(self, wires: tuple[int, ...]) -> list[int]:
        """Our state bits of PennyLane wires: wire w is bit n-1-w."""
        return [self.n_qubits - 1 - w for w in wires]

    def reset(self) -> None:
        self.ours[...] = 0.0
        self.ours[0, 0] = 1.0
        self.lightning.resetStateVector()
        for wire in range(self.n_qubits):
            self.backend.apply_matrix(self.ours, HADAMARD[None], self.bits((wire,)))
            self.lightning.Hadamard([wire], False, [])

    def states_agree(self) -> bool:
        theirs = np.empty(1 << self.n_qubits, dtype=np.complex128)
        self.lightning.getState(theirs)
        return bool(np.allclose(self.ours[0], theirs))


Apply = Callable[[Simulators, tuple[int, ...]], None]
"""Applies one gate to PennyLane wires on one of the two simulators."""


@dataclass(frozen=True)
class Gate:
    """A logical gate on ``n_wires`` wires, as a call into each simulator."""

    name: str
    n_wires: int
    ours: Apply
    lightning: Apply


def gates(seed: int = SEED) -> list[Gate]:
    """RX, CNOT, a random 2-qubit unitary, a doubly controlled random U, Toffoli.

    Wires are (target) for RX, (control, target) for CNOT, (w0, w1) for the 2-qubit matrix
    with w0 its most significant bit, (control, control, target) for the 3-qubit gates.
    """
    angle = np.array([0.3])
    u2 = unitary_group.rvs(4, random_state=seed)
    u1 = unitary_group.rvs(2, random_state=seed + 1)
    return [
        Gate(
            "RX",
            1,
            lambda s, w: s.backend.apply_pauli_rotation(s.ours, angle, "X", s.bits(w)),
            lambda s, w: s.lightning.RX(list(w), False, [0.3]),
        ),
        Gate(
            "CNOT",
            2,
            lambda s, w: s.backend.apply_pauli(s.ours, "X", s.bits(w[1:]), s.bits(w[:1]), [1]),
            lambda s, w: s.lightning.CNOT(list(w), False, []),
        ),
        Gate(
            "2-qubit unitary",
            2,
            lambda s, w: s.backend.apply_matrix(s.ours, u2[None], s.bits(w[::-1])),
            lambda s, w: s.lightning.applyMatrix(u2, list(w), False),
        ),
        Gate(
            "doubly controlled U",
            3,
            lambda s, w: s.backend.apply_matrix(
                s.ours, u1[None], s.bits(w[2:]), s.bits(w[:2]), [1, 1]
            ),
            lambda s, w: s.lightning.applyControlledMatrix(
                u1, list(w[:2]), [True, True], list(w[2:]), False
            ),
        ),
        Gate(
            "Toffoli",
            3,
            lambda s, w: s.backend.apply_pauli(s.ours, "X", s.bits(w[2:]), s.bits(w[:2]), [1, 1]),
            lambda s, w: s.lightning.Toffoli(list(w), False, []),
        ),
    ]


def placements(n_qubits: int, k: int) -> dict[str, tuple[int, ...]]:
    """Wires of a k-qubit gate on the lowest, middle and highest state bits, and spread out."""
    middle = n_qubits // 2 - k // 2
    wires = {
        "low bits": tuple(range(n_qubits - k, n_qubits)),
        "middle bits": tuple(range(middle, middle + k)),
        "high bits": tuple(range(k)),
    }
    if k > 1:
        wires["spread"] = tuple(round(i * (n_qubits - 1) / (k - 1)) for i in range(k))
    return wires


@dataclass
class Timing:
    """Milliseconds per gate at one placement."""

    wires: tuple[int, ...]
    ours_ms: float
    lightning_ms: float


def measure(gate: Gate, sims: Simulators, repeat: int) -> tuple[bool, dict[str, Timing]]:
    """Check the gate at every placement (agreement of the states), then time each one."""
    wires = placements(sims.n_qubits, gate.n_wires)
    sims.reset()
    for w in wires.values():
        gate.ours(sims, w)
        gate.lightning(sims, w)
    agree = sims.states_agree()
    timings = {
        name: Timing(
            w, median_ms(gate.ours, sims, w, repeat), median_ms(gate.lightning, sims, w, repeat)
        )
        for name, w in wires.items()
    }
    return agree, timings


def median_ms(apply: Apply, sims: Simulators, wires: tuple[int, ...], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        apply(sims, wires)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


Results = dict[str, tuple[bool, dict[str, Timing]]]
"""Per gate name: whether the states agreed, and the timing at each placement."""


def render(results: Results, args: argparse.Namespace) -> str:
    """The report: environment, the mean per gate, then every placement."""
    lines = [*_preamble(args), "", "| gate | ours (ms) | lightning.qubit (ms) | ratio |"]
    lines.append("| --- | --- | --- | --- |")
    for name, (agree, timings) in results.items():
        ours = np.mean([t.ours_ms for t in timings.values()])
        theirs = np.mean([t.lightning_ms for t in timings.values()])
        check = "" if agree else " **MISMATCH**"
        lines.append(f"| {name}{check} | {ours:.3f} | {theirs:.3f} | {theirs / ours:.2f}x |")
    lines += ["", "| gate | placement | wires | ours (ms) | lightning.qubit (ms) | ratio |"]
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for name, (_, timings) in results.items():
        for where, t in timings.items():
            lines.append(
                f"| {name} | {where} | {t.wires} | {t.ours_ms:.3f} | {t.lightning_ms:.3f} "
                f"| {t.lightning_ms / t.ours_ms:.2f}x |"
            )
    return "\n".join([*lines, "", *_legend()]) + "\n"


def _preamble(args: argparse.Namespace) -> list[str]:
    return [
        f"# Gate kernels at {args.qubits} qubits: our CPU backend and lightning.qubit",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.platform()}, {os.cpu_count()} CPUs",
        f"- numba {numba.__version__} ({numba.get_num_threads()} threads), "
        f"pennylane_lightning {metadata.version('pennylane_lightning')} "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), complex128",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- time per gate: median of {args.repeat} applications, mean over the placements",
    ]


def _legend() -> list[str]:
    return [
        "ratio = lightning time / our time (higher is better). Wires are PennyLane wires",
        "(wire 0 = most significant bit): 'low bits' are the last wires. Controls come first,",
        "the target last. **MISMATCH**: the two states differed after the gate (np.allclose).",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qubits", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=20, help="timed applications per placement")
    parser.add_argument("--out", default="benchmarks/results/kernels.md")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sims = Simulators(args.qubits)
    results = {gate.name: measure(gate, sims, args.repeat) for gate in gates()}
    report = render(results, args)
    print(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report, encoding="utf-8")
    return 0 if all(agree for agree, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
