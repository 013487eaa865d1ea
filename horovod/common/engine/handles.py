"""What a framework thread holds while its collective runs: a Handle, completed by the engine."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from horovod.common.engine.messages import Request


class Handle:
    """Completes when every tensor of the call (one, or a grouped call's list) is done.

    `wait()` returns the output (a list for grouped calls) or raises the first error.
    """

    __slots__ = ("_event", "_results", "_remaining", "_error", "_lock", "grouped", "name")

    def __init__(self, count: int, grouped: bool, name: str) -> None:
        self._event = threading.Event()
        self._results: list[Any] = [None] * count
        self._remaining = count
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self.grouped = grouped
        self.name = name
        if count == 0:  # an empty grouped call is complete at once
            self._event.set()

    def poll(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._event.wait(timeout):
            raise TimeoutError(f"{self.name} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._results if self.grouped else self._results[0]

    def complete(self, index: int, result: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._results[index] = result
            self._remaining -= 1
            done = self._remaining == 0
        if done:
            self._event.set()


@dataclass(eq=False)
class Entry:
    """One tensor of one call, from enqueue until the engine completes its handle."""

    request: Request
    tensor: np.ndarray | None
    output: np.ndarray | None
    handle: Handle
    index: int = 0
    done: bool = False

    @property
    def name(self) -> str:
        return self.request.name

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete this tensor's part of the handle; later calls are ignored."""
        if not self.done:
            self.done = True
            self.handle.complete(self.index, result, error)
