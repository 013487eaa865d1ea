"""Keras `fit` throughput on CPU: khorovod against tf.distribute.MultiWorkerMirroredStrategy.

    python benchmarks/keras_training.py --jobs 10
    python benchmarks/keras_training.py --jobs 6 --variant overlap=HOROVOD_TF_OVERLAP_BACKWARD=1 --variant one-node=HOROVOD_TF_OVERLAP_BACKWARD=0
    python benchmarks/keras_training.py --quick

One job is three fresh runs of the same model on the same data, each `model.fit` with the same
batch per worker: khorovod (2 ranks via horovodrun, `hvd.DistributedOptimizer`), MWMS (2 worker
processes, TF_CONFIG on loopback ports, TensorFlow's own collectives), and one process alone (no
communication: what a worker would do if the other did not exist). The order of the three
rotates from job to job, so a busy moment of the shared machine hits each in turn. Every run
fits once untimed (tracing, first allocations), then `--epochs` epochs of `--steps` steps, each
epoch timed on rank 0; a run's figure is its median epoch, in samples per second over all
workers. Each job's line also says how many cores the rest of the machine kept busy meanwhile
and the memory bandwidth of one core just before (as `fresh_jobs.py` does), to tell a job the
machine slowed from one slow by itself. With `--variant NAME=VAR=VALUE,...` (repeated) the
khorovod run is made once per variant, with those variables.

All three run tf_keras (Keras 2, `TF_USE_LEGACY_KERAS=1`): Keras 3's `fit` does not run under
MultiWorkerMirroredStrategy (keras-team/keras#20585). Every worker has one intra-op thread and
two inter-op threads: 2 workers on this 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fresh_jobs import children_seconds, copy_gbps, cpu_seconds, parse_variant

HERE = Path(__file__).resolve()
SYSTEMS = ("khorovod", "mwms", "alone")
WORKER_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0",
              "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


# -- one worker ------------------------------------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """Train as `args.worker` says; rank 0 writes its per-epoch samples/s to `args.out`."""
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    keras = tf.keras  # tf_keras: the parent sets TF_USE_LEGACY_KERAS=1
    if not keras.__name__.startswith("tf_keras"):
        raise SystemExit("this benchmark needs tf_keras: pip install --no-deps \"tf_keras~=<your TensorFlow's x.y>.0\"")

    strategy, wrap = tf.distribute.get_strategy(), lambda opt: opt
    if args.worker == "khorovod":
        import horovod.tensorflow.keras as hvd

        hvd.init()
        rank, size, wrap = hvd.rank(), hvd.size(), hvd.DistributedOptimizer
    elif args.worker == "mwms":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank, size = json.loads(os.environ["TF_CONFIG"])["task"]["index"], strategy.num_replicas_in_sync
    else:
        rank, size = 0, 1

    rng = np.random.default_rng(rank)  # each worker its own data, as a sharded data set gives it
    x = rng.normal(size=(args.steps * args.batch_size, args.features)).astype("float32")
    y = rng.integers(0, 10, size=len(x)).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    if args.worker == "mwms":  # MWMS takes global batches and gives each worker its share of one
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        data = data.batch(args.batch_size * size).with_options(options)
    else:
        data = data.batch(args.batch_size)

    with strategy.scope():
        keras.utils.set_random_seed(0)
        layers = [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        model = keras.Sequential([keras.Input((args.features,)), *layers, keras.layers.Dense(10)])
        model.compile(optimizer=wrap(keras.optimizers.SGD(0.01, momentum=0.9)),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class EpochTimes(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float] = []

        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: object = None) -> None:
            self.seconds.append(time.perf_counter() - self.start)

    model.fit(data, epochs=1, steps_per_epoch=args.warmup, verbose=0)
    timer = EpochTimes()
    model.fit(data, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0, callbacks=[timer])
    if rank == 0:
        samples = args.steps * args.batch_size * size
        Path(args.out).write_text(json.dumps({"rates": [samples / s for s in timer.seconds], "workers": size,
                                              "parameters": model.count_params()}))


# -- one job: three fresh runs ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(system: str, worker_args: list[str], env: dict[str, str], timeout: float) -> dict:
    """Start `system`'s processes, wait for them, return rank 0's report and the run's conditions."""
    copy = copy_gbps()
    start, (busy, _), ours = time.perf_counter(), cpu_seconds(), children_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rates.json"
        me = [sys.executable, str(HERE), "--worker", system.split(":")[0], "--out", str(out), *worker_args]
        base = {**os.environ, **WORKER_ENV, **env}
        if system.startswith("khorovod"):
            commands = [([sys.executable, "-m", "horovod.runner.launch", "-np", "2", *me], base)]
        elif system == "mwms":
            cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
            commands = [(me, {**base, "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                                             "index": i}})})
                        for i in range(2)]
        else:
            commands = [(me, base)]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=e)
                 for cmd, e in commands]
        try:
            outputs = [p.communicate(timeout=timeout)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode for p in procs) or not out.exists():
            raise RuntimeError(f"{system} run failed:\n" + "\n".join(o[-3000:] for o in outputs))
        report = json.loads(out.read_text())
    wall, (busy_end, _) = time.perf_counter() - start, cpu_seconds()
    report["others"] = max((busy_end - busy - (children_seconds() - ours)) / wall, 0.0)
    report["copy"] = copy
    report["median"] = statistics.median(report["rates"])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed epoch")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=7, help="hidden layers")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE,...",
                        help="a variant of khorovod's environment, each run in every job")
    parser.add_argument("--quick", action="store_true", help="one short job on a small model: a check, not a timing")
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.steps, args.epochs, args.warmup, args.width, args.layers = 1, 3, 2, 1, 64, 2
    if args.worker:
        worker(args)
        return
    worker_args = ["--steps", str(args.steps), "--epochs", str(args.epochs), "--warmup", str(args.warmup),
                   "--batch-size", str(args.batch_size), "--features", str(args.features), "--width",
                   str(args.width), "--layers", str(args.layers)]
    variants = dict(parse_variant(v) for v in args.variant) or {"": {}}
    systems = [f"khorovod:{name}" if name else "khorovod" for name in variants] + ["mwms", "alone"]
    envs = {f"khorovod:{name}" if name else "khorovod": env for name, env in variants.items()}
    load = [os.getloadavg()[0]]
    jobs = []
    for i in range(args.jobs):
        order = systems[i % len(systems):] + systems[:i % len(systems)]
        job = {s: one_run(s, worker_args, envs.get(s, {}), timeout=600) for s in order}
        jobs.append(job)
        print(job_line(i, job, systems), flush=True)
    load.append(os.getloadavg()[0])
    report(jobs, systems, args, load)


