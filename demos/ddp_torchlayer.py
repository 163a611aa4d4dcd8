"""Data-parallel training of a ``qml.qnn.TorchLayer`` on ``custatevec.qubit`` with
``torch.nn.parallel.DistributedDataParallel`` (DDP), one process ("rank") per device.

Launch two ranks on one machine from the repository root (a few seconds after the imports):

    torchrun --nproc_per_node 2 demos/ddp_torchlayer.py
    python -m torch.distributed.run --nproc_per_node 2 demos/ddp_torchlayer.py --epochs 10

Without a launcher, ``python demos/ddp_torchlayer.py`` runs the same code as one rank.

Every rank builds its own device and the same model,

    TorchLayer(AngleEmbedding + StronglyEntanglingLayers, 4 qubits) -> Linear(4, 2)

(``diff_method="adjoint"``, ``device_vjp=True``: the device differentiates the circuit), and
wraps it in DDP, which copies rank 0's parameters to every rank when it wraps the model. A
``DistributedSampler`` gives each rank its own, equally long share of a seeded data set; each
rank runs the circuit and its adjoint backward pass on its own minibatch only. During
``backward()`` DDP all-reduces the parameters' gradients and divides them by the number of
ranks, so every rank holds the *average* of the ranks' gradients, and the optimizers, starting
from the same parameters with the same gradients, take the same step on every rank. With a
mean loss and minibatches of equal size, that average is the gradient of the mean loss over
the union of the minibatches: a step under DDP on ``R`` ranks equals one step of a single
process on a batch ``R`` times as large (tests/device/test_data_parallel.py checks it to 1e-10).

The process group uses gloo (CPU tensors; it works whatever backend the device simulates on).
With the GPU backend, each rank's device takes GPU ``$LOCAL_RANK`` (the device's
``device_id=None``), so run at most as many ranks per machine as there are GPUs. With
``--dist-backend nccl`` (a CUDA build of torch) the classical model and the minibatches live
on ``cuda:$LOCAL_RANK`` as well. Rank 0 prints the loss of every epoch, averaged over all
ranks' samples.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import pennylane as qml
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import pennylane_custatevec


@dataclass(frozen=True)
class Result:
    epoch_losses: list[float]
    accuracy: float
    world_size: int
    seconds: float


def make_data(
    n_samples: int, n_features: int, seed: int, noise: float = 0.7
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two Gaussian blobs (labels 0 and 1) centred at -0.8 and +0.8 on every feature, in
    random order; the same on every rank for the same arguments."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n_samples) % 2)
    centres = np.where(y[:, None] == 1, 0.8, -0.8)
    x = centres + noise * rng.standard_normal((n_samples, n_features))
    return torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.int64)


def make_device(n_wires: int, backend: str = "auto") -> qml.devices.Device:
    """This process's own ``custatevec.qubit`` device. ``device_id`` stays ``None``: with the
    GPU backend the device then takes GPU ``$LOCAL_RANK``, one GPU per rank under torchrun."""
    return qml.device("custatevec.qubit", wires=n_wires, backend=backend)


def build_model(dev: qml.devices.Device, n_layers: int, compiled: bool = True) -> torch.nn.Module:
    """The classifier on ``dev``, in float64: the device computes in complex128, so the
    classical layer loses nothing, and the gradients that DDP averages match a single
    process's to round-off."""
    n_wires = len(dev.wires)

    @qml.qnode(dev, interface="torch", diff_method="adjoint", device_vjp=True)
    def circuit(inputs: torch.Tensor, weights: torch.Tensor) -> list:
        qml.AngleEmbedding(inputs, wires=range(n_wires))
        qml.StronglyEntanglingLayers(weights, wires=range(n_wires))
        return [qml.expval(qml.PauliZ(w)) for w in range(n_wires)]

    layer = pennylane_custatevec.compile(circuit) if compiled else circuit
    quantum = qml.qnn.TorchLayer(layer, {"weights": (n_layers, n_wires, 3)})
    return torch.nn.Sequential(quantum, torch.nn.Linear(n_wires, 2)).double()


def init_distributed(dist_backend: str) -> None:
    """Join the process group: torchrun's ranks find each other through the environment
    it sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); a script started without a
    launcher is a group of one."""
    if "RANK" in os.environ:
        dist.init_process_group(dist_backend)
    else:
        dist.init_process_group(dist_backend, store=dist.HashStore(), rank=0, world_size=1)


