"""Make the shared test helpers (`tests/support/multirank.py`) importable from every test folder.

Only tests/support goes on sys.path: tests/torch and tests/tensorflow must not shadow the real
packages."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))
