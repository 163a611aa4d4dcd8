"""Data-parallel training with torch.distributed: two gloo ranks, one custatevec.qubit
device each, training demos/ddp_torchlayer.py's model under DistributedDataParallel.

The ranks run this file as a script under ``python -m torch.distributed.run`` (torchrun);
each writes what it saw to a file, and the test compares it with the same model trained in
this process, single-process, on the full batches: DDP's averaged gradient of the ranks'
mean losses over their halves of a batch is the gradient of the mean loss over the whole
batch, so the gradients and the parameters after a few SGD steps agree to round-off.

``--standalone`` lets torchrun's rendezvous bind port 0 (the system picks a free port), so
that runs in parallel (pytest-xdist) never race for a port.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import math
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip(
        "this torch build has no torch.distributed with the gloo backend",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demos" / "ddp_torchlayer.py"

WORLD_SIZE = 2
N_WIRES = 4
N_LAYERS = 2
SEED = 7
BATCH = 8
"""Samples per step, all ranks together: each rank takes a contiguous half."""
STEPS = 3
LR = 0.3
LAUNCH_TIMEOUT = 240
"""Seconds a torchrun launch may take before the test fails (it takes about 10 s alone)."""
RANK_TIMEOUT = 200
"""Seconds after which a rank exits by itself, should the launcher fail to end it."""
ATOL = 1e-10
PATHS = {"compiled": True, "plain": False}
"""The model's QNode through pennylane_custatevec.compile, and the QNode itself."""


def load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("demos_ddp_torchlayer", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the defining module up there
    spec.loader.exec_module(module)
    return module


def step_batches(demo: ModuleType) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One fixed batch of ``BATCH`` samples per SGD step, the same in every process."""
    x, y = demo.make_data(BATCH * STEPS, N_WIRES, SEED)
    return [(x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH]) for i in range(STEPS)]


def new_model(demo: ModuleType, compiled: bool) -> torch.nn.Module:
    """The demo's classifier on the CPU backend: with the GPU backend both ranks would need a
    GPU of their own ($LOCAL_RANK), more than a one-GPU machine has."""
    return demo.build_model(demo.make_device(N_WIRES, "cpu"), N_LAYERS, compiled=compiled)


def parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in module.named_parameters()}


def train(
    model: torch.nn.Module,
    module: torch.nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """SGD steps of ``model`` (``module`` itself, or DDP around it) on the mean
    cross-entropy of each batch: the gradients of the first step, and the parameters after
    the last."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loss_fn = torch.nn.CrossEntropyLoss()
    first = None
    for x, y in batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        if first is None:
            first = gradients(module)
        optimizer.step()
    return first, parameters(module)


def rank_main(out_dir: Path) -> None:
    """One rank (under torchrun): trains its half of every batch under DDP, compiled and
    plain, and saves what it saw to ``out_dir/rank<r>.pt``."""
    # A hang (a rank waiting for a collective that never comes) ends the rank, with the
    # stacks, instead of outliving the test.
    faulthandler.dump_traceback_later(RANK_TIMEOUT, exit=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=RANK_TIMEOUT))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    assert world_size == WORLD_SIZE, world_size
    demo = load_demo()
    half = BATCH // world_size
    shards = [
        (x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half])
        for x, y in step_batches(demo)
    ]
    loss_fn = torch.nn.CrossEntropyLoss()

    record = {}
    for path, compiled in PATHS.items():
        # Different initial weights on each rank: DDP must broadcast rank 0's.
        torch.manual_seed(SEED + rank)
        module = new_model(demo, compiled)
        before_ddp = parameters(module)
        model = torch.nn.parallel.DistributedDataParallel(module)
        initial = parameters(module)

        # This rank's own gradient, without DDP's all-reduce.
        x, y = shards[0]
        with model.no_sync():
            loss_fn(model(x), y).backward()
        local = gradients(module)
        module.zero_grad(set_to_none=True)

        synced, final = train(model, module, shards)
        record[path] = {
            "before_ddp": before_ddp,
            "initial": initial,
            "local": local,
            "synced": synced,
            "final": final,
        }
    torch.save(record, out_dir / f"rank{rank}.pt")
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


