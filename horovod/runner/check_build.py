"""`horovodrun --check-build`: what this installation can do, in Horovod's checklist format.

Nothing is imported to find out: importing TensorFlow or PyTorch takes seconds and may touch
GPUs, so availability is judged from `importlib.util.find_spec` alone. A framework counts when
both the framework and our adapter for it are installed. MPI counts when mpi4py loads an MPI
library (asked in a child process, `horovod.common.mpi_library.usable`) and mpirun is there.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

from horovod.common import mpi_library
from horovod.common.transport.nccl.library import version_string
from horovod.runner.launchers.mpirun import find_mpirun
from horovod.version import __version__

# (label, framework module, our adapter module)
_FRAMEWORKS = (
    ("TensorFlow", "tensorflow", "horovod.tensorflow"),
    ("PyTorch", "torch", "horovod.torch"),
    ("MXNet", "mxnet", "horovod.mxnet"),
)


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _mark(available: bool) -> str:
    return "[X]" if available else "[ ]"


def _mpi_runs() -> bool:
    try:
        find_mpirun()
    except ValueError:
        return False
    return mpi_library.usable()


def _nccl_version() -> int:
    from horovod.common.basics import nccl_built

    return nccl_built()


def report(installed: Callable[[str], bool] = _installed, mpi_runs: Callable[[], bool] = _mpi_runs,
           nccl_version: Callable[[], int] = _nccl_version) -> str:
    """The checklist text; `installed`, `mpi_runs` and `nccl_version` are injectable so tests
    need not install them."""
    have_mpi = installed("mpi4py") and mpi_runs()
    nccl = nccl_version()
    sections = [
        ("Available Frameworks", [(label, installed(fw) and installed(adapter))
                                  for label, fw, adapter in _FRAMEWORKS]),
        ("Available Controllers", [("MPI", have_mpi), ("Gloo", True)]),
        ("Available Tensor Operations", [(f"NCCL {version_string(nccl)}" if nccl else "NCCL", bool(nccl)),
                                         ("DDL", False), ("CCL", False),
                                         ("MPI", have_mpi), ("Gloo", True)]),
    ]
    parts = [f"Horovod v{__version__}:"]
    for title, items in sections:
        parts.append(f"\n{title}:")
        parts += [f"    {_mark(ok)} {label}" for label, ok in items]
    return "\n".join(parts)
