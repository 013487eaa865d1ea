"""The compute service of `horovod.tensorflow.data`: where a job of tf.data workers and the
training job that reads from them find each other.

Horovod's layout: a *compute job* (started with horovodrun) runs tf.data service workers, in
groups of `workers_per_dispatcher`, each group behind one dispatcher; the *training job* reads
its batches from a dispatcher. Both sides need to know, in order: where dispatcher `d` listens,
that all of its workers are up, and when the training is over so the compute job can stop.
`ComputeService` holds these facts in our authenticated key-value store (rendezvous.py: the
job's secret key guards it, and a waiting read blocks in the server, no polling); `ComputeClient`
is how either job reads and writes them.

Every wait is bounded and its error says what was missing and which side should have sent it.
"""

from __future__ import annotations

import socket
import time
from typing import Mapping, Sequence

from horovod.common import wire
from horovod.common.rendezvous import RendezvousClient, RendezvousServer
from horovod.common.netif import interface_address

_SCOPE = "compute"
_DISPATCHERS = "compute.dispatchers"
_LAYOUT, _SHUTDOWN = "layout", "shutdown"

Addresses = Mapping[str, Sequence[tuple[str, int]]]


def _workers_scope(dispatcher_id: int) -> str:
    return f"compute.workers.{dispatcher_id}"


class ComputeService:
    """Serves the compute job's facts (see the module docstring) until `shutdown()`."""

    def __init__(self, dispatchers: int, workers_per_dispatcher: int, key: bytes,
                 nics: Sequence[str] | None = None) -> None:
        if dispatchers < 1 or workers_per_dispatcher < 1:
            raise ValueError(f"ComputeService needs at least one dispatcher and one worker per dispatcher, got "
                             f"dispatchers={dispatchers}, workers_per_dispatcher={workers_per_dispatcher}")
        self._nics = list(nics) if nics else [name for _, name in socket.if_nameindex()]
        loopback_only = all(_address(nic) in (None, "127.0.0.1") for nic in self._nics)
        self._server = RendezvousServer(key, host="127.0.0.1" if loopback_only else "0.0.0.0")
        self._port = self._server.start()
        self._server.put(_SCOPE, _LAYOUT, wire.encode((dispatchers, workers_per_dispatcher)))

    def addresses(self) -> dict[str, list[tuple[str, int]]]:
        """Where clients reach the service: {network interface: [(address, port)]}."""
        found = {nic: _address(nic) for nic in self._nics}
        return {nic: [(address, self._port)] for nic, address in found.items() if address is not None}

    def shutdown(self) -> None:
        """Tell every waiting compute worker to stop, then stop serving (a worker whose connection
        closes before the answer reaches it stops too: see `ComputeClient.wait_for_shutdown`)."""
        self._server.put(_SCOPE, _SHUTDOWN, b"")
        self._server.stop()


def _address(nic: str) -> str | None:
    try:
        return interface_address(nic)
    except ValueError:
        return None


class ComputeClient:
    """A connection to a `ComputeService` through the first of its addresses that answers."""

    def __init__(self, compute_addresses: Addresses, key: bytes, verbose: int = 1) -> None:
        self.verbose = verbose  # Horovod's argument; our waits log nothing
        candidates = [(str(host), int(port)) for addresses in compute_addresses.values() for host, port in addresses]
        if not candidates:
            raise ValueError("ComputeClient: the compute service config lists no address")
        errors = []
        for host, port in candidates:
            try:
                self._store = RendezvousClient(host, port, key, connect_timeout=5.0)
                break
            except (ConnectionError, OSError) as exc:
                errors.append(f"{host}:{port}: {exc}")
        else:
            raise ConnectionError("cannot reach the compute service at any of its addresses (is the compute job "
                                  f"still running?): {'; '.join(errors)}")
        dispatchers, per_dispatcher = wire.decode(self._store.get(_SCOPE, _LAYOUT, 5.0))
        self.dispatchers, self.workers_per_dispatcher = int(dispatchers), int(per_dispatcher)

    def _check_dispatcher(self, dispatcher_id: int) -> None:
        if not 0 <= dispatcher_id < self.dispatchers:
            raise ValueError(f"dispatcher {dispatcher_id} does not exist: the compute job has {self.dispatchers} "
                             f"dispatcher(s), ids 0..{self.dispatchers - 1}")

    def register_dispatcher(self, dispatcher_id: int, dispatcher_address: str) -> None:
        self._check_dispatcher(dispatcher_id)
        self._store.put(_DISPATCHERS, str(dispatcher_id), dispatcher_address.encode())

    def wait_for_dispatcher_registration(self, dispatcher_id: int, timeout: float) -> str:
        """The address of dispatcher `dispatcher_id` once it is registered."""
        self._check_dispatcher(dispatcher_id)
        try:
            return self._store.get(_DISPATCHERS, str(dispatcher_id), timeout).decode()
        except TimeoutError:
            raise TimeoutError(f"dispatcher {dispatcher_id} did not register within {timeout} s: is the compute job "
                               "running, and does its dispatcher_side match the config's?") from None

    def register_worker_for_dispatcher(self, dispatcher_id: int, worker_id: int) -> None:
        self._check_dispatcher(dispatcher_id)
        self._store.put(_workers_scope(dispatcher_id), str(worker_id), b"")

    def wait_for_dispatcher_worker_registration(self, dispatcher_id: int, timeout: float) -> None:
        """Return once all workers of dispatcher `dispatcher_id` are registered."""
        self._check_dispatcher(dispatcher_id)
        first = dispatcher_id * self.workers_per_dispatcher
        deadline = time.monotonic() + timeout
        for worker_id in range(first, first + self.workers_per_dispatcher):
            try:
                self._store.get(_workers_scope(dispatcher_id), str(worker_id), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise TimeoutError(f"compute worker {worker_id} of dispatcher {dispatcher_id} did not register "
                                   f"within {timeout} s: did every process of the compute job start?") from None

    def shutdown(self) -> None:
        """Ask the compute job to stop (the training job calls this when it is done)."""
        try:
            self._store.put(_SCOPE, _SHUTDOWN, b"")
        except ConnectionError:
            pass  # the compute job may stop its service on reading the request, before the reply reaches us

    def wait_for_shutdown(self) -> None:
        """Block until the service is shut down (or gone)."""
        try:
            while True:
                try:
                    self._store.get(_SCOPE, _SHUTDOWN, 3600.0)
                    return
                except TimeoutError:
                    continue
        except (ConnectionError, OSError):
            return  # the service stopped: nothing more to wait for

    def close(self) -> None:
        self._store.close()