def job_line(i: int, job: dict, systems: list[str]) -> str:
    rates = ", ".join(f"{s} {job[s]['median']:.0f}" for s in systems)
    ratios = ", ".join(f"{s}/mwms {job[s]['median'] / job['mwms']['median']:.2f}x" for s in systems
                       if s.startswith("khorovod"))
    conditions = ", ".join(f"{s} {job[s]['others']:.2f}" for s in systems)
    return (f"job {i:2d}: samples/s {rates}; {ratios}; cores others kept busy: {conditions}; "
            f"copy {min(job[s]['copy'] for s in systems):.1f} GB/s")


def report(jobs: list[dict], systems: list[str], args: argparse.Namespace, load: list[float]) -> None:
    first = jobs[0][systems[0]]
    print(f"\n{len(jobs)} jobs; model: {args.layers} x Dense({args.width}) + Dense(10) on {args.features} features "
          f"({first['parameters'] / 1e6:.1f} M parameters), batch {args.batch_size} per worker, 2 workers; "
          f"{args.epochs} timed epochs of {args.steps} steps per run; load average {load[0]:.1f} -> {load[1]:.1f}")
    print("\n| job | " + " | ".join(f"{s} samples/s" for s in systems) + " | "
          + " | ".join(f"{s} / mwms" for s in systems if s.startswith("khorovod")) + " |")
    print("|---:|" + "---:|" * (len(systems) + sum(s.startswith("khorovod") for s in systems)))
    for i, job in enumerate(jobs):
        print(f"| {i} | " + " | ".join(f"{job[s]['median']:.0f}" for s in systems) + " | "
              + " | ".join(f"{job[s]['median'] / job['mwms']['median']:.2f}x" for s in systems
                           if s.startswith("khorovod")) + " |")
    for s in systems:
        if s.startswith("khorovod"):
            ratios = sorted(job[s]["median"] / job["mwms"]["median"] for job in jobs)
            alone = statistics.median(job[s]["median"] / job["alone"]["median"] for job in jobs)
            print(f"\n{s} / mwms over the jobs: min {ratios[0]:.2f}x, median {statistics.median(ratios):.2f}x, "
                  f"max {ratios[-1]:.2f}x; {s} / alone: median {alone:.2f}x")


if __name__ == "__main__":
    main()
