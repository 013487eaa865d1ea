"""Real OpenSSH for launcher tests: Debian's sshd in emulated hosts, keys made for the test.

`RealSsh(tmp)` makes a host key and a client key (ssh-keygen), and an `ssh` on `bin_dir` that runs
the real /usr/bin/ssh with a config file of the test's own (its known_hosts, holding the host key,
instead of the user's ~/.ssh; a user's ~/.ssh/config does the same), so nothing outside `tmp`
changes. `serve(hosts, name)` starts sshd in that host's network namespace on port 2222, the port
the MPI Operator's pods use, accepting only the client key, under the host's own name (a UTS
namespace: every session, and so every worker, sees it as the machine's name). Every sshd is stopped on `close()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from netns import EmulatedHosts

SSHD = Path("/usr/sbin/sshd")
PORT = 2222

SSHD_CONFIG = """\
Port {port}
ListenAddress 0.0.0.0
HostKey {tmp}/host_key
AuthorizedKeysFile {tmp}/authorized_keys
PidFile {tmp}/sshd-{name}.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
LogLevel ERROR
"""

SSH_WRAPPER = """\
#!/bin/sh
exec /usr/bin/ssh -F {config} "$@"
"""


def require_sshd() -> None:
    if not SSHD.exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("Debian's openssh-server is not installed (scripts/setup-system-packages.sh installs it)")


class RealSsh:
    """Keys, a client config and the sshd processes of one test."""

    def __init__(self, tmp: Path, identity_in_config: bool = False, port_in_config: bool = False) -> None:
        require_sshd()
        self.tmp = tmp / "ssh"
        self.tmp.mkdir()
        self.bin_dir = self.tmp / "bin"
        self.bin_dir.mkdir()
        self.identity = self.tmp / "id_ed25519"
        for key in (self.tmp / "host_key", self.identity):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        shutil.copy(f"{self.identity}.pub", self.tmp / "authorized_keys")
        self.host_public_key = (self.tmp / "host_key.pub").read_text().split()[:2]
        self.known_hosts = self.tmp / "known_hosts"
        self.known_hosts.write_text("")
        config = self.tmp / "ssh_config"
        # What a pod's ~/.ssh/config says under the MPI Operator: the key and port 2222 for every host.
        config.write_text("Host *\n"
                          f"  UserKnownHostsFile {self.known_hosts}\n"
                          "  BatchMode yes\n  LogLevel ERROR\n"
                          + (f"  IdentityFile {self.identity}\n" if identity_in_config else "")
                          + (f"  Port {PORT}\n" if port_in_config else ""))
        ssh = self.bin_dir / "ssh"
        ssh.write_text(SSH_WRAPPER.format(config=config))
        ssh.chmod(0o755)
        self._servers: list[subprocess.Popen[bytes]] = []

    def serve(self, hosts: EmulatedHosts, name: str) -> None:
        """Start sshd on port 2222 in host `name`'s namespace; return once it accepts connections."""
        host = hosts.host(name)
        config = self.tmp / f"sshd_config.{name}"
        config.write_text(SSHD_CONFIG.format(port=PORT, tmp=self.tmp, name=name))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        server = subprocess.Popen(hosts.inside(name, [str(SSHD), "-D", "-e", "-f", str(config)]),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self._servers.append(server)
        with self.known_hosts.open("a") as known:
            for alias in (host.address, host.name):
                known.write(f"[{alias}]:{PORT} {' '.join(self.host_public_key)}\n")
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection((host.address, PORT), timeout=1).close()
                return
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not start in {name}: {server.stderr.read().decode() if server.stderr else ''}")
                time.sleep(0.1)

    def env_path(self, path: str) -> str:
        """PATH with this test's `ssh` first."""
        return f"{self.bin_dir}{os.pathsep}{path}"

    def close(self) -> None:
        for server in self._servers:
            try:
                os.killpg(server.pid, signal.SIGTERM)  # sshd and the sessions it forked
            except ProcessLookupError:
                pass
        for server in self._servers:
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
            if server.stderr is not None:
                server.stderr.close()
