"""Tensor fusion planning: which ready allreduces travel together in one buffer.

Pure and deterministic: every member runs it on the same response list and gets the same plan.

On the host, only tensors under `PACK_BELOW_BYTES` are packed. Fusing costs two passes over a
tensor's bytes (into the fusion buffer and back out), which on the host is worth it only while
it is cheaper than a transport call of the tensor's own. On a GPU those passes are device copies
at terabytes per second while every NCCL call costs its latency, so device responses fuse up to
the threshold whatever their size. Measured at 2 ranks, 8 tensors per grouped allreduce
(`benchmarks/fusion_cutoff.py`; docs/engineering-notes.md, "One cycle per step"): packed takes 0.81-0.90x the time
of one by one at 16-64 KiB on shared memory (0.59-0.65x over TCP) and 0.97-1.03x at 256 KiB;
at 1 MiB 1.07-1.10x on shared memory and 1.61-1.74x over TCP, at 4 MiB 1.65x and 1.76-1.85x.
"""

from __future__ import annotations

from horovod.common.engine.messages import OpType, Response
from horovod.common.reduce_ops import DTYPE_SIZES


PACK_BELOW_BYTES = 256 * 1024


def _fusion_key(response: Response) -> tuple:
    return (response.dtype, response.reduce_op, response.prescale, response.postscale, response.on_device)


def plan_fusion(responses: list[Response], threshold_bytes: int) -> list[Response]:
    """Merge allreduces with the same dtype, op and scale factors while they fit the threshold.

    Looks past non-matching responses (e.g. fp16 and fp32 gradients interleaved), keeping the
    first position of each fused group, so execution order stays the same on every rank.
    """
    if threshold_bytes <= 0 or len(responses) == 1:  # a lone response fuses with nothing
        return list(responses)
    planned: list[Response] = []
    used = [False] * len(responses)
    for i, first in enumerate(responses):
        if used[i]:
            continue
        used[i] = True
        if first.op_type != OpType.ALLREDUCE or first.error:
            planned.append(first)
            continue
        itemsize = DTYPE_SIZES[first.dtype]
        total = first.tensor_bytes(itemsize)
        pack_below = threshold_bytes if first.on_device else PACK_BELOW_BYTES
        if total >= threshold_bytes or total >= pack_below:
            planned.append(first)
            continue
        key = _fusion_key(first)
        names, shapes = list(first.names), list(first.shapes)
        for j in range(i + 1, len(responses)):
            other = responses[j]
            if used[j] or other.op_type != OpType.ALLREDUCE or other.error or _fusion_key(other) != key:
                continue
            size = other.tensor_bytes(itemsize)
            if total + size > threshold_bytes or size >= pack_below:
                continue
            used[j] = True
            total += size
            names.extend(other.names)
            shapes.extend(other.shapes)
        if len(names) == len(first.names):  # nothing joined it: it travels as it is, no copy
            planned.append(first)
            continue
        planned.append(Response(OpType.ALLREDUCE, names, first.dtype, shapes, reduce_op=first.reduce_op,
                                prescale=first.prescale, postscale=first.postscale, on_device=first.on_device))
    return planned
