"""Elastic training, the worker's side: state that survives a change of membership, and the loop.

`run_fn(func, reset)` runs the user's training function. A peer that dies makes a collective
raise `HorovodInternalError`: the state rolls back to its last `commit()`, the process re-joins
the job (`reset`: shutdown, then `init()`, which finds the driver's newest round) and the
function runs again from the committed state, synced from the new rank 0. A change of hosts is
noticed by rank 0 at `commit()` / `check_host_updates()` (the driver planned a newer round in
the store); rank 0 tells every rank in one broadcast, so all raise `HostsUpdatedInterrupt`
together, re-join, and continue from the state they have (no rollback; no sync when workers were
only removed, since every survivor holds the same state). Frameworks supply how to broadcast
an object and how to reset (`horovod.torch.elastic`, `horovod.tensorflow.elastic`).

On entering the loop and after each re-join the slot variables in `os.environ` (`HOROVOD_RANK`, `HOROVOD_SIZE`, the
`LOCAL_`/`CROSS_` ones, `HOROVOD_HOSTNAME`) are rewritten to the new round's values: scripts read
them (to pin a device, to name files), and Horovod's workers update them the same way. This loop
is the one place the library writes `os.environ`; a worker keeps its id (`host:local slot`) because
the driver never moves a worker to another local slot.
"""

from __future__ import annotations

import copy
import functools
import os
import queue
from typing import Any, Callable, TypeVar

from horovod.common import basics, runtime
from horovod.common.bootstrap.store import newer_rounds
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

#: Flag of a host update that only removed workers (Horovod's `HostUpdateResult.removed`).
REMOVED = 1

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["REMOVED", "ObjectState", "State", "reset", "run", "run_fn"]


class State:
    """What a training function carries across re-initialisations; see the module docstring.

    Subclasses say how to `save` (snapshot), `restore` (go back to the snapshot) and `sync`
    (take rank 0's values).
    """

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[tuple[int, int]] = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Call these after every re-initialisation (e.g. to scale the learning rate to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: int) -> None:
        """A host update (timestamp: the driver's round number) for the next `check_host_updates`."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Snapshot the state (what a failure rolls back to), then look for host updates."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank at once when the driver changed the workers."""
        if self._rank() == 0:
            self._poll_driver()
        prev = last = self._last_updated_timestamp
        change = 0
        while not self._host_messages.empty():
            timestamp, update = self._host_messages.get()
            if timestamp > last:
                last, change = timestamp, change | update
        prev, last, change = self._bcast_object((prev, last, change))
        self._last_updated_timestamp = last
        if last > prev:
            raise HostsUpdatedInterrupt(change == REMOVED)

    def _poll_driver(self) -> None:
        rt = runtime.peek()
        if rt is None or rt.rendezvous is None:
            return
        newer = newer_rounds(rt.rendezvous, max(rt.round, self._last_updated_timestamp))
        if newer is not None:
            self.on_hosts_updated(*newer)

    def save(self) -> None:
        """Snapshot the values (what `restore` goes back to)."""
        raise NotImplementedError(f"{type(self).__name__} must define save(): how to snapshot its values "
                                  "(ObjectState does it for plain attributes)")

    def restore(self) -> None:
        """Go back to the last snapshot."""
        raise NotImplementedError(f"{type(self).__name__} must define restore(): how to go back to the snapshot "
                                  "save() took")

    def sync(self) -> None:
        """Take rank 0's values on every rank."""
        raise NotImplementedError(f"{type(self).__name__} must define sync(): how every rank takes rank 0's values "
                                  "(e.g. with broadcast_object)")

    def reset(self) -> None:
        """Adjust to the new membership after a re-initialisation (nothing by default)."""


class ObjectState(State):
    """Plain Python attributes (`ObjectState(epoch=0, batch=0)` -> `state.epoch`), saved by deep copy."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int], **kwargs: Any) -> None:
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))


def run_fn(func: F, reset: Callable[[], None]) -> F:
    """`func(state, ...)` under the elastic loop (see the module docstring); `reset` re-joins the job."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        _export_slot()  # a worker may have joined a newer round than the one it was launched for
        while True:
            try:
                if not skip_sync:
                    state.sync()
                try:
                    return func(state, *args, **kwargs)
                except Exception as exc:
                    cause = _horovod_cause(exc)
                    if cause is exc:
                        raise
                    raise cause from exc
            except HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            _rejoin(reset)
            _export_slot()  # before the reset callbacks, which may read it
            state.on_reset()

    return wrapper  # type: ignore[return-value]


def reset() -> None:
    """Leave the current round and join the driver's newest (frameworks with per-round state of
    their own, such as PyTorch's handle table, wrap this)."""
    basics.shutdown()
    basics.init()


def run(func: F) -> F:
    """Decorator: run `func(state, ...)` so that it survives failures and host changes."""
    return run_fn(func, reset)


def _export_slot() -> None:
    """Write the current round's slot variables into `os.environ` (see the module docstring)."""
    os.environ.update(basics.runtime().settings.topology.variables())


def _horovod_cause(exc: Exception) -> Exception:
    """Our failure inside a framework's graph (a `tf.py_function` in Keras' `fit`) reaches us as the
    framework's own error carrying our message: recognise it, so the loop still recovers."""
    if not isinstance(exc, (HorovodInternalError, HostsUpdatedInterrupt)) and "HorovodInternalError" in str(exc):
        return HorovodInternalError(str(exc))
    return exc


def _rejoin(reset: Callable[[], None]) -> None:
    """Reset until a round forms: a round can be superseded while it connects (a member died, or
    the driver re-planned); each attempt is bounded by the start timeout."""
    while True:
        try:
            reset()
            return
        except HorovodInternalError:
            continue
