"""Flags accepted for Horovod's sake that do nothing here: --help says so and each warns once."""

from __future__ import annotations

import logging

import pytest

from horovod.runner import noop_flags
from horovod.runner.launch import make_parser, parse_args
from runner_helpers import horovodrun

pytestmark = pytest.mark.timeout(30)

ACTIONS = {flag: action for action in make_parser()._actions for flag in action.option_strings}
# A value each valued flag accepts.
VALUES = {int: "2", float: "0.5", None: "0"}


def flag_argv(flag: str) -> list[str]:
    action = ACTIONS[flag]
    return [flag] if action.nargs == 0 else [flag, VALUES[action.type]]


def warnings_for(caplog: pytest.LogCaptureFixture, *argv: str) -> list[str]:
    args = parse_args(["-np", "1", *argv, "true"])
    with caplog.at_level(logging.WARNING, logger="horovod.runner"):
        noop_flags.warn_noop_flags(args)
    return [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("flag", [noop.flag for noop in noop_flags.NOOP_FLAGS])
def test_each_noop_flag_warns_once_naming_itself(caplog, flag):
    argv = flag_argv(flag)
    messages = warnings_for(caplog, *argv, *argv)  # given twice: still one warning
    assert len(messages) == 1, messages
    assert messages[0].startswith(flag + " ") and "has no effect here" in messages[0]


@pytest.mark.parametrize("flag", [noop.flag for noop in noop_flags.NOOP_FLAGS])
def test_help_says_the_flag_has_no_effect(flag):
    assert ACTIONS[flag].help.startswith("Accepted, but has no effect here yet")


def test_flags_that_work_do_not_warn(caplog):
    working = ["--fusion-threshold-mb", "8", "--cycle-time-ms", "2", "--cache-capacity", "16",
               "--hierarchical-allreduce", "--hierarchical-allgather", "--timeline-filename", "t.json",
               "--timeline-mark-cycles", "--no-stall-check", "--stall-check-warning-time-seconds", "9",
               "--stall-check-shutdown-time-seconds", "20", "--gloo-timeout-seconds", "5",
               "--log-level", "INFO", "--log-without-timestamp", "--start-timeout", "9", "--verbose",
               "--output-filename", "out", "-prefix-timestamp", "--network-interfaces", "lo",
               "--autotune", "--autotune-log-file", "tune.csv", "--autotune-warmup-samples", "1",
               "--autotune-steps-per-sample", "2", "--autotune-bayes-opt-max-samples", "5",
               "--autotune-gaussian-process-noise", "0.5",
               # Switching a missing feature off asks for nothing that is missing.
               "--no-torus-allreduce"]
    assert warnings_for(caplog, *working) == []
    for flag in working:
        if flag.startswith("-") and flag != "--no-torus-allreduce":
            assert "no effect" not in (ACTIONS[flag].help or ""), flag


def test_config_file_keys_warn_naming_flag_and_key(caplog, tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("autotune:\n  enabled: true\nlibrary_options:\n  num_nccl_streams: 2\n"
                    "  gloo_timeout_seconds: 5\n")
    messages = warnings_for(caplog, "--config-file", str(path), "--autotune")
    assert sorted(messages) == [  # autotune works: only the NCCL key warns
        "--num-nccl-streams (or library_options.num_nccl_streams in a config file) is accepted but has "
        "no effect here: the NCCL path queues its work on one stream per rank",
    ]


def test_horovodrun_warns_once_per_flag_and_still_runs(tmp_path):
    path = tmp_path / "h.yaml"
    path.write_text("library_options:\n  thread_affinity: '0'\n")
    proc = horovodrun("-np", "1", "--torus-allreduce", "--torus-allreduce", "--mpi-threads-disable", "--config-file", str(path),
                      "--fusion-threshold-mb", "8", "true", timeout=30)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--torus-allreduce", "--mpi-threads-disable", "--thread-affinity"):
        assert proc.stderr.count(f"{flag} ") == 1, proc.stderr
    assert proc.stderr.count("has no effect here") == 3 and "fusion" not in proc.stderr
