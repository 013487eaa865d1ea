"""DistributedOptimizer(op=Adasum): the delta optimizer Horovod uses for torch.

Adasum is applied to what the optimizer *does*, not to the gradients: every rank runs the wrapped
optimizer's step on its own gradients, the change of each parameter (delta = new - old) is
Adasum-combined across ranks, and every rank sets the parameter to old + combined delta. So
momentum, Adam's moments and the learning rate act on local gradients, and the adaptive
combination sees the updates the optimizer really wants to make (Maleki et al., MLSys 2021).

Per step, all deltas go out as one grouped allreduce (they fuse; each tensor keeps its own Adasum
coefficients). Gradients accumulate locally over backward passes until `step()`, so
`backward_passes_per_step` needs no bookkeeping here.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Adasum
from horovod.torch._bridge import start
from horovod.torch.compression import Compression, Compressor

__all__ = ["DistributedAdasumOptimizer"]


class DistributedAdasumOptimizer:
    """Wraps `optimizer` (its state, param_groups and class are the wrapped one's)."""

    __class__ = property(lambda self: self._optimizer.__class__)  # type: ignore[assignment]

    def __init__(self, optimizer: torch.optim.Optimizer, compression: type[Compressor] = Compression.none,
                 process_set: ProcessSet = global_process_set,
                 parameter_names: dict[torch.Tensor, str] | None = None) -> None:
        self._optimizer = optimizer
        self._compression = compression
        self._process_set = process_set
        self._parameter_names = parameter_names or {}  # Horovod's attribute (the deltas travel as one group)

    def __getattr__(self, name: str) -> Any:
        if name == "_optimizer":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"DistributedOptimizer(op=Adasum, {self._optimizer!r})"

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._optimizer.param_groups

    @property
    def state(self) -> Any:
        return self._optimizer.state

    def synchronize(self) -> None:
        """Nothing to wait for: the deltas are reduced inside `step()`."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Local step, then every parameter = its value before + the Adasum of all ranks' deltas."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for group in self._optimizer.param_groups for p in group["params"] if p.requires_grad]
        before = [p.detach().clone() for p in params]
        self._optimizer.step()
        deltas, contexts = [], []
        for p, old in zip(params, before):
            sent, ctx = self._compression.compress(p.detach() - old)
            deltas.append(sent.contiguous())
            contexts.append(ctx)
        if deltas:
            start("allreduce", deltas, grouped=True, inplace=True, op=Adasum, process_set=self._process_set,
                  name="DistributedAdasumOptimizer").wait()
        for p, old, sent, ctx in zip(params, before, deltas, contexts):
            p.copy_(old.add_(self._compression.decompress(sent, ctx)))
        return loss
