"""Collective algorithms, each written once over a point-to-point primitive (`PointToPoint`).

`ring` (reduce-scatter + allgather: bandwidth-optimal for large buffers) and `pairwise` (every
member talks to every other directly: one latency, for small buffers and for the collectives
whose data goes from one member straight to another). A transport provides `PointToPoint` over
its own connections and composes these; a new algorithm (Adasum's recursive halving, say) is
written over the same primitive and runs on every such transport.
"""

from horovod.common.algorithms.primitives import PointToPoint, Scratch, segment_bounds

__all__ = ["PointToPoint", "Scratch", "segment_bounds"]