def all_ranks_sum(values: list[float], device: torch.device) -> list[float]:
    """``values`` summed element-wise over the ranks (every rank gets the sums)."""
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a TorchLayer classifier on custatevec.qubit with DDP, one "
        "device per rank (launch with torchrun --nproc_per_node N)."
    )
    parser.add_argument("--wires", type=int, default=4, help="qubits and features (default 4)")
    parser.add_argument("--layers", type=int, default=2, help="entangling layers (default 2)")
    parser.add_argument(
        "--samples", type=int, default=256, help="data set size, all ranks (default 256)"
    )
    parser.add_argument("--epochs", type=int, default=10, help="training epochs (default 10)")
    parser.add_argument(
        "--batch-size", type=int, default=16, help="minibatch of each rank (default 16)"
    )
    parser.add_argument("--lr", type=float, default=0.05, help="Adam learning rate (default 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--backend",
        choices=["auto", "cpu", "custatevec"],
        default="auto",
        help="the device's simulator backend (default auto: the GPU when usable)",
    )
    parser.add_argument(
        "--dist-backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="torch.distributed backend (default gloo; nccl needs a CUDA build of torch)",
    )
    parser.add_argument(
        "--plain-qnode",
        action="store_true",
        help="run the QNode itself rather than pennylane_custatevec.compile of it",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> Result:
    args = parse_args(argv)
    if args.dist_backend == "nccl" and not torch.cuda.is_available():
        raise SystemExit("--dist-backend nccl needs a CUDA build of torch and a GPU; use gloo")
    init_distributed(args.dist_backend)
    try:
        return train(args)
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> Result:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.dist_backend == "nccl":
        # NCCL reduces CUDA tensors only: the classical model and its data go to this
        # rank's GPU, the one its device picked from $LOCAL_RANK.
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device("cpu")

    # The same seed everywhere, so that every rank draws the same data set; DDP would
    # equalise differently initialised parameters anyway (rank 0's are broadcast).
    torch.manual_seed(args.seed)
    x, y = make_data(args.samples, args.wires, args.seed)
    dev = make_device(args.wires, args.backend)
    model = build_model(dev, args.layers, compiled=not args.plain_qnode)
    devices = [None] * world_size
    dist.all_gather_object(devices, repr(dev))
    model = DistributedDataParallel(
        model.to(torch_device), device_ids=[local_rank] if args.dist_backend == "nccl" else None
    )

    # Every rank gets the same number of samples (the sampler repeats a few when the data
    # set does not divide evenly), hence the same number of steps: a rank with one step
    # more would wait for the others' gradients forever.
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    if rank == 0:
        for r, device in enumerate(devices):
            print(f"rank {r}: {device}")
    start = time.perf_counter()
    epoch_losses = []
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        loss_sum = 0.0
        count = 0
        for xb, yb in loader:
            xb, yb = xb.to(torch_device), yb.to(torch_device)
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            loss_sum += loss.item() * len(yb)
            count += len(yb)
        # Each rank only saw its share: the epoch's loss is the average over all shares.
        loss_sum, count = all_ranks_sum([loss_sum, count], torch_device)
        epoch_losses.append(loss_sum / count)
        if rank == 0:
            print(f"epoch {epoch:3d}/{args.epochs}  loss {epoch_losses[-1]:.4f}", flush=True)
    seconds = time.perf_counter() - start

    with torch.no_grad():
        shard = list(sampler)
        predicted = model(x[shard].to(torch_device)).argmax(dim=1).cpu()
        correct, seen = all_ranks_sum(
            [(predicted == y[shard]).sum().item(), len(shard)], torch_device
        )
    result = Result(epoch_losses, correct / seen, world_size, seconds)
    if rank == 0:
        print(
            f"{world_size} rank(s) ({args.dist_backend}), {args.wires} qubits, {args.layers} "
            f"layers, {args.samples} samples ({len(shard)} per rank), {args.epochs} epochs "
            f"in {seconds:.1f} s"
        )
        print(f"final loss {result.epoch_losses[-1]:.4f}  accuracy {result.accuracy:.3f}")
    return result


def exit_now() -> None:
    """End the process without the interpreter's shutdown.

    Once DDP has wrapped a model, torch (2.13 here) keeps the gloo process group's worker
    threads running after ``destroy_process_group()``; a worker that frees a tensor
    while the interpreter shuts down aborts the process ("terminate called without an
    active exception", SIGABRT), now and then, after all the work is done, and torchrun
    then reports the run as failed. Leaving at once, output flushed, avoids that."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    exit_now()
