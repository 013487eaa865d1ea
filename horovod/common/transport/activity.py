"""How a sleeping engine thread learns that a peer has started talking to this rank.

A host transport carries the engine's control messages, and between cycles the engine sleeps
until a peer sends one. The transport only says what shows that a peer is talking and how to be
told of it; whether to spin or sleep, and for how long, is the engine's policy
(`horovod.common.engine.waiting`). Two threads of a rank may sleep at once: the idle engine
thread, and the *driver* (a thread that holds the engine's drive lock); each has its own doorbell,
so neither swallows a ring meant for the other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class PeerActivity(ABC):
    """What a sleeper watches to learn that a peer is talking, and how it asks to be rung."""

    # True when spinning on pending() can beat sleeping (every local rank has a core of its own):
    # the engine's driver then spins briefly before it sleeps on fds().
    spin_useful: bool = False

    def pending(self) -> bool:
        """Non-blocking: a peer's control message waits that no file descriptor shows (shared
        memory mailboxes, MPI). Reads nothing of it."""
        return False

    @abstractmethod
    def fds(self, driver: bool) -> dict[int, bool]:
        """The fds a sleeper watches, with their meaning. True: the fd turning readable itself
        means a peer is talking to us (a peer's socket; it also wakes on hang-up). False: a
        doorbell; after it rings, ask pending(). `driver`: the fds of the thread that holds the
        engine's drive lock, else of the idle engine thread."""

    def listen(self, driver: bool, on: bool) -> None:
        """Around the engine's sleep on fds(driver): ask peers to ring this sleeper's doorbell
        when they post a message (on), or stop asking (off)."""

    def drain(self, driver: bool) -> None:
        """After a sleeper woke: empty its doorbell (the rings have done their job)."""

    def set_caller_driving(self, on: bool) -> None:
        """A framework thread that would otherwise only block drives the engine (on), or no
        longer does (off). Meanwhile the transport may spin longer before it sleeps, and peers need
        not wake the idle engine thread. After off, `waiting_after_release()` tells whether a
        peer's message arrived that no one will be woken for."""

    def waiting_after_release(self) -> bool:
        """After `set_caller_driving(False)`: whether a peer's message waits that was posted
        before peers could see the release (so nobody rings the engine thread for it). Orders the
        release before the look, which costs a round trip between cores: only a rank with work
        pending asks (a rank without would only answer 'nothing ready')."""
        return self.pending()

