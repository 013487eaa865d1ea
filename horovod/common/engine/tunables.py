"""The engine's knobs that may change while the job runs (autotune changes them).

Settings are read once and frozen; these start from them and are what the cycle, the driver and
the transport consult each time. A change is applied by every rank at the same cycle (the
autotuner broadcasts it), so all ranks always fuse and time their cycles alike.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from horovod.common.settings import Settings
from horovod.common.transport.base import Transport


@dataclass
class Tunables:
    fusion_threshold: int  # bytes
    cycle_time_ms: float
    cache_enabled: bool
    hierarchical_allreduce: bool | None  # None: the transport decides
    hierarchical_allgather: bool | None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Tunables":
        return cls(settings.fusion_threshold, settings.cycle_time_ms, settings.cache_capacity > 0,
                   settings.hierarchical_allreduce, settings.hierarchical_allgather)

    def to_wire(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def from_wire(cls, payload: bytes) -> "Tunables":
        return cls(**json.loads(payload))

    def apply_to(self, transport: Transport) -> None:
        """Hand the transport the knobs it owns (those it lists in `tunable_knobs`)."""
        for knob in transport.tunable_knobs:
            setattr(transport, knob, getattr(self, knob))
