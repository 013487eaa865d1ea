"""The one process-wide runtime object: what `init()` built for the current round of the job.

`horovod.common.basics` builds it (`init()`) and tears it down (`shutdown()`); collectives and
queries reach it through `current()`. It is the only global state of the library. The number of
the last round this process took part in outlives the runtime: the next `init()` hands it to the
bootstrap, so a survivor that re-initialises never lands in a round that is over.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from horovod.common.engine.engine import Engine
from horovod.common.engine.handles import Entry, Handle
from horovod.common.engine.messages import OpType, Request
from horovod.common.rendezvous import RendezvousClient
from horovod.common.settings import Settings
from horovod.common.transport.base import Transport

if TYPE_CHECKING:
    from horovod.common.process_sets import ProcessSet
    from horovod.common.timeline import Timeline

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclass
class Runtime:
    settings: Settings  # its topology is this round's slot, as the bootstrap assigned it
    round: int
    transport: Transport
    engine: Engine
    rendezvous: RendezvousClient | None
    timeline: Timeline | None
    process_sets: dict[int, ProcessSet] = field(default_factory=dict)
    name_counters: dict[int, int] = field(default_factory=dict)
    # The Request of each named host allreduce, with what it was built from (see `ops.allreduce_async`).
    allreduce_requests: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # The CUDA device this rank's device collectives run on: its first device tensor's (-1: none yet).
    device: int = -1
    # The members of the global process set: every rank of the round, built once per round.
    global_ranks: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.global_ranks = list(range(self.settings.topology.size))

    def next_anonymous_id(self, process_set: ProcessSet) -> int:
        """Unnamed ops are numbered per process set: members submit the same sequence of ops in
        a set, whatever else they do, so their generated names agree."""
        key = process_set.process_set_id if process_set.process_set_id is not None else -1
        self.name_counters[key] = self.name_counters.get(key, 0) + 1
        return self.name_counters[key]

    def use_device(self, device: int, what: str) -> None:
        """Device collectives of a rank run on one device, the one its first device tensor is on
        (the one its script pinned, as in Horovod); a tensor on another is refused here."""
        if self.device < 0:
            self.device = device
        elif device != self.device:
            raise ValueError(
                f"{what}: the tensor is on CUDA device {device}, but this rank's collectives run on device "
                f"{self.device} (where its first GPU tensor was); keep every tensor of a rank on one device, "
                "e.g. torch.cuda.set_device(hvd.local_rank()) before creating them")

    def set_id(self, process_set: ProcessSet) -> int:
        """The id under which this rank submits to `process_set`: ValueError unless the set is
        registered and this rank is one of its members (checked once per call, here)."""
        set_id = process_set.process_set_id
        if set_id == 0:  # the global set: every rank is a member
            return 0
        process_set.require_registered()
        if self.settings.topology.rank not in process_set.ranks:
            raise ValueError(
                f"rank {self.settings.topology.rank} is not a member of {process_set}; only its members "
                "may submit collectives on it"
            )
        return set_id  # type: ignore[return-value]

    def negotiate(self, op_type: OpType, name: str, shape: tuple[int, ...], root: int) -> Any:
        """Agree with every rank on a change to the process sets; the engine's answer."""
        handle = Handle(1, False, name)
        request = Request(self.settings.topology.rank, op_type, name, shape=shape, root_rank=root)
        self.engine.enqueue(0, [Entry(request, None, None, handle)])
        return handle.wait()


#: Held while `init()` or `shutdown()` changes the runtime.
lock = threading.RLock()
_current: Runtime | None = None
_last_round = 0


def current() -> Runtime:
    """The runtime of the current round; ValueError when `init()` has not run."""
    rt = _current
    if rt is None:
        raise ValueError(NOT_INITIALIZED)
    return rt


def peek() -> Runtime | None:
    """The runtime, or None outside `init()` ... `shutdown()`."""
    return _current


def last_round() -> int:
    """The last round this process took part in (0: none yet)."""
    return _last_round


def record_round(number: int) -> None:
    """This process joined round `number` (even if its `init()` then fails: that round is spent)."""
    global _last_round
    _last_round = number


def install(rt: Runtime) -> None:
    global _current
    _current = rt


def uninstall() -> Runtime | None:
    """Forget the runtime (the caller stops it); returns it, None if there was none."""
    global _current
    rt, _current = _current, None
    return rt
