"""The bootstrap seam: who this process is in the current round of the job.

`init()` asks a bootstrap, and only a bootstrap, for this process's slot (rank, size, which ranks
share its host), the store the round meets in and the round's number. Everything the runtime does
afterwards (the transport, process sets, the collectives' checks) follows from that answer, so a
new way of starting workers (an elastic driver, MPI) is one more bootstrap, not a change to `init()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import Settings, Topology


@dataclass(frozen=True)
class Membership:
    """This process's place in one round of the job."""

    topology: Topology
    rendezvous: RendezvousClient | None  # the round's store; None for a job of one rank
    round: int  # the store's round number: scopes everything this generation publishes there
    communicator: Any = None  # the job's mpi4py communicator, when MPI started the job
    # The store's address and the job's secret, when the bootstrap set the store up itself (no
    # launcher of ours named them in HOROVOD_GLOO_RENDEZVOUS_*): the transport meets there.
    store_address: tuple[str, int] | None = None
    secret_key: bytes | None = None

    def settings_for(self, settings: Settings) -> Settings:
        """`settings` as this round sees them: the bootstrap's slot, and its store where it has one."""
        if self.store_address is None:
            return dataclasses.replace(settings, topology=self.topology)
        return dataclasses.replace(settings, topology=self.topology, rendezvous_addr=self.store_address[0],
                                   rendezvous_port=self.store_address[1], secret_key=self.secret_key)

    def close(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.close()


class Bootstrap(Protocol):
    """Answers `init()`'s question: which slot, which store, which round."""

    def join(self, settings: Settings, previous_round: int, comm: Any = None) -> Membership:
        """Join the job's current round. `previous_round` is the last round this process took
        part in (0: none), so a survivor that re-initialises never lands in a round that is over.
        `comm` is `init(comm=...)`: an MPI communicator or a list of ranks the job runs over."""
        ...


def reject_comm(comm: Any, size: int) -> None:
    """`init(comm=...)` naming anything but every rank needs a job that MPI started."""
    if comm is not None and not (isinstance(comm, (list, tuple)) and list(comm) == list(range(size))):
        raise ValueError("init(comm=...) with an MPI communicator or a subset of ranks needs a job started "
                         "by mpirun (or horovodrun --mpi); use process_sets= for collectives over subsets")


def connect_store(settings: Settings, why_needed: str, rejoining: bool = False) -> RendezvousClient:
    """A connection to the launcher's store; ValueError saying `why_needed` when none is configured.

    Joining the job, a worker may try for the start timeout (the launcher's host may be slow to
    answer at first). `rejoining` after a failure, it reached the store before: one that cannot
    now within the failure detection time is the one cut off, and fails then, so that an elastic
    driver sees it go and goes on with the others instead of waiting the start timeout for it.
    """
    if settings.rendezvous_addr is None or settings.rendezvous_port is None or not settings.secret_key:
        raise ValueError(f"{why_needed}; start the job with horovodrun (or horovod.run), which sets "
                         "HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT")
    timeout = settings.start_timeout
    if rejoining and settings.failure_detection_seconds > 0:
        timeout = min(timeout, settings.failure_detection_seconds)
    return RendezvousClient(settings.rendezvous_addr, settings.rendezvous_port, settings.secret_key,
                            timeout, settings.failure_detection_seconds)
