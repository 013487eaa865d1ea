"""DistributedOptimizer: average gradients across ranks while backward is still running.

How it works. A hook on every parameter (`register_post_accumulate_grad_hook`) fires as soon as
backward has accumulated that parameter's gradient and starts its allreduce right away, so
communication overlaps the rest of backward. `step()` (through `synchronize()`) waits for the
allreduces, writes the averaged gradients back, and runs the wrapped optimizer's own step.

Wrapping, not copying. `DistributedOptimizer(opt)` returns a thin wrapper around *your*
optimizer object: `state`, `param_groups` and `defaults` are `opt`'s own, anything not
defined here is looked up on `opt`, and `isinstance(wrapper, type(opt))` is true because the
wrapper reports `opt`'s class as its `__class__`. No class is created at run time, the wrapped
optimizer's `step` runs exactly once per step (its hooks once too), and an LR scheduler or
checkpoint made for `opt` before wrapping keeps working. `type(wrapper)` is a subclass of
`_DistributedOptimizer` named after `opt`'s class (`type(wrapper).__name__ == "SGD"`, as with
Horovod, whose wrapper subclasses the user's class), made once per optimizer class.

Where a rank has less than two cores of its own (`cores_per_rank`: e.g. 2 ranks on a 2-core
machine), overlapping gains nothing: reducing is memory copies and sums that take the same core
from backward, and each allreduce then needs the peer's engine thread to get its core at the
same moment, so it waits on the scheduler. There the hooks only mark the gradients ready and
the end of backward submits them all at once from the thread that then drives the reduction
itself (measured in docs/engineering-notes.md). The sums are the same; only when they run changes.
Gradients on a GPU always overlap: their allreduce is queued on NCCL's stream as each bucket
fills, as DDP's buckets are, and `step()` waits on its events, not on the host.
`HOROVOD_TORCH_OVERLAP_BACKWARD` overrides that rule (`Settings.torch_overlap_backward`, a
khorovod extension): `1` submits every bucket from its hook whatever the cores, `0` never does.

When `backward()` returns, the gradients it completed are the averaged ones, as with DDP: a
callback queued on autograd's engine waits for their reductions as the pass ends. So a
`GradScaler`'s unscaling and inf check, clipping, or logging see the same numbers on every rank
with no `synchronize()` in the user's code, and every rank skips the same steps. Parameters the
pass did not reach are reduced by `step()`. `no_sync()` blocks start no reduction at all.

Gradient accumulation (`backward_passes_per_step=k`): the allreduce of a parameter starts on
its k-th backward pass. If `step()` or `synchronize()` comes earlier, e.g. on the last, shorter
cycle of an epoch, the gradients accumulated so far are reduced as they are (the sum of the
passes done, not rescaled) and every counter starts again from k. Nothing fails, and the next
epoch starts with a clean cycle. Every rank must still call `step()` the same number of times.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections import Counter
import weakref
from typing import Any, Callable, Iterator, Sequence

import torch

from horovod.common import basics, ops
from horovod.common.gradients import GradientReducer
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Adasum, Average
from horovod.common.settings import Settings
from horovod.common.cores import overlap_backward
from horovod.torch.compression import Compression, Compressor
from horovod.torch._bridge import Pending, start
from horovod.torch.adasum_optimizer import DistributedAdasumOptimizer
from horovod.torch.mpi_ops import sparse_allreduce_async
from horovod.torch.powersgd import PowerSGD

__all__ = ["DistributedOptimizer"]


class _Bucket:
    """Parameters reduced together: one allreduce (a grouped one when there are several)."""

    __slots__ = ("params", "name", "ready")

    def __init__(self, params: list[torch.Tensor], name: str) -> None:
        self.params = params
        self.name = name
        self.ready = 0  # members whose gradient is complete for this step


class _DistributedOptimizer:
    # Reports the wrapped optimizer's class so that isinstance(opt, torch.optim.SGD) holds.
    __class__ = property(lambda self: self._optimizer.__class__)  # type: ignore[assignment]

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Any, reducer: GradientReducer,
                 backward_passes_per_step: int, sparse_as_dense: bool) -> None:
        self._optimizer = optimizer
        self._reducer = reducer  # op, scale factors, groups, process set, compression
        self._sparse_as_dense = sparse_as_dense
        self._backward_passes_per_step = backward_passes_per_step
        self._parameter_names = _parameter_names(optimizer, named_parameters)  # Horovod's name
        params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        self._buckets = _make_buckets(params, reducer, self._parameter_names)
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._passes_left = dict.fromkeys(params, backward_passes_per_step)
        self._inflight: list[tuple[Pending | Callable[[], torch.Tensor], list[tuple]]] = []
        self._launched: set[int] = set()  # ids of buckets whose allreduce started this step
        self._held: list[_Bucket] = []  # complete buckets waiting for synchronize() (no overlap)
        self._synchronized = False
        self._should_synchronize = True
        self._no_sync = 0  # depth of no_sync() blocks: their backward passes only accumulate
        self._finish_queued = False  # the end-of-backward callback of the running backward pass
        process_set = reducer.process_set
        settings = Settings.from_env()
        self._active = bool(process_set.included()) and (basics.size() > 1 or settings.elastic)
        self._overlap = overlap_backward(settings.torch_overlap_backward, basics.local_size(),
                                         on_device=any(p.is_cuda for p in params))  # module docstring
        if self._active:
            self._register_hooks(params)

    # -- the wrapped optimizer's attributes ----------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name == "_optimizer":  # not set yet (during unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    state = property(lambda self: self._optimizer.state,
                     lambda self, value: setattr(self._optimizer, "state", value))
    param_groups = property(lambda self: self._optimizer.param_groups,
                            lambda self, value: setattr(self._optimizer, "param_groups", value))
    defaults = property(lambda self: self._optimizer.defaults,
                        lambda self, value: setattr(self._optimizer, "defaults", value))

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._optimizer!r})"

    # -- hooks ----------------------------------------------------------------------------------------------
    def _register_hooks(self, params: list[torch.Tensor]) -> None:
        # The hooks hold the optimizer weakly and are removed when it is garbage: a dropped
        # wrapper must not keep reducing gradients that nobody steps with.
        ref = weakref.ref(self)

        def hook(param: torch.Tensor) -> None:
            opt = ref()
            if opt is not None:
                opt._on_gradient(param)

        handles = [p.register_post_accumulate_grad_hook(hook) for p in params]
        weakref.finalize(self, _remove_hooks, handles)

    def _on_gradient(self, param: torch.Tensor) -> None:
        if self._no_sync:
            return
        if not self._finish_queued:
            self._finish_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_ready)
        left = self._passes_left[param] - 1
        if left < 0:
            raise AssertionError(
                "Gradients were computed more than backward_passes_per_step times before call to step(). "
                f"The gradient of {self._parameter_names[param]} was computed more than backward_passes_per_step="
                f"{self._backward_passes_per_step} times; call step() (or synchronize()) after that many "
                "backward passes, or raise backward_passes_per_step to accumulate gradients locally.")
        self._passes_left[param] = left
        self._synchronized = False
        if left == 0:
            bucket = self._bucket_of[param]
            bucket.ready += 1
            if bucket.ready == len(bucket.params):
                if self._overlap:
                    self._launch(bucket)
                else:
                    self._held.append(bucket)

    def _launch(self, bucket: _Bucket) -> None:
        """Start the allreduce of a bucket's gradients (in place, or through the compressor)."""
        self._launched.add(id(bucket))
        reducer = self._reducer
        dense: list[tuple] = []
        for p in bucket.params:
            grad = p.grad
            if grad is None:  # unused on this rank: it still takes part, with zeros
                grad = p.grad = torch.zeros_like(p)
            if grad.is_sparse:
                if not self._sparse_as_dense:
                    handle = sparse_allreduce_async(grad, self._parameter_names[p], reducer.op, reducer.process_set)
                    self._inflight.append((handle, [(p, grad, None, None)]))
                    continue
                grad = grad.to_dense()  # handed back sparse once reduced (_complete_inflight)
            if isinstance(reducer.compression, PowerSGD):  # reduces a step's gradients together, itself
                self._inflight.append((reducer.compression.submit(grad, self._parameter_names[p], reducer), [(p, grad, None, None)]))
                continue
            sent, ctx = reducer.compression.compress(grad)
            dense.append((p, grad, sent, ctx))
        if not dense:
            return
        pending = start("allreduce", [sent for _, _, sent, _ in dense], grouped=len(dense) > 1, inplace=True,
                         name=bucket.name, op=reducer.op, prescale_factor=reducer.prescale,
                         postscale_factor=reducer.postscale, process_set=reducer.process_set)
        self._inflight.append((pending, dense))

    def _finish_ready(self) -> None:
        """At the end of a backward pass: finish the reductions of every bucket complete in it,
        so that when `backward()` returns, those gradients are the averaged ones on every rank.
        A GradScaler's unscaling and inf check then see the same numbers everywhere and skip
        the same steps. Buckets not complete yet (more passes to come, parameters this pass did
        not reach) are left for later passes or `step()`."""
        self._finish_queued = False
        ops.submit_waited(self._launch_held)
        self._held.clear()
        self._complete_inflight()

    def _complete_inflight(self) -> None:
        for pending, items in self._inflight:
            if isinstance(pending, Pending):
                pending.wait()
                for p, grad, sent, ctx in items:
                    if sent is not grad:
                        grad.copy_(self._reducer.compression.decompress(sent, ctx))
                    if grad is not p.grad:  # sparse_as_dense: the optimizer (SparseAdam) wants it sparse
                        p.grad = grad.to_sparse(p.grad.sparse_dim())
            else:  # a sparse or PowerSGD gradient: the reduced tensor replaces it
                items[0][0].grad = pending()
        self._inflight.clear()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside this block accumulate gradients locally and start no
        reduction, nor count towards `backward_passes_per_step`; the next pass outside it
        reduces the sum (as DDP's `no_sync`). `step()` inside the block still reduces."""
        self._no_sync += 1
        try:
            yield
        finally:
            self._no_sync -= 1

    def _launch_held(self) -> None:
        """Start the buckets backward completed while overlap is off, in that order."""
        for bucket in self._held:
            self._launch(bucket)

    def _launch_unlaunched(self) -> None:
        """Start every bucket not started yet: the held ones first, in the order backward
        completed them."""
        for bucket in self._held + self._buckets:
            if id(bucket) not in self._launched:
                self._launch(bucket)

    # -- the step -----------------------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish every gradient allreduce of this step and write the results into `.grad`.

        Gradients whose hook has not fired (a parameter unused in this forward, or fewer
        backward passes than `backward_passes_per_step`) are reduced now, as they are."""
        if not self._active or self._synchronized:
            return
        try:
            # Submitted as one batch that this thread then runs (`submit_waited`: one cycle for
            # all, fused, and the engine thread is not woken for each).
            ops.submit_waited(self._launch_unlaunched)
            self._complete_inflight()
        finally:
            self._reset_step()
        self._synchronized = True

    def _reset_step(self) -> None:
        self._finish_queued = False
        self._inflight.clear()
        self._launched.clear()
        self._held.clear()
        for bucket in self._buckets:
            bucket.ready = 0
        for p in self._passes_left:
            self._passes_left[p] = self._backward_passes_per_step

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside this block `step()` does not synchronize: for code that calls `synchronize()`
        itself, e.g. to clip or unscale the averaged gradients first."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Synchronize (unless inside `skip_synchronize()`), then run the wrapped step. A step
        right after an explicit `synchronize()` uses the gradients already averaged.

        A rank that ran no backward since its last step still reduces (its gradients, zeros
        where there are none), so ranks that skip a batch never leave the others waiting."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). The gradients already averaged are used (they are not "
                              "reduced a second time); wrap step() in `with optimizer.skip_synchronize():` when "
                              "you synchronize yourself.", UserWarning, stacklevel=2)
            self.synchronize()
        try:
            if closure is None:
                return self._optimizer.step(**kwargs)
            return self._optimizer.step(closure, **kwargs)
        finally:
            self._synchronized = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._inflight or self._held:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(). Gradient allreduces of this step are still running and would race "
                "with it; call step() or synchronize() first.")
        self._reset_step()  # e.g. after a step a GradScaler skipped: the next cycle starts clean
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before the allreduce."""
        if passes <= 0:
            raise ValueError(f"backward_passes_per_step must be > 0, got {passes}")
        self._backward_passes_per_step = passes
        self._reset_step()

    def load_state_dict(self, state_dict: dict) -> None:
        self._reset_step()
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict) -> None:
        """Add a group to the wrapped optimizer; its parameters are reduced like the others."""
        self._optimizer.add_param_group(param_group)
        g = len(self._optimizer.param_groups) - 1
        new = [p for p in self._optimizer.param_groups[g]["params"] if p.requires_grad and p not in self._passes_left]
        for i, p in enumerate(new):
            self._parameter_names.setdefault(p, f"allreduce.noname.{g}.{i}")
            bucket = _Bucket([p], self._parameter_names[p])
            self._buckets.append(bucket)
            self._bucket_of[p] = bucket
            self._passes_left[p] = self._backward_passes_per_step
        if self._active:
            self._register_hooks(new)


