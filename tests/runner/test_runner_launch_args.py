"""horovodrun's command line: flags, help, validation errors, --check-build and --version."""

from __future__ import annotations

import argparse

import pytest

from horovod.runner import check_build, launch
from horovod.runner.launch import make_parser, parse_args, plan_job, validate
from horovod.version import __version__

pytestmark = pytest.mark.timeout(30)


def option_actions():
    return [a for a in make_parser()._actions if a.option_strings]


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for action in option_actions():
        for flag in action.option_strings:
            assert flag in text, f"{flag} missing from --help"
        assert action.help and action.help != argparse.SUPPRESS, f"{action.option_strings} has no help"


def test_every_tuning_flag_states_its_default():
    without_default = [a.option_strings[0] for a in option_actions()
                       if a.type is not None and a.dest not in ("num_proc", "config_file")
                       and "Default" not in (a.help or "") and a.dest not in launch.ELASTIC_DESTS]
    assert without_default == []


def test_reference_flags_are_all_present():
    flags = {flag for action in option_actions() for flag in action.option_strings}
    expected = """-v --version -np --num-proc -cb --check-build --disable-cache --start-timeout
        --network-interfaces --network-interface --output-filename --verbose --config-file -p --ssh-port
        -i --ssh-identity-file --fusion-threshold-mb --cycle-time-ms --cache-capacity
        --hierarchical-allreduce --no-hierarchical-allreduce --hierarchical-allgather
        --no-hierarchical-allgather --torus-allreduce --no-torus-allreduce --autotune --autotune-log-file
        --autotune-warmup-samples --autotune-steps-per-sample --autotune-bayes-opt-max-samples
        --autotune-gaussian-process-noise --min-np --min-num-proc --max-np --max-num-proc --slots-per-host
        --elastic-timeout --reset-limit --blacklist-cooldown-range --timeline-filename
        --timeline-mark-cycles --no-stall-check --stall-check-warning-time-seconds
        --stall-check-shutdown-time-seconds --mpi-threads-disable --mpi-args --tcp --binding-args
        --num-nccl-streams --thread-affinity --gloo-timeout-seconds --log-level --log-without-timestamp
        --log-hide-timestamp -prefix-timestamp --prefix-output-with-timestamp -H --hosts -hostfile
        --hostfile --host-discovery-script --gloo --mpi --jsrun""".split()
    assert set(expected) <= flags


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["-v"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == __version__


def test_np_is_required(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["python", "train.py"])
    assert info.value.code == 2
    assert "-np/--num-proc is required" in capsys.readouterr().err


def test_command_keeps_its_own_flags():
    args = parse_args(["-np", "2", "-H", "a:1,b:1", "python", "train.py", "-np", "7", "--lr", "0.1"])
    assert args.num_proc == 2 and args.hosts == "a:1,b:1"
    assert args.command == ["python", "train.py", "-np", "7", "--lr", "0.1"]


def test_single_dash_long_flags():
    args = parse_args(["-np", "2", "-hostfile", "hosts.txt", "-prefix-timestamp", "-p", "2222",
                       "-i", "key", "x"])
    assert args.hostfile == "hosts.txt" and args.prefix_output_with_timestamp
    assert args.ssh_port == 2222 and args.ssh_identity_file == "key"


@pytest.mark.parametrize("flags", [["-H", "a:1", "-hostfile", "f"], ["--gloo", "--mpi"]])
def test_mutually_exclusive_flags(flags, capsys):
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", *flags, "x"])
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize("flags, expected", [
    (["--min-np", "1"], dict(min_np=1, max_np=None, reset_limit=None, cooldown_range=None)),
    (["--max-np", "4"], dict(min_np=2, max_np=4)),
    (["--host-discovery-script", "{script}", "--slots-per-host", "3"], dict(min_np=2, hosts={"node-a": 3})),
    (["--min-np", "1", "--slots-per-host", "2", "--elastic-timeout", "60", "--reset-limit", "3",
      "--blacklist-cooldown-range", "10", "100"],
     dict(min_np=1, elastic_timeout=60.0, reset_limit=3, cooldown_range=(10, 100))),
])
def test_elastic_flags_make_an_elastic_job(flags, expected, tmp_path):
    from horovod.runner.elastic.driver import ElasticDriver

    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho node-a\n")
    script.chmod(0o755)
    args = parse_args(["-np", "2", *(f.format(script=script) for f in flags), "python", "train.py"])
    validate(args)
    job = launch.make_job(args, launch.plan_job(args, args.command))
    assert isinstance(job, ElasticDriver)
    assert job.spec.extra_env["HOROVOD_ELASTIC"] == "1" and job.spec.extra_env["HOROVOD_BOOTSTRAP"] == "store"
    elastic = job.elastic
    hosts = expected.pop("hosts", None)
    assert {key: getattr(elastic, key) for key in expected} == expected
    if hosts is not None:
        assert {h.hostname: h.slots for h in elastic.discovery.find_available_hosts()} == hosts


def test_without_elastic_flags_the_job_is_fixed():
    from horovod.runner.elastic.driver import ElasticDriver

    args = parse_args(["-np", "2", "python", "train.py"])
    job = launch.make_job(args, launch.plan_job(args, args.command))
    assert not isinstance(job, ElasticDriver) and "HOROVOD_ELASTIC" not in job.spec.extra_env


@pytest.mark.parametrize("flags, message", [
    (["--slots-per-host", "2"], "only apply to an elastic job"),
    (["--reset-limit", "3"], "only apply to an elastic job"),
    (["--min-np", "3", "--max-np", "2"], "--min-np 3 is larger than --max-np 2"),
    (["--min-np", "1", "--blacklist-cooldown-range", "5", "2"], "need 1 <= MIN <= MAX"),
    (["--min-np", "0"], "--min-np 0 is out of range"),
])
def test_inconsistent_elastic_flags_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        validate(parse_args(["-np", "2", *flags, "python", "train.py"]))


def test_jsrun_is_refused_and_mpi_accepted():
    validate(parse_args(["-np", "1", "--mpi", "x"]))
    with pytest.raises(NotImplementedError, match="jsrun"):
        validate(parse_args(["-np", "1", "--jsrun", "x"]))


@pytest.mark.parametrize("flags, message", [
    (["--start-timeout", "-1"], "start_timeout=-1 must be >= 0"),
    (["--cycle-time-ms", "-1"], "cycle_time_ms=-1.0 must be >= 0"),
    (["--fusion-threshold-mb", "-2"], "fusion_threshold_mb=-2 must be >= 0"),
])
def test_negative_values(flags, message):
    with pytest.raises(ValueError) as info:
        validate(parse_args(["-np", "1", *flags, "x"]))
    assert str(info.value) == message


def test_plan_needs_a_command():
    with pytest.raises(ValueError, match="no command given"):
        launch.plan_job(parse_args(["-np", "1"]), [])


def test_plan_uses_hosts_and_flags(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\nb slots=2\n")
    args = parse_args(["-np", "3", "--hostfile", str(hostfile), "--cache-capacity", "5",
                       "--output-filename", "out", "-prefix-timestamp", "python", "t.py"])
    spec = launch.plan_job(args, args.command)
    assert [(s.hostname, s.local_rank) for s in spec.slots] == [("a", 0), ("b", 0), ("b", 1)]
    assert spec.extra_env == {"HOROVOD_CACHE_CAPACITY": "5"}
    assert spec.output.output_dir == "out" and spec.output.prefix_timestamp
    assert spec.command == ("python", "t.py")


def test_default_host_is_localhost_with_np_slots():
    spec = launch.plan_job(parse_args(["-np", "3", "x"]), ["x"])
    assert {s.hostname for s in spec.slots} == {"localhost"} and len(spec.slots) == 3


def test_too_many_processes_is_reported(capsys):
    assert launch._run(parse_args(["-np", "3", "-H", "localhost:2", "x"])) == 2
    assert ("Requested more processes (3) than there are available slots (2)"
            in capsys.readouterr().err)


def test_check_build_format():
    have = {"torch", "horovod.torch", "tensorflow", "mpi4py"}
    assert check_build.report(lambda name: name in have, mpi_runs=lambda: True, nccl_version=lambda: 0) == (
        f"Horovod v{__version__}:\n\n"
        "Available Frameworks:\n"
        "    [ ] TensorFlow\n"  # the framework is there but our adapter is not
        "    [X] PyTorch\n"
        "    [ ] MXNet\n\n"
        "Available Controllers:\n"
        "    [X] MPI\n"
        "    [X] Gloo\n\n"
        "Available Tensor Operations:\n"
        "    [ ] NCCL\n"
        "    [ ] DDL\n"
        "    [ ] CCL\n"
        "    [X] MPI\n"
        "    [X] Gloo"
    )
    with_nccl = check_build.report(lambda name: name in have, mpi_runs=lambda: True, nccl_version=lambda: 22803)
    assert "    [X] NCCL 2.28.3\n" in with_nccl


def test_check_build_needs_no_np(capsys):
    assert launch._run(parse_args(["--check-build"])) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Horovod v{__version__}:") and "[X] Gloo" in out
    assert check_build.report(lambda name: name != "mpi4py").count("[ ] MPI") == 2  # no mpi4py: no MPI at all


def test_the_start_timeout_grows_with_the_hosts_and_ranks_unless_given(monkeypatch):
    monkeypatch.delenv("HOROVOD_START_TIMEOUT", raising=False)
    hosts = ",".join(f"node{i}:8" for i in range(64))
    assert plan_job(parse_args(["-np", "512", "-H", hosts, "python", "x"]), ["python", "x"]).start_timeout == 116.0
    assert plan_job(parse_args(["-np", "2", "python", "x"]), ["python", "x"]).start_timeout == 30.0
    given = parse_args(["-np", "512", "-H", hosts, "--start-timeout", "40", "python", "x"])
    assert plan_job(given, ["python", "x"]).start_timeout == 40.0
