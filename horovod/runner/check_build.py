"""`horovodrun --check-build`: what this installation can do, in Horovod's checklist format.

Nothing is imported to find out: importing TensorFlow or PyTorch takes seconds and may touch
GPUs, so availability is judged from `importlib.util.find_spec` alone. A framework counts when
both the framework and our adapter for it are installed.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

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


def report(installed: Callable[[str], bool] = _installed) -> str:
    """The checklist text; `installed` is injectable so tests need not install frameworks."""
    have_mpi = installed("mpi4py")
    sections = [
        ("Available Frameworks", [(label, installed(fw) and installed(adapter))
                                  for label, fw, adapter in _FRAMEWORKS]),
        # The launcher cannot drive jobs through mpirun yet, so MPI is never a controller here.
        ("Available Controllers", [("MPI", False), ("Gloo", True)]),
        ("Available Tensor Operations", [("NCCL", False), ("DDL", False), ("CCL", False),
                                         ("MPI", have_mpi), ("Gloo", True)]),
    ]
    parts = [f"Horovod v{__version__}:"]
    for title, items in sections:
        parts.append(f"\n{title}:")
        parts += [f"    {_mark(ok)} {label}" for label, ok in items]
    return "\n".join(parts)
