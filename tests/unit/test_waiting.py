"""The engine's waiting policy over a fake PeerActivity: what wakes a sleeper, what counts as a peer talking."""

from __future__ import annotations

import os
import time

from horovod.common.engine.waiting import Waiter
from horovod.common.transport.activity import PeerActivity
from horovod.common.transport.spin import SPIN_SECONDS


class FakeActivity(PeerActivity):
    """A peer socket (a pipe: readable means talking) and a doorbell, with a mailbox flag."""

    def __init__(self) -> None:
        self.peer_r, self.peer_w = os.pipe()
        self.bell_r, self.bell_w = os.pipe()
        self.mailbox = False
        self.calls: list[tuple[str, bool]] = []

    def pending(self) -> bool:
        return self.mailbox

    def fds(self, driver: bool) -> dict[int, bool]:
        return {self.peer_r: True, self.bell_r: False}

    def listen(self, driver: bool, on: bool) -> None:
        self.calls.append(("listen", on))

    def drain(self, driver: bool) -> None:
        self.calls.append(("drain", driver))
        os.set_blocking(self.bell_r, False)
        try:
            os.read(self.bell_r, 64)
        except BlockingIOError:
            pass


def waiter(activity: FakeActivity, driver: bool = False) -> tuple[Waiter, int]:
    wake_r, wake_w = os.pipe()
    return Waiter(activity, wake_r, driver), wake_w


def test_times_out_when_nothing_happens_and_listens_only_while_asleep() -> None:
    activity = FakeActivity()
    w, _ = waiter(activity)
    start = time.monotonic()
    assert w.wait(0.05) is False
    assert time.monotonic() - start >= 0.04
    assert activity.calls == [("listen", True), ("listen", False), ("drain", False)]
    w.close()


def test_a_peer_socket_turning_readable_means_a_peer_is_talking() -> None:
    activity = FakeActivity()
    w, _ = waiter(activity)
    os.write(activity.peer_w, b"x")
    assert w.wait(5.0) is True
    w.close()


def test_the_wake_fd_wakes_without_claiming_a_peer_talks() -> None:
    activity = FakeActivity()
    w, wake_w = waiter(activity)
    os.write(wake_w, b"\0")
    start = time.monotonic()
    assert w.wait(5.0) is False
    assert time.monotonic() - start < 1.0
    w.close()


def test_a_doorbell_counts_only_if_a_message_waits() -> None:
    activity = FakeActivity()
    w, _ = waiter(activity)
    os.write(activity.bell_w, b"\0")
    assert w.wait(5.0) is False  # rung, but the mailbox is empty
    os.write(activity.bell_w, b"\0")
    activity.mailbox = True
    assert w.wait(5.0) is True
    w.close()


def test_a_waiting_message_returns_at_once_without_sleeping() -> None:
    activity = FakeActivity()
    activity.mailbox = True
    w, _ = waiter(activity)
    assert w.wait(None) is True
    assert activity.calls == []
    w.close()


def test_only_the_driver_spins_and_only_where_spinning_is_useful() -> None:
    activity = FakeActivity()
    activity.spin_useful = True
    checks = 0

    def pending() -> bool:
        nonlocal checks
        checks += 1
        return False

    activity.pending = pending  # type: ignore[method-assign]
    idle, _ = waiter(activity, driver=False)
    idle.wait(SPIN_SECONDS)
    idle_checks, checks = checks, 0
    driver, _ = waiter(activity, driver=True)
    driver.wait(SPIN_SECONDS)
    assert idle_checks <= 3 < checks  # the idle thread looks before and after its sleep; the driver spins
    checks = 0
    driver.wait(0)  # a look, not a wait: no spin
    assert checks <= 3
    idle.close()
    driver.close()
