"""Where the hosts of an elastic job come from: a user's discovery script, or a fixed list.

The script prints one `host` or `host:slots` line per available host; the driver runs it about
once a second. A failing script is fatal the first time (the job cannot start without hosts) and
only logged later, keeping the last answer, so a discovery hiccup never tears down a running job.
"""

from __future__ import annotations

import re
import subprocess
from typing import Protocol

from horovod.runner.hosts import HostInfo

_LINE = re.compile(r"^(?P<host>[\w.-]+)(?::(?P<slots>[0-9]+))?$")
#: A script that has not answered in this many seconds is stopped and counted as failed.
SCRIPT_TIMEOUT_SECONDS = 10.0


class HostDiscovery(Protocol):
    """Answers "which hosts may run workers now, with how many slots each"."""

    def find_available_hosts(self) -> list[HostInfo]: ...


def parse_discovery_output(text: str, default_slots: int | None, source: str) -> list[HostInfo]:
    """The hosts of a discovery script's output, in order, each once."""
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"{source}: line {number} {line!r} is not 'host' or 'host:slots'")
        slots = match.group("slots")
        if slots is None:
            if default_slots is None:
                raise ValueError(f"{source}: line {number} {line!r} names no slot count; print 'host:slots' "
                                 "or give --slots-per-host")
            slots = default_slots
        hosts.setdefault(match.group("host"), int(slots))
    return [HostInfo(host, slots) for host, slots in hosts.items()]


class HostDiscoveryScript:
    """Runs `--host-discovery-script` and parses what it prints."""

    def __init__(self, script: str, default_slots: int | None) -> None:
        self.script = script
        self.default_slots = default_slots

    def find_available_hosts(self) -> list[HostInfo]:
        try:
            done = subprocess.run([self.script], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"host discovery script {self.script} did not answer within "
                               f"{SCRIPT_TIMEOUT_SECONDS:g} s") from None
        except OSError as exc:
            raise RuntimeError(f"cannot run host discovery script {self.script}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise RuntimeError(f"host discovery script {self.script} exited with status {done.returncode}: "
                               f"{done.stderr.strip()[-500:]}")
        return parse_discovery_output(done.stdout, self.default_slots, self.script)


class FixedHosts:
    """The hosts of -H/--hostfile: fault tolerance without scaling."""

    def __init__(self, hosts: list[HostInfo]) -> None:
        self.hosts = list(hosts)

    def find_available_hosts(self) -> list[HostInfo]:
        return list(self.hosts)
