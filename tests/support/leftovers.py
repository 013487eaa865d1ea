"""What a finished job may leave behind on this machine: processes and shared-memory segments.

Read straight from /proc and /dev/shm (no psutil), so tests can assert that a job that failed
in any way still cleaned up after itself.
"""

from __future__ import annotations

import os
import time
from typing import Iterable

SHM_DIR = "/dev/shm"


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], int(fields[2])


def live_processes(pids: Iterable[int], groups: Iterable[int] = ()) -> list[int]:
    """Pids that are still running (not zombies): those given, and any member of `groups`."""
    pids, groups = set(pids), set(groups)
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = _stat(int(entry))
        if info is None or info[0] in ("Z", "X"):
            continue
        if int(entry) in pids or info[1] in groups:
            alive.append(int(entry))
    return sorted(alive)


def wait_for_no_processes(pids: Iterable[int], groups: Iterable[int] = (), seconds: float = 5.0) -> list[int]:
    """Poll until none of `pids` / `groups` runs any more; returns what is still alive then."""
    pids, groups = list(pids), list(groups)
    deadline = time.monotonic() + seconds
    while True:
        alive = live_processes(pids, groups)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def processes_with_env(name: str, value: str) -> list[int]:
    """Pids of the processes on this machine whose environment has `name=value`: a marker a test
    gives whatever an engine starts for it, to find it all afterwards."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def seconds_until_gone(pids: Iterable[int], seconds: float) -> dict[int, float | None]:
    """Poll `pids` for up to `seconds`: how long after the call each stopped running (None: it
    still runs). For bounds on how fast processes go, e.g. after whatever started them died."""
    pids = list(pids)
    start = time.monotonic()
    gone: dict[int, float | None] = dict.fromkeys(pids)
    while True:
        alive = set(live_processes(pids))
        for pid in pids:
            if pid not in alive and gone[pid] is None:
                gone[pid] = time.monotonic() - start
        if not alive or time.monotonic() - start > seconds:
            return gone
        time.sleep(0.02)


def shm_segments(pids: Iterable[int]) -> list[str]:
    """khorovod's shared-memory segments in /dev/shm created by any of `pids`."""
    prefixes = tuple(f"khvd-{pid}-" for pid in pids)
    try:
        return sorted(name for name in os.listdir(SHM_DIR) if name.startswith(prefixes))
    except FileNotFoundError:
        return []


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except (FileNotFoundError, PermissionError):
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    return inodes


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6} address (little-endian 32-bit words) to text."""
    import ipaddress

    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, read from /proc in its network namespace."""
    inodes = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except (FileNotFoundError, PermissionError):
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.append((_address(address), int(port, 16)))
    return sorted(found)
