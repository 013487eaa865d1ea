"""The engine's waiting policy over a fake transport: what wakes a sleeper, and what counts as a peer talking."""

from __future__ import annotations

import os
import time

from horovod.common.engine.waiting import Waiter
from horovod.common.transport.spin import SPIN_SECONDS


class FakeTransport:
    """A peer socket (a pipe: readable means talking) and a doorbell, with a mailbox flag."""

    spin_useful = False

    def __init__(self) -> None:
        self.peer_r, self.peer_w = os.pipe()
        self.bell_r, self.bell_w = os.pipe()
        self.mailbox = False
        self.calls: list[tuple[str, bool]] = []

    def has_activity(self) -> bool:
        return self.mailbox

    def activity_fds(self, driver: bool) -> dict[int, bool]:
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


def waiter(transport: FakeTransport, driver: bool = False) -> tuple[Waiter, int]:
    wake_r, wake_w = os.pipe()
    return Waiter(transport, wake_r, driver), wake_w  # type: ignore[arg-type]


def test_times_out_when_nothing_happens_and_listens_only_while_asleep() -> None:
    transport = FakeTransport()
    w, _ = waiter(transport)
    start = time.monotonic()
    assert w.wait(0.05) is False
    assert time.monotonic() - start >= 0.04
    assert transport.calls == [("listen", True), ("listen", False), ("drain", False)]
    w.close()


def test_a_peer_socket_turning_readable_means_a_peer_is_talking() -> None:
    transport = FakeTransport()
    w, _ = waiter(transport)
    os.write(transport.peer_w, b"x")
    assert w.wait(5.0) is True
    w.close()


def test_the_wake_fd_wakes_without_claiming_a_peer_talks() -> None:
    transport = FakeTransport()
    w, wake_w = waiter(transport)
    os.write(wake_w, b"\0")
    start = time.monotonic()
    assert w.wait(5.0) is False
    assert time.monotonic() - start < 1.0
    w.close()


def test_a_doorbell_counts_only_if_a_message_waits() -> None:
    transport = FakeTransport()
    w, _ = waiter(transport)
    os.write(transport.bell_w, b"\0")
    assert w.wait(5.0) is False  # rung, but the mailbox is empty
    os.write(transport.bell_w, b"\0")
    transport.mailbox = True
    assert w.wait(5.0) is True
    w.close()


def test_a_waiting_message_returns_at_once_without_sleeping() -> None:
    transport = FakeTransport()
    transport.mailbox = True
    w, _ = waiter(transport)
    assert w.wait(None) is True
    assert transport.calls == []
    w.close()


def test_only_the_driver_spins_and_only_where_spinning_is_useful() -> None:
    transport = FakeTransport()
    transport.spin_useful = True
    checks = 0

    def has_activity() -> bool:
        nonlocal checks
        checks += 1
        return False

    transport.has_activity = has_activity  # type: ignore[method-assign]
    idle, _ = waiter(transport, driver=False)
    idle.wait(SPIN_SECONDS)
    idle_checks, checks = checks, 0
    driver, _ = waiter(transport, driver=True)
    driver.wait(SPIN_SECONDS)
    assert idle_checks <= 3 < checks  # the idle thread looks before and after its sleep; the driver spins
    checks = 0
    driver.wait(0)  # a look, not a wait: no spin
    assert checks <= 3
    idle.close()
    driver.close()
