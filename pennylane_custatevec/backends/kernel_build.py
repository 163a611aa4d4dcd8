"""Compile the CPU kernels before their first call, into the package's kernel cache.

numba compiles a kernel at its first call with a new signature: about 0.1 s per function
and signature, some 30 s before a fresh install's first circuits have run. This module
compiles, ahead of time, every signature listed in :data:`MANIFEST` (the signatures the
project's tests call the kernels with, recorded by ``scripts/record_kernel_signatures.sh``)
into ``kernel_cache.CACHE_DIR``, where every later process finds them. It runs when the
package is built (``setup.py``, ``pip install .``), in ``scripts/setup_env.sh``, and on
demand::

    python -m pennylane_custatevec.backends.kernel_build      # the installed package
    python <package>/backends/kernel_build.py                 # without importing PennyLane

The compilations are numba's own, for this CPU model and this numba: another machine or
another numba compiles at the first call, as without this step. Kernels compile in
``--jobs`` processes (each process a share of the kernels; a callee that two processes
compile is saved by both, whole files replaced, so either copy serves).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import pathlib
import subprocess
import sys
import time
import types

MANIFEST = pathlib.Path(__file__).resolve().parent / "kernel_signatures.txt"
"""One line per compilation: kernel name, variant (``serial`` or ``threaded``) and numba
signature, tab-separated, sorted."""

VARIANTS = ("serial", "threaded")


def kernels_module() -> types.ModuleType:
    """``backends._cpu_kernels``. Loaded by path (``__package__`` empty: the package
    build, where PennyLane may be absent), the package and ``backends`` are bare namespace
    modules, so that their ``__init__`` files (which import PennyLane) do not run."""
    if not __package__:
        backends_dir = pathlib.Path(__file__).resolve().parent
        for name, path in (
            ("pennylane_custatevec", backends_dir.parent),
            ("pennylane_custatevec.backends", backends_dir),
        ):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = [str(path)]
                sys.modules[name] = package
    return importlib.import_module("pennylane_custatevec.backends._cpu_kernels")


def _type_names() -> dict[str, object]:
    from numba.core import types as nbtypes

    names = {"Array": nbtypes.Array, "bool": nbtypes.boolean}
    for name in ("int64", "int32", "uint64", "float64", "float32", "complex128", "complex64"):
        names[name] = getattr(nbtypes, name)
    return names


@dataclasses.dataclass(frozen=True)
class KernelSignature:
    """One compilation of one kernel: its name, variant and argument types."""

    kernel: str
    variant: str
    signature: str
    """The numba argument types as numba prints them, e.g.
    ``(Array(complex128, 2, 'C', False, aligned=True), int64)``."""

    def line(self) -> str:
        return f"{self.kernel}\t{self.variant}\t{self.signature}"

    @classmethod
    def parse(cls, line: str) -> KernelSignature:
        kernel, variant, signature = line.rstrip("\n").split("\t")
        if variant not in VARIANTS:
            raise ValueError(f"unknown kernel variant {variant!r} in {line!r}")
        return cls(kernel, variant, signature)

    def argument_types(self) -> tuple:
        """The signature as numba types; a text that does not print back the same is
        refused (the manifest lists only arrays and scalars)."""
        parsed = eval(self.signature, {"__builtins__": {}}, _type_names())  # noqa: S307
        parsed = parsed if isinstance(parsed, tuple) else (parsed,)
        if repr(parsed) != self.signature:
            raise ValueError(f"cannot read the signature {self.signature!r}")
        return parsed

    def dispatcher(self, kernels: types.ModuleType):
        return getattr(getattr(kernels, self.kernel), self.variant)


def compiled_signatures(kernels: types.ModuleType) -> list[KernelSignature]:
    """Every signature this process has compiled (or loaded from the cache) for the
    module's kernels, sorted."""
    found = set()
    for name, value in vars(kernels).items():
        if isinstance(value, kernels.Kernel):
            for variant in VARIANTS:
                for signature in getattr(value, variant).signatures:
                    found.add(KernelSignature(name, variant, repr(tuple(signature))))
    return sorted(found, key=KernelSignature.line)


def read_manifest(path: pathlib.Path = MANIFEST) -> list[KernelSignature]:
    return [KernelSignature.parse(line) for line in path.read_text().splitlines() if line]


def write_manifest(signatures, path: pathlib.Path = MANIFEST) -> None:
    lines = sorted({signature.line() for signature in signatures})
    path.write_text("".join(line + "\n" for line in lines))


def compile_signatures(signatures: list[KernelSignature]) -> list[str]:
    """Compile ``signatures`` in this process; the failures, one line each."""
    kernels = kernels_module()
    failures = []
    for signature in signatures:
        try:
            signature.dispatcher(kernels).compile(signature.argument_types())
        except Exception as error:  # noqa: BLE001 - reported, the others still compile
            failures.append(f"{signature.line()}: {type(error).__name__}: {error}")
    return failures


def shares(signatures: list[KernelSignature], jobs: int) -> list[list[KernelSignature]]:
    """``signatures`` cut into at most ``jobs`` shares, a kernel's signatures in one share,
    the kernels with the most signatures dealt first."""
    by_kernel: dict[str, list[KernelSignature]] = {}
    for signature in signatures:
        by_kernel.setdefault(signature.kernel, []).append(signature)
    cut: list[list[KernelSignature]] = [[] for _ in range(max(1, jobs))]
    for group in sorted(by_kernel.values(), key=len, reverse=True):
        min(cut, key=len).extend(group)
    return [share for share in cut if share]


def build(signatures: list[KernelSignature], jobs: int) -> list[str]:
    """Compile ``signatures`` in ``jobs`` processes (each running this file by path);
    the failures, one line each."""
    workers = []
    for share in shares(signatures, jobs):
        worker = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        worker.stdin.write("".join(signature.line() + "\n" for signature in share))
        worker.stdin.close()
        workers.append(worker)
    failures = []
    for worker in workers:
        failures += worker.stdout.read().splitlines()
        if worker.wait() != 0 and not failures:
            failures.append(f"a compiling process exited with status {worker.returncode}")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--merge",
        type=pathlib.Path,
        metavar="DIR",
        help="write the manifest from the recordings in DIR (scripts/record_kernel_signatures.sh)",
    )
    options = parser.parse_args(argv)
    if options.worker:
        signatures = [KernelSignature.parse(line) for line in sys.stdin if line.strip()]
        print("\n".join(compile_signatures(signatures)), end="")
        return 0
    if options.merge is not None:
        recorded = [
            KernelSignature.parse(line)
            for path in sorted(options.merge.glob("*.txt"))
            for line in path.read_text().splitlines()
            if line
        ]
        write_manifest(recorded)
        print(f"{MANIFEST}: {len({s.line() for s in recorded})} signatures")
        return 0
    signatures = read_manifest()
    start = time.perf_counter()
    failures = build(signatures, options.jobs)
    cache = kernels_module().kernel_cache.cache_dir()
    print(
        f"compiled {len(signatures) - len(failures)} of {len(signatures)} kernel signatures "
        f"in {time.perf_counter() - start:.0f} s ({options.jobs} processes) into {cache}"
    )
    for failure in failures:
        print(f"  failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
