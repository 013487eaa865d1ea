"""The coordinator's side of negotiation (rank 0 of each process set).

It collects every member's uncached requests, decides when a tensor is ready (all members that
have not joined submitted it), and checks that the submissions agree. A disagreement becomes an
ERROR response that names the op, the tensor, which ranks sent what, and what to do; every
member raises it, and the job goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from horovod.common.engine.messages import OpType, Request, Response
from horovod.common.reduce_ops import OP_NAMES

if TYPE_CHECKING:
    from horovod.common.timeline import Timeline


def _describe(values_by_rank: dict[int, object]) -> str:
    """'rank 0 sent float32; ranks [1, 2] sent int32' — grouped so big jobs stay readable."""
    groups: dict[str, list[int]] = {}
    for rank, value in sorted(values_by_rank.items()):
        groups.setdefault(str(value), []).append(rank)
    parts = []
    for value, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        parts.append(f"{who}: {value}")
    return "; ".join(parts)


def _shape_str(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def validate(name: str, requests: dict[int, Request], members: tuple[int, ...], joined: Iterable[int]) -> str:
    """The error message for inconsistent submissions of one tensor, or '' when they agree."""
    reqs = dict(sorted(requests.items()))
    first = next(iter(reqs.values()))
    op_name = OpType(first.op_type).name
    signature = first.signature()
    alike = all(req.signature() == signature for req in reqs.values())  # the usual case: nothing differs

    def differ(what: str, get: Callable[[Request], object], advice: str) -> str:
        if alike:
            return ""
        values = {rank: get(req) for rank, req in reqs.items()}
        if len(set(map(str, values.values()))) > 1:
            return f"{op_name} {name}: {what} ({_describe(values)}). {advice}"
        return ""

    message = differ("mismatched operations", lambda r: OpType(r.op_type).name,
                     "Every rank must call the same collective for the same tensor name.")
    if message:
        return message
    message = differ("mismatched data types", lambda r: r.dtype, "Cast the tensor to the same dtype on every rank.")
    if message:
        return message
    message = differ("mismatched CPU/GPU device selection", lambda r: "GPU" if r.device >= 0 else "CPU",
                     "Every rank must pass the tensor in the same kind of memory (all on CPU, or all on GPU).")
    if message:
        return message
    joined = sorted(joined)
    if joined and first.op_type != OpType.ALLREDUCE:
        return (f"{op_name} {name}: not supported while ranks {joined} have called join(); only allreduce "
                "can run with joined ranks. Call join() after the last collective of this kind.")
    if first.op_type in (OpType.ALLREDUCE, OpType.BROADCAST, OpType.REDUCESCATTER, OpType.ADD_PROCESS_SET):
        message = differ(f"mismatched {op_name} tensor shapes", lambda r: _shape_str(r.shape),
                         "Every rank must pass a tensor of the same shape.")
    if not message and first.op_type in (OpType.ALLREDUCE, OpType.REDUCESCATTER):
        message = (differ("mismatched reduction operations", lambda r: OP_NAMES.get(r.reduce_op, r.reduce_op),
                          "Pass the same op= on every rank.")
                   or differ("mismatched prescale and/or postscale factors", lambda r: (r.prescale, r.postscale),
                             "Pass the same prescale_factor/postscale_factor on every rank."))
    if not message and first.op_type == OpType.BROADCAST:
        message = differ("mismatched root ranks", lambda r: r.root_rank, "Pass the same root_rank on every rank.")
    if not message and first.op_type in (OpType.ALLGATHER, OpType.ALLTOALL):
        message = differ("mismatched number of dimensions", lambda r: len(r.shape),
                         "Tensors may differ only in their first dimension.")
        if not message:
            if len(first.shape) == 0:
                return (f"{op_name} {name}: tensors have rank zero; {op_name.lower()} concatenates along "
                        "the first dimension, so reshape scalars to shape [1].")
            message = differ("mismatched trailing dimensions (all but the first)", lambda r: _shape_str(r.shape[1:]),
                             "Tensors may differ only in their first dimension.")
    return message


@dataclass
class _Pending:
    first_seen: float
    requests: dict[int, Request] = field(default_factory=dict)


class Coordinator:
    """Message table of one process set, kept on its coordinator rank."""

    def __init__(self, members: tuple[int, ...], timeline: Timeline | None = None) -> None:
        self.members = members
        self.table: dict[str, _Pending] = {}
        self.joined: list[int] = []
        self.timeline = timeline

    def add(self, requests: list[Request], now: float | None = None) -> list[str]:
        """Record one member's requests; returns names that became ready, in order."""
        now = time.monotonic() if now is None else now
        ready = []
        for req in requests:
            if req.op_type == OpType.JOIN:
                if req.rank not in self.joined:
                    self.joined.append(req.rank)
                continue
            pending = self.table.get(req.name)
            if pending is None:
                pending = self.table[req.name] = _Pending(now)
                if self.timeline is not None:
                    self.timeline.negotiate_start(req.name, OpType(req.op_type).name)
            pending.requests[req.rank] = req
            if self.timeline is not None:
                self.timeline.negotiate_rank_ready(req.name, req.rank)
            if self._is_ready(pending):
                ready.append(req.name)
        return ready

    def _is_ready(self, pending: _Pending) -> bool:
        submitted = set(pending.requests) | set(self.joined)
        return submitted.issuperset(self.members)

    def ready_after_joins(self) -> list[str]:
        """Tensors that became ready because ranks joined (they submit nothing more)."""
        return [name for name, pending in self.table.items() if self.joined and self._is_ready(pending)]

    def build_responses(self, ready: list[str]) -> list[Response]:
        """Turn ready names into responses (or ERROR responses); append JOIN once all joined."""
        responses = []
        seen = set()
        for name in ready:
            if name in seen or name not in self.table:
                continue
            seen.add(name)
            pending = self.table.pop(name)
            if self.timeline is not None:
                self.timeline.negotiate_end(name)
            responses.append(self._response(name, pending.requests))
        if self.joined and set(self.joined).issuperset(self.members):
            responses.append(Response(OpType.JOIN, ["join.noname"], last_joined_rank=self.joined[-1]))
            self.joined = []
        return responses

    def _response(self, name: str, requests: dict[int, Request]) -> Response:
        error = validate(name, requests, self.members, self.joined)
        if error:
            return Response(OpType.ERROR, [name], error=error)
        first = requests[min(requests)]
        op = first.op_type
        response = Response(op, [name], first.dtype, [first.shape], root_rank=first.root_rank,
                            reduce_op=first.reduce_op, prescale=first.prescale, postscale=first.postscale,
                            on_device=int(first.device >= 0))
        if op == OpType.ALLGATHER:
            response.first_dims = [[requests[m].shape[0] for m in self.members]]
        elif op == OpType.ALLTOALL:
            response.splits = [list(requests[m].splits) for m in self.members]
        elif op in (OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
            response.process_set_ranks = first.shape
        return response

    def stalled(self, now: float, older_than: float) -> dict[str, list[int]]:
        """Tensors waiting longer than `older_than` seconds -> the ranks that have not submitted."""
        result = {}
        for name, pending in self.table.items():
            if now - pending.first_seen >= older_than:
                missing = [m for m in self.members if m not in pending.requests and m not in self.joined]
                result[name] = missing
        return result


def stall_message(stalled: dict[str, list[int]], waited: float, shutting_down: bool) -> str:
    """Per missing rank, the tensors it has not submitted (at most 5 names each)."""
    by_rank: dict[int, list[str]] = {}
    for name, missing in stalled.items():
        for rank in missing:
            by_rank.setdefault(rank, []).append(name)
    lines = []
    for rank in sorted(by_rank):
        names = by_rank[rank]
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        lines.append(f"  {rank}: [{shown}]")
    verdict = ("Shutting down (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS exceeded)." if shutting_down else
               "If this persists, ranks are running different code paths (a collective inside a "
               "rank-dependent branch, or unequal numbers of batches: use hvd.join()).")
    return (f"Stall: some ranks submitted tensors more than {waited:.0f} s ago that other ranks have not "
            f"submitted yet. Missing ranks:\n" + "\n".join(lines) + f"\n{verdict}")


def deadlock_message(set_id: int, waits: dict[int, list[str]]) -> str:
    """Why every member of a set raises at once: each one's waits, and the usual causes."""
    lines = [f"  rank {rank} waits for {', '.join(names)}" for rank, names in sorted(waits.items())]
    where = "the global process set" if set_id == 0 else f"process set {set_id}"
    return (f"Deadlock in {where}: every rank is blocked waiting for a collective that another rank has "
            "not submitted, and none can submit it while it waits:\n" + "\n".join(lines) + "\n"
            "Every rank must call the same collectives in the same order. Usually one rank took another "
            "branch or raised an exception part-way; look at its output.")
