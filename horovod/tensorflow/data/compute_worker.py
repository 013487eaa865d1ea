"""The compute job's program: `horovodrun -np N python -m horovod.tensorflow.data.compute_worker
CONFIGFILE [--dispatchers D] [--dispatcher-side compute|training] [--timeout S]`.

Rank 0 starts the `ComputeService` and writes CONFIGFILE (the training job reads it); every rank
then serves as a tf.data worker (`compute_worker_fn`) until the training job shuts it down."""

from __future__ import annotations

import argparse

from horovod.common import wire
from horovod.runner.compute_service import ComputeService
from horovod.tensorflow.data.compute_service import TfDataServiceConfig, compute_worker_fn


def main(dispatchers: int, dispatcher_side: str, configfile: str, timeout: int = 60) -> None:
    import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if dispatchers < 1 or size % dispatchers:
        raise ValueError(f"the compute job's {size} processes cannot be split among {dispatchers} dispatchers: "
                         "use a number of dispatchers that divides -np")
    service = None
    try:
        if rank == 0:
            key = wire.new_secret_key()
            service = ComputeService(dispatchers, size // dispatchers, key)
            config = TfDataServiceConfig(dispatchers, size // dispatchers, dispatcher_side, service.addresses(), key,
                                         timeout)
            config.write(configfile)
        else:
            config = TfDataServiceConfig.read(configfile, wait_for_file_creation=True)
        compute_worker_fn(config, timeout)
    finally:
        if service is not None:
            service.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m horovod.tensorflow.data.compute_worker",
                                     description="Serve tf.data to a Horovod training job.")
    parser.add_argument("configfile", help="where to write the compute service's config for the training job")
    parser.add_argument("--dispatchers", type=int, default=1, help="number of tf.data dispatchers (divides -np)")
    parser.add_argument("--dispatcher-side", default="compute", choices=("compute", "training"),
                        help="where the dispatchers run")
    parser.add_argument("--timeout", type=int, default=60, help="seconds to wait for dispatchers and workers")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    main(args.dispatchers, args.dispatcher_side, args.configfile, args.timeout)
