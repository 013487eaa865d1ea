"""ShardedDistributedOptimizer: optimizer state split across the ranks (ZeRO stage 1).

A khorovod extension; Horovod has no equivalent. Every rank keeps the full parameters and
computes full gradients, but the optimizer state (momentum, Adam's moments) of each element
lives on one rank only, so it takes about 1/N of the memory per rank. A step:

1. every param group's gradients, flattened into one vector, are reduce-scattered: each rank
   receives the average of its own block (`horovod.torch.shard_layout` says where blocks start);
2. the wrapped optimizer steps that block only, as if the block were its one parameter;
3. the updated blocks are allgathered back into the parameters.

The numbers equal those of `DistributedOptimizer` for optimizers that treat every element on its
own (SGD, momentum, Adam, AdamW, RMSprop, Adagrad, ...). Optimizers that look at a whole
parameter at once (LAMB's and LARS' per-parameter norms, Adafactor's factored moments) see
blocks instead of parameters and must not be sharded this way.

Your optimizer object is kept: its `param_groups` (and so LR schedulers, `defaults`, hooks) stay
its own, but each group's `params` become that rank's block, and its `state` the block's state.
Gradients accumulate locally until `step()`, so several backward passes before a step need no
option. The wrapper reports the wrapped class as its `__class__`, as `DistributedOptimizer` does.

Checkpoints: `consolidate_state_dict(to=0)` (every rank) then `state_dict()` on rank `to` gives
the whole state in the wrapped optimizer's own format (any tool, and the unsharded optimizer,
can read it); `load_state_dict(whole)` on every rank keeps each rank's block. Or per rank:
`shard_state_dict()` / `load_shard_state_dict()`, for the same number of ranks.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Sequence

import torch

from horovod.common import basics, ops
from horovod.common.gradients import GradientReducer
from horovod.common.process_sets import ProcessSet, global_process_set
from horovod.common.reduce_ops import Average, Sum
from horovod.torch.compression import Compression, Compressor
from horovod.torch.mpi_ops import grouped_allgather, grouped_reducescatter
from horovod.torch.shard_layout import Piece, ShardLayout, assemble, split_state

__all__ = ["ShardedDistributedOptimizer"]

_NAME = "ShardedDistributedOptimizer"


class ShardedOptimizer:
    # Reports the wrapped optimizer's class so that isinstance(opt, torch.optim.Adam) and LR
    # schedulers' isinstance(opt, Optimizer) hold.
    __class__ = property(lambda self: self._optimizer.__class__)  # type: ignore[assignment]

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Any, reducer: GradientReducer) -> None:
        self._optimizer = optimizer
        self._reducer = reducer
        self._params = [list(group["params"]) for group in optimizer.param_groups]  # every parameter, as given
        self._trainable = [[p for p in params if p.requires_grad] for params in self._params]
        names = {p: n for n, p in named_parameters} if named_parameters is not None else {}
        self._names = {p: names.get(p, f"param_groups[{g}][{i}]")
                       for g, params in enumerate(self._params) for i, p in enumerate(params)}
        for g, params in enumerate(self._trainable):
            kinds = {(p.dtype, p.device) for p in params}
            if len(kinds) > 1:
                raise ValueError(f"{_NAME}: param group {g} mixes {sorted(str(k) for k in kinds)}; a group is "
                                 "sharded as one flat vector, so put parameters of each dtype and device in a "
                                 "group of their own")
        whole = optimizer.state_dict() if optimizer.state else None
        self._consolidated: dict | None = None
        self._pending: list[Piece] | None = None  # pieces to reshard from at the next collective (elastic)
        self._layout = self._current_layout()
        self._install_shards()
        if whole is not None:  # the optimizer had state already (a checkpoint loaded before wrapping)
            self.load_state_dict(whole)

    # -- the wrapped optimizer's attributes ----------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name == "_optimizer":  # not set yet (during unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    state = property(lambda self: self._optimizer.state)
    param_groups = property(lambda self: self._optimizer.param_groups)
    defaults = property(lambda self: self._optimizer.defaults)
    layout = property(lambda self: self._layout, doc="How the parameters are cut into blocks now.")

    def __repr__(self) -> str:
        return f"{_NAME}({self._optimizer!r})"

    # -- layout ---------------------------------------------------------------------------------------
    def _current_layout(self) -> ShardLayout:
        process_set = self._reducer.process_set
        process_set.require_registered()
        return ShardLayout(tuple(sum(p.numel() for p in params) for params in self._trainable),
                           len(process_set.ranks), process_set.ranks.index(basics.rank()))

    def _segments(self, group: int) -> list[tuple[torch.Tensor, int, int, int]]:
        """(parameter, its flat offset, first, last+1 position of it in this rank's block)."""
        start, end = self._layout.bounds(group)
        segments, offset = [], 0
        for p in self._trainable[group]:
            lo, hi = max(offset, start), min(offset + p.numel(), end)
            if lo < hi:
                segments.append((p, offset, lo, hi))
            offset += p.numel()
        return segments

    def _install_shards(self) -> None:
        """Point every group of the wrapped optimizer at a fresh block of this rank (its state
        starts empty), filled with the parameters' current values."""
        self._shards = []
        for g, params in enumerate(self._trainable):
            like = params[0] if params else torch.empty(0)
            shard = torch.zeros(self._layout.shard(g), dtype=like.dtype, device=like.device)
            self._shards.append(shard)
            self._optimizer.param_groups[g]["params"] = [shard]
        self._optimizer.state = defaultdict(dict)
        self._refresh_shards()

    @torch.no_grad()
    def _refresh_shards(self) -> None:
        """Copy the parameters' values into the blocks: they may have changed since the last step
        (broadcast_parameters, load_state_dict of the model, an elastic restore)."""
        for g, shard in enumerate(self._shards):
            start = self._layout.bounds(g)[0]
            for p, offset, lo, hi in self._segments(g):
                shard[lo - start:hi - start] = p.detach().reshape(-1)[lo - offset:hi - offset]

    def reshard_on_next_step(self, pieces: list[Piece]) -> None:
        """Take the state from `pieces` (saved under any layout, by any ranks) at the next
        collective of this optimizer, under the membership of that moment. Every rank of the new
        membership must call this or `reshard` before that collective (elastic training)."""
        self._pending = pieces

    def reshard(self, pieces: list[Piece]) -> None:
        """Collective: cut the parameters for the current membership and rebuild this rank's
        block's state from every rank's `pieces`."""
        every = ops.allgather_object(pieces, f"{_NAME}.reshard", self._reducer.process_set)
        everything = [piece for rank_pieces in every for piece in rank_pieces]  # type: ignore[union-attr]
        self._pending = None
        self._layout = self._current_layout()
        self._install_shards()
        self._load_pieces(everything)

    def ensure_layout(self) -> None:
        """Reshard now if `reshard_on_next_step` asked for it (collective then); refuse a layout
        that no longer fits the membership."""
        if self._pending is not None:
            self.reshard(self._pending)
        elif self._layout != self._current_layout():
            raise RuntimeError(f"{_NAME}: the job now has {len(self._reducer.process_set.ranks)} ranks but the "
                               f"optimizer state is cut for {self._layout.size}; in elastic training keep the "
                               "optimizer in hvd.elastic.TorchState, which moves the state to the new ranks")

    # -- the step -------------------------------------------------------------------------------------
    def _gradient_blocks(self) -> list[torch.Tensor]:
        """Every group's gradients reduce-scattered: this rank's block of their average."""
        flats, groups = [], []
        for g, params in enumerate(self._trainable):
            if not self._layout.totals[g]:
                continue
            grads = []
            for p in params:
                if p.grad is not None and p.grad.is_sparse:
                    raise ValueError(f"{_NAME}: {self._names[p]} has a sparse gradient; sharded optimizer state "
                                     "needs dense gradients (use DistributedOptimizer(sparse_as_dense=True) or "
                                     "a dense embedding)")
                grads.append(torch.zeros_like(p).reshape(-1) if p.grad is None else p.grad.reshape(-1))
            padding = self._layout.shard(g) * self._layout.size - self._layout.totals[g]
            grads.append(grads[0].new_zeros(padding))
            flats.append(torch.cat(grads))
            groups.append(g)
        if not flats:
            return []
        reducer = self._reducer
        blocks = grouped_reducescatter(flats, name=f"{_NAME}.gradients", compression=reducer.compression,
                                       op=reducer.op, prescale_factor=reducer.prescale,
                                       postscale_factor=reducer.postscale, process_set=reducer.process_set)
        for g, block in zip(groups, blocks):
            self._shards[g].grad = block.to(self._shards[g].dtype)
        return blocks

    @torch.no_grad()
    def _gather_parameters(self) -> None:
        groups = [g for g in range(len(self._shards)) if self._layout.totals[g]]
        if not groups:
            return
        gathered = grouped_allgather([self._shards[g] for g in groups], name=f"{_NAME}.parameters",
                                     process_set=self._reducer.process_set)
        for g, flat in zip(groups, gathered):
            offset = 0
            for p in self._trainable[g]:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Reduce-scatter the gradients, step this rank's block, allgather the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            self.ensure_layout()
            self._refresh_shards()
            self._gradient_blocks()
        self._optimizer.step()
        self._gather_parameters()
        for shard in self._shards:
            shard.grad = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for params in self._trainable:
            for p in params:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def add_param_group(self, param_group: dict) -> None:
        raise NotImplementedError(f"{_NAME} cannot add a param group after it was created; give the optimizer "
                                  "every group before wrapping it")

    # -- state: pieces ----------------------------------------------------------------------------------
    def state_pieces(self) -> list[Piece]:
        """This rank's state, one `Piece` per group (copies, in flat-vector positions)."""
        pieces = []
        for g, shard in enumerate(self._shards):
            start, end = self._layout.bounds(g)
            elements, scalars = split_state(self._optimizer.state.get(shard, {}), len(shard))
            pieces.append(Piece(g, start, end, {k: v[:end - start].clone() for k, v in elements.items()},
                                {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in scalars.items()}))
        return pieces

    def _load_pieces(self, pieces: list[Piece]) -> None:
        """Set this rank's block state from `pieces` (which must cover it)."""
        for g, shard in enumerate(self._shards):
            state = assemble(pieces, g, *self._layout.bounds(g), len(shard))
            if state:
                self._optimizer.state[shard] = state
            else:
                self._optimizer.state.pop(shard, None)

    # -- state: whole and per shard ------------------------------------------------------------------------
    def _hyperparameters(self) -> list[dict]:
        numbered, index = [], 0
        for g, group in enumerate(self._optimizer.param_groups):
            count = len(self._params[g])
            numbered.append({**{k: v for k, v in group.items() if k != "params"},
                             "params": list(range(index, index + count))})
            index += count
        return numbered

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collective: gather the whole optimizer state on global rank `to`, for `state_dict()`."""
        self.ensure_layout()
        every = ops.allgather_object(self.state_pieces(), f"{_NAME}.consolidate", self._reducer.process_set)
        if basics.rank() != to:
            self._consolidated = None
            return
        pieces = [piece for rank_pieces in every for piece in rank_pieces]  # type: ignore[union-attr]
        state: dict[int, dict] = {}
        index = 0
        for g, params in enumerate(self._params):
            total = self._layout.totals[g]
            elements, scalars = split_state(assemble(pieces, g, 0, total, total), total)
            offset = 0
            for p in params:
                if p.requires_grad and (elements or scalars):
                    state[index] = {**{k: _copy(v) for k, v in scalars.items()},
                                    **{k: v[offset:offset + p.numel()].view_as(p).clone() for k, v in elements.items()}}
                    offset += p.numel()
                index += 1
        self._consolidated = {"state": state, "param_groups": self._hyperparameters()}

    def state_dict(self) -> dict:
        """The whole state, in the wrapped optimizer's format, on the rank given to
        `consolidate_state_dict` (which every rank must call first)."""
        if self._consolidated is None:
            raise RuntimeError(f"{_NAME}.state_dict(): the state is split across the ranks; call "
                               "optimizer.consolidate_state_dict(to=0) on every rank first, then state_dict() "
                               "on rank 0 (or save each rank's part with shard_state_dict())")
        result, self._consolidated = self._consolidated, None
        return result

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a whole state (of the wrapped optimizer's format, e.g. from `state_dict()` or
        an unsharded run); every rank passes the same one and keeps its own block."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(params) for params in self._params]:
            raise ValueError(f"{_NAME}.load_state_dict: the state has groups of "
                             f"{[len(g['params']) for g in groups]} parameters, this optimizer "
                             f"{[len(params) for params in self._params]}")
        self.ensure_layout()
        pieces = []
        for g, (group, params) in enumerate(zip(groups, self._params)):
            saved = [state_dict["state"].get(i, {}) for i, p in zip(group["params"], params) if p.requires_grad]
            pieces.append(_piece_of_group(g, saved, self._trainable[g]))
            hyper = {k: v for k, v in group.items() if k != "params"}
            self._optimizer.param_groups[g].update(hyper)
        self._load_pieces(pieces)

    def shard_state_dict(self) -> dict:
        """This rank's part of the state (no communication), for `load_shard_state_dict` on the
        same rank of a job with the same ranks and parameters."""
        self.ensure_layout()
        return {"layout": self._layout, "optimizer": self._optimizer.state_dict()}

    def load_shard_state_dict(self, state_dict: dict) -> None:
        self.ensure_layout()
        if state_dict["layout"] != self._layout:
            raise ValueError(f"{_NAME}.load_shard_state_dict: the part was saved by rank {state_dict['layout'].rank} "
                             f"of {state_dict['layout'].size} (sizes {state_dict['layout'].totals}), this is rank "
                             f"{self._layout.rank} of {self._layout.size} (sizes {self._layout.totals}); load "
                             "a whole state_dict with load_state_dict instead")
        self._optimizer.load_state_dict(state_dict["optimizer"])

    def broadcast_hyperparameters(self, root_rank: int) -> None:
        """Every rank takes `root_rank`'s learning rates and other group options (the state
        blocks belong to their ranks: there is nothing to agree on)."""
        groups = ops.broadcast_object(self._hyperparameters(), root_rank, f"{_NAME}.hyperparameters",
                                      self._reducer.process_set)
        for mine, theirs in zip(self._optimizer.param_groups, groups):  # type: ignore[arg-type]
            mine.update({k: v for k, v in theirs.items() if k != "params"})


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


def _piece_of_group(group: int, saved: Sequence[dict], params: Sequence[torch.Tensor]) -> Piece:
    """The state of a whole group's flat vector from its parameters' states (torch's format;
    parameters without state count as zeros, which is what their first step starts from)."""
    template = next((s for s in saved if s), None)
    total = sum(p.numel() for p in params)
    if template is None:
        return Piece(group, 0, total)
    per_element = [k for k, v in template.items() if isinstance(v, torch.Tensor) and v.shape == params[0].shape]
    elements = {k: torch.cat([(s[k] if k in s else torch.zeros_like(p)).reshape(-1).to(p.device)
                              for s, p in zip(saved, params)]) for k in per_element}
    scalars = {k: _copy(v) for k, v in template.items() if k not in per_element}
    return Piece(group, 0, total, elements, scalars)


def ShardedDistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,
                                compression: type[Compressor] = Compression.none, op: int = Average,
                                gradient_predivide_factor: float = 1.0,
                                process_set: ProcessSet = global_process_set) -> Any:
    """Wrap `optimizer` so that each rank keeps the state of 1/N of the parameters and `step()`
    uses gradients averaged (op=Average) or summed (op=Sum) over `process_set`.

    The arguments mean what they mean for `DistributedOptimizer`; `named_parameters` names the
    parameters in error messages. Gradients of several backward passes before one `step()`
    are accumulated locally, as without Horovod.
    """
    if op not in (Average, Sum):
        raise ValueError(f"{_NAME}: op must be Average or Sum (the gradients are reduce-scattered), got {op}")
    reducer = GradientReducer(_NAME, op, gradient_predivide_factor, 0, None, process_set, compression)
    return _named_wrapper(type(optimizer))(optimizer, named_parameters, reducer)


_wrappers: dict[type, type] = {}


def _named_wrapper(optimizer_class: type) -> type[ShardedOptimizer]:
    """The wrapper class under the wrapped class's name, as `DistributedOptimizer`'s."""
    if optimizer_class not in _wrappers:
        _wrappers[optimizer_class] = type(optimizer_class.__name__, (ShardedOptimizer,), {"__module__": __name__})
    return _wrappers[optimizer_class]
