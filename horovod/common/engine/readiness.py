"""The fast path's decision: which cached tensors every member of a process set has ready.

Every cycle, each member sends the others one small message per set: its status flags, a bitset
of the cached tensors it has ready (bit i is the response cache's entry i, the same entry on every
rank), and a bitset of cache entries it found stale (same name, other parameters). Every member
then takes the same decision from the same messages, here, with no coordinator trip: the AND of
the ready bits runs at once, a stale bit is erased everywhere and renegotiated, and the slow path
runs only if some member asks for it. A pure function, so every case is unit-tested without ranks;
the message's compact wire form (`encode_status`, `decode_status`) lives here too.
"""

from __future__ import annotations

import struct
from typing import Sequence

from horovod.common import wire

# Status flags a member sends with its bitsets.
SHUTDOWN = 1  # this rank is leaving the job (sent in the global set's exchange only)
HAS_UNCACHED = 2  # it has requests for the coordinator: uncached tensors, or a join
JOINED = 4  # it has joined: it submits nothing, so it never holds back a cached tensor
FORCE_SLOW = 8  # it wants the slow path anyway (stalled work the coordinator must see)
FAILED = 16  # with SHUTDOWN: it leaves because of an error (an exception escaped its script)
BLOCKED = 32  # a thread of it is stuck waiting for an op of this set (its names follow the bitsets)
EAGER = 64  # its one ready tensor, a small allreduce, follows the bitsets (see `Cycle`): if every
           # member sends the same status so, each reduces the contributions itself


# What every member of a set concludes from the same replies, as a plain tuple (built once per
# set and cycle on the latency path, where a NamedTuple costs five times as much):
#   ready      cache bits every member that has not joined has ready, none stale; ascending
#   stale      cache bits some member found stale: erase them, renegotiate their tensors
#   slow_path  some member has uncached, stale or forced work for the coordinator
#   shut_down  members (global ranks) that announced they are leaving the job
Agreement = tuple[list[int], list[int], bool, list[int]]


# A status on the wire: flags, the byte lengths of the ready and the stale bitsets, the bitsets
# (little-endian), then what the member waits for (`wire.encode`d) when it says BLOCKED, or its
# contribution's bytes when it says EAGER. Not a pickle: every cycle decodes one per peer, and
# unpickling costs a microsecond.
_STATUS = struct.Struct("<BII")


def encode_status(flags: int, ready: int, stale: int, waits: list[str]) -> bytes:
    """One member's status message for this cycle (see `decode_status`)."""
    ready_bytes = ready.to_bytes((ready.bit_length() + 7) // 8, "little")
    stale_bytes = stale.to_bytes((stale.bit_length() + 7) // 8, "little")
    status = _STATUS.pack(flags, len(ready_bytes), len(stale_bytes)) + ready_bytes + stale_bytes
    return status + wire.encode(waits) if waits else status


def decode_status(data: bytes) -> tuple[int, int, int, list[str]]:
    """(flags, ready bits, stale bits, waits) from a peer's `encode_status`; WireError if malformed."""
    try:
        flags, ready_len, stale_len = _STATUS.unpack_from(data)
    except struct.error:
        raise wire.WireError(f"malformed status message ({len(data)} bytes)") from None
    start = _STATUS.size + ready_len
    end = start + stale_len
    if end > len(data):
        raise wire.WireError(f"malformed status message ({len(data)} bytes, bitsets of {ready_len} + {stale_len})")
    ready = int.from_bytes(data[_STATUS.size:start], "little")
    stale = int.from_bytes(data[start:end], "little")
    waits = wire.decode(data[end:]) if end < len(data) and not flags & EAGER else ()
    if not isinstance(waits, tuple) or not all(isinstance(name, str) for name in waits):
        raise wire.WireError("malformed status message: its waits are not a list of names")
    return flags, ready, stale, list(waits)


def agree(members: Sequence[int], replies: Sequence[tuple], num_bits: int) -> Agreement:
    """Decide the cycle from every member's (flags, ready bits, stale bits[, what it waits for]),
    in `members` order: (ready, stale, slow_path, shut_down), see `Agreement`.

    `num_bits` is the size of the response cache's bit space: when every member has joined, no
    cached tensor is ready (nobody submits); otherwise a bit is ready when every member that has
    not joined set it, and nobody found it stale. One plain loop: this runs every cycle.
    """
    common = (1 << num_bits) - 1
    everyone_joined = True
    any_stale = any_flags = 0
    shut_down: list[int] = []
    for member, reply in zip(members, replies):
        flags = reply[0]
        if not flags & JOINED:  # joined ranks submit nothing: only the others decide
            common &= reply[1]
            everyone_joined = False
        any_stale |= reply[2]
        any_flags |= flags
        if flags & SHUTDOWN:
            shut_down.append(member)
    if everyone_joined:
        common = 0
    if not any_stale:
        return bits(common), [], bool(any_flags & (HAS_UNCACHED | FORCE_SLOW)), shut_down
    return bits(common & ~any_stale), bits(any_stale), True, shut_down


def bits(value: int) -> list[int]:
    """Indices of the set bits of `value`, ascending."""
    found = []
    while value:
        low = value & -value
        found.append(low.bit_length() - 1)
        value ^= low
    return found
