"""The next round's slots, from the usable hosts: a pure function, tested without processes.

A worker is known by `host:slot` (the local slot it was started in, `HOROVOD_HOSTNAME` and
`HOROVOD_LOCAL_RANK` of its environment), as Horovod's driver names workers. Slots are filled
host by host in the driver's host order, so a worker keeps its id for its whole life and the
workers of the oldest hosts keep the lowest ranks; rank 0 stays put while its host does.
"""

from __future__ import annotations

from typing import Mapping

from horovod.common.settings import Topology
from horovod.runner.hosts import HostInfo, SlotInfo, get_host_assignments


def worker_name(slot: SlotInfo) -> str:
    """The id the store bootstrap knows a worker by (`bootstrap.store.worker_id`)."""
    return f"{slot.hostname}:{slot.local_rank}"


def plan_round(usable: Mapping[str, int], min_np: int, max_np: int | None) -> list[SlotInfo] | None:
    """Slots for as many workers as the hosts allow (at most `max_np`); None below `min_np`."""
    total = sum(usable.values())
    if total < max(min_np, 1):
        return None
    count = total if max_np is None else min(total, max_np)
    return get_host_assignments([HostInfo(host, slots) for host, slots in usable.items() if slots > 0], count)


def as_assignment(slots: list[SlotInfo]) -> dict[str, Topology]:
    """The plan the store bootstrap reads: worker id -> its slot this round."""
    return {worker_name(slot): slot.topology() for slot in slots}
