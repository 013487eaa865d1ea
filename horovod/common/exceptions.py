"""The exception types a Horovod user catches: names and bases match Horovod's."""


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank: a cross-rank mismatch, a dead peer, or shutdown.

    Elastic training catches it to roll back to the last committed state.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed; workers interrupt to re-form the ring.

    `skip_sync` is True when only removals happened, so state need not be re-broadcast.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync
