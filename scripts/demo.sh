#!/usr/bin/env bash
# The main job: data-parallel PyTorch training on 2 ranks through horovodrun, progress on rank 0.
# Installs only what it needs (torch and scikit-learn's digits data set); scripts/test.sh adds the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh torch,examples | tail -n 1)
exec "$VENV/bin/horovodrun" -np "${NP:-2}" "$VENV/bin/python" examples/pytorch/pytorch_digits.py "$@"
