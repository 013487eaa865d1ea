#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with khorovod and the extras asked for
# (default: everything the examples and tests use), then print its path as the last line.
#   bash scripts/setup-venv.sh [EXTRAS]      e.g. torch,examples
# torch is pinned to 2.13.0 in pyproject: an unpinned torch pulls gigabytes of CUDA.
# What is installed is remembered in the environment (with pyproject.toml's hash), so a re-run
# installs nothing unless an extra is new or pyproject.toml changed; the install is editable, so
# changes to the code need no reinstall. Progress goes to stderr: stdout is only the path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
EXTRAS=${1:-torch,tensorflow,jax,mpi,examples,test,autotune,ray,spark,lightning,bench,nccl,docs}
STAMP="$VENV/.khorovod-extras"
if [ ! -x "$VENV/bin/python" ]; then
    echo "setup-venv: creating $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
fi
HASH=$(sha256sum pyproject.toml | cut -c1-16)
missing=""
for extra in ${EXTRAS//,/ }; do
    grep -qxF "$HASH $extra" "$STAMP" 2>/dev/null || missing="$missing $extra"
done
if [ -n "$missing" ]; then
    echo "setup-venv: installing khorovod[$EXTRAS] into $VENV (the first time takes a minute or two)..." >&2
    LOG="$VENV/pip-install.log"
    # One line per package as it comes (the full output is kept in $LOG, shown if pip fails).
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
            -e ".[$EXTRAS]" 2>&1 | tee "$LOG" | { grep -E '^(Collecting|Installing collected)' || true; } >&2; then
        tail -n 30 "$LOG" >&2
        echo "setup-venv: pip failed; full output in $LOG" >&2
        exit 1
    fi
    for extra in ${EXTRAS//,/ }; do echo "$HASH $extra"; done >> "$STAMP"
fi
if [[ ",$EXTRAS," == *",test,"* ]]; then
    # Slurm (tests/slurm) and Java (tests/spark) come from the system's packages; only root can install them.
    bash scripts/setup-system-packages.sh >&2
    # MPICH's wheel conflicts with Open MPI's in one environment: tests/mpi run it from its own,
    # beside this one (numpy and khorovod only).
    # The engine's own module, not the bare package: it needs every dependency khorovod declares.
    if ! "$VENV-mpich/bin/python" -c "import mpi4py, horovod.common.basics" 2>/dev/null; then
        [ -x "$VENV-mpich/bin/python" ] || "$VENV/bin/python" -m venv "$VENV-mpich"
        "$VENV-mpich/bin/python" -m pip install -q --disable-pip-version-check mpich "mpi4py>=4" numpy -e . >&2
    fi
fi
if [[ ",$EXTRAS," == *",tensorflow,"* ]]; then
    # Keras 2 (TF_USE_LEGACY_KERAS=1; tests/tensorflow/test_keras2.py): tf_keras of TensorFlow's own
    # version, without its dependency on the full `tensorflow` wheel (tensorflow-cpu is that package).
    if ! "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(not importlib.util.find_spec('tf_keras'))"; then
        TF_MINOR=$("$VENV/bin/python" -c "import importlib.metadata as m; print('.'.join(m.version('tensorflow-cpu').split('.')[:2]))")
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "tf_keras~=$TF_MINOR.0" >&2
    fi
fi
echo "$VENV"
