"""Tuning flags -> `HOROVOD_*` environment variables, the only way settings reach the workers.

Workers read their settings once, from the environment (`horovod.common.settings`), so the
launcher's whole job here is a faithful translation. Only flags the user actually gave (on the
command line or in the config file) produce a variable; anything else stays unset so the core's
own default applies, and a variable already exported in the launcher's shell passes through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

_MIB = 1024 * 1024


def _number(value: Any) -> str:
    """Render a number the way a worker parses it back (`3`, not `3.0`, for whole values)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _switch(value: Any) -> str:
    return "1" if value else "0"


@dataclass(frozen=True)
class _Knob:
    """One flag (its argparse dest) and the variable it sets."""

    dest: str
    env: str
    render: Callable[[Any], str] = _number
    non_negative: bool = True


_KNOBS = (
    _Knob("fusion_threshold_mb", "HOROVOD_FUSION_THRESHOLD", lambda v: str(int(v * _MIB))),
    _Knob("cycle_time_ms", "HOROVOD_CYCLE_TIME"),
    _Knob("cache_capacity", "HOROVOD_CACHE_CAPACITY"),
    _Knob("hierarchical_allreduce", "HOROVOD_HIERARCHICAL_ALLREDUCE", _switch, False),
    _Knob("hierarchical_allgather", "HOROVOD_HIERARCHICAL_ALLGATHER", _switch, False),
    _Knob("torus_allreduce", "HOROVOD_TORUS_ALLREDUCE", _switch, False),
    _Knob("timeline_filename", "HOROVOD_TIMELINE", str, False),
    _Knob("no_stall_check", "HOROVOD_STALL_CHECK_DISABLE", _switch, False),
    _Knob("stall_check_warning_time_seconds", "HOROVOD_STALL_CHECK_TIME_SECONDS"),
    _Knob("stall_check_shutdown_time_seconds", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"),
    _Knob("mpi_threads_disable", "HOROVOD_MPI_THREADS_DISABLE", _switch, False),
    _Knob("num_nccl_streams", "HOROVOD_NUM_NCCL_STREAMS"),
    _Knob("gloo_timeout_seconds", "HOROVOD_GLOO_TIMEOUT_SECONDS"),
    _Knob("start_timeout", "HOROVOD_START_TIMEOUT"),
    _Knob("log_level", "HOROVOD_LOG_LEVEL", str, False),
    # The flag is `--log-without-timestamp` (stores False), the variable says "hide".
    _Knob("log_with_timestamp", "HOROVOD_LOG_HIDE_TIME", lambda v: _switch(not v), False),
)

# Exported only when autotuning is switched on, as Horovod does.
_AUTOTUNE_KNOBS = (
    _Knob("autotune_log_file", "HOROVOD_AUTOTUNE_LOG", str, False),
    _Knob("autotune_warmup_samples", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"),
    _Knob("autotune_steps_per_sample", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE"),
    _Knob("autotune_bayes_opt_max_samples", "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"),
    _Knob("autotune_gaussian_process_noise", "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"),
)


def _export(args: Any, knobs: tuple[_Knob, ...], env: dict[str, str]) -> None:
    for knob in knobs:
        value = getattr(args, knob.dest, None)
        if value is None:
            continue
        if knob.non_negative and value < 0:
            raise ValueError(f"{knob.dest}={value} must be >= 0")
        env[knob.env] = knob.render(value)


def _thread_affinity(value: Any) -> str:
    cores = [part.strip() for part in str(value).split(",")]
    if not all(core.isdigit() for core in cores):
        raise ValueError(
            f"thread_affinity={value} must be >= 0: one non-negative core id, or a comma-separated "
            "list with one core id per local rank"
        )
    return ",".join(cores)


def validate(args: Any) -> None:
    """Raise ValueError for any out-of-range tuning value, before anything is launched."""
    horovod_env(args)


def horovod_env(args: Any) -> dict[str, str]:
    """Map the tuning attributes of `args` (argparse dests) to environment variables."""
    env: dict[str, str] = {}
    _export(args, _KNOBS, env)
    if getattr(args, "timeline_mark_cycles", None) is not None and env.get("HOROVOD_TIMELINE"):
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = _switch(args.timeline_mark_cycles)
    if getattr(args, "autotune", None) is not None:
        env["HOROVOD_AUTOTUNE"] = _switch(args.autotune)
    tuning: dict[str, str] = {}
    _export(args, _AUTOTUNE_KNOBS, tuning)  # validated even when autotune is off
    noise = getattr(args, "autotune_gaussian_process_noise", None)
    if noise is not None and noise > 1.0:
        raise ValueError(f"autotune_gaussian_process_noise={noise} must be between 0 and 1")
    if getattr(args, "autotune", None):
        env.update(tuning)
    affinity = getattr(args, "thread_affinity", None)
    if affinity is not None:
        env["HOROVOD_THREAD_AFFINITY"] = _thread_affinity(affinity)
    if getattr(args, "tcp_flag", None):
        env["NCCL_IB_DISABLE"] = "1"
    nics = getattr(args, "nics", None)
    if nics:
        env["HOROVOD_GLOO_IFACE"] = ",".join(nics)
        env["NCCL_SOCKET_IFNAME"] = ",".join(nics)
    return env
