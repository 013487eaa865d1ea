"""Two hosts joined by a bad network, built without the `netem` qdisc (this kernel has none).

Each host is a network namespace with one interface, a TAP device; a relay thread in the test
process carries every Ethernet frame from one TAP to the other after a delay, plus a random jitter
that reorders frames sent close together. The rest comes from the kernel, inside the namespaces:

- loss: nftables, `numgen random mod 100 < N drop` on the host's outgoing frames;
- partitions: nftables dropping everything a host sends (one way) or both hosts do (full);
- bandwidth: `tc qdisc ... tbf` on the host's interface.

`check_tools()` says what is missing, so a test skips with the reason instead of failing.
"""

from __future__ import annotations

import fcntl
import heapq
import os
import random
import select
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field

_TUNSETIFF = 0x400454CA
_IFF_TAP = 0x0002
_IFF_NO_PI = 0x1000


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def check_tools() -> str | None:
    """Why bad networks cannot be built here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup-system-packages.sh installs nftables)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun for the TAP devices"
    return None


def _open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TAP | _IFF_NO_PI))
    return fd


@dataclass
class Relay:
    """Carries frames between two TAP file descriptors, each `delay` + up to `jitter` seconds late."""

    fds: tuple[int, int]
    delay: float = 0.0
    jitter: float = 0.0
    frames: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="badnet-relay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        rng = random.Random(0)
        due: list[tuple[float, int, int, bytes]] = []  # (when, order, to, frame)
        other = {self.fds[0]: self.fds[1], self.fds[1]: self.fds[0]}
        order = 0
        while not self._stop.is_set():
            wait = 0.05 if not due else max(0.0, min(0.05, due[0][0] - time.monotonic()))
            readable, _, _ = select.select(list(self.fds), [], [], wait)
            now = time.monotonic()
            for fd in readable:
                while True:
                    try:
                        frame = os.read(fd, 65536)
                    except BlockingIOError:
                        break
                    except OSError:  # the interface went away: the test is tearing down
                        return
                    order += 1
                    heapq.heappush(due, (now + self.delay + rng.uniform(0.0, self.jitter), order, other[fd], frame))
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, _, to, frame = heapq.heappop(due)
                try:
                    os.write(to, frame)
                    self.frames += 1
                except OSError:  # the receiving side is down or full: the frame is lost
                    pass


@dataclass
class BadNetwork:
    """Hosts `a` and `b` (namespaces with one address each) joined by a `Relay`."""

    namespaces: tuple[str, str]
    addresses: tuple[str, str]
    interfaces: tuple[str, str]
    relay: Relay

    def nft(self, host: int, *rule: str) -> None:
        """Add a rule to the filter on what host `host` sends out of its interface."""
        _run("ip", "netns", "exec", self.namespaces[host], "nft", "add", "rule", "inet", "badnet", "out",
             "oifname", self.interfaces[host], *rule)

    def lose(self, percent: int) -> None:
        """Each host drops `percent`% of the frames it sends, at random."""
        for host in (0, 1):
            self.nft(host, "numgen", "random", "mod", "100", "<", str(percent), "drop")

    def partition(self, one_way: bool = False) -> None:
        """Nothing `b` sends arrives; unless `one_way`, nothing `a` sends either."""
        for host in ((1,) if one_way else (0, 1)):
            self.nft(host, "drop")

    def heal(self) -> None:
        """Remove every loss and partition rule."""
        for ns in self.namespaces:
            _run("ip", "netns", "exec", ns, "nft", "flush", "chain", "inet", "badnet", "out")

    def limit_rate(self, rate: str) -> None:
        """Each host sends at most `rate` (tc's syntax: `20mbit`) through a token bucket."""
        for ns, dev in zip(self.namespaces, self.interfaces):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", "64kb", "latency", "500ms")

    def exec_argv(self, host: int) -> list[str]:
        """The prefix that runs a command on host `host`."""
        return ["ip", "netns", "exec", self.namespaces[host]]


def build(tag: str, subnet: str, delay: float = 0.0, jitter: float = 0.0) -> BadNetwork:
    """Two namespaces `bn<tag>a`/`b` at `<subnet>.2`/`.3`, joined through a relay; `destroy()` removes it all."""
    namespaces = (f"bn{tag}a", f"bn{tag}b")
    interfaces = (f"bn{tag}ta", f"bn{tag}tb")
    addresses = (f"{subnet}.2", f"{subnet}.3")
    fds: list[int] = []
    try:
        for ns, dev, address in zip(namespaces, interfaces, addresses):
            _run("ip", "netns", "add", ns)
            fds.append(_open_tap(dev))
            _run("ip", "link", "set", dev, "netns", ns)
            inside = ["ip", "-n", ns]
            _run(*inside, "addr", "add", f"{address}/24", "dev", dev)
            _run(*inside, "link", "set", dev, "up")
            _run(*inside, "link", "set", "lo", "up")
            _run("ip", "netns", "exec", ns, "nft", "add", "table", "inet", "badnet")
            _run("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "badnet", "out",
                 "{ type filter hook output priority 0; policy accept; }")
    except BaseException:
        for fd in fds:
            os.close(fd)
        destroy(None, tag)
        raise
    relay = Relay((fds[0], fds[1]), delay, jitter)
    relay.start()
    return BadNetwork(namespaces, addresses, interfaces, relay)


def destroy(net: BadNetwork | None, tag: str) -> None:
    """Stop the relay and remove the namespaces (their TAPs go with them); safe on a partial build."""
    if net is not None:
        net.relay.stop()
        for fd in net.relay.fds:
            os.close(fd)
    for suffix in ("a", "b"):
        _run("ip", "netns", "del", f"bn{tag}{suffix}", check=False)
