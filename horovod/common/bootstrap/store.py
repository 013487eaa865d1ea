"""The bootstrap of a worker whose slot a driver assigns, round by round, through the store.

A driver (the elastic driver, or a test harness) decides who takes part in a round and with which
slot, and publishes that plan with `publish_round`; the store numbers the round. A worker knows
only its own id (`worker_id`: host and local slot, as Horovod's elastic driver names workers):
it waits for the newest round since the one it last took part in, and takes its slot from the plan.
A worker the plan leaves out waits for the next round, except in an elastic job
(`HOROVOD_ELASTIC=1`): there the driver has removed it, and it leaves with `WorkerRemoved`.
This is the base elastic training builds on (`horovod.runner.elastic`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

from horovod.common import wire
from horovod.common.bootstrap.base import Membership, connect_store, reject_comm
from horovod.common.rendezvous import JOINED, ROUNDS, RendezvousClient, RendezvousServer
from horovod.common.rounds import newest_round
from horovod.common.settings import Settings, Topology


class WorkerRemoved(RuntimeError):
    """The elastic driver's newest round leaves this worker out: its host is gone or blacklisted."""


def worker_id(topology: Topology) -> str:
    """The id a driver knows this worker by: `<HOROVOD_HOSTNAME>:<HOROVOD_LOCAL_RANK>`."""
    return f"{topology.hostname}:{topology.local_rank}"


def encode_plan(assignment: Mapping[str, Topology]) -> bytes:
    return wire.encode({worker: dataclasses.astuple(slot) for worker, slot in assignment.items()})


def decode_plan(raw: bytes) -> dict[str, Topology]:
    """The plan `encode_plan` made; WireError for anything else (whoever wrote it to the store)."""
    plan = wire.decode(raw)
    field_types = [type(getattr(Topology(), field.name)) for field in dataclasses.fields(Topology)]
    if not (isinstance(plan, dict) and all(
            isinstance(worker, str) and isinstance(fields, tuple) and len(fields) == len(field_types)
            and all(type(value) is kind for value, kind in zip(fields, field_types))
            for worker, fields in plan.items())):
        raise wire.WireError(f"malformed round plan in the rendezvous store: {plan!r:.200}")
    return {worker: Topology(*fields) for worker, fields in plan.items()}


#: Scope where each worker records the rounds it joined (key `<round>:<worker id>`, empty value):
#: the driver reads it to tell a worker that can still finish from one waiting for a round that a
#: worker which has already finished will never join.
ROUND_MEMBERS = "round_members"


def last_joined_round(server: RendezvousServer, member: str) -> int:
    """Driver side: the newest round that worker `member` joined (0: none yet)."""
    rounds = [int(number) for number, _, who in (key.partition(":") for key in server.keys(ROUND_MEMBERS))
              if who == member]
    return max(rounds, default=0)


def publish_round(server: RendezvousServer, assignment: Mapping[str, Topology]) -> int:
    """Driver side: start a round in which each worker id takes its slot; returns its number."""
    return server.open_round(list(assignment), encode_plan(assignment))


class StoreBootstrap:
    """The slot the newest planned round gives this worker."""

    def join(self, settings: Settings, previous_round: int, comm: Any = None) -> Membership:
        reject_comm(comm, settings.topology.size)
        store = connect_store(settings, "HOROVOD_BOOTSTRAP=store needs the rendezvous store the driver serves",
                              rejoining=previous_round > 0)
        try:
            me = worker_id(settings.topology)
            number, topology = _wait_for_slot(store, me, previous_round, settings.start_timeout,
                                              settings.elastic)
            store.put(JOINED, str(topology.rank), b"")
            store.put(ROUND_MEMBERS, f"{number}:{me}", b"")
        except BaseException:
            store.close()
            raise
        return Membership(topology, store, number)


def _wait_for_slot(store: RendezvousClient, me: str, after: int, timeout: float,
                   removable: bool) -> tuple[int, Topology]:
    """The first round newer than `after` whose plan includes `me`, waiting up to `timeout` seconds;
    `removable`: a round that leaves `me` out raises WorkerRemoved instead."""
    deadline = time.monotonic() + timeout
    while True:
        number = newest_round(store.rounds(), after)
        if number is not None:
            plan = decode_plan(store.get(ROUNDS, str(number), 0.0))
            if me in plan:
                return number, plan[me]
            if removable:
                raise WorkerRemoved(f"worker {me} has been removed from the elastic job: round {number} "
                                    "leaves it out (its host is gone or blacklisted)")
            after = number  # left out of this one: only a later round can take us
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"worker {me} found no round after round {after} that includes it "
                               f"within {timeout:g} s (HOROVOD_START_TIMEOUT; an elastic job's is at least "
                               "HOROVOD_ELASTIC_TIMEOUT)")
        try:
            store.get(ROUNDS, str(after + 1), remaining)  # the store answers as soon as it is published
        except TimeoutError:
            pass  # the loop above says so, naming the worker


#: Scope where the driver says how each planned round changed the workers (key: the round number;
#: value: wire-encoded `HostUpdate` flags: 1 workers removed, 2 added). Rank 0 reads it at commit.
CHANGES = "round_changes"


def publish_change(server: RendezvousServer, number: int, change: int) -> None:
    """Driver side: say how round `number` differs from the one before (read by `newer_rounds`)."""
    server.put(CHANGES, str(number), wire.encode(int(change)))


def newer_rounds(store: RendezvousClient, after: int) -> tuple[int, int] | None:
    """(the newest planned round after `after`, the OR of how the rounds since changed the workers),
    or None when the driver has planned nothing since."""
    numbers = [number for number in store.rounds() if number > after]
    if not numbers:
        return None
    change = 0
    for number in numbers:
        try:
            flags = wire.decode(store.get(CHANGES, str(number), 1.0))
        except TimeoutError:
            continue  # a round planned by something other than the elastic driver: no flags
        if type(flags) is not int:
            raise wire.WireError(f"malformed change of round {number} in the rendezvous store: {flags!r:.80}")
        change |= flags
    return max(numbers), change
