"""Segments: one file in /dev/shm per rank, its layout, and its life cycle.

Every rank owns one segment, unlinked as soon as every local peer has mapped it, so nothing is
left behind however the job ends. The segment's fusion region is reserved lazily, as the engine
asks for larger fusion buffers.
"""

from __future__ import annotations

import mmap
import os
import secrets
import sys
from typing import Protocol, Sequence

import numpy as np

from horovod.common import wire
from horovod.common.logging import log
from horovod.common.transport.shm.signals import HEADER_WORDS, KINDS, Bells

SHM_DIR = "/dev/shm"
PREFIX = "khvd-"
PAGE = mmap.PAGESIZE
# An allreduce round moves PIECE_BYTES per member through a staging slot of n pieces (other
# collectives use the whole slot). Measured here: 256 KiB keeps a round's data in the core's L2;
# larger pieces lose more to cache misses than they save in per-round overhead.
PIECE_BYTES = 256 * 1024
MIN_SLOT_BYTES = 512 * 1024
DEPTH = 4
# One control mailbox; larger control messages travel over the TCP connection instead.
CHANNEL_BYTES = 64 * 1024


def round_up(value: int, to: int = PAGE) -> int:
    return (value + to - 1) // to * to


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class Unavailable(RuntimeError):
    """Shared memory cannot be used here; the caller falls back to TCP."""


class Layout:
    """Byte offsets inside a segment for `local_size` ranks and a fusion region of `fusion` bytes."""

    def __init__(self, local_size: int, fusion: int) -> None:
        self.header_bytes = 8 * HEADER_WORDS
        self.counters = self.header_bytes
        # Words a collective publishes for its peers before its first round: [0] where its buffer
        # lies in the fusion region (sliced allreduce), [1] and [2] the depth of the ring it
        # stages through and the piece it starts at (two-rank allreduce, `staging`).
        self.slot_desc = self.counters + 8 * KINDS * local_size
        self.channels = round_up(self.slot_desc + 8 * DEPTH)
        self.slots = self.channels + 2 * CHANNEL_BYTES * local_size
        self.slot_bytes = max(MIN_SLOT_BYTES, PIECE_BYTES * local_size)
        self.fusion = self.slots + DEPTH * self.slot_bytes
        self.fusion_bytes = fusion
        self.fixed = self.fusion
        self.total = self.fusion + fusion


class MappedSegment:
    """One rank's segment as seen from this process: counters, channels, slots, fusion region."""

    def __init__(self, fd: int, layout: Layout, local_size: int, writable: bool) -> None:
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        self.mm = mmap.mmap(fd, layout.total, mmap.MAP_SHARED, prot)
        view = memoryview(self.mm)
        self.header = view[: layout.header_bytes].cast("Q")
        self.counters = [view[layout.counters + 8 * local_size * k: layout.counters + 8 * local_size * (k + 1)]
                         .cast("Q") for k in range(KINDS)]
        self.slot_desc = view[layout.slot_desc: layout.slot_desc + 8 * DEPTH].cast("Q")
        data = np.frombuffer(self.mm, np.uint8)
        size = layout.slot_bytes
        self.slots = [data[layout.slots + s * size: layout.slots + (s + 1) * size] for s in range(DEPTH)]
        self.fusion = data[layout.fusion: layout.fusion + layout.fusion_bytes]
        # Channel q of this segment carries messages from its owner to local rank q.
        self.channel_len = []
        self.channel_data = []
        for q in range(local_size):
            base = layout.channels + 2 * CHANNEL_BYTES * q
            self.channel_len.append([view[base + s * CHANNEL_BYTES: base + s * CHANNEL_BYTES + 8].cast("Q")
                                     for s in range(2)])
            self.channel_data.append([view[base + s * CHANNEL_BYTES + 8: base + (s + 1) * CHANNEL_BYTES]
                                      for s in range(2)])

    def release(self) -> None:
        """Drop our references; the mapping goes when the last numpy view of it does."""
        self.header = self.slot_desc = None  # type: ignore[assignment]
        self.counters, self.slots, self.channel_len, self.channel_data = [], [], [], []
        self.fusion = None  # type: ignore[assignment]
        try:
            self.mm.close()
        except BufferError:  # a view (e.g. the executor's fusion buffer) is still alive
            pass


def remove_stale_segments() -> None:
    """Unlink segments that crashed jobs of ours left behind (their creator pid is gone)."""
    uid = os.getuid()
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX):].split("-", 1)[0])
            path = os.path.join(SHM_DIR, name)
            if os.stat(path).st_uid != uid:
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
            except OSError:
                pass
        except (ValueError, OSError):
            continue


def shared_memory_usable() -> bool:
    """Whether this platform offers what the shm transport needs (Linux: /dev/shm, abstract sockets)."""
    return sys.platform.startswith("linux") and os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


class Mesh(Protocol):
    """What setting up the segments needs of the TCP mesh: one all-to-all exchange among members."""

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]: ...


