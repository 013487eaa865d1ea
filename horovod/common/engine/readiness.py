"""The fast path's decision: which cached tensors every member of a process set has ready.

Every cycle, each member sends the others one small message per set: its status flags, a bitset
of the cached tensors it has ready (bit i is the response cache's entry i, the same entry on every
rank), and a bitset of cache entries it found stale (same name, other parameters). Every member
then takes the same decision from the same messages, here, with no coordinator trip: the AND of
the ready bits runs at once, a stale bit is erased everywhere and renegotiated, and the slow path
runs only if some member asks for it. A pure function, so every case is unit-tested without ranks.
"""

from __future__ import annotations

from typing import Sequence

# Status flags a member sends with its bitsets.
SHUTDOWN = 1  # this rank is leaving the job (sent in the global set's exchange only)
HAS_UNCACHED = 2  # it has requests for the coordinator: uncached tensors, or a join
JOINED = 4  # it has joined: it submits nothing, so it never holds back a cached tensor
FORCE_SLOW = 8  # it wants the slow path anyway (stalled work the coordinator must see)
FAILED = 16  # with SHUTDOWN: it leaves because of an error (an exception escaped its script)
BLOCKED = 32  # a thread of it is stuck waiting for an op of this set (its names follow the bitsets)


# What every member of a set concludes from the same replies, as a plain tuple (built once per
# set and cycle on the latency path, where a NamedTuple costs five times as much):
#   ready      cache bits every member that has not joined has ready, none stale; ascending
#   stale      cache bits some member found stale: erase them, renegotiate their tensors
#   slow_path  some member has uncached, stale or forced work for the coordinator
#   shut_down  members (global ranks) that announced they are leaving the job
Agreement = tuple[list[int], list[int], bool, list[int]]


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
