"""Run a snippet on N real ranks through our own horovodrun and collect what each rank reports.

Inside the snippet, `report(key=value, ...)` prints one JSON line that comes back as
`result.ranks[rank]` (a dict merged from every report of that rank).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_PRELUDE = '''\
import json as _json
def report(**values):
    print("RESULT:" + _json.dumps(values, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)),
          flush=True)
'''
_LINE = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")


@dataclass
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    ranks: dict[int, dict] = field(default_factory=dict)
    rank_lines: dict[int, list[str]] = field(default_factory=dict)

    def output_of(self, rank: int) -> str:
        return "\n".join(self.rank_lines.get(rank, []))

    def check(self) -> "RunResult":
        assert self.returncode == 0, f"job failed ({self.returncode}):\n{self.stdout}\n{self.stderr}"
        return self

    def every_rank(self, np: int) -> list[tuple[int, dict]]:
        """(rank, its reports) for ranks 0..np-1, after checking that each of them reported: a
        loop over these cannot pass with a rank that printed nothing."""
        assert sorted(self.ranks) == list(range(np)), (
            f"ranks that reported: {sorted(self.ranks)}, expected 0..{np - 1}\n{self.stdout}\n{self.stderr}")
        return sorted(self.ranks.items())


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "_HOROVOD"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def hvdrun(code: str, np: int = 2, env: dict[str, str] | None = None, timeout: float = 90.0,
           args: list[str] | None = None, python: str | None = None) -> RunResult:
    """Run `code` (dedented) as a script on `np` ranks; never hangs past `timeout`. The ranks run
    `python` (default: this interpreter), e.g. another virtual environment's."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "snippet.py"
        script.write_text(_PRELUDE + textwrap.dedent(code))
        argv = [sys.executable, "-m", "horovod.runner.launch", "-np", str(np), *(args or []),
                python or sys.executable, str(script)]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(env),
                              cwd=tmp) as proc:
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                # SIGTERM, not SIGKILL: horovodrun then stops its workers, so a hung test leaves
                # no ranks behind; the test still fails with the timeout.
                proc.terminate()
                try:
                    proc.communicate(timeout=15)
                finally:
                    proc.kill()
                raise
    result = RunResult(proc.returncode, stdout, stderr)
    for line in (stdout + "\n" + stderr).splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        rank, stream, text = int(match[1]), match[2], match[3]
        result.rank_lines.setdefault(rank, []).append(text)
        if stream == "stdout" and text.startswith("RESULT:"):
            result.ranks.setdefault(rank, {}).update(json.loads(text[len("RESULT:"):]))
    return result