class HostSegments:
    """Every local rank's segment, mapped here (`members`: the host's sorted global ranks), and our
    bells, named after our segment.

    Built collectively over the TCP mesh: every member constructs it at the same time. Raises
    `Unavailable` (on every member alike) when shared memory cannot be set up.
    """

    def __init__(self, mesh: Mesh, members: Sequence[int], rank: int, fusion_bytes: int) -> None:
        self.members = list(members)
        self.rank = rank
        self.me = self.members.index(rank)
        self.index = {r: i for i, r in enumerate(self.members)}
        self.layout = Layout(len(self.members), round_up(max(0, fusion_bytes)))
        self.mapped: list[MappedSegment] = []
        self.mine: MappedSegment | None = None
        self.bells: Bells | None = None
        self.bell_address: list[str] = []
        self._fd = -1
        self._path: str | None = None
        self._fusion_reserved = 0
        self._fusion_limit = self.layout.fusion_bytes
        self._fusion_addr = 0
        self._groups: dict[tuple[int, ...], tuple[list[int], int]] = {}
        self._closed = False
        try:
            self._setup(mesh)
        except BaseException:
            self.close()
            raise

    def _setup(self, mesh: Mesh) -> None:
        me, layout = self.me, self.layout
        remove_stale_segments()
        info: tuple = ("", "", 0)
        try:
            name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
            self._path = os.path.join(SHM_DIR, name)
            self._fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            os.ftruncate(self._fd, layout.total)
            os.posix_fallocate(self._fd, 0, layout.fixed)
            self.bells = Bells(name)
            info = ("ok", name, layout.fusion_bytes)
        except OSError as exc:
            info = (f"could not create a {layout.fixed >> 20} MiB segment in {SHM_DIR}: {exc}", "", 0)
        everyone = [wire.decode(p) for p in mesh.exchange(self.members, wire.encode(info))]
        problems = [f"rank {self.members[q]}: {status}" for q, (status, _, _) in enumerate(everyone) if status != "ok"]
        if problems:
            raise Unavailable("; ".join(problems))
        if any(fusion != layout.fusion_bytes for _, _, fusion in everyone):
            raise Unavailable("ranks disagree on HOROVOD_FUSION_THRESHOLD")
        self.bell_address = ["\0" + name for _, name, _ in everyone]
        status = "ok"
        try:
            for q, (_, name, _) in enumerate(everyone):
                if q == me:
                    self.mapped.append(MappedSegment(self._fd, layout, len(self.members), writable=True))
                    continue
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
                try:
                    self.mapped.append(MappedSegment(fd, layout, len(self.members), writable=False))
                finally:
                    os.close(fd)
        except OSError as exc:
            status = f"could not map a peer's segment: {exc} (is {SHM_DIR} shared between them?)"
        answers = [p.decode() for p in mesh.exchange(self.members, status.encode())]
        # Everyone has mapped everyone (or given up): the names are no longer needed.
        self._unlink()
        problems = [f"rank {self.members[q]}: {a}" for q, a in enumerate(answers) if a != "ok"]
        if problems:
            raise Unavailable("; ".join(problems))
        self.mine = self.mapped[me]
        self._fusion_addr = address(self.mine.fusion) if layout.fusion_bytes else 0

    def _unlink(self) -> None:
        if self._path is not None:
            try:
                os.unlink(self._path)
            except OSError:
                pass
            self._path = None

    def group(self, group: Sequence[int]) -> tuple[list[int], int]:
        """Local indices of a group's members, and our position in it."""
        key = tuple(group)
        cached = self._groups.get(key)
        if cached is None:
            cached = self._groups[key] = ([self.index[r] for r in key], key.index(self.rank))
        return cached

    # -- the fusion region --------------------------------------------------------------------
    def fusion_buffer(self, nbytes: int) -> np.ndarray | None:
        """`nbytes` of our fusion region (None if it is too small or /dev/shm is full)."""
        if nbytes > self._fusion_limit:
            return None
        if nbytes > self._fusion_reserved:
            grow = min(self._fusion_limit, max(round_up(nbytes, 1 << 20), 2 * self._fusion_reserved))
            try:
                os.posix_fallocate(self._fd, self.layout.fusion + self._fusion_reserved, grow - self._fusion_reserved)
            except OSError as exc:
                log.warning("shared memory: could not grow the fusion buffer to %d bytes (%s); "
                            "fusing in private memory instead", grow, exc)
                self._fusion_limit = self._fusion_reserved  # stop trying
                return None
            self._fusion_reserved = grow
        return self.mine.fusion[:nbytes]

    def descriptor(self, buf: np.ndarray) -> int:
        """1 + the byte offset of `buf` in our fusion region, or 0 when it lives elsewhere."""
        if not self._fusion_reserved:
            return 0
        offset = address(buf) - self._fusion_addr
        if 0 <= offset and offset + buf.nbytes <= self._fusion_reserved and offset % buf.itemsize == 0:
            return offset + 1
        return 0

    def close(self) -> None:
        """Close our bells, release the mappings. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._unlink()
        if self.bells is not None:
            self.bells.close()
        for seg in self.mapped:
            seg.release()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
