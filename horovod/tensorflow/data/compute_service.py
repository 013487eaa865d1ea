"""Training from a tf.data service that a separate Horovod job (the compute job) runs.

    # compute job (CPU hosts):   horovodrun -np 4 python -m horovod.tensorflow.data.compute_worker /shared/compute.json
    # training job:
    config = TfDataServiceConfig.read("/shared/compute.json", wait_for_file_creation=True)
    dataset = dataset.send_to_data_service(config, hvd.rank(), hvd.size())

The compute job writes a `TfDataServiceConfig` (where its `ComputeService` listens and the key
that opens it); the training side reads it and asks the service for its dispatcher's address
(`tf_data_service`). The dispatchers run in the compute job (`dispatcher_side="compute"`) or in
the training processes (`"training"`: one per training rank, or one on rank 0 when there is one
dispatcher). The training job ends the compute job with `config.compute_client().shutdown()`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import tensorflow as tf

from horovod.runner.compute_service import ComputeClient

log = logging.getLogger("horovod.tensorflow.data")
_SIDES = ("compute", "training")

__all__ = ["TfDataServiceConfig", "compute_worker_fn", "send_to_data_service", "tf_data_service"]


@dataclasses.dataclass(frozen=True)
class TfDataServiceConfig:
    """What a training job needs to reach a compute job (see the module docstring)."""

    dispatchers: int
    workers_per_dispatcher: int
    dispatcher_side: str
    addresses: Mapping[str, Sequence[tuple[str, int]]]
    key: bytes
    timeout: int = 60

    def __post_init__(self) -> None:
        if self.dispatcher_side not in _SIDES:
            raise ValueError(f"dispatcher_side must be 'compute' or 'training', got {self.dispatcher_side!r}")

    def compute_client(self, verbose: int = 1) -> ComputeClient:
        return ComputeClient(self.addresses, self.key, verbose=verbose)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the key as hex."""
        return {**dataclasses.asdict(self), "key": self.key.hex(),
                "addresses": {nic: [list(a) for a in addrs] for nic, addrs in self.addresses.items()}}

    @staticmethod
    def from_dict(config: Mapping[str, Any]) -> "TfDataServiceConfig":
        fields = dict(config)
        fields["key"] = bytes.fromhex(fields["key"])
        fields["addresses"] = {nic: [(str(host), int(port)) for host, port in addrs]
                               for nic, addrs in fields["addresses"].items()}
        return TfDataServiceConfig(**fields)

    def write(self, filename: str) -> None:
        """Write atomically, so a reader waiting for the file never sees half of it."""
        partial = f"{filename}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as out:
            json.dump(self.to_dict(), out)
        os.replace(partial, filename)

    @staticmethod
    def read(filename: str, wait_for_file_creation: bool = False, wait_seconds: float = 600.0
             ) -> "TfDataServiceConfig":
        """Read the config, waiting up to `wait_seconds` for the compute job to write it if asked."""
        deadline = time.monotonic() + wait_seconds
        while wait_for_file_creation and not os.path.exists(filename):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the compute job did not write {filename} within {wait_seconds:g} s: is it "
                                   "running (python -m horovod.tensorflow.data.compute_worker <configfile>)?")
            time.sleep(0.1)
        with open(filename, encoding="utf-8") as source:
            return TfDataServiceConfig.from_dict(json.load(source))


@contextmanager
def tf_data_service(compute_config: TfDataServiceConfig, rank: int) -> Iterator[str]:
    """The address of the dispatcher training rank `rank` reads from, once its workers are up.

    With `dispatcher_side="training"` the dispatcher runs here for the duration of the block."""
    client = compute_config.compute_client(verbose=2)
    server = None
    dispatcher_id = rank if compute_config.dispatchers > 1 else 0
    try:
        if compute_config.dispatcher_side == "training" and (compute_config.dispatchers > 1 or rank == 0):
            server = tf.data.experimental.service.DispatchServer()
            log.info("training rank %d: dispatcher %d at %s", rank, dispatcher_id, server.target)
            client.register_dispatcher(dispatcher_id, server.target)
        address = client.wait_for_dispatcher_registration(dispatcher_id, compute_config.timeout)
        client.wait_for_dispatcher_worker_registration(dispatcher_id, compute_config.timeout)
        yield address
    finally:
        client.close()
        if server is not None:
            server.stop()


def send_to_data_service(dataset: tf.data.Dataset, compute_config: TfDataServiceConfig, rank: int,
                         size: int | None = None, reuse_dataset: bool = False,
                         round_robin: bool = False) -> tf.data.Dataset:
    """`dataset` produced by the compute job's workers ("distributed_epoch": each element once per
    job). `reuse_dataset`: all training ranks share one job, so each element goes to one rank;
    with `round_robin` too, ranks take turns (the dataset must repeat forever)."""
    if compute_config.dispatcher_side == "training":
        raise RuntimeError("send_to_data_service needs the dispatchers in the compute job "
                           "(dispatcher_side='compute'); with training-side dispatchers use the "
                           "tf_data_service(config, rank) context manager around the training loop")
    if round_robin and size is None:
        raise ValueError("send_to_data_service(round_robin=True) needs size: the number of training ranks")
    shared = reuse_dataset and round_robin
    with tf_data_service(compute_config, rank) as address:
        return dataset.apply(tf.data.experimental.service.distribute(
            processing_mode="distributed_epoch", service=address, job_name="job" if reuse_dataset else None,
            consumer_index=rank if shared else None, num_consumers=size if shared else None))


# Horovod's spelling: dataset.send_to_data_service(config, rank, size).
tf.data.Dataset.send_to_data_service = send_to_data_service


def compute_worker_fn(compute_config: TfDataServiceConfig, timeout: int | None = None) -> None:
    """One process of the compute job: a tf.data worker (and its group's dispatcher when the
    dispatchers run here), serving until the training job shuts the service down."""
    import horovod.tensorflow as hvd

    hvd.init()
    index = hvd.rank()
    dispatcher_id = index // compute_config.workers_per_dispatcher
    client = compute_config.compute_client(verbose=2)
    dispatcher = None
    try:
        if compute_config.dispatcher_side == "compute" and index % compute_config.workers_per_dispatcher == 0:
            dispatcher = tf.data.experimental.service.DispatchServer()
            log.info("compute rank %d: dispatcher %d at %s", index, dispatcher_id, dispatcher.target)
            client.register_dispatcher(dispatcher_id, dispatcher.target)
        address = client.wait_for_dispatcher_registration(dispatcher_id, compute_config.timeout)
        host = socket.gethostbyname(socket.gethostname())
        worker = tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
            dispatcher_address=address.split("://", 1)[-1], worker_address=f"{host}:%port%",
            heartbeat_interval_ms=1000, dispatcher_timeout_ms=timeout * 1000 if timeout else None))
        client.register_worker_for_dispatcher(dispatcher_id, index)
        client.wait_for_shutdown()
        worker.stop()
    finally:
        client.close()
        if dispatcher is not None:
            dispatcher.stop()
