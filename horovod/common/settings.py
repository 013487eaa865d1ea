"""Every knob of the runtime, read once from `HOROVOD_*` variables into a frozen dataclass.

The CLI and the config file only ever set environment variables; this is the one place that
reads them, so a value cannot mean two things in two places.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Mapping

from horovod.common.launcher_env import (TORCH_LAUNCH_VARIABLES, LauncherSlot, TorchLaunch, launcher_sizes,
                                         launcher_slot, torch_launch)

DEFAULT_FUSION_THRESHOLD = 128 * 1024 * 1024
# khorovod extension: how long a peer that went away without closing its connections (host down,
# network cut) may go unnoticed. Five seconds: far above a healthy round trip, even on a loaded
# machine, and well below what a user would wait before suspecting a hang.
DEFAULT_FAILURE_DETECTION_SECONDS = 5.0
DEFAULT_ELASTIC_TIMEOUT = 600.0  # Horovod's defaults for both
DEFAULT_SPARK_START_TIMEOUT = 600.0
#: Set by a horovod.spark task for the worker it starts: the task's GPU addresses (see Settings).
SPARK_TASK_GPUS_ENV = "HOROVOD_SPARK_TASK_GPUS"
SPARK_CONTROL_SECRET_ENV = "_HOROVOD_SPARK_CONTROL_SECRET"
#: Horovod's start and peer (Gloo) timeouts: the least a job waits, whatever its size.
BASE_TIMEOUT_SECONDS = 30.0


def scaled_timeout(ranks: int, hosts: int, base: float = BASE_TIMEOUT_SECONDS) -> float:
    """The default of a timeout that grows with the job: `base` seconds, or 1 s per host plus 0.1 s
    per rank when that is longer (from 64 hosts of 8 ranks on: 116 s). Horovod's fixed 30 s start
    and Gloo timeouts were a known failure from about 50 hosts on: starting and importing on every
    host, and a collective's slowest step, take longer as a job grows."""
    return max(base, float(math.ceil(hosts + ranks / 10)))


def job_scale(topology: "Topology", slot: LauncherSlot | None) -> tuple[int, int]:
    """(ranks, hosts) of the job as this process knows them before it joins: our launcher's
    HOROVOD_SIZE/LOCAL_SIZE, else what mpirun's, srun's or torchrun's variables say."""
    size, local_size = topology.size, topology.local_size
    if size == 1 and slot is not None:
        size, local_size = slot.size, slot.local_size
    return size, -(-size // max(1, local_size))


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first when unset), else ValueError naming the variable and them."""
    raw = env.get(name, "").strip().lower() or choices[0]
    if raw not in choices:
        raise ValueError(f"{name}={raw!r} is not one of {', '.join(choices)}")
    return raw


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return value


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """A non-negative number from `env`, `default` when unset; ValueError naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0")
    return value


def _hex(raw: str, name: str) -> bytes:
    try:
        return bytes.fromhex(raw.strip())
    except ValueError:
        raise ValueError(f"{name} is not hexadecimal (the job's secret, e.g. from `openssl rand -hex 32`)") from None


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    return raw not in ("0", "false", "no", "off")


