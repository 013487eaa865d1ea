"""Gradients averaged across ranks for MXNet: `DistributedOptimizer` (an `mx.optimizer`) and
`DistributedTrainer` (a Gluon `Trainer`).

Both reduce through `horovod.common.gradients.GradientReducer` (names, groups, predivide factor,
compression, all of a step's gradients submitted before any is waited on) and write the
averages back into the gradient NDArrays before the wrapped update runs.
"""

from __future__ import annotations

from typing import Any, Sequence

import mxnet as mx

from horovod.common import ops
from horovod.common.gradients import GradientReducer, Plan
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average
from horovod.mxnet._bridge import host_array, to_ndarray
from horovod.mxnet.compression import Compression, Compressor

__all__ = ["DistributedOptimizer", "DistributedTrainer"]


def _transport(reducer: GradientReducer, tensors: list[Any], plan: Plan) -> list[Any]:
    arrays = [host_array(t, f"gradient {name}") for t, name in zip(tensors, plan.names)]
    wait = ops.submit_waited(reducer.submit, arrays, plan)
    return [to_ndarray(a, t) for a, t in zip(wait(), tensors)]


def reduce_in_place(reducer: GradientReducer, grads: Sequence[Any], keys: Sequence[Any]) -> None:
    """Overwrite every gradient NDArray with its reduction across ranks (one request)."""
    reduced = reducer.reduce(list(grads), list(keys), lambda ts, plan: _transport(reducer, ts, plan),
                             lambda g, factor: g * factor)
    for grad, value in zip(grads, reduced):
        if value is not grad:
            grad[:] = value


class DistributedOptimizer(mx.optimizer.Optimizer):
    """`optimizer` whose `update` first averages the gradients across ranks.

    Everything else (learning rate, states, multi-precision) is the wrapped optimizer's."""

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: ProcessSet = global_process_set) -> None:
        # No Optimizer.__init__: every attribute not set here is the wrapped optimizer's.
        self._optimizer = optimizer
        self._reducer = GradientReducer("DistributedOptimizer", Average, gradient_predivide_factor,
                                        groups=num_groups or None, process_set=process_set)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Gluon's Trainer sets rescale_grad and param_dict on its optimizer every step: they
        # belong to the wrapped one.
        if name in ("_optimizer", "_reducer"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._optimizer, name, value)

    def create_state(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index: Any, weight: Any) -> Any:
        return self._optimizer.create_state_multi_precision(index, weight)

    def _reduce(self, index: Any, grad: Any) -> None:
        grads, keys = (list(grad), list(index)) if isinstance(index, (list, tuple)) else ([grad], [index])
        reduce_in_place(self._reducer, grads, keys)

    def update(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._reduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index: Any, weight: Any, grad: Any, state: Any) -> None:
        self._reduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr: float) -> None:
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult: dict) -> None:
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult: dict) -> None:
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A Gluon `Trainer` that averages the gradients of every step across ranks (no kvstore).

    `trainer.step(batch_size)` with this rank's batch size gives the same update as one process
    stepping on the union of every rank's batch."""

    def __init__(self, params: Any, optimizer: Any, optimizer_params: dict | None = None,
                 compression: type[Compressor] = Compression.none, gradient_predivide_factor: float = 1.0,
                 prefix: str | None = None, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set) -> None:
        if isinstance(optimizer, DistributedOptimizer):
            raise ValueError("DistributedTrainer reduces the gradients itself: pass the plain optimizer, "
                             "not a DistributedOptimizer")
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._hvd_reducer = GradientReducer(prefix or "DistributedTrainer", Average, gradient_predivide_factor,
                                            groups=num_groups or None, process_set=process_set,
                                            compression=compression)

    def _allreduce_grads(self) -> None:
        params = [p for p in self._params if p.grad_req != "null"]
        reduce_in_place(self._hvd_reducer, [p.list_grad()[0] for p in params], params)
        for param in params:  # other devices of this rank take the first one's average
            first, *others = param.list_grad()
            for grad in others:
                first.copyto(grad)
