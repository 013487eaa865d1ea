"""The bootstrap of a job a torch-style launcher started: torchrun, Kubeflow's PyTorchJob, JobSet.

Those launchers give each process its slot (RANK, WORLD_SIZE, LOCAL_*, GROUP_RANK, read by
`launcher_env.torch_launch`) and a meeting point, torch's own TCPStore at MASTER_ADDR:MASTER_PORT,
but no store of ours and no secret. So rank 0 serves our authenticated store itself and leaves its
address in torch's store; the job then meets there exactly as under horovodrun (shared memory
within a host, TCP across hosts). torch's store authenticates no one: when the user gives no
secret (`_HOROVOD_SECRET_KEY`, HOROVOD_SECRET_KEY_FILE), rank 0 makes one and hands it over that
way, and every rank says so loudly. Keys are scoped by torchrun's restart count and by the
process's `init()` count, so a restarted job, or a job that re-initialises, never meets an old one.
"""

from __future__ import annotations

import datetime
import logging
import platform
import socket
from typing import Any

from horovod.common import wire
from horovod.common.bootstrap.base import Membership, reject_comm
from horovod.common.launcher_env import TorchLaunch
from horovod.common.rendezvous import RendezvousClient, RendezvousServer
from horovod.common.settings import Settings, Topology

log = logging.getLogger("horovod.bootstrap")


class TorchrunBootstrap:
    """The slot the launcher's variables give, in a store rank 0 serves for this `init()`."""

    def join(self, settings: Settings, previous_round: int, comm: Any = None) -> Membership:
        launch = settings.torch_launch
        if launch is None:
            raise ValueError("HOROVOD_BOOTSTRAP=torchrun needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, "
                             "as torchrun or a PyTorchJob sets them")
        slot = launch.slot
        topology = Topology(rank=slot.rank, size=slot.size, local_rank=slot.local_rank, local_size=slot.local_size,
                            cross_rank=slot.cross_rank, cross_size=slot.cross_size,
                            hostname=platform.node() or "localhost")
        reject_comm(comm, topology.size)
        number = previous_round + 1  # every member counts its init() calls: they are collective
        if topology.size == 1:
            return Membership(topology, None, number)
        secret = given_secret(settings)
        if secret is None:
            log.warning(
                "no job secret was given, so rank 0 made one and passed it through torch's store at %s:%d, "
                "which authenticates no one: whoever reaches that store can read it and join this job. Give "
                "every process the same secret: HOROVOD_SECRET_KEY_FILE=<file> (e.g. a mounted Kubernetes "
                "Secret) or _HOROVOD_SECRET_KEY=<hex>", launch.master_addr, launch.master_port)
        scope = f"horovod/attempt_{launch.restart_count}/init_{number}"
        torch_store = _torch_store(launch, settings.start_timeout)
        if topology.rank == 0:
            return _serve(settings, topology, number, launch, torch_store, scope, secret)
        address = _read(torch_store, f"{scope}/store", launch).decode()
        if secret is None:
            secret = bytes.fromhex(_read(torch_store, f"{scope}/secret", launch).decode())
        del torch_store  # read what we needed: the store is not kept busy
        host, _, port = address.rpartition(":")
        client = RendezvousClient(host, int(port), secret, settings.start_timeout, settings.failure_detection_seconds)
        return Membership(topology, client, number, store_address=(host, int(port)), secret_key=secret)


def given_secret(settings: Settings) -> bytes | None:
    """The job's secret as the user gave it (`_HOROVOD_SECRET_KEY`, else the content of
    HOROVOD_SECRET_KEY_FILE, surrounding whitespace dropped); None when neither is set."""
    if settings.secret_key:
        return settings.secret_key
    if settings.secret_key_file is None:
        return None
    try:
        with open(settings.secret_key_file, "rb") as file:
            secret = file.read().strip()
    except OSError as exc:
        raise ValueError(f"HOROVOD_SECRET_KEY_FILE={settings.secret_key_file!r} cannot be read: {exc}") from None
    if not secret:
        raise ValueError(f"HOROVOD_SECRET_KEY_FILE={settings.secret_key_file!r} is empty; put the job's secret in it")
    return secret


class _HostedStore(RendezvousClient):
    """Rank 0's connection to the store it serves: closing it stops the server and lets torch's
    store go (rank 0 hosts that one too where no torchrun agent does)."""

    def __init__(self, server: RendezvousServer, torch_store: Any, host: str, port: int, secret: bytes,
                 settings: Settings) -> None:
        self._server = server
        self._torch_store = torch_store
        super().__init__(host, port, secret, settings.start_timeout, settings.failure_detection_seconds)

    def close(self) -> None:
        super().close()
        self._server.stop()
        self._torch_store = None


def _serve(settings: Settings, topology: Topology, number: int, launch: TorchLaunch, torch_store: Any,
           scope: str, secret: bytes | None) -> Membership:
    """Rank 0: start our store where the other hosts can reach it and publish its address (and the
    secret, when the user gave none) in torch's store."""
    if secret is None:
        secret = wire.new_secret_key()
        torch_store.set(f"{scope}/secret", secret.hex())
    host = _reachable_host(launch.master_addr)
    server = RendezvousServer(secret, "127.0.0.1" if host.startswith("127.") else "",
                              settings.failure_detection_seconds)
    port = server.start()
    try:
        client = _HostedStore(server, torch_store, host, port, secret, settings)
    except BaseException:
        server.stop()
        raise
    torch_store.set(f"{scope}/store", f"{host}:{port}")
    return Membership(topology, client, number, store_address=(host, port), secret_key=secret)


def _reachable_host(master_addr: str) -> str:
    """The address the other ranks can reach this host on: loopback when MASTER_ADDR is, else the
    interface that routes to MASTER_ADDR (MASTER_ADDR itself when that is this host, whose name
    may resolve to a loopback address such as Debian's 127.0.1.1)."""
    if master_addr in ("localhost", "") or master_addr.startswith("127."):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((master_addr, 9))
        address = probe.getsockname()[0]
    except OSError:
        return master_addr
    finally:
        probe.close()
    return master_addr if address.startswith("127.") else address


def _torch_store(launch: TorchLaunch, timeout: float) -> Any:
    """A handle on torch's store at MASTER_ADDR:MASTER_PORT: a client of torchrun's agent store, or,
    without an agent, hosted by rank 0 as `init_process_group("env://")` does (and shared with it)."""
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise ImportError("HOROVOD_BOOTSTRAP=torchrun meets through torch's TCPStore at MASTER_ADDR:MASTER_PORT: "
                          "install torch (pip install torch) in this environment") from None
    host = not launch.agent_store and launch.slot.rank == 0
    try:
        return TCPStore(launch.master_addr, launch.master_port, is_master=host, wait_for_workers=False,
                        multi_tenant=host, timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as exc:
        raise ConnectionError(f"cannot {'serve' if host else 'reach'} torch's store at "
                              f"MASTER_ADDR={launch.master_addr} MASTER_PORT={launch.master_port} within "
                              f"{timeout:g} s (HOROVOD_START_TIMEOUT): {exc}") from None


def _read(torch_store: Any, key: str, launch: TorchLaunch) -> bytes:
    """`key` from torch's store, waiting for rank 0 to publish it up to the store's timeout."""
    try:
        return bytes(torch_store.get(key))
    except RuntimeError as exc:
        raise TimeoutError(f"rank 0 did not publish {key} in torch's store at {launch.master_addr}:"
                           f"{launch.master_port}: has rank 0 started, and called hvd.init()? ({exc})") from None
