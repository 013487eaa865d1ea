"""`--config-file`: YAML sections map to flags; flags given on the command line win."""

from __future__ import annotations

import logging
import textwrap

import pytest

from horovod.runner import config_file, env_builder
from horovod.runner.launch import parse_args

pytestmark = pytest.mark.timeout(30)

FULL = textwrap.dedent("""\
    controller: gloo
    params:
      fusion_threshold_mb: 32
      cycle_time_ms: 10
      cache_capacity: 2048
      hierarchical_allreduce: true
      hierarchical_allgather: false
      torus_allreduce: false
    autotune:
      enabled: true
      log_file: tune.csv
      warmup_samples: 4
      steps_per_sample: 12
      bayes_opt_max_samples: 25
      gaussian_process_noise: 0.7
    timeline:
      filename: timeline.json
      mark_cycles: true
    stall_check:
      enabled: false
      warning_time_seconds: 90
      shutdown_time_seconds: 300
    library_options:
      mpi_threads_disable: true
      num_nccl_streams: 2
      thread_affinity: "0,1"
      gloo_timeout_seconds: 40
    logging:
      level: DEBUG
      with_timestamp: false
    """)


@pytest.fixture
def config(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "horovod.yaml"
        path.write_text(text)
        return str(path)
    return write


def test_every_key_sets_its_flag(config):
    args = parse_args(["-np", "2", "--config-file", config(FULL), "python", "train.py"])
    assert (args.fusion_threshold_mb, args.cycle_time_ms, args.cache_capacity) == (32, 10, 2048)
    assert args.hierarchical_allreduce is True and args.hierarchical_allgather is False
    assert args.autotune is True and args.autotune_log_file == "tune.csv"
    assert (args.autotune_warmup_samples, args.autotune_steps_per_sample,
            args.autotune_bayes_opt_max_samples, args.autotune_gaussian_process_noise) == (4, 12, 25, 0.7)
    assert args.timeline_filename == "timeline.json" and args.timeline_mark_cycles is True
    assert args.no_stall_check is True  # enabled: false
    assert (args.stall_check_warning_time_seconds, args.stall_check_shutdown_time_seconds) == (90, 300)
    assert args.mpi_threads_disable is True and args.num_nccl_streams == 2
    assert args.thread_affinity == "0,1" and args.gloo_timeout_seconds == 40
    assert args.log_level == "DEBUG" and args.log_with_timestamp is False
    assert args.use_gloo is True and not args.use_mpi
    env = env_builder.horovod_env(args)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1024 * 1024)
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1" and env["HOROVOD_LOG_HIDE_TIME"] == "1"
    assert env["HOROVOD_AUTOTUNE_LOG"] == "tune.csv"


def test_command_line_wins_over_the_file_whatever_the_order(config):
    path = config(FULL)
    for argv in (["--config-file", path, "--fusion-threshold-mb", "8", "--stall-check"],
                 ["--fusion-threshold-mb", "8", "--stall-check", "--config-file", path]):
        args = parse_args(["-np", "2", *argv, "python", "train.py"])
        assert args.fusion_threshold_mb == 8
        assert args.no_stall_check is False  # --stall-check beats `enabled: false`
        assert args.cycle_time_ms == 10  # not on the command line: from the file


def test_explicit_default_value_still_wins(config):
    path = config("params:\n  hierarchical_allreduce: true\n")
    args = parse_args(["-np", "1", "--no-hierarchical-allreduce", "--config-file", path, "x"])
    assert args.hierarchical_allreduce is False


def test_flags_of_the_worker_command_do_not_count_as_explicit(config):
    path = config("params:\n  fusion_threshold_mb: 16\n")
    args = parse_args(["-np", "1", "--config-file", path, "python", "train.py", "--fusion-threshold-mb", "1"])
    assert args.fusion_threshold_mb == 16
    assert args.command == ["python", "train.py", "--fusion-threshold-mb", "1"]


def test_gloo_flag_beats_controller_in_file(config):
    path = config("controller: mpi\n")
    args = parse_args(["-np", "1", "--gloo", "--config-file", path, "x"])
    assert args.use_gloo is True and not args.use_mpi
    args = parse_args(["-np", "1", "--config-file", path, "x"])
    assert args.use_mpi is True


def test_empty_file_changes_nothing(config):
    args = parse_args(["-np", "1", "--config-file", config(""), "x"])
    assert env_builder.horovod_env(args) == {}


@pytest.mark.parametrize("text, message", [
    ("params:\n  fusion_threshold_mb: lots\n", "params.fusion_threshold_mb must be int"),
    ("params:\n  cycle_time_ms: true\n", "params.cycle_time_ms must be int or float"),
    ("stall_check:\n  enabled: 1\n", "stall_check.enabled must be bool"),
    ("controller: nccl\n", "controller must be 'gloo' or 'mpi'"),
    ("- just\n- a list\n", "expected a mapping"),
    ("params: [unclosed\n", "not valid YAML"),
])
def test_bad_files_are_usage_errors(config, capsys, text, message):
    with pytest.raises(SystemExit) as info:
        parse_args(["-np", "1", "--config-file", config(text), "x"])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "--config-file", str(tmp_path / "absent.yaml"), "x"])
    assert "absent.yaml" in capsys.readouterr().err


def test_unknown_keys_are_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="horovod.runner"):
        values = config_file.config_values({"params": {"fusion_threshold_mb": 1, "typo_mb": 2},
                                            "extras": 3}, source="f.yaml")
    assert values == {"fusion_threshold_mb": 1}
    assert "params.typo_mb" in caplog.text and "'extras'" in caplog.text


def test_negative_value_in_file_is_refused_before_launch(config):
    args = parse_args(["-np", "1", "--config-file", config("params:\n  cache_capacity: -1\n"), "x"])
    with pytest.raises(ValueError, match=r"cache_capacity=-1 must be >= 0"):
        env_builder.validate(args)
