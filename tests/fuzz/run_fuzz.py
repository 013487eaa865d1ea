"""Coverage-guided fuzzing of the parsers that face the network and the user (not run in CI).

    python tests/fuzz/run_fuzz.py                       # every target, 100,000 executions each
    python tests/fuzz/run_fuzz.py wire store -runs=2000 # some targets, other libFuzzer flags

Each target (`targets.py`) runs in a process of its own under atheris, which instruments
`horovod`'s bytecode, starting from the target's seed inputs. A crash (an error the target's
contract does not allow, a hang past `-timeout`) stops that target: libFuzzer saves the input as
`crash-<hash>` (or `timeout-<hash>`) in the working directory, to be replayed by a regression test
in `test_fuzz.py`. A summary line per target: executions, coverage, speed, and whether it crashed.
Figures: docs/reliability.md.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]
DEFAULT_FLAGS = ["-runs=100000", "-timeout=20", "-max_len=4096", "-rss_limit_mb=4096"]


def fuzz_one(name: str, flags: list[str]) -> None:
    """In the child: instrument horovod, then hand the target to libFuzzer (which exits)."""
    import atheris

    with atheris.instrument_imports(include=["horovod"]):
        from tests.fuzz import targets
    with tempfile.TemporaryDirectory() as corpus:
        for number, seed in enumerate(targets.seeds(name)):
            (Path(corpus) / f"seed-{number}").write_bytes(seed)
        atheris.Setup([sys.argv[0], *flags, corpus], targets.TARGETS[name])
        atheris.Fuzz()


def run(name: str, flags: list[str]) -> tuple[bool, str]:
    """Fuzz `name` in a child process: (it finished without a crash, its summary)."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--child", name, *flags], capture_output=True, text=True)
    log = done.stderr
    seconds = time.monotonic() - started
    final = re.findall(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)", log, re.M)
    runs, cov, features = final[-1] if final else ("0", "?", "?")
    ok = done.returncode == 0
    summary = (f"{name}: {runs} executions in {seconds:.0f} s ({int(runs) / seconds:.0f}/s with start-up), "
               f"coverage {cov} edges, {features} features: "
               f"{'no crash' if ok else 'CRASH (exit ' + str(done.returncode) + ')'}")
    if not ok:
        summary += "\n" + "\n".join(log.splitlines()[-40:])
    return ok, summary


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        fuzz_one(argv[1], argv[2:])
        return 0
    from tests.fuzz.targets import TARGETS

    names = [arg for arg in argv if not arg.startswith("-")] or list(TARGETS)
    flags = [arg for arg in argv if arg.startswith("-")]
    flags = flags + [flag for flag in DEFAULT_FLAGS if flag.split("=")[0] not in {f.split("=")[0] for f in flags}]
    failed = 0
    for name in names:
        ok, summary = run(name, flags)
        failed += not ok
        print(summary, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
