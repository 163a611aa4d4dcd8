"""The benchmark workloads W1..W6 of bench/WORKLOADS.md as torch training steps.

Every builder takes the device name, the QNode's ``diff_method`` and ``device_vjp`` and
optional size overrides, and returns a :class:`Workload`. Its ``step`` runs the timed work
once (forward and backward) and returns the values and the gradients as numpy arrays, so
the warm-up call doubles as the cross-check between devices.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import networkx as nx
import numpy as np
import pennylane as qml
import torch

SEED = 1234
Arrays = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Workload:
    """One benchmark step and its estimated cost under parameter-shift.

    ``shift_work`` counts amplitude updates (circuit executions x gates x 2**n x batch)
    that one step would take if the device differentiated it by parameter-shift.
    """

    step: Callable[[], Arrays]
    shift_work: float


def _shift_work(n_wires: int, n_gates: int, n_params: int, batch: int = 1, passes: int = 1):
    """Amplitude updates of ``passes`` parameter-shift Jacobians (2 executions per param)."""
    return float(passes * 2 * n_params * (n_gates + 1) * batch * 2**n_wires)


def _qnode(func, device_name: str, n_wires: int, diff_method: str, device_vjp: bool):
    device = qml.device(device_name, wires=n_wires)
    return qml.QNode(
        func, device, interface="torch", diff_method=diff_method, device_vjp=device_vjp
    )


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy()


def _sel_weights(n_layers: int, n_wires: int) -> torch.Tensor:
    shape = qml.StronglyEntanglingLayers.shape(n_layers=n_layers, n_wires=n_wires)
    values = np.random.default_rng(SEED).uniform(0.0, 2 * np.pi, size=shape)
    return torch.tensor(values, requires_grad=True)


def _sel_all_z(n_wires: int):
    def circuit(weights):
        qml.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return [qml.expval(qml.Z(w)) for w in range(n_wires)]

    return circuit


def sel_vjp(
    device_name: str, diff_method: str, device_vjp: bool, n_wires: int = 20, n_layers: int = 4
) -> Workload:
    """W1 (and W6): StronglyEntanglingLayers, expval(Z_i) on every wire, backward of the sum."""
    circuit = _qnode(_sel_all_z(n_wires), device_name, n_wires, diff_method, device_vjp)
    weights = _sel_weights(n_layers, n_wires)

    def step() -> Arrays:
        weights.grad = None
        outputs = torch.stack(circuit(weights))
        outputs.sum().backward()
        return _numpy(outputs), _numpy(weights.grad)

    work = _shift_work(n_wires, 2 * n_layers * n_wires, weights.numel())
    return Workload(step, work)


def sel_jacobian(
    device_name: str, diff_method: str, device_vjp: bool, n_wires: int = 16, n_layers: int = 4
) -> Workload:
    """W2: the full Jacobian of the n outputs of W1's circuit (torch.autograd.functional)."""
    circuit = _qnode(_sel_all_z(n_wires), device_name, n_wires, diff_method, device_vjp)
    weights = _sel_weights(n_layers, n_wires)

    def step() -> Arrays:
        outputs = []

        def forward(w):
            outputs.append(torch.stack(circuit(w)))
            return outputs[-1]

        jacobian = torch.autograd.functional.jacobian(forward, weights)
        return _numpy(outputs[0]), _numpy(jacobian)

    work = _shift_work(n_wires, 2 * n_layers * n_wires, weights.numel(), passes=n_wires)
    return Workload(step, work)


def minibatch(
    device_name: str,
    diff_method: str,
    device_vjp: bool,
    n_wires: int = 8,
    n_layers: int = 2,
    batch: int = 64,
) -> Workload:
    """W3: AngleEmbedding of a broadcast minibatch, then StronglyEntanglingLayers; expval(Z0)."""

    def func(x, weights):
        qml.AngleEmbedding(x, wires=range(n_wires))
        qml.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return qml.expval(qml.Z(0))

    circuit = _qnode(func, device_name, n_wires, diff_method, device_vjp)
    x = torch.tensor(np.random.default_rng(SEED + 1).uniform(0.0, np.pi, size=(batch, n_wires)))
    weights = _sel_weights(n_layers, n_wires)

    def step() -> Arrays:
        weights.grad = None
        outputs = circuit(x, weights)
        outputs.sum().backward()
        return _numpy(outputs), _numpy(weights.grad)

    work = _shift_work(n_wires, (2 * n_layers + 1) * n_wires, weights.numel(), batch=batch)
    return Workload(step, work)


