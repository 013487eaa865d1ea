"""How a length splits among the members of a group: the one rule every layer shares.

Reducescatter hands member i the i-th block of dim 0, the shared-memory and ring algorithms cut a
buffer into per-member slices, and the adapters compute the shape of a member's output: all of them
use the same split, so it is stated once here. The first `total % parts` members get one extra
element (Horovod's rule for uneven reducescatter).
"""

from __future__ import annotations

from typing import Sequence


def even_counts(total: int, parts: int) -> list[int]:
    """`total` split into `parts` counts that differ by at most one, larger ones first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def block_size(total: int, parts: int, member: int) -> int:
    """Member `member`'s count in `even_counts(total, parts)`, without building the list."""
    return total // parts + (member < total % parts)


def offsets(counts: Sequence[int]) -> list[int]:
    """Where each block starts when blocks of `counts` are laid end to end."""
    out, acc = [], 0
    for count in counts:
        out.append(acc)
        acc += int(count)
    return out
