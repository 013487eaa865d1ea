"""Run a snippet on N ranks through a real `mpirun` (the one mpi4py's wheel installs), no horovodrun.

Every rank's `report(...)` lines carry its rank, so results come back per rank as with
`multirank.hvdrun`. As root Open MPI needs --allow-run-as-root, and above the core count
--oversubscribe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from multirank import REPO, RunResult, child_env  # noqa: F401 (REPO for tests)

BIN = Path(sys.executable).parent
MPIRUN = BIN / "mpirun"
_PRELUDE = '''\
import json as _json, os as _os
def report(**values):
    values.setdefault("rank", int(_os.environ.get("OMPI_COMM_WORLD_RANK", _os.environ.get("PMI_RANK", -1))))
    print("RESULT:" + _json.dumps(values, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)),
          flush=True)
'''


def mpirun_flags() -> list[str]:
    """What Open MPI needs on this machine: root, and more ranks than cores."""
    flags = ["--oversubscribe"]
    if os.geteuid() == 0:
        flags.append("--allow-run-as-root")
    return flags


def run_command(argv: list[str], env: dict[str, str] | None = None, timeout: float = 90.0,
                cwd: str | None = None) -> RunResult:
    """Run a launcher command line; never hangs past `timeout` (the launcher is killed with its job)."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(env),
                          cwd=cwd, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, 15)
            try:
                proc.communicate(timeout=15)
            finally:
                _signal_group(proc.pid, 9)
            raise
    result = RunResult(proc.returncode, stdout, stderr)
    for line in stdout.splitlines():
        if "RESULT:" in line:
            values = json.loads(line[line.index("RESULT:") + len("RESULT:"):])
            result.ranks.setdefault(values["rank"], {}).update(values)
    return result


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass


def mpirun(code: str, np: int = 2, args: list[str] | None = None, env: dict[str, str] | None = None,
           timeout: float = 90.0) -> RunResult:
    """Run `code` (dedented) as a script under `mpirun -np N`."""
    return _run_snippet(code, [str(MPIRUN), *mpirun_flags(), "-np", str(np), *(args or [])], env, timeout)


def horovodrun_mpi(code: str, np: int = 2, env: dict[str, str] | None = None, timeout: float = 90.0) -> RunResult:
    """Run `code` (dedented) as a script under `horovodrun --mpi -np N` (which runs mpirun)."""
    return _run_snippet(code, [sys.executable, "-m", "horovod.runner.launch", "--mpi", "-np", str(np)], env, timeout)


def _run_snippet(code: str, launcher: list[str], env: dict[str, str] | None, timeout: float) -> RunResult:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "snippet.py"
        script.write_text(_PRELUDE + textwrap.dedent(code))
        return run_command([*launcher, sys.executable, str(script)], env, timeout, cwd=tmp)
