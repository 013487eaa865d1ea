"""One step's gradients, reduced across ranks: the part every optimizer wrapper shares.

`GradientReducer` holds the options of Horovod's DistributedOptimizer / DistributedGradientTape
(op, predivide factor, gradient groups, process set, compression, local sources) and turns a
list of gradients into reduced gradients. A framework adapter supplies only `transport`: how
its tensors reach `GradientReducer.submit` (a function on numpy arrays) and come back -
directly in eager code, through a graph node or a host callback when traced.

Every gradient of a step is submitted before any is waited on, so the engine negotiates the
step in one round and fuses the small tensors. Op names are `<reducer name>.<i>of<n>`
(position in the gradient list), identical on every rank that runs the same program.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from horovod.common import ops, runtime
from horovod.common.device.buffers import Buffer, DeviceBuffer
from horovod.common.compression import Compressor, NoneCompressor
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average, Sum


def resolve_op(op: int | None, average: bool | None) -> int:
    """`op`, or Horovod's deprecated `average=` flag mapped onto it (default Average)."""
    if average is None:
        return Average if op is None else op
    if op is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them: op= "
                         "(average= is deprecated).")
    warnings.warn("Parameter `average` has been replaced with `op`; pass op=Average or op=Sum instead of "
                  "average=True or False.", DeprecationWarning, stacklevel=3)
    return Average if average else Sum


@dataclass(frozen=True)
class Plan:
    """How the reduced gradients of one step are launched.

    `names[k]` names the k-th tensor; each entry of `groups` lists tensor positions reduced as
    one grouped allreduce (a one-element group is a plain allreduce), named
    `<prefix>.group<first_group + its index>`."""

    names: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    prefix: str
    first_group: int = 0

    def group_name(self, number: int) -> str:
        return f"{self.prefix}.group{self.first_group + number}"

    def parts(self) -> list[tuple[tuple[int, ...], "Plan"]]:
        """Each group as a plan of its own, named as in this one, with its positions here: what
        is submitted separately when each group goes as soon as its gradients exist."""
        return [(group, Plan(tuple(self.names[k] for k in group), (tuple(range(len(group))),), self.prefix,
                             self.first_group + number))
                for number, group in enumerate(self.groups)]

    def restricted(self, keep: Sequence[int]) -> "Plan":
        """The plan for the tensors at positions `keep` only, renumbered 0..len(keep)-1."""
        where = {old: new for new, old in enumerate(keep)}
        groups = tuple(tuple(where[i] for i in g if i in where) for g in self.groups)
        return Plan(tuple(self.names[i] for i in keep), tuple(g for g in groups if g), self.prefix, self.first_group)


class GradientReducer:
    """Validated reduction options plus the set of local sources (variables whose gradients
    stay on this rank)."""

    def __init__(self, name: str, op: int = Average, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, groups: int | Sequence[Sequence[Any]] | None = None,
                 process_set: ProcessSet = global_process_set, compression: type[Compressor] = NoneCompressor,
                 scale_local_gradients: bool = True) -> None:
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average: a factor other than "
                             "1.0 splits the averaging, so it needs op=Average.")
        if num_groups:
            warnings.warn("Parameter `num_groups` has been replaced by `groups`; pass groups= (the same "
                          "number, or lists of parameters).", DeprecationWarning, stacklevel=3)
            groups = num_groups if groups is None else groups
        if groups is not None and not (isinstance(groups, (list, tuple))
                                       or (isinstance(groups, int) and groups >= 0)):
            raise ValueError("groups must be a non-negative integer or a list of lists of variables")
        self.name = name
        self.op = op
        self.prescale = 1.0 / gradient_predivide_factor
        self.postscale = gradient_predivide_factor
        self.groups = groups
        self.process_set = process_set
        self.compression = compression
        self.scale_local_gradients = scale_local_gradients
        self._local: dict[int, Any] = {}

    def register_local_source(self, variable: Any) -> None:
        """Keep `variable`'s gradient on this rank (scaled by 1/size when scale_local_gradients)."""
        self._local[id(variable)] = variable

    def is_local(self, variable: Any) -> bool:
        return variable is not None and id(variable) in self._local

    def set_size(self) -> int:
        self.process_set.require_registered()
        return len(self.process_set.ranks)

    def plan(self, variables: Sequence[Any], positions: Sequence[int], total: int) -> Plan:
        """Names and groups for the gradients of `variables` (at `positions` of a list of `total`)."""
        names = tuple(f"{self.name}.{p}of{total}" for p in positions)
        count = len(variables)
        if not self.groups:
            groups: list[tuple[int, ...]] = [(k,) for k in range(count)]
        elif isinstance(self.groups, int):
            groups = [tuple(chunk) for chunk in np.array_split(np.arange(count), min(self.groups, count))
                      if chunk.size]
        else:
            where = {id(v): k for k, v in enumerate(variables)}
            groups, taken = [], set()
            for group in self.groups:
                members = tuple(where[id(v)] for v in group if id(v) in where and where[id(v)] not in taken)
                taken.update(members)
                if members:
                    groups.append(members)
            groups += [(k,) for k in range(count) if k not in taken]
        return Plan(names, tuple(tuple(int(k) for k in g) for g in groups), self.name)

    def submit(self, arrays: Sequence[Buffer], plan: Plan) -> Callable[[], list[Buffer]]:
        """Submit the allreduces of `arrays` (host or device buffers) as `plan` says; returns the
        function that waits for all of them and returns the reduced buffers in order."""
        pending = []
        for number, group in enumerate(plan.groups):
            members = [arrays[k] if isinstance(arrays[k], DeviceBuffer) else np.asarray(arrays[k], order="C")
                       for k in group]
            if len(group) == 1:
                handle = ops.allreduce_async(members[0], plan.names[group[0]], self.op, self.prescale,
                                             self.postscale, self.process_set)
            else:
                handle = ops.grouped_allreduce_async(members, plan.group_name(number), self.op,
                                                     self.prescale, self.postscale, self.process_set)
            pending.append((group, handle))

        def wait() -> list[Buffer]:
            out: list[Buffer] = [np.empty(0)] * len(arrays)
            for group, handle in pending:
                result = handle.wait()
                for k, array in zip(group, result if len(group) > 1 else [result]):
                    out[k] = array
            return out

        return wait

    def reduce(self, grads: Sequence[Any], variables: Sequence[Any],
               transport: Callable[[list[Any], Plan], list[Any]],
               scale: Callable[[Any, float], Any]) -> list[Any]:
        """Reduced `grads` (grads[i] belongs to variables[i]; None stays None).

        `transport(tensors, plan)` moves the compressed tensors through `submit`;
        `scale(tensor, factor)` multiplies a tensor (for local sources)."""
        out = list(grads)
        size = self.set_size()
        chosen = []
        for i, (grad, var) in enumerate(zip(grads, variables)):
            if grad is None:
                continue
            if self.is_local(var):
                if self.scale_local_gradients and size > 1:
                    out[i] = scale(grad, 1.0 / size)
                continue
            chosen.append(i)
        if not chosen or (size == 1 and not runtime.current().settings.elastic):
            return out
        compressed, contexts = zip(*(self.compression.compress(out[i]) for i in chosen))
        plan = self.plan([variables[i] for i in chosen], chosen, len(grads))
        for i, tensor, ctx in zip(chosen, transport(list(compressed), plan), contexts):
            out[i] = self.compression.decompress(tensor, ctx)
        return out
