"""Hierarchical collectives for jobs on several hosts: shared memory inside a host, TCP across.

An allreduce over a group with k members on each of H hosts runs in three steps:

1. reduce-scatter inside every host through shared memory: local member p ends up holding its
   host's sum of slice p (1/k of the buffer);
2. allreduce of slice p across hosts, among the p-th members of all hosts, with the TCP ring:
   the k rings of a host run at the same time, each on its own connections;
3. allgather inside every host through shared memory.

Each rank sends 1/k of what a flat ring would over the network, and nothing crosses the
loopback TCP stack. An allgather first collects, over TCP, the blocks of the members at the same
local position on the other hosts, then shares them inside the host through shared memory.

When: `HOROVOD_HIERARCHICAL_ALLREDUCE` / `HOROVOD_HIERARCHICAL_ALLGATHER` (horovodrun
`--[no-]hierarchical-allreduce`, `--[no-]hierarchical-allgather`) = 1 uses it for every group
that has the same number of members on each host, = 0 turns it off. Unset: allreduce is
hierarchical when the group spans several hosts with the same number of members, at least two,
on each (it moves less data, and is faster even over loopback); allgather stays flat (its
hierarchical form saves network traffic but adds copies: worth it only on a slow network).
Adasum on such a group averages inside every host and combines the hosts' averages with Adasum
(the number of hosts must be a power of two). Everything else (groups on one host, other
collectives, uneven groups) is what `ShmTransport` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from horovod.common.algorithms.adasum import layout_error as adasum_layout_error
from horovod.common.algorithms.primitives import Scratch
from horovod.common.logging import log
from horovod.common.partition import even_counts, offsets
from horovod.common.reduce_ops import Sum, scale_in_place
from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.base import Transport, TransportContext
from horovod.common.transport.shm import ShmTransport


@dataclass(frozen=True)
class _Plan:
    """How a group spanning hosts splits: our host's members and, per local position, its cross group."""

    local: tuple[int, ...]  # members on this host, sorted
    position: int  # our index in `local`
    crosses: tuple[tuple[int, ...], ...]  # crosses[p]: the p-th member of every host, sorted


