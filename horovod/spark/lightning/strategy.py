"""A Lightning `Strategy` whose data parallelism is `horovod.torch`, for the Spark estimator's ranks.

Lightning 2 has no Horovod strategy of its own, so the estimator gives its `Trainer` this one:
ranks and world size come from `hvd`, `setup` broadcasts rank 0's weights and optimizer state
and wraps each optimizer in `hvd.DistributedOptimizer` (as Lightning's Horovod strategy did, the
learning rates are scaled by the number of ranks, the total batch being that many times larger),
`reduce` / `all_gather` / `broadcast` / `barrier` are Horovod collectives (so `self.log(...,
sync_dist=True)`, early stopping and checkpoint decisions agree on every rank).

Gradients are averaged while `backward()` runs (the optimizer's hooks); after each backward the
strategy completes every optimizer's reductions (`post_backward`), so `optimizer.step()` runs
inside `skip_synchronize()` and a module with several optimizers (manual optimization) steps each
on averaged gradients. Gradient accumulation (`accumulate_grad_batches`) runs the accumulating
backward passes inside the optimizers' `no_sync()`, as DDP's.

Horovod's users' modules subclass `lightning.pytorch.LightningModule` or
`pytorch_lightning.LightningModule`: two packages with separate class trees, so the classes here
are made once for each (`horovod_strategy(package, ...)`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import posixpath
from typing import Any

import torch

#: The Lightning packages a LightningModule can come from.
PACKAGES = ("lightning.pytorch", "pytorch_lightning")


def lightning_package(model: Any) -> str | None:
    """The Lightning package whose `LightningModule` `model` is, or None when it is not one."""
    for cls in type(model).__mro__:
        if cls.__name__ == "LightningModule":
            for package in PACKAGES:
                if cls.__module__.startswith(package + "."):
                    return package
    return None


def fabric_package(package: str) -> str:
    """The Lightning Fabric package that `package` is built on (its environments, checkpoint IO)."""
    return "lightning.fabric" if package == "lightning.pytorch" else "lightning_fabric"


class StoreSync:
    """Copies rank 0's local run directory (checkpoints, logs, profiles) into the store's run
    directory, and deletes there the checkpoints Lightning deletes locally."""

    def __init__(self, store: Any, run_id: str, local_dir: str) -> None:
        self.store, self.local_dir = store, local_dir
        self.run_path = store.get_run_path(run_id)
        self._sync = store.sync_fn(run_id)

    def sync(self) -> None:
        self._sync(self.local_dir)

    def remove(self, local_path: str) -> None:
        relative = posixpath.relpath(str(local_path), self.local_dir)
        remote = posixpath.join(self.run_path, relative)
        if not relative.startswith("..") and self.store.exists(remote):
            self.store.delete(remote)


def horovod_strategy(package: str, device: torch.device, compression: Any, sync: StoreSync | None) -> Any:
    """A `HorovodStrategy` of `package` for this rank: training on `device`, gradients through
    `compression`; each checkpoint rank 0 writes goes to the store through `sync`."""
    strategy_cls, checkpoint_io_cls = _classes(package)
    return strategy_cls(device, compression, checkpoint_io_cls(sync) if sync else None)


def _reduce_op(hvd: Any, reduce_op: Any) -> Any:
    """Lightning's reduce op ('mean', 'sum', torch's ReduceOp, ...) as Horovod's."""
    name = str(reduce_op if reduce_op is not None else "mean").lower()
    for key, op in (("sum", hvd.Sum), ("mean", hvd.Average), ("avg", hvd.Average), ("max", hvd.Max),
                    ("min", hvd.Min), ("prod", hvd.Product)):
        if key in name:
            return op
    raise ValueError(f"HorovodStrategy.reduce: unsupported reduce_op {reduce_op!r} (sum, mean, max, min or product)")


