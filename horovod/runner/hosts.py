"""Which rank runs where: parse `-H` / `--hostfile` and assign slots, with no I/O besides reading a file.

Slot assignment is a pure function so that every topology (one host, many hosts, uneven slot
counts) is checked by unit tests instead of by launching processes. The rules are Horovod's:
hosts are filled in the order given, all slots of the first host before the second, and ranks
with the same local rank on different hosts form a "cross" group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from horovod.common.launcher_env import expand_tasks_per_node
from horovod.common.settings import Topology

_HOST_ENTRY = re.compile(r"^[\w.-]+:[0-9]+$")
_HOSTFILE_LINE = re.compile(r"^(?P<host>[\w.-]+)(?:\s+slots\s*=\s*(?P<slots>[0-9]+))?$")


@dataclass(frozen=True)
class HostInfo:
    """A host and how many worker processes it may run."""

    hostname: str
    slots: int


@dataclass(frozen=True)
class SlotInfo:
    """Everything a worker needs to know about its place in the job."""

    hostname: str
    rank: int
    local_rank: int
    cross_rank: int
    size: int
    local_size: int
    cross_size: int

    def topology(self) -> Topology:
        return Topology(self.rank, self.size, self.local_rank, self.local_size,
                        self.cross_rank, self.cross_size, self.hostname)

    def to_response_string(self) -> str:
        """The compact form Horovod's elastic driver sends to workers."""
        return (
            f"{self.rank},{self.size},{self.local_rank},{self.local_size},"
            f"{self.cross_rank},{self.cross_size}"
        )


def _check_unique(hosts: list[HostInfo]) -> list[HostInfo]:
    seen: set[str] = set()
    for host in hosts:
        if host.hostname in seen:
            raise ValueError(
                f"host {host.hostname!r} is listed more than once; give it once with the total slots"
            )
        seen.add(host.hostname)
    return hosts


def parse_hosts(hosts_string: str) -> list[HostInfo]:
    """Parse `-H "h1:2,h2:4"`; every entry must be `<name>:<slots>`."""
    hosts = []
    for entry in hosts_string.split(","):
        entry = entry.strip()
        if not _HOST_ENTRY.match(entry):
            raise ValueError(
                f"invalid host entry {entry!r} in --hosts {hosts_string!r}: expected "
                "'<hostname>:<slots>' entries separated by commas, e.g. 'server1:2,server2:4'"
            )
        name, slots = entry.rsplit(":", 1)
        hosts.append(HostInfo(name, int(slots)))
    return _check_unique(hosts)


def parse_hostfile_text(text: str, source: str = "<hostfile>") -> list[HostInfo]:
    """Parse hostfile lines `<host> slots=<n>` (a bare `<host>` means one slot; `#` starts a comment)."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _HOSTFILE_LINE.match(line)
        if match is None:
            raise ValueError(
                f"{source}:{number}: cannot parse {raw.strip()!r}; expected '<hostname> slots=<n>'"
            )
        slots = match.group("slots")
        hosts.append(HostInfo(match.group("host"), int(slots) if slots is not None else 1))
    if not hosts:
        raise ValueError(f"{source} lists no hosts")
    return _check_unique(hosts)


def parse_hostfile(path: str) -> list[HostInfo]:
    with open(path, encoding="utf-8") as f:
        return parse_hostfile_text(f.read(), source=path)


def hosts_string(hosts: list[HostInfo]) -> str:
    """The `-H` form of a host list (what Horovod turns a hostfile into)."""
    return ",".join(f"{h.hostname}:{h.slots}" for h in hosts)


def get_host_assignments(hosts: list[HostInfo], num_proc: int) -> list[SlotInfo]:
    """Give `num_proc` ranks to the hosts' slots in order; returns one SlotInfo per rank."""
    if num_proc < 1:
        raise ValueError(f"the number of processes must be at least 1, got {num_proc}")
    available = sum(h.slots for h in hosts)
    if num_proc > available:
        raise ValueError(
            f"Requested more processes ({num_proc}) than there are available slots ({available})"
        )
    # How many ranks each host gets: fill the first host completely, then the next.
    used: list[tuple[str, int]] = []
    remaining = num_proc
    for host in hosts:
        take = min(host.slots, remaining)
        if take > 0:
            used.append((host.hostname, take))
            remaining -= take
    cross_size = [sum(1 for _, n in used if n > local_rank) for local_rank in range(max(n for _, n in used))]
    slots = []
    rank = 0
    for index, (hostname, local_size) in enumerate(used):
        for local_rank in range(local_size):
            cross_rank = sum(1 for _, n in used[:index] if n > local_rank)
            slots.append(
                SlotInfo(
                    hostname=hostname,
                    rank=rank,
                    local_rank=local_rank,
                    cross_rank=cross_rank,
                    size=num_proc,
                    local_size=local_size,
                    cross_size=cross_size[local_rank],
                )
            )
            rank += 1
    return slots


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list (`node[01-03,7],login`) as names (`node01 node02 node03 node7 login`)."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            names += [f"{prefix}{n:0{width}d}" for n in range(int(low), int(high or low) + 1)]
    return names


def slurm_allocation(env: Mapping[str, str]) -> list[HostInfo] | None:
    """The hosts and slots of the Slurm allocation this launcher runs in; None outside one."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist or not env.get("SLURM_JOB_ID"):
        return None
    names = expand_nodelist(nodelist)
    tasks = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_JOB_CPUS_PER_NODE") or ""
    counts = expand_tasks_per_node(tasks) if tasks else [1] * len(names)
    if len(counts) != len(names):
        raise ValueError(f"the Slurm allocation lists {len(names)} nodes ({nodelist}) but tasks for "
                         f"{len(counts)} ({tasks})")
    return _check_unique([HostInfo(name, slots) for name, slots in zip(names, counts)])
