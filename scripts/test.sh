#!/usr/bin/env bash
# The whole test suite, from a fresh machine: sets up the virtual environment, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh | tail -n 1)
# MXNet lives in its own environment (numpy<1.24); its tests skip, saying why, if it cannot be made.
bash scripts/setup-mxnet-venv.sh >/dev/null || echo "warning: the MXNet environment could not be created" >&2
# So do the S3 test server and s3fs (python-dateutil<3); the S3 store tests say why if it cannot be made.
bash scripts/setup-s3-venv.sh >/dev/null || echo "warning: the S3 test environment could not be created" >&2
exec "$VENV/bin/python" -m pytest -q -ra "$@"
