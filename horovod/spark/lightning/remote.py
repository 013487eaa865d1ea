"""What each rank of `horovod.spark.lightning.TorchEstimator` runs: Lightning's own `Trainer`.

Every rank builds a `Trainer` with the estimator's `HorovodStrategy` and fits the module on its
share of the rows, so the module's hooks, `trainer_args`, loggers, callbacks, profilers and
checkpoints are Lightning's. Run output goes to a local directory that rank 0 copies into the
store's run directory (`runs/<run_id>/`): each checkpoint as it is written (the checkpoint
callback's file is `checkpoint.ckpt`, so `store.get_checkpoints(run_id)` finds it), the logs
(`logs/`) after each epoch and at the end.
"""

from __future__ import annotations

import importlib
import io
import math
import os
import queue
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import cloudpickle
import numpy as np

from horovod.spark.common.estimator import TrainingPlan, TrainResult
from horovod.spark.common.reader import ShardReader
from horovod.spark.lightning.strategy import StoreSync, horovod_strategy


@dataclass(frozen=True)
class LightningConfig:
    """What a rank needs besides the plan (which carries the callbacks): the module, logger,
    profiler and data module class (cloudpickled together), the module's Lightning package and
    the Trainer's settings."""

    package: str
    payload: bytes  # cloudpickle of (model, logger, profiler, data_module)
    plan: TrainingPlan
    compression: Any
    num_gpus: int | None
    log_every_n_steps: int
    terminate_on_nan: bool
    accumulate_grad_batches: int
    trainer_args: dict[str, Any]
    loader_num_epochs: int | None
    train_queue_size: int | None
    val_queue_size: int | None
    debug_data_loader: bool
    resume_from: bytes | None = None


class Batches:
    """A rank's batches for one Trainer epoch, as dicts of tensors by column: `steps` of them (the
    same on every rank), going round the shard when it is short. With `budget` (batches, from
    `loader_num_epochs`), the loader stops for good once it has given that many. With
    `queue_size`, a thread prepares up to that many batches ahead of training."""

    def __init__(self, reader: ShardReader, plan: TrainingPlan, batch_size: int, steps: int, shuffle: bool,
                 rng: np.random.Generator, budget: int | None = None, queue_size: int | None = None) -> None:
        self.reader, self.plan, self.batch_size, self.steps = reader, plan, batch_size, steps
        self.shuffle, self.rng, self.left, self.queue_size = shuffle, rng, budget, queue_size

    def __len__(self) -> int:
        return self.steps if self.left is None else min(self.steps, self.left)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        batches = self._batches()
        return read_ahead(batches, self.queue_size) if self.queue_size else batches

    def _batches(self) -> Iterator[dict[str, Any]]:
        import torch

        for arrays in self.reader.epoch(self.batch_size, len(self), self.shuffle, self.rng):
            if self.left is not None:
                self.left -= 1
            yield self.plan.shaped({col: torch.as_tensor(values) for col, values in arrays.items()})


