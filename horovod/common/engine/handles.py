"""What a framework thread holds while its collective runs: a Handle, completed by the engine."""

from __future__ import annotations

from _thread import allocate_lock as _allocate_lock
from typing import Any, Protocol

import numpy as np

from horovod.common.engine.messages import Request


class Driving(Protocol):
    """What a handle needs of the engine: a thread about to wait for it runs the cycles itself."""

    def drive_until(self, handle: Handle) -> None:
        """Return once `handle` completes, running the engine's cycles on the calling thread
        meanwhile where no other thread does."""


class Handle:
    """Completes when every tensor of the call (one, or a grouped call's list) is done.

    `wait()` returns the output (a list for grouped calls) or raises the first error.
    """

    __slots__ = ("_done", "_results", "_remaining", "_error", "grouped", "name", "engine", "set_id")

    def __init__(self, count: int, grouped: bool, name: str) -> None:
        # A bare lock held until completion: waiting on it is one C call that releases the GIL,
        # several times cheaper than a threading.Event on the latency path of a small op.
        self._done = _allocate_lock()
        self._results: list[Any] = [None] * count
        self._remaining = count
        self._error: BaseException | None = None
        self.grouped = grouped
        self.name = name
        self.engine: Driving | None = None  # set on enqueue; a waiting thread runs it (drive_until)
        self.set_id = 0  # the process set it was submitted to, set on enqueue
        if count:
            self._done.acquire()

    def poll(self) -> bool:
        return self._remaining == 0

    def wait(self, timeout: float | None = None) -> Any:
        if self._remaining:
            engine = self.engine
            if timeout is None and engine is not None:
                engine.drive_until(self)
            else:
                self.block_until_done(timeout)
        if self._error is not None:
            raise self._error
        return self._results if self.grouped else self._results[0]

    def block_until_done(self, timeout: float | None) -> None:
        """Sleep until the handle completes (it is another thread that completes it)."""
        if self._remaining:
            if not self._done.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
                raise TimeoutError(f"{self.name} did not complete within {timeout} s")
            self._done.release()  # let any other waiter (and later wait() calls) through

    def complete(self, index: int, result: Any = None, error: BaseException | None = None) -> None:
        """Called only by the thread driving the engine (it holds the drive lock), so the countdown
        needs no lock of its own."""
        if error is not None and self._error is None:
            self._error = error
        self._results[index] = result
        self._remaining -= 1
        if self._remaining == 0:
            self._done.release()


class Entry:
    """One tensor of one call, from enqueue until the engine completes its handle (a plain
    class with slots: one is built per tensor per op, twice as fast as a dataclass)."""

    __slots__ = ("request", "tensor", "output", "handle", "index", "done")

    def __init__(self, request: Request, tensor: np.ndarray | None, output: np.ndarray | None, handle: Handle,
                 index: int = 0) -> None:
        self.request, self.tensor, self.output = request, tensor, output
        self.handle, self.index = handle, index
        self.done = False

    @property
    def name(self) -> str:
        return self.request.name

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete this tensor's part of the handle; later calls are ignored."""
        if not self.done:
            self.done = True
            self.handle.complete(self.index, result, error)
