"""Control messages (negotiation) between the ranks of one host, through mailboxes in the segments.

Channel q of a segment carries messages from its owner to local rank q, in two mailboxes used in
turn, so a sender may post the next message while the previous one is being read. A message too
large for a mailbox leaves a marker there and travels over the TCP connection instead.
"""

from __future__ import annotations

from typing import Sequence

from horovod.common.transport.shm.segment import CHANNEL_BYTES, HostSegments
from horovod.common.transport.shm.signals import RECEIVED, SENT, WAITING, Signals, fence
from horovod.common.transport.tcp import TcpTransport

_VIA_TCP = 1 << 63


class Mailbox:
    """exchange / gather / bcast_bytes among local ranks, as the transport interface defines them."""

    def __init__(self, host: HostSegments, signals: Signals, tcp: TcpTransport) -> None:
        self.tcp = tcp
        self.members, self.me, self.rank, self.index = host.members, host.me, host.rank, host.index
        self.segments, self.mine = host.mapped, host.mine
        self.group = host.group
        self._wait, self._ring = signals.wait, signals.ring

    def send(self, q: int, payload: bytes) -> bool:
        """Post a message to local rank q; True when it went over TCP (flush before returning)."""
        sent = self.mine.counters[SENT]
        k = sent[q]
        # Its mailbox k % 2 is free again once it read message k - 2 (looked at here first: a
        # call to wait costs more than the look, which nearly always finds it so).
        if k >= 2 and self.segments[q].counters[RECEIVED][self.me] < k - 1:
            self._wait(q, RECEIVED, k - 1)
        size = len(payload)
        via_tcp = size > CHANNEL_BYTES - 8
        if not via_tcp:
            self.mine.channel_data[q][k % 2][:size] = payload
        self.mine.channel_len[q][k % 2][0] = (_VIA_TCP | size) if via_tcp else size
        sent[q] = k + 1
        fence()
        self._ring((SENT,), (q,))
        if via_tcp:
            self.tcp.peer(self.members[q]).send_frame(payload)
        return via_tcp

    def recv(self, q: int) -> bytes:
        received = self.mine.counters[RECEIVED]
        k = received[q]
        seg = self.segments[q]
        if seg.counters[SENT][self.me] <= k:  # not posted yet (the look first, as in send)
            self._wait(q, SENT, k + 1)
        size = seg.channel_len[self.me][k % 2][0]
        if size & _VIA_TCP:
            payload = self.tcp.peer(self.members[q]).recv_frame()
        else:
            payload = bytes(seg.channel_data[self.me][k % 2][:size])
        received[q] = k + 1
        fence()
        if seg.header[WAITING]:  # only a peer asleep on its full mailbox waits for this (rare)
            self._ring((RECEIVED,), (q,))
        return payload

    def _flush(self, ranks: Sequence[int]) -> None:
        for r in ranks:
            self.tcp.peer(r).flush()

    def exchange(self, group: Sequence[int], payload: bytes) -> list[bytes]:
        # Plain loops: every cycle comes here, and a list comprehension is a call of its own.
        gl, pos = self.group(group)
        flush = []
        for i, q in enumerate(gl):
            if i != pos and self.send(q, payload):
                flush.append(self.members[q])
        result = []
        for i, q in enumerate(gl):
            result.append(payload if i == pos else self.recv(q))
        if flush:
            self._flush(flush)
        return result

    def gather(self, group: Sequence[int], payload: bytes, root: int) -> list[bytes] | None:
        gl, pos = self.group(group)
        if self.rank != root:
            if self.send(self.index[root], payload):
                self._flush([root])
            return None
        return [payload if i == pos else self.recv(q) for i, q in enumerate(gl)]

    def bcast_bytes(self, group: Sequence[int], payload: bytes | None, root: int) -> bytes:
        gl, pos = self.group(group)
        if self.rank != root:
            return self.recv(self.index[root])
        assert payload is not None
        flush = [self.members[q] for i, q in enumerate(gl) if i != pos and self.send(q, payload)]
        self._flush(flush)
        return payload