class HierarchicalTransport(Transport):
    """A ShmTransport (shared memory on this host, TCP across) plus the hierarchical algorithms for
    groups that span hosts; everything else goes to the ShmTransport as it is."""

    name = "hierarchical"

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        inner = self.shm_transport = ShmTransport(context)
        # The pieces the hierarchical algorithms use: TCP across hosts, shared memory inside.
        self.tcp, self.shm, self.hosts = inner.tcp, inner.shm, inner.hosts
        self.hierarchical_allreduce: bool | None = context.settings.hierarchical_allreduce
        self.hierarchical_allgather: bool | None = context.settings.hierarchical_allgather
        if len(set(self.hosts)) > 1:  # on one host the switches change nothing: nothing to tune
            self.tunable_knobs = ("hierarchical_allreduce", "hierarchical_allgather")
        self._plans: dict[tuple[int, ...], _Plan | None] = {}
        self._warned: set[tuple[int, ...]] = set()
        self._scratch = Scratch()

    def _plan(self, group: Sequence[int], setting: bool | None) -> _Plan | None:
        """The plan for `group` if the hierarchical algorithm should run on it, else None."""
        if setting is False or self.shm is None:
            return None
        key = tuple(group)
        if key not in self._plans:
            self._plans[key] = self._make_plan(key)
        plan = self._plans[key]
        if plan is None and setting and key not in self._warned and len({self.hosts[r] for r in key}) > 1:
            self._warned.add(key)
            log.warning("hierarchical collectives need the same number of ranks on every host; "
                        "group %s is uneven, so it uses the flat TCP ring", list(key))
        if plan is not None and len(plan.local) < 2:  # one member per host: that is the flat ring
            return None
        return plan

    def _make_plan(self, group: tuple[int, ...]) -> _Plan | None:
        by_host: dict[str, list[int]] = {}
        for r in group:
            by_host.setdefault(self.hosts[r], []).append(r)
        if len(by_host) < 2 or len({len(members) for members in by_host.values()}) != 1:
            return None
        local = tuple(sorted(by_host[self.hosts[self.rank]]))
        crosses = tuple(tuple(sorted(members[p] for members in by_host.values())) for p in range(len(local)))
        return _Plan(local, local.index(self.rank), crosses)

    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int) -> None:
        self.allreduce_scaled(group, buf, op, 1.0)

    def allreduce_scaled(self, group: Sequence[int], buf: np.ndarray, op: int, postscale: float) -> None:
        """Reduce-scatter in the host, allreduce across hosts, allgather in the host; each rank
        scales only its own part, before the allgather (1/local of the buffer)."""
        plan = self._plan(group, self.hierarchical_allreduce) if buf.size else None
        if plan is None:
            return self.shm_transport.allreduce_scaled(group, buf, op, postscale)
        assert self.shm is not None
        counts = even_counts(buf.size, len(plan.local))
        lo = offsets(counts)[plan.position]
        part = buf[lo: lo + counts[plan.position]]
        self.shm.reducescatter(plan.local, buf, part, counts, op)
        if part.size:
            self.tcp.allreduce(plan.crosses[plan.position], part, op)
        scale_in_place(part, postscale)
        self.shm.allgatherv(plan.local, part, buf, counts)

    def adasum(self, group: Sequence[int], buf: np.ndarray, bounds: Sequence[tuple[int, int]]) -> None:
        """Average inside each host, Adasum across hosts (as Horovod's hierarchical Adasum): the
        ranks of a host see samples of one distribution, so they add; hosts combine adaptively."""
        plan = self._plan(group, self.hierarchical_allreduce) if buf.size else None
        if plan is None:
            return self.shm_transport.adasum(group, buf, bounds)
        assert self.shm is not None
        self.shm.allreduce(plan.local, buf, Sum)
        scale_in_place(buf, 1.0 / len(plan.local))
        if plan.position == 0:
            self.tcp.adasum(plan.crosses[0], buf, bounds)
        self.shm.broadcast(plan.local, buf, plan.local[0])

    def adasum_error(self, group: Sequence[int]) -> str | None:
        plan = self._plan(group, self.hierarchical_allreduce)
        return adasum_layout_error(len(plan.crosses[0] if plan is not None else group))

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        # Only when asked for: it halves what crosses hosts, but costs two more copies inside each,
        # and over loopback (two "hosts" on one machine) the flat ring was faster.
        plan = self._plan(group, True) if self.hierarchical_allgather else None
        if plan is None:
            return self.shm_transport.allgatherv(group, send, recv, counts)
        assert self.shm is not None
        where = {r: i for i, r in enumerate(group)}
        starts = offsets(counts)
        cross_counts = [[int(counts[where[r]]) for r in cross] for cross in plan.crosses]
        held = [sum(c) for c in cross_counts]
        # Scratch: the blocks of our cross group, then everyone's (grouped by cross group).
        scratch = self._scratch.take((held[plan.position] + sum(held)) * recv.itemsize, recv.dtype)
        mine, everything = scratch[: held[plan.position]], scratch[held[plan.position]:]
        self.tcp.allgatherv(plan.crosses[plan.position], send, mine, cross_counts[plan.position])
        self.shm.allgatherv(plan.local, mine, everything, held)
        at = 0
        for cross, sizes in zip(plan.crosses, cross_counts):
            for r, size in zip(cross, sizes):
                start = starts[where[r]]
                recv[start: start + size] = everything[at: at + size]
                at += size

    # -- the rest is the ShmTransport's -------------------------------------------------------
    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        self.shm_transport.broadcast(group, buf, root)

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int]) -> None:
        self.shm_transport.alltoallv(group, send, send_counts, recv, recv_counts)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                      op: int) -> None:
        self.shm_transport.reducescatter(group, buf, recv, counts, op)

    def fusion_buffer(self, nbytes: int) -> np.ndarray | None:
        return self.shm_transport.fusion_buffer(nbytes)

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        return self.shm_transport.exchange(group, payload)

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        return self.shm_transport.gather(group, payload, root)

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        return self.shm_transport.bcast_bytes(group, payload, root)

    @property
    def activity(self) -> PeerActivity:
        return self.shm_transport.activity

    def close(self) -> None:
        self.shm_transport.close()
