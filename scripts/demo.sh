#!/usr/bin/env bash
# The main job: data-parallel PyTorch training on 2 ranks through horovodrun, progress on rank 0.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh | tail -n 1)
exec "$VENV/bin/horovodrun" -np "${NP:-2}" "$VENV/bin/python" examples/pytorch/pytorch_digits.py "$@"
