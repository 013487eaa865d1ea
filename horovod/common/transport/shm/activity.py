"""What shows the engine that a peer is talking when the ranks of this host share memory."""

from __future__ import annotations

from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.shm.signals import Bells, Signals, fence


class ShmActivity(PeerActivity):
    """Local peers post control messages to shared-memory mailboxes, which no fd shows: they ring
    our bell when we listen. Peers on other hosts (and hang-ups) show on the TCP mesh's sockets."""

    def __init__(self, sockets: PeerActivity, signals: Signals, bells: Bells) -> None:
        self._sockets = sockets
        self._signals = signals
        self._bells = bells
        self.spin_useful = signals.may_spin

    def pending(self) -> bool:
        return self._signals.pending()

    def fds(self, driver: bool) -> dict[int, bool]:
        fds = self._sockets.fds(driver)
        fds[(self._bells.driver if driver else self._bells.idle).fileno()] = False
        return fds

    def listen(self, driver: bool, on: bool) -> None:
        self._signals.set_listening(on, driver)

    def drain(self, driver: bool) -> None:
        self._bells.drain(idle=not driver)

    def set_caller_driving(self, on: bool) -> None:
        self._signals.set_driven(on)

    def waiting_after_release(self) -> bool:
        fence()  # our DRIVEN word before our look at the peers' counters (they do the reverse)
        return self._signals.pending()