def launch(args: list[str]) -> subprocess.CompletedProcess:
    """``args`` (a script and its arguments) on ``WORLD_SIZE`` ranks under torchrun."""
    command = [
        sys.executable,
        *("-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD_SIZE}"),
        *args,
    ]
    # One thread per rank (what torchrun sets, said here to silence its notice about it).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=LAUNCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            # SIGTERM: torchrun then ends its ranks (each in a session of its own).
            process.terminate()
            stdout, stderr = process.communicate(timeout=60)
            pytest.fail(f"torchrun took over {LAUNCH_TIMEOUT} s\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def assert_close(actual: dict, expected: dict, what: str) -> None:
    assert actual.keys() == expected.keys(), what
    for name in expected:
        torch.testing.assert_close(
            actual[name],
            expected[name],
            atol=ATOL,
            rtol=0,
            msg=lambda m, name=name: f"{what} {name}: {m}",
        )


def assert_identical(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for name in a:
        assert torch.equal(a[name], b[name]), f"{what} {name}: {a[name]} != {b[name]}"


def max_difference(a: dict, b: dict) -> float:
    return max((a[name] - b[name]).abs().max().item() for name in a)


def test_ddp_gradients_and_steps_equal_single_process_full_batch(tmp_path):
    completed = launch([__file__, str(tmp_path)])
    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]

    demo = load_demo()
    batches = step_batches(demo)
    for path, compiled in PATHS.items():
        # The single-process reference: rank 0's initial weights, the full batches.
        torch.manual_seed(SEED)
        model = new_model(demo, compiled)
        initial = parameters(model)
        full, final = train(model, model, batches)
        seen = [rank[path] for rank in ranks]

        # DDP started every rank from rank 0's weights, though rank 1 drew others.
        assert max_difference(seen[1]["before_ddp"], initial) > 0.01, path
        for r, rank in enumerate(seen):
            assert_identical(rank["initial"], initial, f"{path} rank {r} initial")

        # Each rank's own gradient is that of its half only (they differ), and their
        # average is the full batch's.
        assert max_difference(seen[0]["local"], seen[1]["local"]) > 1e-3, path
        average = {name: (seen[0]["local"][name] + seen[1]["local"][name]) / 2 for name in full}
        assert_close(average, full, f"{path} average of the local gradients")

        # After DDP's backward, both ranks hold the full batch's gradient, the same bits.
        assert_identical(seen[0]["synced"], seen[1]["synced"], f"{path} synced gradients")
        for r, rank in enumerate(seen):
            assert_close(rank["synced"], full, f"{path} rank {r} gradient")

        # STEPS SGD steps under DDP: the same parameters as single-process, which moved.
        assert max_difference(final, initial) > 0.01, path
        assert_identical(seen[0]["final"], seen[1]["final"], f"{path} final parameters")
        for r, rank in enumerate(seen):
            assert_close(rank["final"], final, f"{path} rank {r} parameters after {STEPS} steps")


def test_demo_trains_on_two_ranks(tmp_path):
    epochs = 3
    completed = launch(
        [
            str(DEMO),
            *("--samples", "32", "--batch-size", "4", "--epochs", str(epochs)),
            *("--backend", "cpu"),
        ]
    )

    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    lines = completed.stdout.strip().splitlines()
    # One device per rank, listed by rank 0.
    for r in range(WORLD_SIZE):
        assert sum(line.startswith(f"rank {r}: <CuStateVecDevice: wires=4") for line in lines) == 1
    # Only rank 0 prints the epochs' losses, once each, in order.
    epoch_lines = [line for line in lines if line.startswith("epoch")]
    losses = []
    for epoch, line in enumerate(epoch_lines, start=1):
        found = re.fullmatch(rf"epoch +{epoch}/{epochs}  loss (\d+\.\d+)", line)
        assert found, epoch_lines
        losses.append(float(found.group(1)))
    assert len(losses) == epochs, epoch_lines
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0], losses  # chance level is ln 2 = 0.693
    summary, final = lines[-2:]
    assert f"{WORLD_SIZE} rank(s) (gloo), 4 qubits, 2 layers, 32 samples (16 per rank)" in summary
    found = re.fullmatch(r"final loss (\d+\.\d+)  accuracy (\d\.\d+)", final)
    assert found, final
    assert float(found.group(1)) == losses[-1]
    assert float(found.group(2)) > 0.5


if __name__ == "__main__":
    rank_main(Path(sys.argv[1]))
    # Past the interpreter's shutdown, which a gloo worker thread that DDP kept alive can
    # abort now and then (demos/ddp_torchlayer.py, exit_now).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
