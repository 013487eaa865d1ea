"""Transports, chosen by name (`HOROVOD_CPU_OPERATIONS`): each moves bytes between ranks.

Built in: `tcp` (a full mesh, ring allreduce), `shm` (shared memory among the ranks of a host,
TCP across hosts) and `hierarchical` (shm, plus hierarchical allreduce/allgather for groups that
span hosts). `auto`, the default (also what Horovod's `gloo` means here), picks `shm` when every
rank is on one host, `hierarchical` when there are several, and `tcp` where shared memory is not
available (not Linux, no writable /dev/shm) or for a single rank.
"""

from __future__ import annotations

from horovod.common.transport.base import PeerFailure, Transport, TransportContext
from horovod.common.transport.registry import create, default_name

__all__ = ["PeerFailure", "Transport", "TransportContext", "create", "default_name"]
