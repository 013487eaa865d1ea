#!/usr/bin/env bash
# The documentation site, from a fresh checkout: makes the test environment (scripts/setup-venv.sh,
# whose versions the site's supported-versions table shows) and MXNet's beside it, then runs MkDocs.
#   bash scripts/docs.sh            build the site into site/ (strict: a broken link fails)
#   bash scripts/docs.sh serve      serve it on http://127.0.0.1:8000, rebuilt as you edit
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(bash scripts/setup-venv.sh | tail -n 1)
bash scripts/setup-mxnet-venv.sh >/dev/null || echo "warning: the MXNet environment could not be created" >&2
export NO_MKDOCS_2_WARNING=1  # Material's notice about its successor, printed on every build
exec "$VENV/bin/mkdocs" "${1:-build}" "${@:2}"
