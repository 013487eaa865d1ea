"""The bootstrap of a job our launcher started: the slot comes from its HOROVOD_* variables.

horovodrun gives every worker its rank, size and host in the environment (read by `Settings`);
the store only numbers the round, so a replacement for rank r started later meets the ranks that
re-initialise in the same round.
"""

from __future__ import annotations

from typing import Any

from horovod.common.bootstrap.base import Membership, connect_store, reject_comm
from horovod.common.rendezvous import JOINED
from horovod.common.settings import Settings


class EnvBootstrap:
    """The launcher's slot (`Settings.topology`), in the round the store hands out."""

    def join(self, settings: Settings, previous_round: int, comm: Any = None) -> Membership:
        topology = settings.topology
        reject_comm(comm, topology.size)
        if topology.size == 1:
            return Membership(topology, None, previous_round + 1)  # alone: no store, no one to meet
        store = connect_store(settings, f"HOROVOD_SIZE={topology.size} but no rendezvous store is configured")
        try:
            store.put(JOINED, str(topology.rank), b"")  # the launcher times the start from here
            number = store.join_round(str(topology.rank), topology.size)
        except BaseException:
            store.close()
            raise
        return Membership(topology, store, number)
