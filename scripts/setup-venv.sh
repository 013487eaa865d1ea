#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with khorovod and every extra the
# examples and tests use. torch is pinned to 2.13.0: an unpinned torch pulls gigabytes of CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[torch,tensorflow,test,mpi]"
# Slurm (for tests/slurm) comes from the system's packages; only root can install them.
bash scripts/setup-slurm.sh >&2
# MPICH's wheel conflicts with Open MPI's in one environment: tests/mpi run it from its own,
# beside this one (numpy and khorovod only).
if [ ! -x "$VENV-mpich/bin/python" ]; then
    "$VENV/bin/python" -m venv "$VENV-mpich"
fi
"$VENV-mpich/bin/python" -m pip install -q --disable-pip-version-check mpich "mpi4py>=4" numpy -e . >&2
echo "$VENV"
