"""horovodrun with real worker processes: environment, output, failures, signals, the secret.

Workers are tiny `python -c` scripts; nothing here calls hvd.init().
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from horovod.runner.launchers.process import rank_output_dir
from runner_helpers import child_env, horovodrun, horovodrun_argv, process_alive

pytestmark = pytest.mark.timeout(20)

PY = sys.executable

PRINT_ENV = textwrap.dedent("""\
    import json, os
    print(json.dumps({k: v for k, v in os.environ.items()
                      if k.startswith(("HOROVOD_", "_HOROVOD", "PYTHONUNBUFFERED", "KHVD_TEST"))
                      or k in ("OLDPWD", "CUDA_VISIBLE_DEVICES", "NV_CUDA_VISIBLE_DEVICES")
                      or k.startswith("BASH_FUNC_")}))
    """)


def rank_lines(output: str, stream: str = "stdout") -> dict[int, list[str]]:
    lines: dict[int, list[str]] = {}
    for match in re.finditer(rf"^\[(\d+)\]<{stream}>:(.*)$", output, re.M):
        lines.setdefault(int(match.group(1)), []).append(match.group(2))
    return lines


def worker_envs(output: str) -> dict[int, dict[str, str]]:
    return {rank: json.loads(lines[0]) for rank, lines in rank_lines(output).items()}


def wait_gone(pids, seconds=5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if process_alive(pid)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


def test_each_rank_gets_its_slot_and_the_job_environment():
    env = child_env(KHVD_TEST_VAR="kept", OLDPWD="/old", CUDA_VISIBLE_DEVICES="0",
                    NV_CUDA_VISIBLE_DEVICES="1", **{"BASH_FUNC_f%%": "() { :; }"},
                    _HOROVOD_SECRET_KEY="00" * 32)
    proc = horovodrun("-np", "2", PY, "-c", PRINT_ENV, env=env)
    assert proc.returncode == 0, proc.stderr
    envs = worker_envs(proc.stdout)
    assert sorted(envs) == [0, 1]
    keys = set()
    for rank, wenv in envs.items():
        assert wenv["HOROVOD_RANK"] == str(rank) and wenv["HOROVOD_SIZE"] == "2"
        assert wenv["HOROVOD_LOCAL_RANK"] == str(rank) and wenv["HOROVOD_LOCAL_SIZE"] == "2"
        assert wenv["HOROVOD_CROSS_RANK"] == "0" and wenv["HOROVOD_CROSS_SIZE"] == "1"
        assert wenv["HOROVOD_HOSTNAME"] == "localhost"
        assert wenv["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
        assert int(wenv["HOROVOD_GLOO_RENDEZVOUS_PORT"]) > 0
        assert wenv["HOROVOD_CONTROLLER"] == "gloo" and wenv["PYTHONUNBUFFERED"] == "1"
        assert re.fullmatch(r"[0-9a-f]{64}", wenv["_HOROVOD_SECRET_KEY"])
        keys.add(wenv["_HOROVOD_SECRET_KEY"])
        assert wenv["KHVD_TEST_VAR"] == "kept"
        for dropped in ("OLDPWD", "CUDA_VISIBLE_DEVICES", "NV_CUDA_VISIBLE_DEVICES", "BASH_FUNC_f%%"):
            assert dropped not in wenv
    assert len(keys) == 1 and keys != {"00" * 32}  # one fresh secret per job


def test_simulated_hosts_on_one_machine():
    proc = horovodrun("-np", "4", "-H", "localhost:2,127.0.0.1:2", PY, "-c", PRINT_ENV)
    assert proc.returncode == 0, proc.stderr
    got = {r: (e["HOROVOD_HOSTNAME"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"],
               e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) for r, e in worker_envs(proc.stdout).items()}
    assert got == {0: ("localhost", "0", "2", "0", "2"), 1: ("localhost", "1", "2", "0", "2"),
                   2: ("127.0.0.1", "0", "2", "1", "2"), 3: ("127.0.0.1", "1", "2", "1", "2")}


def test_flags_and_config_file_reach_the_workers(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("params:\n  fusion_threshold_mb: 2\n  cycle_time_ms: 7\nstall_check:\n  enabled: false\n")
    proc = horovodrun("-np", "1", "--config-file", str(config), "--cycle-time-ms", "3",
                      "--timeline-filename", "tl.json", "--timeline-mark-cycles", "--log-level", "DEBUG",
                      PY, "-c", PRINT_ENV)
    assert proc.returncode == 0, proc.stderr
    wenv = worker_envs(proc.stdout)[0]
    assert wenv["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
    assert wenv["HOROVOD_CYCLE_TIME"] == "3"
    assert wenv["HOROVOD_STALL_CHECK_DISABLE"] == "1"
    assert wenv["HOROVOD_TIMELINE"] == "tl.json" and wenv["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    assert wenv["HOROVOD_LOG_LEVEL"] == "DEBUG"
    assert "HOROVOD_CACHE_CAPACITY" not in wenv  # not given: the core's default applies


def test_output_prefixes_and_a_partial_last_line():
    script = ("import sys, os; r = os.environ['HOROVOD_RANK']; print('out', r); "
              "print('err', r, file=sys.stderr); sys.stdout.write('tail ' + r)")
    proc = horovodrun("-np", "2", PY, "-c", script)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert rank_lines(proc.stdout)[rank] == [f"out {rank}", f"tail {rank}"]
        assert rank_lines(proc.stderr, "stderr")[rank] == [f"err {rank}"]


def test_prefix_output_with_timestamp():
    proc = horovodrun("-np", "1", "--prefix-output-with-timestamp", PY, "-c", "print('hi')")
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[0\]<stdout>:hi\n", proc.stdout)


def test_output_filename_writes_one_directory_per_rank(tmp_path):
    out = tmp_path / "logs"
    script = "import sys, os; r = os.environ['HOROVOD_RANK']; print('o' + r); print('e' + r, file=sys.stderr)"
    proc = horovodrun("-np", "2", "--output-filename", str(out), PY, "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out)) == ["rank.0", "rank.1"]
    for rank in (0, 1):
        assert (out / f"rank.{rank}" / "stdout").read_text() == f"o{rank}\n"
        assert (out / f"rank.{rank}" / "stderr").read_text() == f"e{rank}\n"
    assert "[1]<stdout>:o1" in proc.stdout  # still echoed to the console


def test_rank_directory_padding():
    assert rank_output_dir("d", 3, 11) == os.path.join("d", "rank.03")
    assert rank_output_dir("d", 10, 11) == os.path.join("d", "rank.10")
    assert rank_output_dir("d", 0, 1) == os.path.join("d", "rank.0")


FAIL_RANK_1 = textwrap.dedent("""\
    import os, sys, time
    if os.environ["HOROVOD_RANK"] == "1":
        time.sleep(0.3)
        for i in range(30):
            print("line", i, file=sys.stderr)
        sys.exit(3)
    print("pid", os.getpid(), flush=True)
    time.sleep(30)
    """)


def test_first_failure_stops_the_job_and_is_summarised_last():
    start = time.monotonic()
    proc = horovodrun("-np", "2", PY, "-c", FAIL_RANK_1, timeout=15)
    elapsed = time.monotonic() - start
    assert proc.returncode == 3
    assert elapsed < 5, f"horovodrun took {elapsed:.1f} s to stop the job"
    pid = int(rank_lines(proc.stdout)[0][0].split()[1])
    assert wait_gone([pid]) == []
    summary_at = proc.stderr.index("Horovod detected that one or more processes exited with non-zero status")
    summary = proc.stderr[summary_at:]
    assert "[1]<stderr>" not in summary  # worker output is all above the summary
    assert "rank 1 on host localhost" in summary and "exit code 3" in summary
    assert "line 29" in summary and "line 10" in summary and "line 9\n" not in summary  # last 20 lines


def test_signal_death_is_named():
    script = "import os, signal, time\nif os.environ['HOROVOD_RANK'] == '0': os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)"
    proc = horovodrun("-np", "2", PY, "-c", script)
    assert proc.returncode == 128 + signal.SIGKILL
    assert "rank 0 on host localhost" in proc.stderr and "killed by signal SIGKILL" in proc.stderr


def test_failure_report_in_the_store_is_the_root_cause():
    script = textwrap.dedent("""\
        import os, sys
        from horovod.common.rendezvous import RendezvousClient
        client = RendezvousClient(os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                                  int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                                  bytes.fromhex(os.environ["_HOROVOD_SECRET_KEY"]))
        client.put("failures", os.environ["HOROVOD_RANK"],
                   b"HorovodInternalError: tensor grad.w has shape [2] on rank 0 but [3] on rank 1")
        print("noise on stderr", file=sys.stderr)
        sys.exit(1)
        """)
    proc = horovodrun("-np", "1", PY, "-c", script)
    assert proc.returncode == 1
    summary = proc.stderr[proc.stderr.index("Horovod detected"):]
    assert "Root cause" in summary
    assert "HorovodInternalError: tensor grad.w has shape [2] on rank 0 but [3] on rank 1" in summary
    assert "noise on stderr" in summary


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_horovodrun_leaves_no_process_behind(signum):
    # Each worker also starts a child of its own: the whole process group must go.
    script = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
              "print('pids', os.getpid(), child.pid, flush=True)\n"
              "time.sleep(30)\n")
    proc = subprocess.Popen(horovodrun_argv("-np", "2", PY, "-c", script), env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        while len(pids) < 4:
            line = proc.stdout.readline()
            assert line, f"horovodrun ended early: {proc.stderr.read()}"
            if "pids" in line:
                pids += [int(p) for p in line.split()[1:]]
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum
    assert signal.Signals(signum).name in err
    assert wait_gone(pids) == []


def test_secret_key_is_never_on_a_command_line():
    script = textwrap.dedent("""\
        import os
        key = os.environ["_HOROVOD_SECRET_KEY"]
        seen = [open(f"/proc/{pid}/cmdline", "rb").read().decode() for pid in (os.getpid(), os.getppid())]
        print("leaked" if any(key in cmd for cmd in seen) else "clean", len(key))
        """)
    proc = horovodrun("-np", "2", PY, "-c", script)
    assert proc.returncode == 0, proc.stderr
    assert rank_lines(proc.stdout) == {0: ["clean 64"], 1: ["clean 64"]}


def test_usage_errors_exit_2_without_starting_workers():
    for args, message in [
        (["-np", "2", "--min-np", "3", "--max-np", "2", PY, "-c", "pass"], "--min-np 3 is larger than --max-np 2"),
        (["-np", "2", "--jsrun", PY, "-c", "pass"], "jsrun controller not available"),
        (["-np", "3", "-H", "localhost:2", PY, "-c", "pass"], "Requested more processes (3)"),
        (["-np", "1", "-H", "bad host:1", PY, "-c", "pass"], "invalid host entry"),
        (["-np", "1"], "no command given"),
    ]:
        proc = horovodrun(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr
        assert "<stdout>" not in proc.stdout


def test_missing_program():
    proc = horovodrun("-np", "1", "no-such-program-khorovod")
    assert proc.returncode == 127
    assert "cannot start 'no-such-program-khorovod'" in proc.stderr


def test_verbose_describes_the_plan():
    proc = horovodrun("-np", "2", "--verbose", PY, "-c", "pass")
    assert proc.returncode == 0
    assert "rank 1 -> localhost (local rank 1/2, cross rank 0/1)" in proc.stderr
    assert "rendezvous store at 127.0.0.1:" in proc.stderr