def _remove_hooks(handles: list[Any]) -> None:
    for handle in handles:
        handle.remove()


def _parameter_names(optimizer: torch.optim.Optimizer, named_parameters: Any) -> dict[torch.Tensor, str]:
    """A unique op name for every parameter: the model's names, else its position."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{g}.{i}" for g, group in enumerate(optimizer.param_groups)
                for i, p in enumerate(group["params"])}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced "
                         "by model.named_parameters().")
    counts = Counter(name for name, _ in named)
    duplicates = sorted(name for name, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(duplicates)}. Every parameter needs its own name: its gradient's allreduce "
                         "is matched across ranks by name.")
    by_param = {p: name for name, p in named}
    missing = [p for p in params if p not in by_param]
    if missing:
        shown = ", ".join(str(tuple(p.shape)) for p in missing[:5])
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(id(p)) for p in missing)}. The {len(missing)} "
                         f"unnamed ones have shapes {shown}{' ...' if len(missing) > 5 else ''}; pass "
                         "model.named_parameters() of the model whose parameters the optimizer updates.")
    return by_param


# Gradients on a GPU travel in buckets of about this many bytes, as DDP's do (its defaults): every
# NCCL call costs its latency, so a step makes a few large calls, the first one small and early.
FIRST_BUCKET_BYTES = 1 << 20
BUCKET_BYTES = 25 << 20


def size_buckets(nbytes: Sequence[int], first: int = FIRST_BUCKET_BYTES, rest: int = BUCKET_BYTES
                 ) -> list[tuple[int, ...]]:
    """Positions of parameters grouped from the last (about the order in which backward finishes
    their gradients), each group closed once it holds `first`, then `rest`, bytes or more."""
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    size, cap = 0, first
    for k in reversed(range(len(nbytes))):
        current.append(k)
        size += nbytes[k]
        if size >= cap:
            groups.append(tuple(current))
            current, size, cap = [], 0, rest
    if current:
        groups.append(tuple(current))
    return groups


def _make_buckets(params: list[torch.Tensor], reducer: GradientReducer,
                  names: dict[torch.Tensor, str]) -> list[_Bucket]:
    """The groups asked for (named after their first member); else one bucket per parameter on
    the CPU (the engine fuses what is ready together), or buckets by size on a GPU."""
    if not reducer.groups and any(p.is_cuda for p in params):
        groups = size_buckets([p.numel() * p.element_size() for p in params])
    else:
        groups = list(reducer.plan(params, range(len(params)), len(params)).groups)
    return [_Bucket([params[k] for k in group], names[params[group[0]]]) for group in groups]


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                         compression: type[Compressor] = Compression.none, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: int | Sequence[Sequence[torch.Tensor]] | None = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set) -> Any:
    """Wrap `optimizer` so that `step()` uses gradients averaged (op=Average) over the ranks of
    `process_set`.

    named_parameters: `model.named_parameters()`, to name each gradient's allreduce (recommended;
      otherwise parameters are named by position). Names must be unique and cover every parameter.
    compression: `Compression.none`, `.fp16` or `.bf16` for the gradients on the wire, or
      `Compression.powersgd(...)` (low-rank, with error feedback; a khorovod extension).
    backward_passes_per_step: backward passes accumulated locally before each allreduce.
    op: `Average`, `Sum`, or `Adasum` (the delta optimizer of `horovod.torch.adasum_optimizer`).
    gradient_predivide_factor: with Average, divide by this before the sum and by size/factor after.
    groups: an int N to reduce the parameters in N grouped allreduces, or a list of parameter lists
      (each reduced as one; parameters in no list go alone). `num_groups` is its deprecated name.
    sparse_as_dense: reduce sparse gradients as dense tensors instead of by gathering; the wrapped
      optimizer still receives them sparse.
    """
    if backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be > 0, got {backward_passes_per_step}")
    if op == Adasum:
        return DistributedAdasumOptimizer(optimizer, compression, process_set,
                                          _parameter_names(optimizer, named_parameters))
    reducer = GradientReducer("DistributedOptimizer", op, gradient_predivide_factor, num_groups, groups,
                              process_set, compression)
    wrapper = _named_wrapper(type(optimizer))
    return wrapper(optimizer, named_parameters, reducer, backward_passes_per_step, sparse_as_dense)


@functools.cache
def _named_wrapper(optimizer_class: type) -> type[_DistributedOptimizer]:
    """The wrapper class under the wrapped class's name, for code that logs or checks
    `type(opt).__name__`; it adds nothing else."""
    return type(optimizer_class.__name__, (_DistributedOptimizer,), {"__module__": __name__})
