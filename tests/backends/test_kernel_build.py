"""The CPU kernels compiled ahead (``backends/kernel_build.py``) into the package's kernel
cache (``backends/kernel_cache.py``): the manifest covers the kernels, the cache lives in
the package (or a per-user copy where the package cannot be written), the first calls of
common circuits compile nothing once the manifest is built, and the kernels loaded from
the cache give the bits that compiling them at the call gives."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from numba.core import caching

from pennylane_custatevec.backends import _cpu_kernels, kernel_build, kernel_cache

ROOT = pathlib.Path(__file__).resolve().parents[2]

FIRST_CALLS = r"""
import json, sys
import numba.core.event as event
import numpy as np
import pennylane as qml
import torch

compiled = []


class CompileLog(event.Listener):
    def on_start(self, e):
        compiled.append(e.data["dispatcher"].py_func.__qualname__ + str(e.data["args"]))

    def on_end(self, e):
        pass


event.register("numba:compile", CompileLog())
torch.manual_seed(0)
dev = qml.device("custatevec.qubit", wires=4, backend="cpu")


@qml.qnode(dev, interface="torch", diff_method="adjoint")
def layered(x, w):
    qml.AngleEmbedding(x, wires=range(4))
    qml.StronglyEntanglingLayers(w, wires=range(4))
    return qml.expval(qml.Z(0) @ qml.Z(1))


@qml.qnode(dev, interface="torch", diff_method="adjoint")
def gates(a):
    qml.Hadamard(0)
    qml.CRX(a[0], wires=[0, 1])
    qml.IsingXX(a[1], wires=[1, 2])
    qml.PhaseShift(a[2], wires=3)
    qml.Toffoli(wires=[0, 2, 3])
    return qml.probs(wires=[0, 3])


bits = []
for _ in range(3):
    x = torch.rand(4, dtype=torch.float64)
    w = torch.rand(2, 4, 3, dtype=torch.float64, requires_grad=True)
    value = layered(x, w)
    value.backward()
    bits += [value.detach().numpy().tobytes().hex(), w.grad.numpy().tobytes().hex()]
for _ in range(2):
    a = torch.rand(3, dtype=torch.float64, requires_grad=True)
    value = gates(a)
    value.sum().backward()
    bits += [value.detach().numpy().tobytes().hex(), a.grad.numpy().tobytes().hex()]
print(json.dumps({"compiled": compiled, "bits": bits}))
"""


def run_first_calls(tmp_path: pathlib.Path, **environment: str) -> dict:
    """FIRST_CALLS in a fresh process with an empty ``NUMBA_CACHE_DIR``."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), **environment}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", FIRST_CALLS],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    return json.loads(result.stdout.splitlines()[-1])


def kernel_names() -> set[str]:
    return {
        name for name, value in vars(_cpu_kernels).items() if isinstance(value, _cpu_kernels.Kernel)
    }


def test_the_manifest_names_every_kernel_in_both_variants():
    listed = {(s.kernel, s.variant) for s in kernel_build.read_manifest()}
    expected = {(name, variant) for name in kernel_names() for variant in kernel_build.VARIANTS}
    assert expected - listed == set()
    assert {kernel for kernel, _ in listed} <= kernel_names()


def test_every_manifest_line_reads_back_as_numba_types():
    lines = kernel_build.MANIFEST.read_text().splitlines()
    assert lines == sorted(set(lines))
    for line in lines:
        signature = kernel_build.KernelSignature.parse(line)
        assert signature.line() == line
        types = signature.argument_types()
        assert repr(types) == signature.signature
        assert signature.dispatcher(_cpu_kernels) is getattr(
            getattr(_cpu_kernels, signature.kernel), signature.variant
        )


def test_a_signature_that_does_not_print_back_is_refused():
    signature = kernel_build.KernelSignature("apply_1q", "serial", "(int64,int64)")
    with pytest.raises(ValueError, match="cannot read the signature"):
        signature.argument_types()
    with pytest.raises(ValueError, match="unknown kernel variant 'fast'"):
        kernel_build.KernelSignature.parse("apply_1q\tfast\t(int64,)")


def test_shares_keep_each_kernels_signatures_together_and_lose_none():
    signatures = kernel_build.read_manifest()
    shares = kernel_build.shares(signatures, 3)
    assert len(shares) == 3
    assert sorted(s.line() for share in shares for s in share) == [s.line() for s in signatures]
    owners = {}
    for index, share in enumerate(shares):
        for signature in share:
            assert owners.setdefault(signature.kernel, index) == index
    assert kernel_build.shares(signatures[:1], 4) == [signatures[:1]]


def test_the_kernels_are_located_in_the_package_and_other_functions_are_not():
    assert caching.CacheImpl._locator_classes[0] is kernel_cache.PackagedKernelLocator
    source = _cpu_kernels.__file__
    locator = kernel_cache.PackagedKernelLocator.from_function(
        _cpu_kernels.apply_1q.serial.py_func, source
    )
    assert locator.get_cache_path() == str(kernel_cache.cache_dir())
    assert kernel_cache.cache_dir() == kernel_cache.CACHE_DIR  # the checkout is writable
    assert kernel_cache.PackagedKernelLocator.from_function(run_first_calls, __file__) is None


def test_a_read_only_package_cache_is_copied_to_the_user_cache(tmp_path):
    package, user = tmp_path / "package", tmp_path / "user"
    package.mkdir()
    (package / "kernel.nbi").write_bytes(b"index")
    (package / "kernel.0.nbc").write_bytes(b"data")
    user.mkdir()
    (user / "kernel.0.nbc").write_bytes(b"newer data")

    chosen = kernel_cache.choose_cache_dir(package, user, writable=lambda path: path == user)

    assert chosen == user
    assert (user / "kernel.nbi").read_bytes() == b"index"
    assert (user / "kernel.0.nbc").read_bytes() == b"newer data"  # never overwritten
    assert sorted(p.name for p in user.iterdir()) == ["kernel.0.nbc", "kernel.nbi"]
    assert kernel_cache.choose_cache_dir(package, user, writable=lambda path: False) is None
    assert kernel_cache.choose_cache_dir(package, user) == package


def test_is_writable(tmp_path):
    assert kernel_cache.is_writable(tmp_path / "new" / "dir")
    (tmp_path / "file").write_text("")
    assert not kernel_cache.is_writable(tmp_path / "file" / "dir")
    assert list((tmp_path / "new" / "dir").iterdir()) == []


def test_the_user_cache_is_under_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.user_cache_dir().parent == tmp_path / "pennylane-custatevec"


def test_first_calls_compile_nothing_once_built_and_give_the_bits_of_kernels_compiled_there(
    tmp_path,
):
    """The built manifest serves the first calls of the cold-start benchmark's circuits;
    numba compiling the kernels afresh at the call (its own locator only, an empty cache)
    gives the same bits."""
    assert kernel_build.build(kernel_build.read_manifest(), jobs=1) == []
    built = run_first_calls(tmp_path / "built")
    assert built["compiled"] == [], (
        "the first calls compiled kernels the manifest lacks: run "
        "scripts/record_kernel_signatures.sh"
    )
    afresh = run_first_calls(
        tmp_path / "afresh", NUMBA_CACHE_LOCATOR_CLASSES="UserProvidedCacheLocator"
    )
    assert afresh["compiled"] != []
    assert afresh["bits"] == built["bits"]
