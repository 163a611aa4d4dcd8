"""Helpers of the compiled path's tests: a compiled QNode's call compared with the QNode's
(results exactly as the QNode gives them, gradients to 1e-10)."""

from __future__ import annotations

import numpy as np
import pennylane as qml
import torch

ATOL = 1e-10


def tensors_in(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def assert_same_result(got, want, path: str = "result") -> None:
    """The same nesting (types), and per leaf the same type, shape, dtype, torch device
    and values (to ATOL)."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), f"{path}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_result(g, w, f"{path}[{i}]")
        return
    if isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for name in want:
            assert_same_result(got[name], want[name], f"{path}[{name!r}]")
        return
    if isinstance(want, torch.Tensor):
        assert got.shape == want.shape, f"{path}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{path}: dtype {got.dtype} != {want.dtype}"
        assert got.device == want.device, f"{path}: device {got.device} != {want.device}"
        np.testing.assert_allclose(
            got.detach().cpu().numpy(), want.detach().cpu().numpy(), atol=ATOL, err_msg=path
        )
        return
    np.testing.assert_allclose(got, want, atol=ATOL, err_msg=path)


def weighted_loss(result, seed: int = 7) -> torch.Tensor:
    """A real scalar that reads every output entry with its own fixed weight (real and
    imaginary parts of complex outputs apart)."""
    generator = np.random.default_rng(seed)
    total = torch.zeros((), dtype=torch.float64)
    for leaf in tensors_in(result):
        parts = (leaf.real, leaf.imag) if leaf.is_complex() else (leaf,)
        for part in parts:
            weights = torch.as_tensor(generator.uniform(-1, 1, tuple(part.shape)))
            total = total + (part.to(torch.float64) * weights).sum()
    return total


def assert_same_call(compiled, qnode, *args, **kwargs):
    """``compiled(*args, **kwargs)`` gives the QNode's results and torch gradients; returns
    the compiled call's result."""
    got = compiled(*args, **kwargs)
    want = qnode(*args, **kwargs)
    assert_same_result(got, want)
    inputs = [t for t in tensors_in((args, kwargs)) if t.requires_grad]
    if inputs and any(t.requires_grad for t in tensors_in(want)):
        got_grads = torch.autograd.grad(weighted_loss(got), inputs, allow_unused=True)
        want_grads = torch.autograd.grad(weighted_loss(want), inputs, allow_unused=True)
        for i, (g, w) in enumerate(zip(got_grads, want_grads, strict=True)):
            if w is None:
                assert g is None or not g.abs().max() > 0, f"gradient {i}: not None"
                continue
            assert g is not None, f"gradient {i}: None"
            np.testing.assert_allclose(g.numpy(), w.numpy(), atol=ATOL, err_msg=f"gradient {i}")
    return got


def expval_and_probs():
    return qml.expval(qml.Z(0)), qml.probs(wires=[1, 2])


def three_qubit_circuit(measurements=expval_and_probs) -> qml.QNode:
    """A QNode on 3 wires of ``x`` (3 entries): RX, RY, CNOT, CRZ and IsingXX of
    ``x[0] * x[1]``, returning ``measurements()``."""

    @qml.qnode(qml.device("custatevec.qubit", wires=3, backend="cpu"), interface="torch")
    def circuit(x):
        qml.RX(x[0], 0)
        qml.RY(x[1], 1)
        qml.CNOT([0, 1])
        qml.CRZ(x[2], [1, 2])
        qml.IsingXX(x[0] * x[1], wires=[0, 2])
        return measurements()

    return circuit
