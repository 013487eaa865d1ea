"""Failure detection and blame: which rank failed first, when one failure brings others down.

A connection that closes wakes a watcher thread at once; a rank that stops because of a failure
says whom it blamed before it closes its own connections, so the others can tell the rank that
crashed from the ranks that merely stopped because of it.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
from typing import Callable

from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import DEFAULT_FAILURE_DETECTION_SECONDS
from horovod.common.transport.base import PeerFailure

# poll() events of a connection whose other end closed or broke (POLLRDHUP: Linux only).
HANGUP = getattr(select, "POLLRDHUP", 0) | getattr(select, "POLLHUP", 0) | getattr(select, "POLLERR", 0)
CLOSED_BY_PEER = "closed its connection (its process exited or crashed)"
# How long to wait for a rank's connection to close when another rank says it failed (see _hung_up).
HANGUP_GRACE_SECONDS = 0.1


# What the kernel reports when a peer's host stopped answering (liveness checks gave up, or the
# network says there is no route any more).
UNREACHABLE = {errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def unreachable(detection_seconds: float, exc: BaseException) -> str:
    """The reason given for a peer whose host stopped answering."""
    return (f"stopped answering: its host sent nothing back for about {detection_seconds:g} s "
            f"({getattr(exc, 'strerror', None) or exc}; network cut, or the host is down?)")


class DeathWatch:
    """Names the rank that failed first, when one failure brings others down with it.

    A thread of its own notices, as they happen, peers whose connection closes (and calls
    `listeners`, so waits elsewhere can stop at once). A rank that reported a failure says whom it
    blamed before it closes its connections (`announce`: in the rendezvous store, and through
    `local_cause` where a faster channel exists, shared memory); so when a connection closes, we
    can tell a rank that crashed from one that stopped because of another.
    """

    def __init__(self, rank: int, sockets: dict[int, socket.socket], store: RendezvousClient, scope: str,
                 hosts: dict[int, str] | None = None,
                 detection_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS) -> None:
        self.first: int | None = None  # the rank that failed first, once known
        self.hosts = hosts or {}  # where each rank runs, for messages
        self._sockets = dict(sockets)
        self._detection_seconds = detection_seconds
        self._reasons: dict[int, str] = {}  # ranks whose host stopped answering (the kernel said so)
        self._reasons_lock = threading.Lock()
        self._told: dict[int, str] = {}  # how a rank failed, as the rank that blamed it put it
        self._tellers: dict[int, int] = {}  # who blamed a rank (the first to tell us)
        self._reported_reason = ""
        self.listeners: list[Callable[[], None]] = []  # called (on the watch thread) when a connection closes
        # Whom a rank blamed, and whether it said that rank's host stopped answering, where a faster
        # channel than the store tells (shared memory, which also works when the store is cut off).
        self.local_cause: Callable[[int], tuple[int, bool] | None] | None = None
        self.reported: int | None = None  # the rank our own failure report named
        self._rank = rank
        self._store, self._scope = store, scope
        self._ranks = {sock.fileno(): r for r, sock in sockets.items()}
        self._stop_r, self._stop_w = os.pipe()
        self._poll = select.poll()
        self._poll.register(self._stop_r, select.POLLIN)
        for sock in sockets.values():
            self._poll.register(sock, HANGUP)
        self._thread = threading.Thread(target=self._run, name="hvd-death-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            for fd, _ in self._poll.poll():
                if fd == self._stop_r:
                    return
                self._poll.unregister(fd)
                self._kernel_reason(self._ranks[fd])
                if self.first is None:
                    self.first = self._cause(self._ranks[fd])
                for listener in list(self.listeners):
                    listener()

    def note_unreachable(self, rank: int, reason: str) -> None:
        """A read or write to `rank` failed because its host stopped answering (that error is
        reported once: remember it for later messages)."""
        with self._reasons_lock:
            self._reasons.setdefault(rank, reason)

    def _kernel_reason(self, rank: int) -> str | None:
        """Why the connection to `rank` broke when it was not closed but timed out or lost its route
        (a cut network, a host down): the socket's pending error says so, once; kept here."""
        with self._reasons_lock:
            if rank not in self._reasons and rank in self._sockets:
                try:
                    code = self._sockets[rank].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                except OSError:
                    code = 0
                if code in UNREACHABLE:
                    self._reasons[rank] = unreachable(self._detection_seconds, OSError(code, os.strerror(code)))
            return self._reasons.get(rank)

    def _cause(self, rank: int) -> int:
        """Whom `rank` blamed when it stopped, or `rank` itself if it left no word (it crashed)."""
        local_cause = self.local_cause
        local = local_cause(rank) if local_cause is not None else None
        known = None
        if local is not None:
            known, cut_off = local
            if cut_off and known != rank:
                self._told.setdefault(known, unreachable(self._detection_seconds, f"as rank {rank} saw it"))
        word = self._word_of(rank)  # the store also carries why, even when shared memory told us whom
        if known is None:
            if word is None:
                return rank
            known = word[0]
        if word is not None and word[0] == known and word[1]:
            self._told.setdefault(known, word[1])
        if known != rank:
            self._tellers.setdefault(known, rank)
        return known

    def _word_of(self, rank: int) -> tuple[int, str] | None:
        """Whom `rank` blamed and why, as it left word in the rendezvous store (None: no word)."""
        try:
            blamed, _, why = self._store.get(self._scope, f"blame.{rank}", 0.0).decode().partition("\n")
            return int(blamed), why
        except (TimeoutError, OSError, ValueError):
            return None

    def _hung_up(self, rank: int) -> bool:
        """Whether `rank`'s end of its connection closes within a moment, as a crashed process's
        does (a dying process closes its sockets one after another: another rank may have seen
        one of them close, and stopped, before ours does)."""
        try:
            probe = select.poll()
            probe.register(self._sockets[rank], HANGUP)
            return bool(probe.poll(int(HANGUP_GRACE_SECONDS * 1000)))
        except (KeyError, ValueError, OSError):
            return False

    def blame(self, rank: int, reason: str) -> PeerFailure:
        """The failure to report when talking to `rank` failed for `reason`: the rank that failed
        first, and how, as far as this rank can tell (it may only know that another blamed it)."""
        first = self.first if self.first is not None else self._cause(rank)
        seen = self._kernel_reason(rank)  # what this rank's own connection to `rank` says
        if first == rank:
            how = seen or reason
        elif seen and not self._kernel_reason(first):
            first, how = rank, seen  # a network fault we saw ourselves beats what another rank said
        else:
            teller = self._tellers.get(first, rank)
            how = self._kernel_reason(first) or self._told.get(first) or ""
            if not how:
                closed = self._hung_up(first)
                # Asked again: a cut we had not noticed yet (the other rank's own limit ran out a
                # moment before ours) shows as an error event during that wait, not a hang-up.
                how = self._kernel_reason(first) or (
                    CLOSED_BY_PEER if closed else f"failed, according to rank {teller}, which stopped because of it")
        if self.reported is None:
            self.reported, self._reported_reason = first, how
        return PeerFailure(first, how, self.hosts.get(first))

    @property
    def reported_unreachable(self) -> bool:
        """Whether our own failure report said the rank it named stopped answering."""
        return self._reported_reason.startswith("stopped answering")

    def announce(self) -> None:
        """Before our connections close: tell the others whom we blamed and why, if we failed."""
        if self.reported is not None:
            try:
                self._store.put(self._scope, f"blame.{self._rank}",
                                f"{self.reported}\n{self._reported_reason}".encode())
            except OSError:
                pass

    def close(self) -> None:
        os.write(self._stop_w, b"\0")
        self._thread.join(timeout=1.0)
        os.close(self._stop_r)
        os.close(self._stop_w)
