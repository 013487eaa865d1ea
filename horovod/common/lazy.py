"""Registries by name hold `"package.module:Name"` strings, and this loads one when it is chosen.

Transports, bootstraps and launchers are registered this way so that naming one imports only that
one (mpi4py, pyspark or ray are never imported by a job that does not use them), and so that no
backend imports the registry that lists it.
"""

from __future__ import annotations

import importlib
from typing import Any


def load(spec: str) -> Any:
    """The object that `spec` ("package.module:Name") names, importing its module now."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)
