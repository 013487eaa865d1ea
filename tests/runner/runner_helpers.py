"""Helpers for the launcher tests: run horovodrun as a real process, inspect processes via /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child_env(**extra: str) -> dict[str, str]:
    """This environment, with the repository importable (khorovod need not be installed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.pop("_HOROVOD_SECRET_KEY", None)
    env.update(extra)
    return env


def horovodrun_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "horovod.runner.launch", *args]


def horovodrun(*args: str, timeout: float = 10.0, env: dict[str, str] | None = None,
               cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run horovodrun to completion and capture its output."""
    return subprocess.run(horovodrun_argv(*args), capture_output=True, text=True, timeout=timeout,
                          env=env or child_env(), cwd=cwd)


def process_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (read from /proc, no psutil needed)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")
