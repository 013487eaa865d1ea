#!/usr/bin/env bash
# Create (or reuse) the MXNet environment: mxnet 1.9.1 needs numpy<1.24, which the main
# environment (TensorFlow, JAX: numpy 2) cannot hold, so MXNet gets a virtual environment of its own.
# khorovod itself is put on PYTHONPATH by whoever runs it (the tests do). Prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side-venv.sh
side_venv "${VENV_MXNET:-.venv-mxnet}" "mxnet, cloudpickle, yaml, msgpack" "mxnet==1.9.1" "numpy<1.24" "cloudpickle>=2.0" \
    "pyyaml>=5.4" "msgpack>=1.0"
