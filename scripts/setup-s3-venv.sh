#!/usr/bin/env bash
# Create (or reuse) the S3 test environment: an S3-compatible server (moto's server mode) and
# s3fs, the fsspec file system for s3:// URLs. Both need python-dateutil<3 (through botocore),
# older than the main environment's, so they get a virtual environment of their own. The store
# tests start moto_server from it and run the store's S3 checks with its interpreter (khorovod
# itself is put on PYTHONPATH by whoever runs it). Prints the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/side-venv.sh
side_venv "${VENV_S3:-.venv-s3}" "moto.server, s3fs, cloudpickle, numpy, msgpack" "moto[server]>=5" "s3fs>=2023.1" \
    "fsspec>=2023.1" "cloudpickle>=2.0" numpy "msgpack>=1.0"
