"""Framework-neutral core: lifecycle, topology, process sets, and the op constants.

Every framework module (`horovod.torch`, `horovod.tensorflow`, ...) re-exports these names.
"""

from horovod.common.basics import (
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from horovod.common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horovod.common.reduce_ops import Adasum, Average, Max, Min, Product, Sum

__all__ = [
    "Adasum", "Average", "HorovodInternalError", "HostsUpdatedInterrupt", "Max", "Min", "ProcessSet",
    "Product", "Sum", "add_process_set", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "init", "is_homogeneous", "is_initialized",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank",
    "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline",
]
