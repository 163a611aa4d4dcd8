"""Drop-in behaviour of the device against default.qubit (issue 14, items 3, 9, 12, 14, 15):
Hessians with diff_method="best", bad input, qml.Tracker counts, seed="global", and free
memory without /proc/meminfo."""

from __future__ import annotations

import os
import sys
import types

import pennylane as qml
import pytest
from conftest import DEVICE

from pennylane_custatevec.backends import cpu
from pennylane_custatevec.backends.cpu import CPUBackend
from pennylane_custatevec.simulate import StateTooLargeError

# --- item 15: free memory without /proc/meminfo ----------------------------------------------


@pytest.fixture
def no_meminfo(monkeypatch, tmp_path):
    """A platform without /proc/meminfo (macOS, Windows) and without psutil."""
    monkeypatch.setattr(cpu, "MEMINFO_PATH", str(tmp_path / "no-meminfo"))
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError


def _fake_sysconf(monkeypatch, values: dict):
    names = {name: i for i, name in enumerate(values)}
    calls = []

    def sysconf(name):
        calls.append(name)
        return values[name]

    monkeypatch.setattr(os, "sysconf_names", names, raising=False)
    monkeypatch.setattr(os, "sysconf", sysconf, raising=False)
    return calls


def test_available_bytes_reads_proc_meminfo_where_it_exists(monkeypatch, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  999 kB\nMemFree:  5 kB\nMemAvailable:   1234 kB\n")
    monkeypatch.setattr(cpu, "MEMINFO_PATH", str(meminfo))
    assert CPUBackend().available_bytes() == 1234 * 1024


def test_available_bytes_without_proc_meminfo_uses_sysconf(no_meminfo, monkeypatch):
    calls = _fake_sysconf(monkeypatch, {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 1000})
    available = CPUBackend().available_bytes()
    assert type(available) is int and available == 4096 * 1000
    assert "SC_AVPHYS_PAGES" in calls


def test_available_bytes_without_free_page_count_takes_half_the_memory(no_meminfo, monkeypatch):
    """macOS: os.sysconf knows the physical pages, not the free ones."""
    _fake_sysconf(monkeypatch, {"SC_PAGE_SIZE": 16384, "SC_PHYS_PAGES": 1 << 20})
    assert CPUBackend().available_bytes() == 16384 * (1 << 20) // 2


def test_available_bytes_without_sysconf_is_the_documented_default(no_meminfo, monkeypatch):
    """Windows without psutil: no os.sysconf."""
    monkeypatch.setattr(os, "sysconf_names", {}, raising=False)
    available = CPUBackend().available_bytes()
    assert available == cpu.UNKNOWN_PLATFORM_BYTES > 0


def test_available_bytes_without_proc_meminfo_uses_psutil(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu, "MEMINFO_PATH", str(tmp_path / "no-meminfo"))
    fake = types.SimpleNamespace(
        virtual_memory=lambda: types.SimpleNamespace(available=7 * 2**30, total=16 * 2**30)
    )
    monkeypatch.setitem(sys.modules, "psutil", fake)
    assert CPUBackend().available_bytes() == 7 * 2**30


def test_too_large_circuit_refused_without_proc_meminfo(no_meminfo, monkeypatch):
    """With the fallback's figure (here 1 MiB free), a 21-qubit circuit (32 MiB) is refused
    before any state is allocated."""
    _fake_sysconf(monkeypatch, {"SC_PAGE_SIZE": 4096, "SC_AVPHYS_PAGES": 256})
    allocations = []
    for method in ("zero_state", "product_state", "from_host"):
        original = getattr(CPUBackend, method)

        def spy(self, *args, _original=original, **kwargs):
            allocations.append(args)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(CPUBackend, method, spy)
    dev = qml.device(DEVICE, wires=21, backend="cpu")

    @qml.qnode(dev)
    def circuit():
        for wire in range(21):
            qml.Hadamard(wire)
        return qml.expval(qml.Z(0))

    message = r"needs 33,554,432 bytes of cpu memory; 1,048,576 bytes are available"
    with pytest.raises(StateTooLargeError, match=message):
        circuit()
    assert allocations == []
