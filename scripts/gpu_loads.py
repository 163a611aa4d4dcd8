"""Split wheels into loads: folders that each travel to an offline GPU machine in one call,
together with the repository, under a size limit.

    python scripts/gpu_loads.py --into .whl --repo-bytes N [--limit-mib 62]
                                [--alone custatevec_cu13] WHEEL...

Moves every WHEEL into ``<into>/load1``, ``<into>/load2``, ... and writes the same manifest
(``LOADS.txt``: one ``<load> <wheel>`` line per wheel) into each, so that any one load says
which loads the check needs (``scripts/gpu_check.sh`` reads it). Prints each load's wheels
and size, then the device calls that carry them.

The rule (:func:`split_loads`): the wheels are packed first-fit decreasing into as few loads
as hold them, and a wheel whose file name starts with an ``--alone`` prefix gets a load of
its own, after them (the custatevec wheel, 57 MiB: the last call's, so that the first call
carries everything else and its parts run without it). A load holds at most ``limit -
repo_bytes`` bytes: the repository travels with every call.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
DEFAULT_LIMIT_MIB = 62
"""What one call may carry with the repository: the device's working-tree limit is 64 MiB
(/work/.library/device/README.md); 2 MiB stay spare for files the tree gains (the
custatevec wheel, 57.1 MiB, and the repository, 2.9 MiB on 2026-12-06, leave 2)."""
MANIFEST = "LOADS.txt"


@dataclass(frozen=True)
class Load:
    """One folder of wheels that travels in one call: ``name`` (``load1``...), its
    ``wheels`` (file names, largest first) and their total ``size`` in bytes."""

    name: str
    wheels: tuple[str, ...]
    size: int


def split_loads(sizes: Mapping[str, int], capacity: int, alone: Sequence[str] = ()) -> list[Load]:
    """The loads of the wheels ``sizes`` (file name -> bytes), each at most ``capacity``
    bytes: the wheels first-fit decreasing (ties by name), then every wheel whose name
    starts with a prefix in ``alone`` by itself, in the order of the prefixes.

    Raises ValueError when ``capacity`` is not positive or a wheel is larger than it.
    """
    if capacity <= 0:
        raise ValueError(
            f"no room for wheels: the repository takes the whole limit ({capacity} bytes left)"
        )
    too_large = sorted(name for name, size in sizes.items() if size > capacity)
    if too_large:
        raise ValueError(
            f"{', '.join(too_large)} larger than a load may be ({capacity / MIB:.1f} MiB "
            "beside the repository): shrink the repository or raise the limit"
        )
    by_size = sorted(sizes, key=lambda name: (-sizes[name], name))
    singles = [
        name for prefix in alone for name in by_size if name.startswith(prefix)
    ]  # in the order of the prefixes
    bins: list[list[str]] = [[name] for name in dict.fromkeys(singles)]
    shared_bins: list[list[str]] = []
    for name in by_size:
        if name in singles:
            continue
        for wheels in shared_bins:
            if sum(sizes[w] for w in wheels) + sizes[name] <= capacity:
                wheels.append(name)
                break
        else:
            shared_bins.append([name])
    return [
        Load(f"load{index}", tuple(wheels), sum(sizes[w] for w in wheels))
        for index, wheels in enumerate(shared_bins + bins, start=1)
    ]


def manifest_text(loads: Sequence[Load]) -> str:
    """The manifest every load carries: ``<load> <wheel>`` per line, loads in order."""
    return "".join(f"{load.name} {wheel}\n" for load in loads for wheel in load.wheels)


def device_calls(loads: Sequence[Load], into: str) -> list[str]:
    """The device calls that carry ``loads``: the first installs its load and runs the
    parts that need no cuStateVec library (``first``), any between install theirs
    (``install``), the last installs the library and runs the rest (``run``)."""
    calls = []
    for index, load in enumerate(loads, start=1):
        mode = "first" if index == 1 else "run" if index == len(loads) else "install"
        calls.append(
            f"call {index}: command 'bash scripts/gpu_check.sh {mode}', "
            f'carry ["{into}/{load.name}"]'
        )
    return calls


def place(loads: Sequence[Load], wheels: Mapping[str, Path], into: Path) -> None:
    """Move each wheel into ``into/<load>`` and write the manifest into every load."""
    text = manifest_text(loads)
    for load in loads:
        folder = into / load.name
        folder.mkdir(parents=True, exist_ok=False)
        for wheel in load.wheels:
            shutil.move(wheels[wheel], folder / wheel)
        (folder / MANIFEST).write_text(text, encoding="ascii")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="the wheel files to split")
    parser.add_argument("--into", type=Path, required=True, help="folder of the loads")
    parser.add_argument(
        "--repo-bytes", type=int, required=True, help="bytes of the working tree that travels"
    )
    parser.add_argument("--limit-mib", type=float, default=DEFAULT_LIMIT_MIB)
    parser.add_argument(
        "--alone", action="append", default=[], help="file-name prefix of a wheel to load alone"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wheels = {path.name: path for path in args.wheels}
    capacity = int(args.limit_mib * MIB) - args.repo_bytes
    try:
        loads = split_loads({name: path.stat().st_size for name, path in wheels.items()},
                            capacity, args.alone)  # fmt: skip
    except ValueError as exc:
        print(f"gpu_loads.py: {exc}", file=sys.stderr)
        return 1
    stale = sorted(p.name for p in args.into.glob("load*")) if args.into.exists() else []
    if stale:
        print(f"gpu_loads.py: {args.into} already holds {', '.join(stale)}", file=sys.stderr)
        return 1
    place(loads, wheels, args.into)
    repo_mib = args.repo_bytes / MIB
    print(f"repository: {repo_mib:.1f} MiB; limit per call: {args.limit_mib:g} MiB")
    for load in loads:
        print(f"{args.into}/{load.name}: {load.size / MIB:.1f} MiB "
              f"({(load.size + args.repo_bytes) / MIB:.1f} MiB with the repository)")  # fmt: skip
        for wheel in load.wheels:
            print(f"    {(args.into / load.name / wheel).stat().st_size / MIB:6.2f} MiB  {wheel}")
    print("device calls (one after the other, the next within the machine's 30 s warm time):")
    for call in device_calls(loads, str(args.into)):
        print(f"  {call}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