def read_ahead(items: Iterator[Any], size: int) -> Iterator[Any]:
    """`items`, produced by a thread up to `size` ahead of the consumer (its exception re-raised
    here); the thread stops when the consumer stops early."""
    pending: queue.Queue = queue.Queue(maxsize=size)
    stop, end = threading.Event(), object()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        pending.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            pending.put((end, None))
        except BaseException as error:  # handed to the consumer
            pending.put((end, error))

    thread = threading.Thread(target=produce, name="khorovod-batch-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = pending.get()
            if error is not None:
                raise error
            if item is end:
                return
            yield item
    finally:
        stop.set()


def _callbacks(pl: Any, config: LightningConfig, rank: int, sync: StoreSync | None) -> list[Any]:
    """The estimator's own callbacks: NaN checks (`terminate_on_nan`), rank 0's per-epoch line
    (`verbose`) and its copy of the logs to the store after each epoch."""
    import torch

    plan = config.plan

    class EstimatorCallback(pl.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if not config.terminate_on_nan:
                return
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
                raise ValueError(f"The loss returned in `training_step` is {loss}.")
            for name, param in module.named_parameters():
                if not bool(torch.isfinite(param).all()):
                    raise ValueError(f"Detected nan and/or inf values in `{name}`.")

        def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
            if rank != 0:
                return
            if plan.verbose:
                metrics = ", ".join(f"{name}={float(value):.4f}" for name, value in
                                    sorted(trainer.callback_metrics.items()) if value.numel() == 1)
                print(f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}: {metrics}", flush=True)
            if sync is not None:
                sync.sync()

    return [EstimatorCallback()]


def _checkpoint_callback(pl: Any, callbacks: list[Any], directory: str, filename: str) -> tuple[Any, bool]:
    """The user's `ModelCheckpoint`, writing `<filename>.ckpt` into the run directory, else a new
    one saving the last epoch; and whether the user gave one (then the best model is returned)."""
    for callback in callbacks:
        if isinstance(callback, pl.callbacks.ModelCheckpoint):
            callback.dirpath, callback.filename = directory, filename
            return callback, True
    callback = pl.callbacks.ModelCheckpoint(dirpath=directory, filename=filename)
    callbacks.append(callback)
    return callback, False


def _logger(pl: Any, logger: Any, logs_path: str) -> Any:
    """The user's logger writing under the run's `logs/`, or Lightning's TensorBoard logger there."""
    if logger is None:
        return pl.loggers.TensorBoardLogger(logs_path)
    for attribute in ("_save_dir", "_root_dir"):  # where Lightning's own loggers keep it
        if attribute in vars(logger):
            setattr(logger, attribute, logs_path)
    try:
        logger.save_dir = logs_path  # a logger keeping it as a plain attribute
    except AttributeError:  # a read-only property: set above
        pass
    return logger


def _data_module_kwargs(config: LightningConfig, rank: int, size: int, steps: tuple[int, int]) -> dict[str, Any]:
    """The arguments Horovod gives a `data_module` class (its names)."""
    plan, reader = config.plan, config.plan.reader
    return dict(train_dir=plan.store.get_full_path(plan.data.train_path),
                val_dir=plan.store.get_full_path(plan.data.val_path) if plan.data.val_path else None,
                num_train_epochs=plan.epochs, has_val=bool(plan.data.val_path), train_batch_size=plan.batch_size,
                val_batch_size=plan.val_batch_size, shuffle=plan.shuffle, num_reader_epochs=config.loader_num_epochs,
                reader_pool_type=reader.pool_type, reader_worker_count=reader.train_workers,
                transformation=reader.transformation_fn, transformation_edit_fields=reader.edit_fields,
                transformation_removed_fields=reader.removed_fields, inmemory_cache_all=reader.cache_all,
                cur_shard=rank, shard_count=size, schema_fields=plan.columns,
                storage_options=plan.store.storage_options, steps_per_epoch_train=steps[0],
                steps_per_epoch_val=steps[1], verbose=bool(plan.verbose), debug_data_loader=config.debug_data_loader,
                train_async_data_loader_queue_size=config.train_queue_size,
                val_async_data_loader_queue_size=config.val_queue_size, seed=plan.seed)


def _device(torch: Any, hvd: Any, config: LightningConfig) -> Any:
    """The rank's GPU (by local rank) when it may use one and CUDA has one, else the CPU."""
    wants_gpu = config.plan.use_gpu and config.num_gpus != 0
    if wants_gpu and torch.cuda.is_available():
        return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    return torch.device("cpu")


def train(config: LightningConfig) -> TrainResult | None:
    """One rank's `Trainer.fit`; rank 0 returns the logged metrics, the weights and output shapes."""
    import torch

    import horovod.torch as hvd

    pl = importlib.import_module(config.package)
    plan = config.plan
    hvd.init()
    try:
        if plan.seed is not None:
            pl.seed_everything(plan.seed)
        model, logger, profiler, data_module = cloudpickle.loads(config.payload)
        rank, size = hvd.rank(), hvd.size()
        device = _device(torch, hvd, config)
        with plan.store.get_local_output_dir_fn(plan.run_id)() as run_dir:
            logs_path = os.path.join(run_dir, plan.store.get_logs_subdir())
            os.makedirs(logs_path, exist_ok=True)
            sync = StoreSync(plan.store, plan.run_id, run_dir) if rank == 0 and plan.store.saving_runs() else None
            callbacks = list(plan.callbacks)
            checkpoint, best_wanted = _checkpoint_callback(pl, callbacks, run_dir, plan.store.get_checkpoint_filename())
            callbacks += _callbacks(pl, config, rank, sync)
            kwargs = dict(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
                          strategy=horovod_strategy(config.package, device, config.compression, sync),
                          callbacks=callbacks, max_epochs=plan.epochs, logger=_logger(pl, logger, logs_path),
                          log_every_n_steps=config.log_every_n_steps, num_sanity_val_steps=0,
                          use_distributed_sampler=False,  # each rank reads its own shard already
                          accumulate_grad_batches=config.accumulate_grad_batches, profiler=profiler,
                          default_root_dir=run_dir, enable_progress_bar=False,
                          enable_model_summary=bool(plan.verbose) and rank == 0)
            kwargs.update(config.trainer_args)
            trainer = pl.Trainer(**kwargs)
            if trainer.profiler is not None and getattr(trainer.profiler, "dirpath", "") is None:
                trainer.profiler.dirpath, trainer.profiler.filename = logs_path, "profile"
            fit_kwargs = _data(config, data_module, rank, size)
            with tempfile.TemporaryDirectory() as resume_dir:
                if config.resume_from is not None:
                    fit_kwargs["ckpt_path"] = os.path.join(resume_dir, "resume.ckpt")
                    with open(fit_kwargs["ckpt_path"], "wb") as f:
                        f.write(config.resume_from)
                trainer.fit(model, **fit_kwargs)
            if sync is not None:
                sync.sync()  # the last logs and the profiler's report
            if rank != 0:
                return None
            if best_wanted and checkpoint.best_model_path:
                state = torch.load(checkpoint.best_model_path, map_location="cpu", weights_only=False)
                model.load_state_dict(state["state_dict"])
            sample = next(plan.train_reader(rank, size).epoch(1, 1, False, np.random.default_rng(0)))
            return _result(torch, model, trainer, plan, sample)
    finally:
        hvd.shutdown()


def _data(config: LightningConfig, data_module: Any, rank: int, size: int) -> dict[str, Any]:
    """`trainer.fit`'s data: the user's `data_module` class built with Horovod's arguments, else
    this rank's batches read from the store."""
    plan = config.plan
    if data_module is not None:
        return {"datamodule": data_module(**_data_module_kwargs(config, rank, size, plan.steps))}
    rng = np.random.default_rng(None if plan.seed is None else plan.seed + rank)
    budget = None
    if config.loader_num_epochs is not None:  # the same on every rank: each batch is a collective
        budget = math.ceil(config.loader_num_epochs * (plan.data.train_rows // size) / plan.batch_size)
    data = {"train_dataloaders": Batches(plan.train_reader(rank, size), plan, plan.batch_size, plan.steps[0],
                                         plan.shuffle, rng, budget, config.train_queue_size)}
    val_reader = plan.val_reader(rank, size)
    if val_reader is not None:
        data["val_dataloaders"] = Batches(val_reader, plan, plan.val_batch_size, plan.steps[1], False, rng,
                                          queue_size=config.val_queue_size)
    if config.debug_data_loader and rank == 0:
        print(f"data loaders: {plan.steps[0]} training batches of {plan.batch_size} per epoch and rank"
              f" (loader_num_epochs={config.loader_num_epochs}, reader {plan.reader}), "
              f"{plan.steps[1]} validation batches of {plan.val_batch_size}", flush=True)
    return data


def _result(torch: Any, model: Any, trainer: Any, plan: TrainingPlan, sample: dict[str, np.ndarray]) -> TrainResult:
    """Rank 0's answer: Lightning's logged metrics (as numbers), the weights, and the shapes of
    the outputs (from one `sample` row)."""
    model = model.cpu().eval()
    with torch.no_grad():
        outputs = model(*plan.inputs({col: torch.as_tensor(values) for col, values in sample.items()}))
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    history = {name: float(value) if value.numel() == 1 else value.tolist()
               for name, value in trainer.logged_metrics.items()}
    return {"history": history, "state_dict": buffer.getvalue(),
            "output_shapes": [tuple(output.shape[1:]) for output in outputs]}
