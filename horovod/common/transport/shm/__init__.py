"""Same-host transport: ranks on one machine move data through shared memory.

Every rank owns one segment, a file in /dev/shm that is unlinked as soon as every local peer has
mapped it, so nothing is left behind however the job ends (normal exit, `shutdown()`, a crash,
SIGKILL). A segment holds, in this order:

    control block  counters the owner writes and its peers read (below)
    channels       two mailboxes per peer for control messages (negotiation)
    slots          DEPTH staging slots for the data plane, small enough that data handed from
                   one rank to another stays in the shared cache
    fusion region  the engine's fusion buffer (`fusion_buffer`): peers read tensors packed there
                   in place, so packing is the only copy

Data plane. A collective runs in *rounds*. In round r a rank stages, into its slot r % DEPTH, the
r-th piece of what its peers need, and reads what it needs from theirs, one round behind, so
staging and reading overlap. Allreduce:
- two members: each stages its buffer and reduces the other's staged copy into its own. The
  operations are commutative, so both hold the same bits; this is as much memory traffic as
  slicing, in fewer steps. A large buffer stages either through the slots or through a ring
  larger than the cache in the fusion region, whichever this rank measures faster (`staging`:
  where the host has put the two cores apart, rewriting a slot the peer has just read is slow).
- more members, or a buffer in the fusion region: every member owns one slice; it reduces its
  slice's piece from every peer (reading a fusion-region buffer in place), publishes the result,
  and copies the others' reduced pieces. Work and traffic split evenly.
- up to SMALL_ALLREDUCE_BYTES: everyone stages the whole buffer once and reduces all of it, in
  member order, so every rank computes the same bits with a single synchronisation.

Signalling. Progress is published as monotonic counters, one per ordered pair of ranks and kind.
Both ranks of a pair run the same collectives in the same order and agree on how many rounds each
takes, so no counter needs to say which collective it belongs to. A waiting rank spins briefly
(only when every local rank has a core of its own, and only while recent waits ended within the
spin: `transport.spin`), then sleeps on a datagram socket; a peer that publishes what it sleeps
on rings it. Each local rank runs on its own share of the cores (`placement`): ranks that wake
each other are otherwise pulled onto one core by the kernel and stay there. The TCP mesh stays
up underneath: a peer that dies closes its connections, which wakes every waiter, and
`tcp.DeathWatch` names the rank that failed first.

Ordering relies on stores becoming visible in program order (x86-64 and the fences in
`signals`); each counter is an aligned 8-byte word with a single writer.

Modules: `segment` (layout, mapping, life cycle, the fusion region), `signals` (counters, fences,
bells, waiting), `placement` (core shares), `mailbox` (control messages), `activity` (what the
engine sleeps on: mailboxes, bells, the mesh's sockets), `collectives` (the data plane), `staging`
(slots or ring for a large two-rank allreduce), `transport`
(`ShmTransport`: routes each group to shared memory or TCP).
"""

from __future__ import annotations

from horovod.common.transport.shm.segment import Unavailable, shared_memory_usable
from horovod.common.transport.shm.transport import ShmTransport

__all__ = ["ShmTransport", "Unavailable", "shared_memory_usable"]
