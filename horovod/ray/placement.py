"""Where a `RayExecutor`'s workers go: a placement group, and each worker's slot from its node.

Resources are reserved for every worker at once (a placement group), so a job never starts half
placed. Which node each bundle landed on decides the slots: the ranks of one node are
consecutive and numbered by local rank, exactly as horovodrun numbers the slots of `-H` hosts
(`horovod.runner.hosts.get_host_assignments`); a node is a host, named by its Ray node id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from horovod.runner.hosts import HostInfo, SlotInfo, get_host_assignments


def slots_by_node(node_ids: Sequence[str]) -> list[tuple[SlotInfo, int]]:
    """Given the node of each placed worker (in placement order), the workers by rank: each one's
    slot and its index in `node_ids`. Ranks go node by node, in the order the nodes first appear,
    so the ranks of one node are consecutive even when its bundles are not."""
    counts: dict[str, int] = {}
    for node in node_ids:
        counts[node] = counts.get(node, 0) + 1
    slots = get_host_assignments([HostInfo(node, count) for node, count in counts.items()], len(node_ids))
    unplaced: dict[str, list[int]] = {}
    for index, node in enumerate(node_ids):
        unplaced.setdefault(node, []).append(index)
    return [(slot, unplaced[slot.hostname].pop(0)) for slot in slots]


@dataclass(frozen=True)
class Layout:
    """How many workers, with what each, in which bundles of the placement group."""

    num_workers: int
    cpus_per_worker: float
    gpus_per_worker: float
    workers_per_bundle: int  # num_hosts mode: one bundle per host holds all of that host's workers
    per_host: bool = False  # num_hosts mode: each bundle on a node of its own

    @classmethod
    def of(cls, num_workers: int | None, num_hosts: int | None, num_workers_per_host: int,
           cpus_per_worker: float, use_gpu: bool, gpus_per_worker: float | None) -> "Layout":
        """The layout of `RayExecutor`'s arguments; ValueError for a contradiction."""
        if (num_workers is None) == (num_hosts is None):
            raise ValueError("RayExecutor needs either num_workers or num_hosts (with num_workers_per_host), "
                             "not both and not neither")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be at least 1")
        if num_hosts is not None and (num_hosts < 1 or num_workers_per_host < 1):
            raise ValueError(f"num_hosts={num_hosts} and num_workers_per_host={num_workers_per_host} "
                             "must be at least 1")
        if cpus_per_worker <= 0:
            raise ValueError(f"cpus_per_worker={cpus_per_worker} must be positive")
        if gpus_per_worker is not None and not use_gpu:
            raise ValueError("gpus_per_worker is given but use_gpu=False; set use_gpu=True")
        gpus = (1 if gpus_per_worker is None else gpus_per_worker) if use_gpu else 0
        if num_hosts is not None:
            return cls(num_hosts * num_workers_per_host, cpus_per_worker, gpus, num_workers_per_host, True)
        assert num_workers is not None
        return cls(num_workers, cpus_per_worker, gpus, 1)

    def bundles(self) -> list[dict[str, float]]:
        bundle = {"CPU": self.cpus_per_worker * self.workers_per_bundle}
        if self.gpus_per_worker:
            bundle["GPU"] = self.gpus_per_worker * self.workers_per_bundle
        return [dict(bundle) for _ in range(self.num_workers // self.workers_per_bundle)]

    def strategy(self) -> str:
        """Workers packed onto few nodes; with num_hosts, each host's bundle on its own node."""
        return "STRICT_SPREAD" if self.per_host else "PACK"

    def bundle_of(self, worker: int) -> int:
        return worker // self.workers_per_bundle

    def describe(self) -> str:
        gpus = f" and {self.gpus_per_worker:g} GPU" if self.gpus_per_worker else ""
        where = f" ({self.workers_per_bundle} per node)" if self.per_host else ""
        return f"{self.num_workers} workers with {self.cpus_per_worker:g} CPU{gpus} each{where}"
