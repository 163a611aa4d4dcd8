"""What the offline GPU check's Python sees: the project registered in the install target,
and a report of the environment.

    python scripts/gpu_site.py register TARGET   # TARGET/pennylane_custatevec-*.dist-info
    python scripts/gpu_site.py report [--strict] # versions, GPU, the backend's status

``register`` writes the distribution metadata that ``pip install`` would (METADATA and the
``pennylane.plugins`` entry points of setup.cfg), so that ``qml.device("custatevec.qubit")``
finds the repository's package on PYTHONPATH without building or copying it. ``report``
prints the versions of the packages the check depends on, what torch and cupy see, and
``unavailable_reason()`` of the cuStateVec backend; with ``--strict`` it exits 1 when the
cuStateVec bindings cannot be imported (with the traceback: the first thing to fix on a new
machine).
"""

from __future__ import annotations

import configparser
import importlib.util
import sys
import traceback
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTION = "pennylane_custatevec"
REPORTED = (
    "numpy",
    "scipy",
    "numba",
    "torch",
    "jax",
    "cupy-cuda13x",
    "pennylane",
    "pennylane_lightning",
    "custatevec-cu13",
    "cuquantum-python-cu13",
    "nvmath-python",
    "cuda-bindings",
    "cuda-core",
    "cuda-pathfinder",
    "nvidia-cuda-runtime",
    "nvidia-cublas",
    "pytest",
    "pytest-xdist",
    "flaky",
)


def entry_points_text(setup_cfg: Path) -> str:
    """setup.cfg's ``[options.entry_points]`` as an ``entry_points.txt`` file."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg, encoding="utf-8")
    sections = []
    for group, lines in parser["options.entry_points"].items():
        entries = [line.strip() for line in lines.splitlines() if line.strip()]
        sections.append(f"[{group}]\n" + "".join(f"{entry}\n" for entry in entries))
    return "\n".join(sections)


def register(target: Path, root: Path = ROOT) -> Path:
    """Write ``target/pennylane_custatevec-<version>.dist-info`` (METADATA, entry points)
    for the package in ``root``, replacing an earlier one; returns the folder."""
    version = _version_in(root)
    for stale in target.glob(f"{DISTRIBUTION}-*.dist-info"):
        for path in stale.iterdir():
            path.unlink()
        stale.rmdir()
    info = target / f"{DISTRIBUTION}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: pennylane-custatevec\nVersion: {version}\n",
        encoding="utf-8",
    )
    (info / "entry_points.txt").write_text(entry_points_text(root / "setup.cfg"), encoding="utf-8")
    return info


def _version_in(root: Path) -> str:
    """``__version__`` of the package in ``root``, read from its source (not imported)."""
    for line in (root / DISTRIBUTION / "__init__.py").read_text(encoding="utf-8").splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise RuntimeError(f"no __version__ in {root / DISTRIBUTION / '__init__.py'}")


def report(strict: bool) -> int:
    """Print versions, the GPU torch sees, and the backend's status; 1 when ``strict`` and
    the cuStateVec bindings do not import."""
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    for name in REPORTED:
        try:
            print(f"  {name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            print(f"  {name}: not installed")
    print(f"jax importable: {importlib.util.find_spec('jax') is not None}")
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        print(f"torch: CUDA {torch.version.cuda}, GPU {gpu}")
    except Exception as exc:  # reported, not fatal: only the peers need torch's GPU
        print(f"torch: {type(exc).__name__}: {exc}")
    try:
        import cuquantum.bindings.custatevec  # noqa: F401
    except Exception:  # the check cannot run: say exactly why
        print("cuquantum.bindings.custatevec does not import:")
        traceback.print_exc(file=sys.stdout)
        return 1 if strict else 0
    from pennylane_custatevec.backends import gpu

    print(f"cuStateVec backend: {gpu.unavailable_reason() or 'usable'}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "register":
        print(f"registered {register(Path(argv[1]))}")
        return 0
    if argv[:1] == ["report"] and argv[1:] in ([], ["--strict"]):
        return report(strict=argv[1:] == ["--strict"])
    print("usage: gpu_site.py register TARGET | gpu_site.py report [--strict]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
