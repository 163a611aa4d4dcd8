"""Passes over the state per training step, counted at the CPU backend, per workload:
with the CNOT rings as permutation runs (the CPU's ``FusionTraits.permutation_bits``) and
without them (0: every CNOT its own pass).

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


def passes_per_step(workload: str, sizes: dict, permutation_bits: int) -> collections.Counter:
    """The passes of one warm step of ``workload`` (our QNode, adjoint + device_vjp), with
    the CPU's permutation runs limited to ``permutation_bits`` moved bits (0: none)."""
    traits = dataclasses.replace(cpu.CPU_FUSION_TRAITS, permutation_bits=permutation_bits)
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
    runs = cpu.CPU_FUSION_TRAITS.permutation_bits
    print("| workload | passes, CNOTs one by one | passes, permutation runs | ratio | runs |")
    print("|---|---|---|---|---|")
    for workload in args.workloads.split(","):
        sizes = QUICK_SIZES[workload] if args.quick else {}
        before = passes_per_step(workload, sizes, 0)
        after = passes_per_step(workload, sizes, runs)
        total_before, total_after = sum(before.values()), sum(after.values())
        print(
            f"| {workload} | {total_before} | {total_after} | "
            f"{total_before / max(total_after, 1):.2f}x | {after['apply_bit_permutation']} |"
        )


if __name__ == "__main__":
    main()
