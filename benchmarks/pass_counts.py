"""Passes over the state per training step, counted at the CPU backend, per workload, in
three configurations: neither permutation runs nor tiled runs (every CNOT and every
one-bit block its own pass), with the CNOT rings as permutation runs (the CPU's
``FusionTraits.permutation_bits``), and with tiled runs as well (``tile_bits``, from
``min_tiled_qubits``: the default).

A *pass* here is one backend call on one state-sized vector: a call that takes a batch of
B vectors (and, for an adjoint step, its R bras per vector) counts B (+ B*R), each array
argument shaped like the state counted once. A kernel that reads a vector several times
within one call (the permutation's read into its buffer and write back) is one pass; a
call that touches half the amplitudes (a CNOT) is one too. The count says how many times
the step walks over vectors, not how many bytes move.

    python benchmarks/pass_counts.py [--workloads W1,W2,W5,W6] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import warnings
from collections.abc import Callable
from unittest import mock

import numpy as np
import torch
from workloads import BUILDERS, QUICK_SIZES, Setup

from pennylane_custatevec.backends import cpu
from pennylane_custatevec.backends.cpu import CPUBackend

COUNTED = (
    "apply_matrix",
    "apply_diagonal",
    "apply_pauli",
    "apply_pauli_rotation",
    "apply_one_qubit_rotations",
    "apply_z_rotations",
    "apply_bit_permutation",
    "apply_tiled_matrices",
    "scale",
    "product_state",
    "expval_pauli_words",
    "braket",
    "inner_pauli",
    "inner_matrix",
    "adjoint_pauli_rotation_step",
    "adjoint_z_rotations_step",
    "adjoint_one_qubit_rotations_step",
    "adjoint_block_step",
    "adjoint_tiled_matrices_step",
    "add_pauli_sum",
    "add_scaled",
    "probabilities",
    "run_sequence",
    "sweep_sequence",
    "run_sequence_measured",
    "sweep_sequence_from_words",
)
"""The CPU backend's methods that walk over state vectors."""

PASSES: collections.Counter = collections.Counter()


def _vectors(arguments: tuple, result: object) -> int:
    """The state-sized vectors among a call's array arguments (and a new state it returns):
    rows of 2-D complex arrays of 2**k amplitudes, k >= 1."""
    arrays = [a for a in arguments if isinstance(a, np.ndarray)]
    if isinstance(result, np.ndarray) and not any(a is result for a in arrays):
        arrays.append(result)
    count = 0
    for array in arrays:
        width = array.shape[-1] if array.ndim == 2 else 0
        if np.iscomplexobj(array) and width >= 2 and width & (width - 1) == 0:
            count += array.shape[0]
    return count


def _counting(name: str, method: Callable) -> Callable:
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        result = method(self, *args, **kwargs)
        PASSES[name] += _vectors(args + tuple(kwargs.values()), result)
        return result

    return wrapper


CONFIGURATIONS = {
    "neither": {"permutation_bits": 0, "tile_bits": 0},
    "permutation runs": {"tile_bits": 0},
    "permutation and tiled runs": {},
}
"""The CPU's fusion traits changed for each configuration (the last: the default)."""


def passes_per_step(workload: str, sizes: dict, changes: dict) -> collections.Counter:
    """The passes of one warm step of ``workload`` (our QNode, adjoint + device_vjp), with
    the CPU's fusion traits changed by ``changes``."""
    traits = dataclasses.replace(cpu.CPU_FUSION_TRAITS, **changes)
    with mock.patch.object(CPUBackend, "fusion_traits", traits):
        step = BUILDERS[workload](Setup("custatevec.qubit", "adjoint", True), **sizes).step
        step()  # warm-up: plans and compiles
        PASSES.clear()
        step()
    return collections.Counter(PASSES)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W5,W6")
    parser.add_argument("--quick", action="store_true", help="the workloads' quick sizes")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="custatevec.qubit runs on the CPU backend")
    torch.set_num_threads(2)
    for name in COUNTED:
        setattr(CPUBackend, name, _counting(name, getattr(CPUBackend, name)))
    names = list(CONFIGURATIONS)
    print(f"| workload | passes: {' | '.join(names)} | ratio, first / last | permutation "
          "runs | tiled runs (forward + sweep) |")  # fmt: skip
    print("|---|" + "---|" * (len(names) + 3))
    for workload in args.workloads.split(","):
        sizes = QUICK_SIZES[workload] if args.quick else {}
        counts = [passes_per_step(workload, sizes, CONFIGURATIONS[name]) for name in names]
        totals = [sum(count.values()) for count in counts]
        last = counts[-1]
        tiled = last["apply_tiled_matrices"] + last["adjoint_tiled_matrices_step"]
        print(
            f"| {workload} | {' | '.join(str(t) for t in totals)} | "
            f"{totals[0] / max(totals[-1], 1):.2f}x | {last['apply_bit_permutation']} | "
            f"{tiled} |"
        )


if __name__ == "__main__":
    main()