def detect_bootstrap(env: Mapping[str, str]) -> str:
    """Who started this process, when HOROVOD_BOOTSTRAP does not say: our launcher ("env", its
    HOROVOD_RANK), mpirun/mpiexec ("mpi": Open MPI's OMPI_COMM_WORLD_*, MPICH's and PMIx's PMI_*),
    Slurm's srun (a job step's SLURM_PROCID: "mpi" too, srun's PMIx plugin serves MPI the job), or
    a torch-style launcher ("torchrun": RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; torchrun itself,
    Kubeflow's PyTorchJob). torchrun started by srun or mpirun (its TORCHELASTIC_RUN_ID) is the
    launcher nearest the process, so it wins over theirs. Job scripts then need no change."""
    if env.get("HOROVOD_RANK", "").strip():
        return "env"
    torch_style = all(env.get(name, "").strip() for name in TORCH_LAUNCH_VARIABLES)
    if torch_style and env.get("TORCHELASTIC_RUN_ID", "").strip():
        return "torchrun"
    if any(env.get(name) for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return "mpi"
    if env.get("SLURM_PROCID") and env.get("SLURM_STEP_ID") and env.get("SLURM_NTASKS"):
        return "mpi"
    return "torchrun" if torch_style else "env"


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job: rank, size, and which ranks share its host."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    cross_rank: int = 0
    cross_size: int = 1
    hostname: str = "localhost"

    def variables(self) -> dict[str, str]:
        """The slot variables a worker's environment carries (what `Settings.from_env` reads)."""
        return {"HOROVOD_HOSTNAME": self.hostname, "HOROVOD_RANK": str(self.rank), "HOROVOD_SIZE": str(self.size),
                "HOROVOD_LOCAL_RANK": str(self.local_rank), "HOROVOD_LOCAL_SIZE": str(self.local_size),
                "HOROVOD_CROSS_RANK": str(self.cross_rank), "HOROVOD_CROSS_SIZE": str(self.cross_size)}


@dataclass(frozen=True)
class AutotuneSettings:
    """HOROVOD_AUTOTUNE*: whether the engine tunes its knobs, how it samples, and which knobs the
    user pinned (set explicitly: those are never tuned)."""

    enabled: bool = False
    log_file: str | None = None
    warmup_samples: int = 3
    steps_per_sample: int = 10
    bayes_opt_max_samples: int = 20
    gaussian_process_noise: float = 0.8
    fixed: frozenset[str] = frozenset()  # Tunables field names the user set

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "AutotuneSettings":
        pinned = {"fusion_threshold": "HOROVOD_FUSION_THRESHOLD", "cycle_time_ms": "HOROVOD_CYCLE_TIME",
                  "cache_enabled": "HOROVOD_CACHE_CAPACITY",
                  "hierarchical_allreduce": "HOROVOD_HIERARCHICAL_ALLREDUCE",
                  "hierarchical_allgather": "HOROVOD_HIERARCHICAL_ALLGATHER"}
        noise = env_float(env, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", 0.8)
        if noise > 1.0:
            raise ValueError(f"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE={noise} must be between 0 and 1")
        return cls(
            enabled=_flag(env, "HOROVOD_AUTOTUNE"),
            log_file=env.get("HOROVOD_AUTOTUNE_LOG") or None,
            warmup_samples=_int(env, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", 3),
            steps_per_sample=max(1, _int(env, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", 10)),
            bayes_opt_max_samples=max(1, _int(env, "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 20)),
            gaussian_process_noise=noise,
            fixed=frozenset(name for name, var in pinned.items() if env.get(var, "").strip()),
        )


GPU_OPERATION_NAMES = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")


@dataclass(frozen=True)
class GpuOperations:
    """Per collective, which transport moves device memory: "nccl" or "host"."""

    allreduce: str = "nccl"
    allgather: str = "nccl"
    broadcast: str = "nccl"
    alltoall: str = "nccl"
    reducescatter: str = "nccl"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "GpuOperations":
        every = (env.get("HOROVOD_GPU_OPERATIONS") or "nccl").strip().lower()
        chosen = {op: (env.get(f"HOROVOD_GPU_{op.upper()}") or every).strip().lower() for op in GPU_OPERATION_NAMES}
        return cls(**{op: "nccl" if value == "nccl" else "host" for op, value in chosen.items()})


@dataclass(frozen=True)
class Settings:
    # From `from_env`: the slot as the launcher's HOROVOD_* variables describe it (what the `env`
    # bootstrap uses). In the runtime's settings: the slot the bootstrap assigned for this round.
    topology: Topology = field(default_factory=Topology)
    # Who assigns this process its slot (`horovod.common.bootstrap`): "env", our launcher's
    # variables; "store", the round plan the launcher side publishes in the rendezvous store;
    # "mpi", the MPI library of a job mpirun or srun started; "torchrun", the variables of a
    # torch-style launcher (`detect_bootstrap`).
    bootstrap: str = "env"
    rendezvous_addr: str | None = None
    rendezvous_port: int | None = None
    secret_key: bytes | None = None
    # khorovod extension (HOROVOD_SECRET_KEY_FILE): a file holding the job's secret, the same on every
    # host (a mounted Kubernetes Secret), for jobs our launcher did not start (`bootstrap.torchrun`).
    secret_key_file: str | None = None
    fusion_threshold: int = DEFAULT_FUSION_THRESHOLD
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    hierarchical_allreduce: bool | None = None
    hierarchical_allgather: bool | None = None
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time_seconds: float = 60.0
    stall_shutdown_time_seconds: float = 0.0
    log_level: str = "warning"
    log_hide_time: bool = False
    dynamic_process_sets: bool = False
    elastic: bool = False
    cpu_operations: str = "auto"
    # Which transport takes each collective on device (CUDA) memory: "nccl" (the default), or
    # "host" (staged through host memory to the CPU transport). HOROVOD_GPU_OPERATIONS sets all,
    # HOROVOD_GPU_ALLREDUCE and its siblings one each; Horovod's MPI/DDL/CCL values mean "host".
    gpu_operations: GpuOperations = field(default_factory=lambda: GpuOperations())
    # Where libnccl.so.2 is, when not where the GPU frameworks installed it (HOROVOD_NCCL_LIB: the
    # file; HOROVOD_NCCL_HOME: the folder holding lib/).
    nccl_lib: str | None = None
    # NCCL's own variables that decide whether two ranks of one host may share a GPU (we report
    # such a pair clearly, before NCCL would): NCCL_HOSTID and NCCL_MULTI_RANK_GPU_ENABLE.
    nccl_hostid: str = ""
    nccl_multi_rank_gpu: bool = False
    # khorovod extension (HOROVOD_CPU_BINDING=0 to turn off): each rank of a host on its own share
    # of the cores, where nobody placed the processes already (transport/shm/placement.py).
    cpu_binding: bool = True
    # khorovod extension (HOROVOD_SHM_STAGING): how a large two-rank allreduce in shared memory
    # stages its pieces: "auto" (measured per rank, transport/shm/staging.py), "slots" (the small
    # staging slots) or "ring" (a ring larger than the cache, in the fusion region).
    shm_staging: str = "auto"
    # khorovod extension (HOROVOD_TF_OVERLAP_BACKWARD): inside a tf.function, submit each gradient's
    # allreduce as soon as backward has produced it (tensorflow/backward_overlap.py). None (unset):
    # where a rank has two cores of its own or more, as the torch hooks decide.
    tf_overlap_backward: bool | None = None
    # khorovod extension (HOROVOD_TORCH_OVERLAP_BACKWARD): DistributedOptimizer submits each bucket
    # from its hook as soon as it is ready (1), or all at step() (0). None (unset): by cores_per_rank.
    torch_overlap_backward: bool | None = None
    start_timeout: float = BASE_TIMEOUT_SECONDS  # HOROVOD_START_TIMEOUT, else scaled_timeout
    # Driver side: how long an elastic job may stay below --min-np (HOROVOD_ELASTIC_TIMEOUT), and how
    # long horovod.spark.run waits for its tasks to start (HOROVOD_SPARK_START_TIMEOUT).
    elastic_timeout: float = DEFAULT_ELASTIC_TIMEOUT
    spark_start_timeout: float = DEFAULT_SPARK_START_TIMEOUT
    # Worker side, under horovod.spark: the GPU addresses Spark's resource scheduling gave the task
    # hosting this worker (HOROVOD_SPARK_TASK_GPUS, comma-separated, set by that task).
    spark_task_gpus: tuple[str, ...] = ()
    # mpirun's agent under horovod.spark.run(use_mpi=True): the driver's control store secret (hex,
    # SPARK_CONTROL_SECRET_ENV), kept off the agent's command line.
    spark_control_secret_hex: str | None = None
    # How long a peer may stay silent in the middle of a collective before we call it hung.
    peer_timeout_seconds: float = BASE_TIMEOUT_SECONDS  # HOROVOD_GLOO_TIMEOUT_SECONDS, else scaled_timeout
    # How long a peer whose host stopped answering may go unnoticed (0: the kernel's defaults).
    failure_detection_seconds: float = DEFAULT_FAILURE_DETECTION_SECONDS
    iface: str | None = None
    autotune: AutotuneSettings = field(default_factory=AutotuneSettings)
    # Tasks of the Slurm job step this process belongs to (SLURM_NTASKS; 0 outside srun).
    slurm_tasks: int = 0
    # The slot mpirun's or srun's own variables give (`launcher_env`): the mpi bootstrap's answer
    # where mpi4py is not installed.
    launcher_slot: LauncherSlot | None = None
    # What torchrun, Kubeflow's PyTorchJob or JobSet tell the process (RANK, WORLD_SIZE, MASTER_*):
    # the torchrun bootstrap's slot and meeting point.
    torch_launch: TorchLaunch | None = None
    # Which launcher variables say the job has several processes (`launcher_env.launcher_sizes`):
    # `init()` refuses to run alone against them. Empty when our launcher set HOROVOD_SIZE: it knows.
    launcher_sizes: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        topology = Topology(
            rank=_int(env, "HOROVOD_RANK", 0),
            size=max(1, _int(env, "HOROVOD_SIZE", 1)),
            local_rank=_int(env, "HOROVOD_LOCAL_RANK", 0),
            local_size=max(1, _int(env, "HOROVOD_LOCAL_SIZE", 1)),
            cross_rank=_int(env, "HOROVOD_CROSS_RANK", 0),
            cross_size=max(1, _int(env, "HOROVOD_CROSS_SIZE", 1)),
            hostname=env.get("HOROVOD_HOSTNAME", "localhost") or "localhost",
        )
        if topology.rank >= topology.size:
            raise ValueError(f"HOROVOD_RANK={topology.rank} must be < HOROVOD_SIZE={topology.size}")
        port = env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        key_hex = env.get("_HOROVOD_SECRET_KEY")
        level = env.get("HOROVOD_LOG_LEVEL", "warning").strip().lower() or "warning"
        if level not in ("trace", "debug", "info", "warning", "error", "fatal"):
            level = "warning"

        def tristate(name: str) -> bool | None:
            return _flag(env, name) if env.get(name, "").strip() else None

        bootstrap = (env.get("HOROVOD_BOOTSTRAP") or detect_bootstrap(env)).strip().lower()
        torch = torch_launch(env) if bootstrap == "torchrun" else None
        slot = launcher_slot(env)
        default_timeout = scaled_timeout(*job_scale(topology, torch.slot if torch is not None else slot))
        return cls(
            topology=topology,
            bootstrap=bootstrap,
            rendezvous_addr=env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR") or None,
            rendezvous_port=int(port) if port else None,
            secret_key=_hex(key_hex, "_HOROVOD_SECRET_KEY") if key_hex else None,
            secret_key_file=env.get("HOROVOD_SECRET_KEY_FILE") or None,
            fusion_threshold=_int(env, "HOROVOD_FUSION_THRESHOLD", DEFAULT_FUSION_THRESHOLD),
            cycle_time_ms=env_float(env, "HOROVOD_CYCLE_TIME", 1.0),
            cache_capacity=_int(env, "HOROVOD_CACHE_CAPACITY", 1024),
            hierarchical_allreduce=tristate("HOROVOD_HIERARCHICAL_ALLREDUCE"),
            hierarchical_allgather=tristate("HOROVOD_HIERARCHICAL_ALLGATHER"),
            timeline=env.get("HOROVOD_TIMELINE") or None,
            timeline_mark_cycles=_flag(env, "HOROVOD_TIMELINE_MARK_CYCLES"),
            stall_check_disable=_flag(env, "HOROVOD_STALL_CHECK_DISABLE"),
            stall_check_time_seconds=env_float(env, "HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0),
            stall_shutdown_time_seconds=env_float(env, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0),
            log_level=level,
            log_hide_time=_flag(env, "HOROVOD_LOG_HIDE_TIME"),
            dynamic_process_sets=_flag(env, "HOROVOD_DYNAMIC_PROCESS_SETS"),
            elastic=_flag(env, "HOROVOD_ELASTIC"),
            cpu_operations=(env.get("HOROVOD_CPU_OPERATIONS") or "auto").strip().lower(),
            gpu_operations=GpuOperations.from_env(env),
            nccl_lib=env.get("HOROVOD_NCCL_LIB") or env.get("HOROVOD_NCCL_HOME") or None,
            nccl_hostid=env.get("NCCL_HOSTID", ""),
            nccl_multi_rank_gpu=env.get("NCCL_MULTI_RANK_GPU_ENABLE", "") == "1",
            cpu_binding=_flag(env, "HOROVOD_CPU_BINDING", True),
            shm_staging=_choice(env, "HOROVOD_SHM_STAGING", ("auto", "slots", "ring")),
            tf_overlap_backward=tristate("HOROVOD_TF_OVERLAP_BACKWARD"),
            torch_overlap_backward=tristate("HOROVOD_TORCH_OVERLAP_BACKWARD"),
            start_timeout=env_float(env, "HOROVOD_START_TIMEOUT", default_timeout),
            elastic_timeout=env_float(env, "HOROVOD_ELASTIC_TIMEOUT", DEFAULT_ELASTIC_TIMEOUT),
            spark_start_timeout=env_float(env, "HOROVOD_SPARK_START_TIMEOUT", DEFAULT_SPARK_START_TIMEOUT),
            spark_control_secret_hex=env.get(SPARK_CONTROL_SECRET_ENV) or None,
            spark_task_gpus=tuple(a.strip() for a in env.get(SPARK_TASK_GPUS_ENV, "").split(",") if a.strip()),
            peer_timeout_seconds=env_float(env, "HOROVOD_GLOO_TIMEOUT_SECONDS", default_timeout),
            failure_detection_seconds=env_float(env, "HOROVOD_FAILURE_DETECTION_SECONDS",
                                                DEFAULT_FAILURE_DETECTION_SECONDS),
            iface=env.get("HOROVOD_GLOO_IFACE") or None,
            autotune=AutotuneSettings.from_env(env),
            slurm_tasks=_int(env, "SLURM_NTASKS", 0) if env.get("SLURM_STEP_ID") else 0,
            launcher_slot=slot,
            torch_launch=torch,
            launcher_sizes=() if env.get("HOROVOD_SIZE", "").strip() else launcher_sizes(env),
        )
