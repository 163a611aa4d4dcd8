#!/usr/bin/env bash
# Create (or reuse) the virtual environment .venv at the repository root and install the
# package in editable mode with its test, benchmark and docs extras, and the real cuStateVec
# bindings (CUDA 13, no GPU needed) for the live binding check. Safe to run again.
#
# Environment:
#   PYTHON             interpreter used to create .venv (default: python3, must be >= 3.11)
#   TORCH_REQUIREMENT  torch to install when .venv has none (default: torch==2.13.0)
#   REAL_CUSTATEVEC    0: leave out the real cuStateVec bindings (default: 1; about 530 MB
#                      of wheels, 444 MB of them cuBLAS)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
# Pinned on purpose: a CPU build of this version lies on the development machines' disk,
# whereas an unpinned torch makes pip download a multi-GB CUDA build.
TORCH_REQUIREMENT="${TORCH_REQUIREMENT:-torch==2.13.0}"

if [ ! -x "$VPY" ] || ! "$VPY" -c 'import sys' >/dev/null 2>&1; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "setup_env.sh: $PYTHON is $("$PYTHON" --version 2>&1); Python >= 3.11 is required" >&2
        exit 1
    fi
    echo "==> creating virtual environment $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
else
    echo "==> reusing virtual environment $VENV"
fi

echo "==> upgrading pip"
"$VPY" -m pip install --upgrade pip

if "$VPY" -c 'import torch' >/dev/null 2>&1; then
    echo "==> torch $("$VPY" -c 'import torch; print(torch.__version__)') already installed"
else
    echo "==> installing $TORCH_REQUIREMENT"
    "$VPY" -m pip install "$TORCH_REQUIREMENT"
fi

echo "==> installing pennylane-custatevec (editable) with extras test,bench,docs,mpi"
"$VPY" -m pip install -e ".[test,bench,docs,mpi]"

# The CPU kernels compiled now rather than at the first circuits' calls (about 30 s there);
# see pennylane_custatevec/backends/kernel_build.py. A failure is reported, not fatal: the
# kernels it could not compile compile at their first call.
echo "==> compiling the CPU kernels ahead (backends/kernel_build.py)"
"$VPY" -m pennylane_custatevec.backends.kernel_build || echo "setup_env.sh: some kernels compile at their first call" >&2

# The real library without a GPU: tests/backends/test_custatevec_double.py checks the backend's calls
# against its bindings, and that its create() fails the way the backend's fallback expects.
# --no-deps: the cuquantum-python wheel asks for cuQuantum's other libraries (not needed to
# import the custatevec bindings), and nothing here may move numpy, pennylane, jax or torch.
if [ "${REAL_CUSTATEVEC:-1}" = 1 ]; then
    echo "==> installing the real cuStateVec bindings (scripts/gpu_cuquantum.txt, gpu_cuda_runtime.txt)"
    "$VPY" -m pip install --no-deps -r scripts/gpu_cuquantum.txt -r scripts/gpu_cuda_runtime.txt
fi

echo "==> done: $("$VPY" -c 'import pennylane_custatevec as p; print("pennylane-custatevec", p.__version__)')"
