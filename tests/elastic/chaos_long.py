"""The long chaos run of elastic training (not run in CI; `test_elastic_chaos.py` is its short form).

    python tests/elastic/chaos_long.py [KILLS] [SEED]

Jobs of `train_torch.py` on three hosts (`localhost`, `127.0.0.1`, `127.0.0.2`, one slot each,
`--min-np 1`, blacklist cooldown 1-2 s) run one after another until KILLS (default 100) workers
have been killed: at random moments (0.5-4 s apart, so in training, committing, re-initialising
or starting) a random live worker gets SIGKILL or SIGTERM, and one event in five kills rank 0
itself; one event in six removes a host through the discovery script instead (the next one puts
it back). After each job: it must succeed, every sample of every epoch must have been committed
exactly once (`test_elastic_jobs.committed`), and no process of the job nor shared-memory segment
may be left. The totals are printed at the end; docs/reliability.md records a run.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.elastic.test_elastic_chaos import processes_mentioning  # noqa: E402
from tests.elastic.test_elastic_jobs import REPO, TRAIN, committed, discovery, shm_segments  # noqa: E402

HOSTS = ["localhost:1", "127.0.0.1:1", "127.0.0.2:1"]
# Few, slow steps: the model's loss grows with the sample values, so long runs (many batches, so
# large samples) would diverge to NaN; slow steps give the kills time to land.
EPOCHS, BATCHES, STEP_SECONDS = 3, 6, "1.0"
KILLS_PER_JOB = 8
_ROUND = re.compile(r"round (\d+): \d+ workers \(rank=host:slot: ([^)]*)\)")


def workers_by_id(tmp: Path, launcher: int) -> dict[str, int]:
    """The job's live workers, by worker id (`host:local rank`, fixed for a worker's life)."""
    found = {}
    for pid in processes_mentioning(f"{TRAIN}\0{tmp}"):
        if pid == launcher:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        if b"HOROVOD_HOSTNAME" in env and b"HOROVOD_LOCAL_RANK" in env:  # not the launcher between fork and exec
            found[f"{env[b'HOROVOD_HOSTNAME'].decode()}:{env[b'HOROVOD_LOCAL_RANK'].decode()}"] = pid
    return found


def rank0_id(stderr_path: Path) -> str | None:
    """The worker id that is rank 0 in the newest round the driver announced."""
    rounds = _ROUND.findall(stderr_path.read_text(errors="replace"))
    if not rounds:
        return None
    members = dict(entry.split("=", 1) for entry in rounds[-1][1].split(", "))
    return members.get("0")


def one_job(rng: random.Random, kills_left: int, totals: dict[str, int]) -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        script = discovery(tmp, ",".join(HOSTS))
        env = dict(os.environ, PYTHONPATH=str(REPO), ELASTIC_STEP_SECONDS=STEP_SECONDS)
        env.pop("_HOROVOD_SECRET_KEY", None)
        before = shm_segments()
        stderr_path = tmp / "launcher.stderr"
        with open(stderr_path, "wb") as stderr:
            job = subprocess.Popen([sys.executable, "-m", "horovod.runner.launch", "-np", "3", "--min-np", "1",
                                    "--blacklist-cooldown-range", "1", "2", "--host-discovery-script", script,
                                    sys.executable, TRAIN, str(tmp), str(EPOCHS), str(BATCHES)],
                                   stdout=subprocess.DEVNULL, stderr=stderr, env=env, start_new_session=True)
        removed: str | None = None
        kills = 0
        try:
            while job.poll() is None and kills < kills_left:
                time.sleep(rng.uniform(0.5, 4.0))
                if removed is None and rng.random() < 1 / 6:
                    removed = rng.choice(HOSTS[1:])
                    (tmp / "hosts").write_text("\n".join(h for h in HOSTS if h != removed) + "\n")
                    totals["hosts removed"] += 1
                    continue
                if removed is not None:
                    (tmp / "hosts").write_text("\n".join(HOSTS) + "\n")
                    removed = None
                live = workers_by_id(tmp, job.pid)
                if not live:
                    continue
                target = rank0_id(stderr_path) if rng.random() < 0.2 else None
                pid = live.get(target) if target else None
                if pid is None:
                    target, pid = rng.choice(sorted(live.items()))
                signum = rng.choice([signal.SIGKILL, signal.SIGTERM])
                try:
                    os.kill(pid, signum)
                except ProcessLookupError:
                    continue
                kills += 1
                totals["kills"] += 1
                totals["SIGKILL" if signum == signal.SIGKILL else "SIGTERM"] += 1
                totals["rank 0 killed"] += target == rank0_id(stderr_path)
            job.wait(timeout=600)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        text = stderr_path.read_text(errors="replace")
        totals["jobs"] += 1
        totals["rounds after the first"] += max(0, len(_ROUND.findall(text)) - 1)
        if job.returncode != 0:
            totals["jobs failed"] += 1
            print(f"job failed ({job.returncode}):\n{text[-3000:]}", file=sys.stderr)
        else:
            try:
                committed(tmp, EPOCHS)
            except AssertionError:
                totals["jobs with samples lost or twice"] += 1
                kept = Path(tempfile.mkdtemp(prefix="chaos-failed-"))
                for name in ("result.json", "launcher.stderr"):
                    (kept / name).write_bytes((tmp / name).read_bytes())
                print(f"committed samples wrong (kept in {kept}):\n{traceback.format_exc()}", file=sys.stderr)
        deadline = time.monotonic() + 10
        while processes_mentioning(str(tmp)) and time.monotonic() < deadline:
            time.sleep(0.1)
        totals["leftover processes"] += len(processes_mentioning(str(tmp)))
        totals["leftover segments"] += len(shm_segments() - before)


def main() -> None:
    target = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    totals = dict.fromkeys(["jobs", "kills", "SIGKILL", "SIGTERM", "rank 0 killed", "hosts removed",
                            "rounds after the first", "jobs failed", "jobs with samples lost or twice",
                            "leftover processes", "leftover segments"], 0)
    started = time.monotonic()
    while totals["kills"] < target:
        one_job(rng, min(KILLS_PER_JOB, target - totals["kills"]), totals)
        print(f"after {totals['jobs']} jobs, {time.monotonic() - started:.0f} s: {totals}", flush=True)
    print("totals:", ", ".join(f"{name} {value}" for name, value in totals.items()))


if __name__ == "__main__":
    main()
