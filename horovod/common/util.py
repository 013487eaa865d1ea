"""The helpers of Horovod's `horovod.common.util` that scripts import directly.

Horovod's versions probe compiled extension libraries; khorovod's framework modules are plain
Python, so "is the extension there" means "does its framework import".
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Callable, Iterator, Sequence, TypeVar

from horovod.common import basics

T = TypeVar("T")

# A Horovod extension module (or its package) -> the framework it needs.
_FRAMEWORKS = {"torch": "torch", "tensorflow": "tensorflow", "keras": "tensorflow", "mxnet": "mxnet",
               "jax": "jax"}


def _framework_of(ext_base_name: str) -> str | None:
    parts = ext_base_name.split(".")
    return next((_FRAMEWORKS[p] for p in parts if p in _FRAMEWORKS), None)


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """True when the framework the extension `ext_base_name` (e.g. `horovod.torch`) serves imports."""
    framework = _framework_of(ext_base_name)
    available = framework is None or importlib.util.find_spec(framework) is not None
    if verbose and not available:
        print(f"Extension {ext_base_name} is not available: {framework} is not installed")
    return available


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: str) -> None:
    """ImportError, as Horovod raises it, when the extension `ext_name` cannot be used."""
    if not extension_available(ext_name):
        raise ImportError(f"Extension {ext_name} has not been built: {_framework_of(ext_name)} is not "
                          f"installed. Install it (the {ext_env_var}=1 build flag has no meaning for khorovod).")


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the extension can run collectives on GPU tensors: where it is installed and a CUDA
    runtime sees a GPU (torch moves them over NCCL; the others through host memory, docs/gpu.md)."""
    available = extension_available(ext_base_name) and (basics.cuda_built() or basics.rocm_built())
    if verbose and not available:
        print(f"Extension {ext_base_name} was built without GPU support")
    return available


def _build_query(query: Callable[[], T]) -> Callable[..., T]:
    """`query` as Horovod's `util` spells it, with a `verbose` flag (nothing to print here: the
    answer does not come from probing compiled extensions)."""

    def built(verbose: bool = False) -> T:
        return query()

    built.__name__ = built.__qualname__ = query.__name__
    built.__doc__ = query.__doc__
    return built


gloo_built = _build_query(basics.gloo_built)
mpi_built = _build_query(basics.mpi_built)
nccl_built = _build_query(basics.nccl_built)
ccl_built = _build_query(basics.ccl_built)
ddl_built = _build_query(basics.ddl_built)
cuda_built = _build_query(basics.cuda_built)
rocm_built = _build_query(basics.rocm_built)


def split_list(items: Sequence[T], parts: int) -> list[Sequence[T]]:
    """`items` cut into `parts` consecutive slices whose lengths differ by at most one (the longer first)."""
    size, extra = divmod(len(items), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [items[bounds[i]:bounds[i + 1]] for i in range(parts)]


def num_rank_is_power_2(num_rank: int) -> bool:
    """True for 1, 2, 4, 8, ... (Adasum's requirement on the number of ranks)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """`ver >= target` for `X.Y.Z` version strings; ValueError for anything else."""
    from packaging import version

    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError("is_version_greater_equal_than takes two version strings")
    if any(len(v.split(".")) != 3 for v in (ver, target)):
        raise ValueError(f"versions must have the form X.Y.Z, got {ver!r} and {target!r}")
    return version.parse(ver) >= version.parse(target)


@contextlib.contextmanager
def env(**kwargs: str) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore the old ones.

    A helper that the caller invokes for its own process; the library itself never uses it."""
    saved = {key: os.environ.get(key) for key in kwargs}
    os.environ.update({key: str(value) for key, value in kwargs.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
