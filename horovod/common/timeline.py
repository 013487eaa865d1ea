"""The Horovod timeline: a Chrome-tracing JSON file of what the engine did to every tensor.

Only the coordinator (global rank 0) writes one. Each tensor name appears as a "process" of its
own (pid 1, 2, ... in order of first appearance) whose slices are its negotiation, the operation
and the activities nested inside it. The file is a JSON array that stays loadable after every
write: it always ends in `]`, and each batch overwrites that bracket with `,<events>]`.

The engine calls the event methods on its hot path, so they only take a timestamp and append a
tuple to a deque. A daemon writer thread, one per open file, formats the tuples and writes them in
batches every `_FLUSH_INTERVAL` seconds; nothing on the engine's side waits for the disk.
"""

from __future__ import annotations

import atexit
import enum
import json
import threading
import time
import weakref
from collections import deque
from time import monotonic_ns
from typing import Any, Sequence

from horovod.common.logging import log

_FLUSH_INTERVAL = 0.05  # seconds between batches while a file is open

# What the engine appends to the queue: (kind, name or names, argument, monotonic_ns()).
_BEGIN, _END, _INSTANT_RANK, _END_OP, _CYCLE, _BEGIN_ALL, _END_ALL = range(7)


def _type_name(value: Any) -> str:
    """A request or response type as the timeline spells it: `allreduce` or an enum -> ALLREDUCE."""
    if isinstance(value, enum.Enum):
        value = value.name
    return str(value).upper()