def _rx_cnot_chain(n_wires: int):
    def circuit(angles):
        for w in range(n_wires):
            qml.RX(angles[w], wires=w)
        for w in range(n_wires - 1):
            qml.CNOT(wires=[w, w + 1])
        return qml.expval(qml.Z(n_wires - 1))

    return circuit


def latency(
    device_name: str, diff_method: str, device_vjp: bool, n_wires: int = 4, calls: int = 20
) -> Workload:
    """W4: ``calls`` sequential forward+backward calls of RX on each wire and a CNOT chain."""
    circuit = _qnode(_rx_cnot_chain(n_wires), device_name, n_wires, diff_method, device_vjp)
    rows = np.random.default_rng(SEED + 2).uniform(0.0, np.pi, size=(calls, n_wires))
    angles = [torch.tensor(row, requires_grad=True) for row in rows]

    def step() -> Arrays:
        values = []
        for a in angles:
            a.grad = None
            value = circuit(a)
            value.backward()
            values.append(_numpy(value))
        return np.array(values), np.stack([_numpy(a.grad) for a in angles])

    work = calls * _shift_work(n_wires, 2 * n_wires - 1, n_wires)
    return Workload(step, work)


def latency_forward(
    device_name: str, diff_method: str, device_vjp: bool, n_wires: int = 4, calls: int = 20
) -> Workload:
    """W4 forward only: ``calls`` sequential evaluations of W4's circuit, no gradient."""
    circuit = _qnode(_rx_cnot_chain(n_wires), device_name, n_wires, diff_method, device_vjp)
    rows = np.random.default_rng(SEED + 2).uniform(0.0, np.pi, size=(calls, n_wires))
    angles = [torch.tensor(row) for row in rows]

    def step() -> Arrays:
        values = np.array([_numpy(circuit(a)) for a in angles])
        return values, np.zeros(0)

    return Workload(step, 0.0)


def qaoa_maxcut(
    device_name: str, diff_method: str, device_vjp: bool, n_wires: int = 16, depth: int = 4
) -> Workload:
    """W5: QAOA MaxCut on a random 3-regular graph; expval of sum over edges of Z_i Z_j."""
    edges = list(nx.random_regular_graph(3, n_wires, seed=7).edges)
    cost = qml.Hamiltonian([1.0] * len(edges), [qml.Z(i) @ qml.Z(j) for i, j in edges])

    def func(gammas, betas):
        for w in range(n_wires):
            qml.Hadamard(wires=w)
        for gamma, beta in zip(gammas, betas, strict=True):
            for i, j in edges:
                qml.IsingZZ(2 * gamma, wires=[i, j])
            for w in range(n_wires):
                qml.RX(2 * beta, wires=w)
        return qml.expval(cost)

    circuit = _qnode(func, device_name, n_wires, diff_method, device_vjp)
    rng = np.random.default_rng(SEED + 3)
    gammas = torch.tensor(rng.uniform(0.0, 1.0, size=depth), requires_grad=True)
    betas = torch.tensor(rng.uniform(0.0, 1.0, size=depth), requires_grad=True)

    def step() -> Arrays:
        gammas.grad = betas.grad = None
        value = circuit(gammas, betas)
        value.backward()
        return _numpy(value), np.concatenate([_numpy(gammas.grad), _numpy(betas.grad)])

    n_gates = n_wires + depth * (len(edges) + n_wires)
    work = _shift_work(n_wires, n_gates, depth * (len(edges) + n_wires))
    return Workload(step, work)


BUILDERS: dict[str, Callable[..., Workload]] = {
    "W1": sel_vjp,
    "W2": sel_jacobian,
    "W3": minibatch,
    "W4": latency,
    "W4F": latency_forward,
    "W5": qaoa_maxcut,
    "W6": partial(sel_vjp, n_wires=24, n_layers=1),
}
"""W6 is W1's step with one layer at 24 wires, run in a fresh process for its peak RSS."""

QUICK_SIZES: dict[str, dict[str, int]] = {
    "W1": {"n_wires": 8},
    "W2": {"n_wires": 6},
    "W3": {"n_wires": 4, "batch": 16},
    "W4": {"calls": 5},
    "W4F": {"calls": 5},
    "W5": {"n_wires": 8, "depth": 2},
    "W6": {"n_wires": 12},
}
"""Size overrides for ``--quick``: every workload kept, every size small."""
