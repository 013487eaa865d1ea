"""CLI tuning flags -> HOROVOD_* variables (Horovod's mapping), checked on parsed command lines."""

from __future__ import annotations

import argparse

import pytest

from horovod.common.settings import Settings
from horovod.runner import env_builder
from horovod.runner.launch import default_args, parse_args

pytestmark = pytest.mark.timeout(30)


def env_for(*flags: str) -> dict[str, str]:
    return env_builder.horovod_env(parse_args(["-np", "1", *flags, "python", "x.py"]))


def test_no_flags_no_variables():
    assert env_builder.horovod_env(default_args()) == {}
    assert env_for() == {}


@pytest.mark.parametrize("flags, expected", [
    (["--fusion-threshold-mb", "32"], {"HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024)}),
    (["--fusion-threshold-mb", "0"], {"HOROVOD_FUSION_THRESHOLD": "0"}),
    (["--cycle-time-ms", "2.5"], {"HOROVOD_CYCLE_TIME": "2.5"}),
    (["--cycle-time-ms", "3"], {"HOROVOD_CYCLE_TIME": "3"}),
    (["--cache-capacity", "0"], {"HOROVOD_CACHE_CAPACITY": "0"}),
    (["--hierarchical-allreduce"], {"HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}),
    (["--no-hierarchical-allreduce"], {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}),
    (["--hierarchical-allgather"], {"HOROVOD_HIERARCHICAL_ALLGATHER": "1"}),
    (["--no-hierarchical-allgather"], {"HOROVOD_HIERARCHICAL_ALLGATHER": "0"}),
    (["--torus-allreduce"], {"HOROVOD_TORUS_ALLREDUCE": "1"}),
    (["--timeline-filename", "/tmp/t.json"], {"HOROVOD_TIMELINE": "/tmp/t.json"}),
    (["--timeline-filename", "t.json", "--timeline-mark-cycles"],
     {"HOROVOD_TIMELINE": "t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1"}),
    (["--timeline-mark-cycles"], {}),  # only exported together with a timeline file
    (["--no-stall-check"], {"HOROVOD_STALL_CHECK_DISABLE": "1"}),
    (["--stall-check"], {"HOROVOD_STALL_CHECK_DISABLE": "0"}),
    (["--stall-check-warning-time-seconds", "120"], {"HOROVOD_STALL_CHECK_TIME_SECONDS": "120"}),
    (["--stall-check-shutdown-time-seconds", "300"], {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "300"}),
    (["--log-level", "DEBUG"], {"HOROVOD_LOG_LEVEL": "DEBUG"}),
    (["--log-without-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "1"}),
    (["--log-hide-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "1"}),
    (["--log-with-timestamp"], {"HOROVOD_LOG_HIDE_TIME": "0"}),
    (["--start-timeout", "90"], {"HOROVOD_START_TIMEOUT": "90"}),
    (["--gloo-timeout-seconds", "45"], {"HOROVOD_GLOO_TIMEOUT_SECONDS": "45"}),
    (["--num-nccl-streams", "2"], {"HOROVOD_NUM_NCCL_STREAMS": "2"}),
    (["--thread-affinity", "0,2"], {"HOROVOD_THREAD_AFFINITY": "0,2"}),
    (["--mpi-threads-disable"], {"HOROVOD_MPI_THREADS_DISABLE": "1"}),
    (["--tcp"], {"NCCL_IB_DISABLE": "1"}),
    (["--network-interfaces", "eth0,eth1"], {"HOROVOD_GLOO_IFACE": "eth0,eth1", "NCCL_SOCKET_IFNAME": "eth0,eth1"}),
    (["--network-interface", "ib0", "--network-interface", "eth0"],
     {"HOROVOD_GLOO_IFACE": "ib0,eth0", "NCCL_SOCKET_IFNAME": "ib0,eth0"}),
    (["--no-autotune"], {"HOROVOD_AUTOTUNE": "0"}),
])
def test_flag_mapping(flags, expected):
    assert env_for(*flags) == expected


def test_autotune_knobs_only_exported_with_autotune():
    knobs = ["--autotune-log-file", "tune.csv", "--autotune-warmup-samples", "5",
             "--autotune-steps-per-sample", "7", "--autotune-bayes-opt-max-samples", "30",
             "--autotune-gaussian-process-noise", "0.5"]
    assert env_for(*knobs) == {}
    assert env_for("--autotune", *knobs) == {
        "HOROVOD_AUTOTUNE": "1",
        "HOROVOD_AUTOTUNE_LOG": "tune.csv",
        "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "5",
        "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "7",
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "30",
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5",
    }


@pytest.mark.parametrize("dest, value", [
    ("fusion_threshold_mb", -1), ("cycle_time_ms", -0.5), ("cache_capacity", -3),
    ("stall_check_warning_time_seconds", -1), ("stall_check_shutdown_time_seconds", -2),
    ("num_nccl_streams", -1), ("gloo_timeout_seconds", -10), ("start_timeout", -1),
    ("autotune_warmup_samples", -1), ("autotune_steps_per_sample", -1),
    ("autotune_bayes_opt_max_samples", -1), ("autotune_gaussian_process_noise", -0.1),
])
def test_negative_values_are_refused(dest, value):
    args = argparse.Namespace(**{dest: value})
    with pytest.raises(ValueError) as info:
        env_builder.horovod_env(args)
    assert str(info.value) == f"{dest}={value} must be >= 0"


def test_gaussian_noise_above_one_is_refused():
    with pytest.raises(ValueError, match="between 0 and 1"):
        env_builder.horovod_env(argparse.Namespace(autotune=True, autotune_gaussian_process_noise=1.5))


@pytest.mark.parametrize("affinity", ["-1", "0,x", "a"])
def test_bad_thread_affinity(affinity):
    with pytest.raises(ValueError, match="thread_affinity"):
        env_builder.horovod_env(argparse.Namespace(thread_affinity=affinity))


def test_workers_read_back_what_the_launcher_exports():
    env = env_for("--fusion-threshold-mb", "4", "--cycle-time-ms", "0.5", "--cache-capacity", "16",
                  "--no-stall-check", "--timeline-filename", "t.json", "--timeline-mark-cycles",
                  "--log-level", "INFO", "--log-without-timestamp", "--hierarchical-allreduce",
                  "--start-timeout", "12", "--gloo-timeout-seconds", "9")
    settings = Settings.from_env(env)
    assert settings.fusion_threshold == 4 * 1024 * 1024
    assert settings.cycle_time_ms == 0.5
    assert settings.cache_capacity == 16
    assert settings.stall_check_disable
    assert settings.timeline == "t.json" and settings.timeline_mark_cycles
    assert settings.log_level == "info" and settings.log_hide_time
    assert settings.hierarchical_allreduce is True
    assert settings.start_timeout == 12 and settings.peer_timeout_seconds == 9
