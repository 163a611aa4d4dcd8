"""Whether LLVM vectorises a one-qubit gate over a state vector, by memory layout and by
how the loop reaches it: the interleaved complex128 vector indexed through one argument
(the CPU kernels' loops before 2026-12-02), the same vector passed as two arguments with
each span sliced from its own (the kernels' ``_pairs_2x2`` now), a float64 view of it with
stride-2 access, and planar real and imaginary arrays. A 2x2 complex matrix applied to one
bit of a 2**``--qubits`` vector, ns per amplitude, best of ``--rounds`` (numba, the
backend's fastmath flags). All give the same numbers (checked first).

    python benchmarks/layout_probe.py
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from pennylane_custatevec.backends._cpu_kernels import _FASTMATH, _pairs_2x2

MATRIX = (0.5 + 0.1j, 0.2j, 0.3 + 0j, 0.4 - 0.1j)


@numba.njit(fastmath=_FASTMATH)
def interleaved(vec, bit, m00, m01, m10, m11):
    step = 1 << bit
    for start in range(0, vec.shape[0], 2 * step):
        for j in range(start, start + step):
            a = vec[j]
            b = vec[j + step]
            vec[j] = m00 * a + m01 * b
            vec[j + step] = m10 * a + m11 * b


@numba.njit(fastmath=_FASTMATH)
def two_arguments(vec, bit, m00, m01, m10, m11):
    _pairs_2x2(vec, vec, bit, 0, vec.shape[0] >> 1, m00, m01, m10, m11)


@numba.njit(fastmath=_FASTMATH)
def float_view(vec, bit, m00, m01, m10, m11):
    v = vec.view(np.float64)
    step = 1 << bit
    for start in range(0, vec.shape[0], 2 * step):
        for j in range(start, start + step):
            p, q = 2 * j, 2 * (j + step)
            ar, ai, br, bi = v[p], v[p + 1], v[q], v[q + 1]
            v[p] = m00.real * ar - m00.imag * ai + m01.real * br - m01.imag * bi
            v[p + 1] = m00.real * ai + m00.imag * ar + m01.real * bi + m01.imag * br
            v[q] = m10.real * ar - m10.imag * ai + m11.real * br - m11.imag * bi
            v[q + 1] = m10.real * ai + m10.imag * ar + m11.real * bi + m11.imag * br


@numba.njit(fastmath=_FASTMATH)
def planar(re, im, bit, m00, m01, m10, m11):
    step = 1 << bit
    for start in range(0, re.shape[0], 2 * step):
        lr, li = re[start : start + step], im[start : start + step]
        hr, hi = re[start + step : start + 2 * step], im[start + step : start + 2 * step]
        for i in range(step):
            ar, ai, br, bi = lr[i], li[i], hr[i], hi[i]
            lr[i] = m00.real * ar - m00.imag * ai + m01.real * br - m01.imag * bi
            li[i] = m00.real * ai + m00.imag * ar + m01.real * bi + m01.imag * br
            hr[i] = m10.real * ar - m10.imag * ai + m11.real * br - m11.imag * bi
            hi[i] = m10.real * ai + m10.imag * ar + m11.real * bi + m11.imag * br


def _best(kernel, arguments: tuple, rounds: int, reps: int) -> float:
    """Best seconds per call of ``kernel(*arguments)``."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(reps):
            kernel(*arguments)
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qubits", type=int, default=16)
    parser.add_argument("--bits", default="0,2,3,6,12")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = 1 << args.qubits
    rng = np.random.default_rng(0)
    vec = rng.normal(size=size) + 1j * rng.normal(size=size)
    print("| bit | one argument | two arguments | float view | planar (ns per amplitude) |")
    print("|---|---|---|---|---|")
    for bit in (int(b) for b in args.bits.split(",")):
        a, b, c = vec.copy(), vec.copy(), vec.copy()
        re, im = vec.real.copy(), vec.imag.copy()
        interleaved(a, bit, *MATRIX)
        two_arguments(c, bit, *MATRIX)
        float_view(b, bit, *MATRIX)
        planar(re, im, bit, *MATRIX)
        assert np.allclose(a, b) and np.allclose(a, c) and np.allclose(a, re + 1j * im)
        times = [
            _best(interleaved, (a, bit, *MATRIX), args.rounds, 100),
            _best(two_arguments, (c, bit, *MATRIX), args.rounds, 100),
            _best(float_view, (b, bit, *MATRIX), args.rounds, 100),
            _best(planar, (re, im, bit, *MATRIX), args.rounds, 100),
        ]
        print(f"| {bit} | " + " | ".join(f"{t / size * 1e9:.2f}" for t in times) + " |")


if __name__ == "__main__":
    main()