def _shape_text(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _event(ph: str, quoted_name: str, ts: int, pid: int) -> str:
    return f'{{"ph":"{ph}","name":{quoted_name},"ts":{ts},"pid":{pid},"tid":0}}'


class _FileWriter:
    """One open timeline file and the thread that drains its queue into it."""

    def __init__(self, path: str) -> None:
        self.queue: deque = deque()
        self._path = path
        self._t0 = monotonic_ns()
        self._last_ts = 0
        self._pids: dict[str, int] = {}  # tensor name -> pid
        self._open: dict[int, list[str]] = {}  # pid -> names (as JSON) of its open B slices
        self._quoted: dict[str, str] = {}  # slice names as JSON, cached
        self._failed = False
        self._file = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by the thread
        try:
            header = (
                '[{"name":"process_name","ph":"M","pid":0,"args":{"name":"Horovod",'
                f'"start_time_since_epoch_in_micros":{time.time_ns() // 1000}}}}},'
                '{"name":"process_sort_index","ph":"M","pid":0,"args":{"sort_index":0}}]'
            )
            self._write_all(header.encode("ascii"))
        except BaseException:
            self._file.close()
            raise
        self._end = self._file.tell() - 1  # offset of the closing bracket
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="horovod-timeline", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write everything queued so far, close the slices still open, close the file."""
        self._stopping.set()
        self._thread.join()

    # --- writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                stopping = self._stopping.wait(_FLUSH_INTERVAL)
                self._drain()
                if stopping:
                    break
            out: list[str] = []
            ts = max(self._last_ts, (monotonic_ns() - self._t0) // 1000)
            for pid, stack in self._open.items():
                while stack:
                    out.append(_event("E", stack.pop(), ts, pid))
            self._append(out)
        finally:
            self._file.close()

    def _drain(self) -> None:
        queue = self.queue
        out: list[str] = []
        while queue:
            item = queue.popleft()
            try:
                self._format(item, out)
            except Exception as exc:  # one bad argument must not end the timeline
                log.warning("timeline: dropped event %r: %s", item, exc)
        self._append(out)

    def _format(self, item: tuple, out: list[str]) -> None:
        kind, name, arg, t = item
        if t < self._t0:  # raced with a restart: it belongs to the previous file
            return
        ts = (t - self._t0) // 1000
        if ts < self._last_ts:
            ts = self._last_ts
        self._last_ts = ts
        if kind == _BEGIN:
            self._begin(name, self._quote(arg), ts, out)
        elif kind == _END:
            self._end_slice(name, ts, out)
        elif kind == _INSTANT_RANK:
            pid = self._pid(name, out)
            out.append(f'{{"ph":"X","name":"{int(arg)}","ts":{ts},"pid":{pid},"tid":0,"dur":0}}')
        elif kind == _END_OP:
            self._end_op(name, arg, ts, out)
        elif kind == _CYCLE:
            out.append(f'{{"ph":"i","name":"CYCLE_START","ts":{ts},"pid":0,"tid":0,"s":"g"}}')
        elif kind == _BEGIN_ALL:
            quoted = self._quote(arg)
            for one in name:
                self._begin(one, quoted, ts, out)
        elif kind == _END_ALL:
            for one in name:
                self._end_slice(one, ts, out)

    def _pid(self, name: str, out: list[str]) -> int:
        pid = self._pids.get(name)
        if pid is not None:
            return pid
        pid = self._pids[name] = len(self._pids) + 1
        self._open[pid] = []
        quoted = json.dumps(str(name))
        out.append(f'{{"name":"process_name","ph":"M","pid":{pid},"args":{{"name":{quoted}}}}}')
        out.append(
            f'{{"name":"process_sort_index","ph":"M","pid":{pid},"args":{{"sort_index":{pid}}}}}'
        )
        return pid

    def _quote(self, text: str) -> str:
        quoted = self._quoted.get(text)
        if quoted is None:
            quoted = self._quoted[text] = json.dumps(str(text))
        return quoted

    def _begin(self, name: str, quoted_slice: str, ts: int, out: list[str]) -> None:
        pid = self._pid(name, out)
        self._open[pid].append(quoted_slice)
        out.append(_event("B", quoted_slice, ts, pid))

    def _end_slice(self, name: str, ts: int, out: list[str]) -> None:
        pid = self._pids.get(name)
        if pid is None or not self._open[pid]:
            return  # its B went to an earlier file (or never happened): keep this file balanced
        out.append(_event("E", self._open[pid].pop(), ts, pid))

    def _end_op(self, name: str, arg: tuple, ts: int, out: list[str]) -> None:
        pid = self._pids.get(name)
        if pid is None or not self._open[pid]:
            return
        stack = self._open[pid]
        while len(stack) > 1:  # activities left open end with the operation
            out.append(_event("E", stack.pop(), ts, pid))
        dtype, shape = arg
        args = f'{{"dtype":{self._quote(str(dtype))},"shape":"{_shape_text(shape)}"}}'
        out.append(f'{{"ph":"E","name":{stack.pop()},"ts":{ts},"pid":{pid},"tid":0,"args":{args}}}')

    def _append(self, events: list[str]) -> None:
        if not events or self._failed:
            return
        data = ("," + ",".join(events) + "]").encode("ascii")
        try:
            self._file.seek(self._end)
            self._write_all(data)
        except OSError as exc:
            self._failed = True
            log.warning("timeline: cannot write %s (%s); no further events are recorded",
                        self._path, exc)
            return
        self._end += len(data) - 1

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._file.write(view):]


class Timeline:
    """Chrome-tracing JSON writer owned by the engine on the coordinator (global rank 0).

    The engine's background thread calls the event methods; any thread may call `start` and
    `stop`. Event methods do nothing unless a file is open.
    """

    def __init__(self) -> None:
        self.active = False  # a file is open (an attribute, not a property: every op reads it)
        self._mark_cycles = False  # true only while active and marking
        self._writer: _FileWriter | None = None
        self._push = _discard
        self._lock = threading.Lock()

    @property
    def mark_cycles(self) -> bool:
        return self._mark_cycles

    def start(self, path: str, mark_cycles: bool = False) -> None:
        """Open (truncate) `path` and record into it; a file already open is finished first.

        Returns once the new file holds its header, so a reader can load it at once. Raises
        OSError, leaving the timeline inactive, when the file cannot be created.
        """
        with self._lock:
            self._stop_locked()
            writer = _FileWriter(path)
            self._writer = writer
            self._push = writer.queue.append
            _open_timelines.add(self)
            self.active = True
            self._mark_cycles = bool(mark_cycles)

    def stop(self) -> None:
        """Write what is queued, end the slices still open, close the file. Safe when inactive."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        self.active = False
        self._mark_cycles = False
        writer, self._writer = self._writer, None
        self._push = _discard
        _open_timelines.discard(self)
        if writer is not None:
            writer.close()

    # --- events (engine thread) ----------------------------------------------------------------

    def negotiate_start(self, name: str, request_type: str) -> None:
        if not self.active:
            return
        self._push((_BEGIN, name, "NEGOTIATE_" + _type_name(request_type), monotonic_ns()))

    def negotiate_rank_ready(self, name: str, rank: int) -> None:
        if not self.active:
            return
        self._push((_INSTANT_RANK, name, rank, monotonic_ns()))

    def negotiate_end(self, name: str) -> None:
        if not self.active:
            return
        self._push((_END, name, None, monotonic_ns()))

    def start_op(self, name: str, response_type: str) -> None:
        if not self.active:
            return
        self._push((_BEGIN, name, _type_name(response_type), monotonic_ns()))

    def activity_start(self, name: str, activity: str) -> None:
        if not self.active:
            return
        self._push((_BEGIN, name, activity, monotonic_ns()))

    def activity_end(self, name: str) -> None:
        if not self.active:
            return
        self._push((_END, name, None, monotonic_ns()))

    def activity_start_all(self, names: Sequence[str], activity: str) -> None:
        if not self.active:
            return
        self._push((_BEGIN_ALL, tuple(names), activity, monotonic_ns()))

    def activity_end_all(self, names: Sequence[str]) -> None:
        if not self.active:
            return
        self._push((_END_ALL, tuple(names), None, monotonic_ns()))

    def end_op(self, name: str, dtype: str, shape: Sequence[int]) -> None:
        """End the operation (and any activity of it still open) with its dtype and shape."""
        if not self.active:
            return
        self._push((_END_OP, name, (dtype, tuple(shape)), monotonic_ns()))

    def mark_cycle_start(self) -> None:
        if not self._mark_cycles:
            return
        self._push((_CYCLE, None, None, monotonic_ns()))


def _discard(item: tuple) -> None:
    """Where events go in the instant between a stop and the engine seeing `active` false."""


_open_timelines: weakref.WeakSet[Timeline] = weakref.WeakSet()


@atexit.register
def _stop_open_timelines() -> None:
    for timeline in list(_open_timelines):
        timeline.stop()
