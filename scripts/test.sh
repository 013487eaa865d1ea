#!/usr/bin/env bash
# The whole test suite, from a fresh machine: sets up the virtual environment, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh | tail -n 1)
exec "$VENV/bin/python" -m pytest -q -ra "$@"
