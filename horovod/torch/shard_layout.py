"""Where a sharded optimizer cuts its parameters, and how a shard's state is rebuilt from pieces.

Each param group is seen as one flat vector (its trainable parameters, flattened, in order),
padded to a multiple of the member count and cut into equal blocks: member k owns
`[k * shard, (k + 1) * shard)`. Positions in that flat vector do not depend on the member
count, so state saved under one layout (`Piece`: a range of the flat vector and the state of
every element in it) can be reassembled under any other: this is what lets an elastic job move
the shards when members leave or join, and what turns per-shard state into a whole state_dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class ShardLayout:
    """The cut of every group's flat vector for `size` members, seen from member `rank`."""

    totals: tuple[int, ...]  # elements of each group's flat vector (unpadded)
    size: int
    rank: int  # position within the process set

    def shard(self, group: int) -> int:
        """Elements per member (the padded block length) of `group`."""
        return -(-self.totals[group] // self.size)

    def bounds(self, group: int, rank: int | None = None) -> tuple[int, int]:
        """The real (unpadded) range `[start, end)` of the flat vector owned by `rank`; empty
        (start == end) for a member whose whole block is padding."""
        rank = self.rank if rank is None else rank
        start = min(rank * self.shard(group), self.totals[group])
        return start, min(start + self.shard(group), self.totals[group])


@dataclass
class Piece:
    """The optimizer state of `[start, end)` of group `group`'s flat vector: `elements` holds the
    per-element tensors (one value per position, e.g. Adam's moments), `scalars` the rest (e.g.
    Adam's step count), the same for every position."""

    group: int
    start: int
    end: int
    elements: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, object] = field(default_factory=dict)


def split_state(state: dict[str, object], length: int) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """A shard's state split into per-element tensors (1-D, `length` long) and scalars."""
    elements = {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and tuple(v.shape) == (length,)}
    return elements, {k: v for k, v in state.items() if k not in elements}


def assemble(pieces: list[Piece], group: int, start: int, end: int, length: int) -> dict[str, object]:
    """The state of `[start, end)` of `group`, padded to `length` elements, from `pieces` (which
    may overlap and come in any order). Empty when no piece has state (no step taken yet).
    Raises RuntimeError naming the positions no piece covers."""
    relevant = [p for p in pieces if p.group == group and (p.elements or p.scalars)]
    if not relevant:
        return {}
    template = relevant[0]
    state: dict[str, object] = dict(template.scalars)
    covered = torch.zeros(max(end - start, 0), dtype=torch.bool)
    for key, sample in template.elements.items():
        state[key] = torch.zeros(length, dtype=sample.dtype, device=sample.device)
    for piece in relevant:
        lo, hi = max(piece.start, start), min(piece.end, end)
        if lo >= hi:
            continue
        covered[lo - start:hi - start] = True
        for key, values in piece.elements.items():
            state[key][lo - start:hi - start] = values[lo - piece.start:hi - piece.start]  # type: ignore[index]
    if not bool(covered.all()):
        missing = (~covered).nonzero().flatten() + start
        raise RuntimeError(
            f"optimizer state of positions {int(missing[0])}..{int(missing[-1])} of param group {group} is on no "
            "remaining rank: the ranks that held it and its copy all left before the next commit. Restart from a "
            "checkpoint")
    return state
