"""Free host memory, for every backend (a GPU backend's samples and the host copies of
its results live there too): one function, from the first source the platform has."""

from __future__ import annotations

import os

MEMINFO_PATH = "/proc/meminfo"
"""Linux's memory statistics; its MemAvailable counts free memory and reclaimable caches."""

UNKNOWN_PLATFORM_BYTES = 4 << 30
"""Free memory assumed where the platform says nothing (no /proc/meminfo, no psutil, no
os.sysconf): 4 GiB, up to 28 qubits at complex128. Install psutil for the true figure."""


def free_host_bytes() -> int:
    """Free host memory in bytes, from the first source the platform has:

    1. Linux: MemAvailable of /proc/meminfo (free memory plus reclaimable caches);
    2. psutil, when importable (macOS, Windows): ``virtual_memory().available``;
    3. ``os.sysconf``: free pages times the page size (SC_AVPHYS_PAGES: free memory
       only, below what the system could reclaim), else half the physical memory
       (SC_PHYS_PAGES; macOS has no count of free pages);
    4. ``UNKNOWN_PLATFORM_BYTES``.
    """
    try:
        with open(MEMINFO_PATH, encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil  # optional: only where /proc/meminfo is missing
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    return _sysconf_bytes() or UNKNOWN_PLATFORM_BYTES


def _sysconf_bytes() -> int | None:
    """Free (else half the physical) memory from ``os.sysconf``, or None where it has
    neither (Windows)."""
    names = getattr(os, "sysconf_names", {})
    if "SC_PAGE_SIZE" not in names:
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    for name, share in (("SC_AVPHYS_PAGES", 1), ("SC_PHYS_PAGES", 2)):
        if name in names:
            pages = os.sysconf(name)
            if pages > 0 and page > 0:
                return pages * page // share
    return None
