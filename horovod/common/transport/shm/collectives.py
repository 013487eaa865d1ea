"""The data plane among the ranks of one host: collectives over the segments' staging slots.

A collective runs in *rounds*. In round r a rank stages, into its slot r % DEPTH, the r-th piece
of what its peers need, and reads what it needs from theirs, one round behind, so staging and
reading overlap. Both ranks of a pair run the same collectives in the same order and agree on how
many rounds each takes, so no counter needs to say which collective it belongs to. See the
package docstring for the allreduce algorithms and when each runs.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from horovod.common.partition import even_counts, offsets
from horovod.common.reduce_ops import reduce_into, scale_in_place
from horovod.common.transport.shm.segment import DEPTH, PIECE_BYTES, HostSegments, address
from horovod.common.transport.shm.signals import CONSUMED, REDUCED, STAGED, Signals, fence
from horovod.common.transport.shm.staging import RING_BYTES, RING_MIN_BYTES, RING_MIN_SIZE, StagingChoice

# Up to this size an allreduce stages the whole buffer once and every rank reduces all of it.
SMALL_ALLREDUCE_BYTES = 64 * 1024
# What a pair's publications ring for (built once: every small op rings twice).
_STAGED, _STAGED_CONSUMED = (STAGED,), (STAGED, CONSUMED)


class Collectives:
    """allreduce, reducescatter, allgatherv, broadcast and alltoallv among local ranks."""

    def __init__(self, host: HostSegments, signals: Signals, staging: StagingChoice) -> None:
        self.me, self.rank, self.index = host.me, host.rank, host.index
        self.layout, self.segments, self.mine = host.layout, host.mapped, host.mine
        self.group, self._descriptor = host.group, host.descriptor
        self._wait, self._publish, self._progress = signals.wait, signals.publish, signals.progress
        self._ring = signals.ring
        self.rounds = [0] * len(host.members)  # rounds completed with each peer
        self.slot_readers: list[list[tuple[int, int]]] = [[] for _ in range(DEPTH)]
        self._typed_views: dict[np.dtype, list] = {}
        self._reserve = host.fusion_buffer  # the ring of large two-rank allreduces lives in the fusion region
        ring_bytes = min(RING_BYTES, self.layout.fusion_bytes) // self.layout.slot_bytes * self.layout.slot_bytes
        self._ring_depth = ring_bytes // self.layout.slot_bytes if ring_bytes >= RING_MIN_SIZE else 0
        self._ring_views: dict[tuple[int, np.dtype, int], list[np.ndarray]] = {}
        self._ring_cursor = 0
        self.staging = staging

    def close(self) -> None:
        """Drop our typed views of the segments, so that their mappings can go."""
        self._typed_views.clear()
        self._ring_views.clear()

    def _typed(self, dtype: np.dtype) -> list[tuple[list[np.ndarray], np.ndarray]]:
        """Per local rank: its slots and its fusion region as arrays of `dtype` (made once per dtype)."""
        views = self._typed_views.get(dtype)
        if views is None:
            views = self._typed_views[dtype] = [([slot.view(dtype) for slot in seg.slots], seg.fusion.view(dtype))
                                                for seg in self.segments]
        return views

    def _reuse(self, s: int) -> None:
        """Wait until every reader of our slot s's previous contents has finished with it."""
        for q, target in self.slot_readers[s]:
            self._wait(q, CONSUMED, target)

    def _finish(self, gl: Sequence[int], bases: Sequence[int], rounds: Sequence[int]) -> None:
        """Close the collective: every counter of every pair ends at base + rounds."""
        me, counters = self.me, self.mine.counters
        for q, base, count in zip(gl, bases, rounds):
            if q != me and count:
                end = base + count
                counters[STAGED][q] = counters[REDUCED][q] = counters[CONSUMED][q] = end
                self.rounds[q] = end

    # -- the collectives -------------------------------------------------------------------
    def allreduce(self, group: Sequence[int], buf: np.ndarray, op: int, postscale: float = 1.0) -> None:
        """Reduce `buf` in place and multiply by `postscale`: each piece is scaled right after it is
        reduced, while it is in cache, rather than in a pass of its own over the whole buffer."""
        gl, pos = self.group(group)
        if len(gl) == 2 and (buf.nbytes <= SMALL_ALLREDUCE_BYTES or not self._descriptor(buf)):
            self._allreduce_pair(gl, pos, buf, op, postscale)
        elif buf.nbytes <= SMALL_ALLREDUCE_BYTES or buf.size < len(gl):
            self._allreduce_whole(gl, pos, buf, op)
            scale_in_place(buf, postscale)
        else:
            self._sliced(gl, pos, buf, None, even_counts(buf.size, len(gl)), op, postscale)

    def reducescatter(self, group: Sequence[int], buf: np.ndarray, recv: np.ndarray, counts: Sequence[int],
                      op: int) -> None:
        gl, pos = self.group(group)
        if sum(counts) != buf.size:
            raise ValueError(f"segment counts sum to {sum(counts)}, buffer holds {buf.size}")
        self._sliced(gl, pos, buf, recv, counts, op)

    def _allreduce_whole(self, gl: list[int], pos: int, buf: np.ndarray, op: int) -> None:
        """Everyone stages its whole buffer; everyone reduces all of it in member order."""
        me, bases, typed = self.me, [self.rounds[q] for q in gl], self._typed(buf.dtype)
        self._reuse(0)
        own = typed[me][0][0][: buf.size]
        np.copyto(own, buf)
        self.slot_readers[0] = [(q, b + 1) for q, b in zip(gl, bases) if q != me]
        self._publish(STAGED, gl, bases, 1)
        for i, q in enumerate(gl):
            if i == pos:
                src = own
            else:
                self._wait(q, STAGED, bases[i] + 1)
                src = typed[q][0][0][: buf.size]
            if i == 0:
                if pos != 0:
                    np.copyto(buf, src)
            else:
                reduce_into(buf, src, op)
        self._publish(CONSUMED, gl, bases, 1)
        self._finish(gl, bases, [1] * len(gl))

    def _allreduce_pair(self, gl: list[int], pos: int, buf: np.ndarray, op: int, postscale: float) -> None:
        """Two members: each stages its buffer round by round and reduces the other's copy into its
        own. The operations are commutative (a + b and b + a are the same bits), so both end alike;
        it is as much work as slicing for two, with fewer steps. Every small op of a 2-rank job
        comes here, so it writes its own two counters rather than going through `progress`
        (half the time of a 4 KiB op). A large buffer may stage through the ring instead of the
        small slots (`staging`); which one travels with the first round."""
        q = gl[1 - pos]
        base = self.rounds[q]
        pe = self.layout.slot_bytes // buf.itemsize
        total_rounds = math.ceil(buf.size / pe)
        typed = self._typed(buf.dtype)
        mine, theirs, depth = typed[self.me][0], typed[q][0], DEPTH
        counters = self.mine.counters
        staged, consumed = counters[STAGED], counters[CONSUMED]
        ring, readers = self._ring, self.slot_readers
        large = buf.nbytes >= RING_MIN_BYTES
        on_ring = large and self.staging.use_ring()
        start = 0  # the piece round 0 goes to: a ring op goes on where the last one ended
        if on_ring:
            pieces = self._ring_pieces(self.me, buf.dtype, pe, self._ring_depth)
            on_ring = pieces is not None
            if pieces is not None:
                mine, depth, start = pieces, len(pieces), self._ring_cursor
                self._ring_cursor = (start + total_rounds) % depth
        if large:  # before round 0 is staged: the peer reads them then
            self.mine.slot_desc[1], self.mine.slot_desc[2] = (depth if on_ring else 0), start
        staging: list[float] = []  # seconds per byte of each piece staged (a large op's)

        def stage(r: int) -> None:
            if on_ring:
                if r >= depth:  # the peer has read what this piece held, depth rounds ago
                    self._wait(q, CONSUMED, base + r - depth + 1)
            else:
                self._reuse(r % DEPTH)
                readers[r % DEPTH] = [(q, base + r + 1)]
            chunk = buf[r * pe: (r + 1) * pe]
            if large:
                began = time.perf_counter()
                np.copyto(mine[(start + r) % depth][: chunk.size], chunk)
                staging.append((time.perf_counter() - began) / chunk.nbytes)
            else:
                np.copyto(mine[r % DEPTH][: chunk.size], chunk)
            staged[q] = base + r + 1

        stage(0)
        fence()
        ring(_STAGED, gl)
        peer_depth, peer_start = DEPTH, 0
        for r in range(total_rounds):
            if r + 1 < total_rounds:
                stage(r + 1)
            self._wait(q, STAGED, base + r + 1)
            if large and r == 0:
                peer_ring = int(self.segments[q].slot_desc[1])
                if peer_ring:
                    theirs = self._ring_pieces(q, buf.dtype, pe, peer_ring)
                    peer_depth, peer_start = peer_ring, int(self.segments[q].slot_desc[2])
            chunk = buf[r * pe: (r + 1) * pe] if total_rounds > 1 else buf
            reduce_into(chunk, theirs[(peer_start + r) % peer_depth][: chunk.size], op)
            scale_in_place(chunk, postscale)
            consumed[q] = base + r + 1  # its slot r % DEPTH is free again
            fence()
            ring(_STAGED_CONSUMED, gl)
        if on_ring:  # the ring is our fusion region, which the next op may fill: the peer must be done with it
            self._wait(q, CONSUMED, base + total_rounds)
        if large:  # the median piece: a piece that lost the core to another process says nothing
            self.staging.record(on_ring, sorted(staging)[len(staging) // 2])
        counters[REDUCED][q] = self.rounds[q] = base + total_rounds  # as `_finish` leaves a pair

    def _ring_pieces(self, q: int, dtype: np.dtype, pe: int, depth: int) -> list[np.ndarray] | None:
        """Local rank q's ring (its fusion region) as `depth` pieces of `pe` elements; for our own,
        None when the region cannot hold a ring (see `staging`)."""
        key = (q, dtype, depth)
        pieces = self._ring_views.get(key)
        if pieces is None:
            if q == self.me and (depth == 0 or self._reserve(depth * pe * dtype.itemsize) is None):
                return None
            region = self._typed(dtype)[q][1]
            pieces = self._ring_views[key] = [region[i * pe: (i + 1) * pe] for i in range(depth)]
        return pieces

    def _sliced(self, gl: list[int], pos: int, buf: np.ndarray, out: np.ndarray | None, counts: Sequence[int],
                op: int, postscale: float = 1.0) -> None:
        """Reduce `buf` slice by slice: member i reduces slice i (counts[i] elements).

        With `out` None (allreduce) every member then copies the others' reduced slices into `buf`;
        otherwise (reducescatter) our reduced slice goes to `out` and that is all. Each reduced
        piece is multiplied by `postscale` before anyone reads it. Round r stages
        piece r of every slice; our progress (staged, reduced, consumed) goes out once per round.
        """
        n, dtype = len(gl), buf.dtype
        pe = min(PIECE_BYTES, self.layout.slot_bytes // n) // 64 * 64 // dtype.itemsize  # elements a piece
        offs = offsets(counts)
        total_rounds = max(math.ceil(c / pe) for c in counts)
        if total_rounds == 0:
            return
        bases = [self.rounds[q] for q in gl]
        peers = [(i, q) for i, q in enumerate(gl) if i != pos]
        gather = out is None
        desc = self._descriptor(buf)
        typed = self._typed(dtype)
        own_slots = typed[self.me][0]
        peer_desc = [0] * n
        lows = [offs[i] for i in range(n)]
        ends = [offs[i] + counts[i] for i in range(n)]

        def piece(i: int, r: int) -> tuple[int, int]:
            lo = lows[i] + r * pe
            return min(lo, ends[i]), min(lo + pe, ends[i])

        def source(i: int, q: int, owner: int, r: int, lo: int, hi: int) -> np.ndarray:
            """Rank q's piece r of slice `owner` (staged at position `owner`, or in its fusion buffer)."""
            if peer_desc[i]:
                at = (peer_desc[i] - 1) // dtype.itemsize + lo
                return typed[q][1][at: at + hi - lo]
            at = owner * pe
            return typed[q][0][r % DEPTH][at: at + hi - lo]

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            if r == 0:
                self.mine.slot_desc[0] = desc
            if not desc:
                slot = own_slots[r % DEPTH]
                for i in range(n):
                    lo, hi = piece(i, r)
                    if i != pos and hi > lo:
                        np.copyto(slot[i * pe: i * pe + hi - lo], buf[lo:hi])
            self.slot_readers[r % DEPTH] = [(q, bases[i] + r + 1) for i, q in peers]

        def gather_round(r: int) -> None:
            for i, q in peers:
                lo, hi = piece(i, r)
                self._wait(q, REDUCED, bases[i] + r + 1)
                if hi > lo:
                    np.copyto(buf[lo:hi], source(i, q, i, r, lo, hi))

        stage(0)
        staged = total_rounds if desc else 1  # with a descriptor, the whole buffer is readable at once
        consumed = 0
        self._progress(gl, bases, staged, 0, 0)
        for r in range(total_rounds):
            if not desc and r + 1 < total_rounds:
                stage(r + 1)
                staged = r + 2
            lo, hi = piece(pos, r)
            target = buf[lo:hi] if gather else out[lo - offs[pos]: hi - offs[pos]]
            if not gather and hi > lo:
                np.copyto(target, buf[lo:hi])
            for i, q in peers:
                self._wait(q, STAGED, bases[i] + r + 1)
                if r == 0:
                    peer_desc[i] = self.segments[q].slot_desc[0]
                if hi > lo:
                    reduce_into(target, source(i, q, pos, r, lo, hi), op)
            scale_in_place(target, postscale)  # before anyone gathers our reduced piece
            if gather and not desc and hi > lo:
                np.copyto(own_slots[r % DEPTH][pos * pe: pos * pe + hi - lo], target)
            # Consumption is reported a round late; DEPTH >= 3 keeps that from stalling stage().
            self._progress(gl, bases, staged, r + 1 if gather else 0, consumed)
            if not gather:
                consumed = r + 1
            elif r:
                gather_round(r - 1)
                consumed = r
        if gather:
            gather_round(total_rounds - 1)
        self._progress(gl, bases, staged, total_rounds if gather else 0, total_rounds)
        if desc:  # peers read our buffer in place: the caller may change it only once they are done
            for i, q in peers:
                self._wait(q, CONSUMED, bases[i] + total_rounds)
        self._finish(gl, bases, [total_rounds] * n)

    def allgatherv(self, group: Sequence[int], send: np.ndarray, recv: np.ndarray, counts: Sequence[int]) -> None:
        gl, pos = self.group(group)
        pe = self.layout.slot_bytes // recv.itemsize
        offs = offsets(counts)
        if offs[-1] + counts[-1] != recv.size:
            raise ValueError(f"segment counts sum to {sum(counts)}, buffer holds {recv.size}")
        mine = recv[offs[pos]: offs[pos] + counts[pos]]
        if address(mine) != address(send):
            np.copyto(mine, send[: counts[pos]])
        total_rounds = max(math.ceil(c / pe) for c in counts)
        bases = [self.rounds[q] for q in gl]
        peers = [(i, q) for i, q in enumerate(gl) if i != pos]
        typed = self._typed(recv.dtype)

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            chunk = send[r * pe: min((r + 1) * pe, counts[pos])]
            np.copyto(typed[self.me][0][r % DEPTH][: chunk.size], chunk)
            self.slot_readers[r % DEPTH] = [(q, bases[i] + r + 1) for i, q in peers]
            self._publish(STAGED, gl, bases, r + 1)

        if total_rounds:
            stage(0)
        for r in range(total_rounds):
            if r + 1 < total_rounds:
                stage(r + 1)
            for i, q in peers:
                lo, hi = min(r * pe, counts[i]), min((r + 1) * pe, counts[i])
                self._wait(q, STAGED, bases[i] + r + 1)
                np.copyto(recv[offs[i] + lo: offs[i] + hi], typed[q][0][r % DEPTH][: hi - lo])
            self._publish(CONSUMED, gl, bases, r + 1)
        self._finish(gl, bases, [total_rounds] * len(gl))

    def broadcast(self, group: Sequence[int], buf: np.ndarray, root: int) -> None:
        gl, pos = self.group(group)
        pe = self.layout.slot_bytes // buf.itemsize
        total_rounds = math.ceil(buf.size / pe)
        typed = self._typed(buf.dtype)
        bases = [self.rounds[q] for q in gl]
        r_idx = self.index[root]
        r_pos = gl.index(r_idx)
        if self.rank == root:
            readers = [(q, b) for q, b in zip(gl, bases) if q != self.me]
            for r in range(total_rounds):
                chunk = buf[r * pe: (r + 1) * pe]
                self._reuse(r % DEPTH)
                np.copyto(typed[self.me][0][r % DEPTH][: chunk.size], chunk)
                self.slot_readers[r % DEPTH] = [(q, b + r + 1) for q, b in readers]
                self._publish(STAGED, gl, bases, r + 1)
        else:
            for r in range(total_rounds):
                chunk = buf[r * pe: (r + 1) * pe]
                self._wait(r_idx, STAGED, bases[r_pos] + r + 1)
                np.copyto(chunk, typed[r_idx][0][r % DEPTH][: chunk.size])
                self._publish(CONSUMED, (r_idx,), (bases[r_pos],), r + 1)
        self._finish(gl, bases, [total_rounds] * len(gl))

    def alltoallv(self, group: Sequence[int], send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                  recv_counts: Sequence[int]) -> None:
        gl, pos = self.group(group)
        n = len(gl)
        s_offs, r_offs = offsets(send_counts), offsets(recv_counts)
        np.copyto(recv[r_offs[pos]: r_offs[pos] + recv_counts[pos]], send[s_offs[pos]: s_offs[pos] + send_counts[pos]])
        if n == 1:
            return
        # A round's slot holds one piece for each other member, in member order without us.
        pe = self.layout.slot_bytes // (n - 1) // 64 * 64 // recv.itemsize
        # Each pair agrees on its own number of rounds: enough for the larger of its two blocks.
        pair_rounds = [0 if i == pos else math.ceil(max(send_counts[i], recv_counts[i]) / pe) for i in range(n)]
        bases = [self.rounds[q] for q in gl]
        peers = [(i, q) for i, q in enumerate(gl) if i != pos]
        typed = self._typed(recv.dtype)

        def active(r: int) -> list[tuple[int, int]]:
            return [(i, q) for i, q in peers if r < pair_rounds[i]]

        def stage(r: int) -> None:
            self._reuse(r % DEPTH)
            slot = typed[self.me][0][r % DEPTH]
            now = active(r)
            for i, _ in now:
                lo, hi = min(r * pe, send_counts[i]), min((r + 1) * pe, send_counts[i])
                at = (i if i < pos else i - 1) * pe
                np.copyto(slot[at: at + hi - lo], send[s_offs[i] + lo: s_offs[i] + hi])
            self.slot_readers[r % DEPTH] = [(q, bases[i] + r + 1) for i, q in now]
            self._publish(STAGED, [q for _, q in now], [bases[i] for i, _ in now], r + 1)

        total_rounds = max(pair_rounds)
        if total_rounds:
            stage(0)
        for r in range(total_rounds):
            if r + 1 < total_rounds:
                stage(r + 1)
            now = active(r)
            for i, q in now:
                lo, hi = min(r * pe, recv_counts[i]), min((r + 1) * pe, recv_counts[i])
                self._wait(q, STAGED, bases[i] + r + 1)
                at = (pos if pos < i else pos - 1) * pe
                np.copyto(recv[r_offs[i] + lo: r_offs[i] + hi], typed[q][0][r % DEPTH][at: at + hi - lo])
            self._publish(CONSUMED, [q for _, q in now], [bases[i] for i, _ in now], r + 1)
        self._finish(gl, bases, pair_rounds)
