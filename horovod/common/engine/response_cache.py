"""The response cache: remembers decisions so steady-state steps skip the coordinator.

Every member puts the same responses in the same order, so caches (and the bit each entry owns)
are identical on all ranks without ever being compared. A cycle then only needs a bitwise AND of
"which cached tensors do I have ready" across ranks.
"""

from __future__ import annotations

from collections import OrderedDict

from horovod.common.engine.messages import Request, Response
from horovod.common.logging import log


class ResponseCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.enabled = capacity > 0  # an attribute, not a property: every cycle reads it
        # name -> (response, this rank's request it answered, bit), in LRU order
        self._entries: OrderedDict[str, tuple[Response, Request | None, int]] = OrderedDict()
        self._by_bit: dict[int, str] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0
        self._warned_eviction = False

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_bits(self) -> int:
        return self._next_bit

    def lookup(self, request: Request) -> tuple[str, int]:
        """('hit', bit), ('invalid', bit) when the name is cached with other parameters, or ('miss', -1)."""
        entry = self._entries.get(request.name)
        if entry is None:
            return "miss", -1
        _response, cached, bit = entry
        # A request that repeats is often the very object cached (`ops.allreduce_async` keeps it);
        # otherwise every field must match: the rank and the name always do.
        return ("hit", bit) if cached is request or cached == request else ("invalid", bit)

    def response_for_bit(self, bit: int) -> Response:
        name = self._by_bit[bit]
        self._entries.move_to_end(name)
        return self._entries[name][0]

    def name_for_bit(self, bit: int) -> str | None:
        return self._by_bit.get(bit)

    def put(self, single: Response, request: Request | None) -> None:
        """Remember a single-tensor response with this rank's own request (None: it had none).

        Every member calls this for the same responses in the same order, so bits agree."""
        if not self.enabled:
            return
        name = single.names[0]
        if name in self._entries:
            _old, _sig, bit = self._entries.pop(name)
        else:
            if len(self._entries) >= self.capacity:
                self._evict_oldest()
            bit = self._free_bits.pop() if self._free_bits else self._take_new_bit()
        self._entries[name] = (single, request, bit)
        self._by_bit[bit] = name

    def _take_new_bit(self) -> int:
        bit = self._next_bit
        self._next_bit += 1
        return bit

    def _evict_oldest(self) -> None:
        name, (_r, _s, bit) = self._entries.popitem(last=False)
        del self._by_bit[bit]
        self._free_bits.append(bit)
        if not self._warned_eviction:
            self._warned_eviction = True
            log.warning(
                "response cache is full (%d entries): evicting %s. A training step that submits more "
                "tensors than that renegotiates every step; raise HOROVOD_CACHE_CAPACITY.",
                self.capacity, name,
            )

    def erase_bit(self, bit: int) -> None:
        name = self._by_bit.pop(bit, None)
        if name is not None:
            del self._entries[name]
            self._free_bits.append(bit)

    def clear(self) -> None:
        """Forget every entry and bit, as a new cache; every member must do it in the same cycle."""
        self._entries.clear()
        self._by_bit.clear()
        self._free_bits.clear()
        self._next_bit = 0