@functools.cache
def _classes(package: str) -> tuple[type, type]:
    """The strategy and checkpoint IO classes for one Lightning package."""
    import horovod.torch as hvd

    parallel = importlib.import_module(f"{package}.strategies.parallel")
    fabric = fabric_package(package)
    environments = importlib.import_module(f"{fabric}.plugins.environments")
    torch_io = importlib.import_module(f"{fabric}.plugins.io.torch_io")
    rank_zero_modules = [importlib.import_module(f"{fabric}.utilities.rank_zero"),
                         importlib.import_module(f"{package}.utilities.rank_zero")]

    class HorovodEnvironment(environments.ClusterEnvironment):
        """The processes are Horovod's ranks, started by the Spark backend, not by Lightning."""

        @property
        def creates_processes_externally(self) -> bool:
            return True

        @property
        def main_address(self) -> str:
            return "127.0.0.1"  # Lightning starts no process group: Horovod has its own rendezvous

        @property
        def main_port(self) -> int:
            return 0

        @staticmethod
        def detect() -> bool:
            return hvd.is_initialized()

        def world_size(self) -> int:
            return hvd.size()

        def set_world_size(self, size: int) -> None:
            """Horovod decides the world size; Lightning's value is not used."""

        def global_rank(self) -> int:
            return hvd.rank()

        def set_global_rank(self, rank: int) -> None:
            """Horovod decides the rank; Lightning's value is not used."""

        def local_rank(self) -> int:
            return hvd.local_rank()

        def node_rank(self) -> int:
            return hvd.cross_rank()

    class StoreCheckpointIO(torch_io.TorchCheckpointIO):
        """Lightning's checkpoint files, each also copied to (or deleted from) the store at once."""

        def __init__(self, sync: StoreSync) -> None:
            super().__init__()
            self.store_sync = sync

        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            self.store_sync.sync()

        def remove_checkpoint(self, path: Any) -> None:
            super().remove_checkpoint(path)
            self.store_sync.remove(str(path))

    class HorovodStrategy(parallel.ParallelStrategy):
        """Data-parallel training over `horovod.torch` (see the module's docstring)."""

        strategy_name = "horovod"

        def __init__(self, device: torch.device, compression: Any, checkpoint_io: Any = None) -> None:
            super().__init__(parallel_devices=[device], cluster_environment=HorovodEnvironment(),
                             checkpoint_io=checkpoint_io)
            self.compression = compression or hvd.Compression.none
            self._skipping = contextlib.ExitStack()

        @property
        def is_distributed(self) -> bool:
            """Lightning honours `self.log(..., sync_dist=True)` only for strategies that say so."""
            return True

        @property
        def root_device(self) -> torch.device:
            return self.parallel_devices[0]

        @property
        def distributed_sampler_kwargs(self) -> dict[str, Any]:
            return {"num_replicas": self.world_size, "rank": self.global_rank}

        def set_world_ranks(self) -> None:
            for module in rank_zero_modules:  # rank_zero_only / rank_zero_info act on rank 0 only
                module.rank_zero_only.rank = self.global_rank

        def model_to_device(self) -> None:
            if self.root_device.type == "cuda":
                torch.cuda.set_device(self.root_device)
            self.model.to(self.root_device)

        def setup(self, trainer: Any) -> None:
            self.model_to_device()
            super().setup(trainer)
            if trainer.state.fn != "fit":
                return
            optimizers = [getattr(opt, "_optimizer", opt) for opt in self.optimizers]
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    group["lr"] *= self.world_size
            for config in self.lr_scheduler_configs:
                if hasattr(config.scheduler, "base_lrs"):
                    config.scheduler.base_lrs = [lr * self.world_size for lr in config.scheduler.base_lrs]
            hvd.broadcast_parameters(self.lightning_module.state_dict(), root_rank=0)
            for optimizer in optimizers:
                hvd.broadcast_optimizer_state(optimizer, root_rank=0)
            self.optimizers = [self._distributed(optimizer) for optimizer in optimizers]
            for optimizer in self.optimizers:
                self._skipping.enter_context(optimizer.skip_synchronize())

        def _distributed(self, optimizer: Any) -> Any:
            owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
            named = [(name, p) for name, p in self.lightning_module.named_parameters() if id(p) in owned]
            return hvd.DistributedOptimizer(optimizer, named_parameters=named, compression=self.compression)

        def post_backward(self, closure_loss: torch.Tensor) -> None:
            for optimizer in self.optimizers:
                optimizer.synchronize()

        @contextlib.contextmanager
        def block_backward_sync(self) -> Any:
            with contextlib.ExitStack() as stack:
                for optimizer in self.optimizers:
                    if hasattr(optimizer, "no_sync"):
                        stack.enter_context(optimizer.no_sync())
                yield

        def barrier(self, name: str | None = None, *args: Any, **kwargs: Any) -> None:
            if hvd.is_initialized():
                hvd.barrier()

        def broadcast(self, obj: Any, src: int = 0) -> Any:
            return hvd.broadcast_object(obj, root_rank=src)

        def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
            if group is not None:
                raise ValueError("HorovodStrategy.reduce: Horovod reduces over all ranks; leave group unset")
            if not isinstance(tensor, torch.Tensor):
                return tensor
            return hvd.allreduce(tensor, op=_reduce_op(hvd, reduce_op))

        def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
            if group is not None:
                raise ValueError("HorovodStrategy.all_gather: Horovod gathers from all ranks; leave group unset")
            return hvd.allgather(tensor.unsqueeze(0))  # (world size, *shape), as Lightning's

        def teardown(self) -> None:
            self._skipping.close()
            super().teardown()

    return HorovodStrategy, StoreCheckpointIO

