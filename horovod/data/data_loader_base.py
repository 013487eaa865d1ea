"""Data loaders that Horovod's Spark/Lightning helpers and user code build on.

`BaseDataLoader` is the contract: a subclass yields raw batches from `_iterate()`, and
`_process_batch()` turns each into what the training loop sees. `AsyncDataLoaderMixin`, put
before such a class, produces the raw batches on a background thread into a bounded queue,
so that reading and decoding overlap the training step:

    class AsyncLoader(AsyncDataLoaderMixin, MyLoader):
        pass

    loader = AsyncLoader(async_loader_queue_size=16, ...)   # the rest goes to MyLoader

The thread keeps one epoch ahead: when an epoch ends it starts the next, so the first batches
of every epoch after the first are ready when iteration starts. `async_loader_queue_size=0`
turns the thread off. Call `close_async_loader()` when done (garbage collection also does).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator


class BaseDataLoader:
    """Iterating yields `_process_batch(batch)` for each `batch` of `_iterate()`."""

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__(): the number of batches in an epoch")

    def _iterate(self) -> Iterator[Any]:
        """The raw batches of one epoch."""
        raise NotImplementedError(f"{type(self).__name__} must define _iterate(): a generator of one epoch's raw "
                                  "batches")

    def __iter__(self) -> Iterator[Any]:
        for batch in self._iterate():
            yield self._process_batch(batch)

    def _process_batch(self, batch: Any) -> Any:
        return batch


class _EndOfEpoch:
    """Queued after an epoch's last batch."""


class _Failed:
    """Queued when `_iterate()` raised: the consumer re-raises `error`."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class AsyncDataLoaderMixin:
    """Produces the batches of the class it is mixed into on a background thread (see module)."""

    def __init__(self, async_loader_queue_size: int = 64, *args: Any, **kwargs: Any) -> None:
        self.async_loader_queue_size = async_loader_queue_size
        super().__init__(*args, **kwargs)
        self.started = False
        if async_loader_queue_size > 0:
            self.finished_event = threading.Event()
            self.queue: queue.Queue = queue.Queue(async_loader_queue_size)
            self.thread = threading.Thread(target=self._async_worker, name="horovod-async-loader", daemon=True)

    def __del__(self) -> None:
        self.close_async_loader()

    def close_async_loader(self) -> None:
        """Stop the background thread and wait for it."""
        if self.async_loader_queue_size > 0 and getattr(self, "started", False) and self.thread.is_alive():
            self.finished_event.set()
            while self.thread.is_alive():  # free room so that a blocked put() sees the stop
                try:
                    self.queue.get(timeout=0.05)
                except queue.Empty:
                    pass
            self.thread.join()

    def _put(self, item: Any) -> bool:
        """Queue `item` unless asked to stop meanwhile; False once stopped."""
        while not self.finished_event.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _async_worker(self) -> None:
        while not self.finished_event.is_set():
            end: _EndOfEpoch | _Failed = _EndOfEpoch()
            try:
                for batch in self._iterate():  # type: ignore[attr-defined]
                    if not self._put(batch):
                        return
            except Exception as exc:  # handed to the training loop, which raises it and ends the epoch
                end = _Failed(exc)
            if not self._put(end):
                return

    def __iter__(self) -> Iterator[Any]:
        if self.async_loader_queue_size <= 0:
            yield from super().__iter__()  # type: ignore[misc]
            return
        if not self.started:
            self.started = True
            self.thread.start()
        while True:
            item = self.queue.get()
            if isinstance(item, _EndOfEpoch):
                return
            if isinstance(item, _Failed):
                raise item.error
            yield self._process_batch(item)  # type: ignore[attr-defined]
