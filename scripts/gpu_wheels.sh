#!/usr/bin/env bash
# Prepare the loads of an offline GPU check (run on a machine with a package registry, from
# any checkout of the repository): download, without resolving dependencies, the cp312
# manylinux x86_64 wheels of scripts/gpu_cuquantum.txt and scripts/gpu_carry.txt, split
# them into loads that each stay under LIMIT_MIB together with the working tree that
# travels (scripts/gpu_loads.py: the rest in load1, the custatevec wheel alone in load2, the
# last call's), and print each
# load's wheels and size and the device calls that carry them (doc/development.md, "The GPU check").
#
# Environment:
#   DEST       folder of the loads, relative to the repository root (default: .whl); made
#              anew, with a .gitignore of '*' so that git and the device tool ignore it
#   LIMIT_MIB  size of one call: a load and the working tree together (default: 62)
#   PYTHON     interpreter with pip (default: python3); any version: wheels are chosen
#              by --python-version 3.12
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DEST="${DEST:-.whl}"
LIMIT_MIB="${LIMIT_MIB:-62}"
PYTHON="${PYTHON:-python3}"
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
    manylinux2014_x86_64 manylinux1_x86_64)

case "$DEST" in
    /* | *..*) echo "gpu_wheels.sh: DEST=$DEST must be a folder inside the repository" >&2
        exit 1 ;;
esac

rm -rf "$DEST"
mkdir -p "$DEST/download"
# Ignored by a .gitignore of its own (it ignores itself too): this needs no edit of
# .git/info/exclude, which a linked worktree shares with the main checkout.
echo '*' > "$DEST/.gitignore"
if ! git check-ignore -q "$DEST/load1/x.whl"; then
    echo "gpu_wheels.sh: git does not ignore $DEST; the wheels would travel in every call" >&2
    exit 1
fi

echo "==> downloading the cp312 wheels (no dependencies) into $DEST/download"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${PLATFORMS[@]/#/--platform=}" --dest "$DEST/download" \
    -r scripts/gpu_cuquantum.txt -r scripts/gpu_carry.txt

# The working tree that travels with every call: tracked files and untracked ones that git
# does not ignore (what exists of them), and shared/ where the checkout has one.
repo_bytes="$(git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}')"
if [ -d shared ] && git check-ignore -q shared; then
    repo_bytes=$((repo_bytes + $(du -sb shared | cut -f1)))
fi

echo "==> splitting into loads of at most $LIMIT_MIB MiB with the working tree"
"$PYTHON" scripts/gpu_loads.py --into "$DEST" --repo-bytes "$repo_bytes" \
    --limit-mib "$LIMIT_MIB" --alone custatevec_cu13 "$DEST"/download/*.whl
rmdir "$DEST/download"
