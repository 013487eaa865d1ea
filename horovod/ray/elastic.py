"""`ElasticRayExecutor`: an elastic Horovod job whose hosts are the nodes of the Ray cluster.

It is `horovodrun`'s elastic driver (`horovod.runner.elastic.ElasticDriver`) with two pieces
swapped: the hosts come from `ray.nodes()` (`RayHostDiscovery`, one slot per `cpus_per_slot`
CPUs and `gpus_per_slot` GPUs of a live node), and each worker is a Ray actor pinned to its node
(the `ray` launcher). When a node joins, the next round adds workers on it; when a node leaves,
its workers' actors die, the driver blacklists it and the survivors go on in a smaller round,
as in any elastic Horovod job. `run(worker_fn)` is `horovod.run` of an elastic function.
"""

from __future__ import annotations

import random
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import ray

from horovod.ray.results import Reporting
from horovod.ray.settings import NO_SSH, ElasticRaySettings, ray_address, warn_ignored
from horovod.ray.worker import run_reporting
from horovod.runner import run_function
from horovod.runner.elastic import ElasticDriver, ElasticSpec
from horovod.runner.elastic.setup import elastic_spec
from horovod.runner.hosts import HostInfo
from horovod.runner.job import JobSpec


class RayHostDiscovery:
    """The live nodes of the Ray cluster as hosts (named by node id), with the slots they can hold.

    `find_available_hosts_and_slots()` is Horovod's interface (a dict host -> slots), which
    discovery classes of Horovod's Ray examples override; the driver reads `find_available_hosts()`."""

    def __init__(self, use_gpu: bool = False, cpus_per_slot: float = 1, gpus_per_slot: float = 1) -> None:
        self.use_gpu, self.cpus_per_slot, self.gpus_per_slot = use_gpu, cpus_per_slot, gpus_per_slot

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        hosts = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            resources = node.get("Resources", {})
            slots = int(resources.get("CPU", 0) // self.cpus_per_slot)
            if self.use_gpu:
                slots = min(slots, int(resources.get("GPU", 0) // self.gpus_per_slot))
            if slots > 0:
                hosts[node["NodeID"]] = slots
        return hosts

    def find_available_hosts(self) -> list[HostInfo]:
        return [HostInfo(host, slots) for host, slots in self.find_available_hosts_and_slots().items()]


class TestDiscovery(RayHostDiscovery):
    """Horovod's host discovery for trying elastic jobs on a fixed cluster: every
    `change_frequency_s` seconds it hides one more of the cluster's hosts, or shows one it hid,
    keeping between `min_hosts` and `max_hosts` visible (at random between the limits)."""

    __test__ = False  # a helper for users' trials, not a pytest class

    def __init__(self, min_hosts: int, max_hosts: int, change_frequency_s: float, use_gpu: bool = False,
                 cpus_per_slot: float = 1, gpus_per_slot: float = 1, verbose: bool = True,
                 _graceful: bool = True) -> None:
        super().__init__(use_gpu=use_gpu, cpus_per_slot=cpus_per_slot, gpus_per_slot=gpus_per_slot)
        if not _graceful:
            warn_ignored("_graceful=False", "hosts are hidden from discovery; no node is killed")
        self.min_hosts, self.max_hosts, self.change_frequency_s = min_hosts, max_hosts, change_frequency_s
        self.verbose = verbose
        self.hidden: set[str] = set()
        self._last_change: float | None = None

    def _change(self, hosts: dict[str, int]) -> None:
        self.hidden &= hosts.keys()  # a host that left the cluster is no longer ours to show
        visible = [h for h in hosts if h not in self.hidden]
        grow = len(visible) <= self.min_hosts or (len(visible) < self.max_hosts and random.random() < 0.5)
        if grow and self.hidden:
            self.hidden.remove(random.choice(sorted(self.hidden)))
        elif not grow and visible:
            self.hidden.add(random.choice(visible))

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        now = time.monotonic()
        if self._last_change is None:
            self._last_change = now
        hosts = super().find_available_hosts_and_slots()
        if now - self._last_change >= self.change_frequency_s:
            self._change(hosts)
            self._last_change = now
        visible = {h: slots for h, slots in hosts.items() if h not in self.hidden}
        if self.verbose:
            print(f"TestDiscovery: {len(visible)} of {len(hosts)} hosts: {visible}")
        return visible


class ElasticRayExecutor:
    """Runs an elastic Horovod function on as many slots as the Ray cluster's nodes give."""

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False, cpus_per_slot: float = 1,
                 gpus_per_slot: float | None = None, env_vars: dict[str, str] | None = None,
                 override_discovery: bool = True) -> None:
        if cpus_per_slot <= 0 or (gpus_per_slot is not None and gpus_per_slot <= 0):
            raise ValueError("cpus_per_slot and gpus_per_slot must be positive")
        if gpus_per_slot is not None and not use_gpu:
            raise ValueError("gpus_per_slot is given but use_gpu=False; set use_gpu=True")
        self.settings = settings
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.cpus_per_slot = cpus_per_slot
        self.env_vars = {name: str(value) for name, value in (env_vars or {}).items()}
        if override_discovery:
            settings.discovery = RayHostDiscovery(use_gpu, cpus_per_slot, self.gpus_per_slot or 1)
        elif settings.discovery is None:
            raise ValueError("override_discovery=False needs a discovery of your own: set settings.discovery "
                             "(e.g. horovod.ray.elastic.TestDiscovery(...)) first")
        self._address: str | None = None

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: int | None = None, reset_limit: int | None = None,
                        elastic_timeout: float = 600, timeout_s: float = 30, ssh_identity_file: str | None = None,
                        nics: Sequence[str] | None = None, min_np: int | None = None, max_np: int | None = None,
                        **kwargs: Any) -> ElasticRaySettings:
        """Horovod's arguments; `min_np`/`max_np` are its deprecated names for the limits, and
        `kwargs` its other settings fields (`verbose`, `cooldown_range` and `discovery` are used;
        any other says with a warning that it has no effect here)."""
        if min_np is not None:
            warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning, stacklevel=2)
            min_num_proc = min_np if min_num_proc == 1 else min_num_proc
        if max_np is not None:
            warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning, stacklevel=2)
            max_num_proc = max_np if max_num_proc is None else max_num_proc
        if min_num_proc < 1 or (max_num_proc is not None and max_num_proc < min_num_proc):
            raise ValueError(f"need 1 <= min_num_proc ({min_num_proc}) <= max_num_proc ({max_num_proc})")
        if elastic_timeout <= 0 or timeout_s <= 0:
            raise ValueError("elastic_timeout and timeout_s must be positive")
        if ssh_identity_file is not None:
            warn_ignored("ssh_identity_file", NO_SSH)
        used = {name: kwargs.pop(name) for name in ("verbose", "cooldown_range", "discovery") if name in kwargs}
        for name in kwargs:
            warn_ignored(name, "not an elastic Ray setting here")
        cooldown = used.get("cooldown_range")
        return ElasticRaySettings(timeout_s=timeout_s, ssh_identity_file=ssh_identity_file,
                                  nics=tuple(nics) if nics else None, min_num_proc=min_num_proc,
                                  max_num_proc=max_num_proc, reset_limit=reset_limit, elastic_timeout=elastic_timeout,
                                  cooldown_range=tuple(cooldown) if cooldown else None,
                                  verbose=bool(used.get("verbose", False)), discovery=used.get("discovery"))

    def start(self) -> None:
        """Connect to the Ray cluster (`ray.init()` unless done already)."""
        self._address = ray_address()

    def run(self, worker_fn: Callable[[], Any], callbacks: list[Callable[[Any], None]] | None = None) -> list[Any]:
        """Run the elastic function `worker_fn` on every slot until it returns; the results of the
        final round's first `min_num_proc` ranks. `callbacks` get what rank 0 passes to
        `horovod.ray.report` (called from a thread of this process)."""
        if self._address is None:
            raise RuntimeError("the ElasticRayExecutor is not started: call start() first")
        settings = self.settings
        spec = elastic_spec(JobSpec(
            command=("horovod.runner.run_task",), slots=(),
            extra_env={**settings.worker_env(), **self.env_vars}, verbose=settings.verbose,
            start_timeout=settings.timeout_s, launcher="ray", store_address=self._address,
            worker_resources={"CPU": self.cpus_per_slot, "GPU": self.gpus_per_slot}), settings.elastic_timeout)
        elastic = ElasticSpec(settings.discovery, settings.min_num_proc, settings.max_num_proc,
                              settings.elastic_timeout, settings.reset_limit, settings.cooldown_range)
        with Reporting(callbacks) as reporting, ElasticDriver(spec, elastic, base_env={}) as driver:
            queue = reporting.queue
            done = threading.Event()
            forwarder = threading.Thread(target=_forward, args=(reporting, done), name="hvd-ray-reports", daemon=True)
            forwarder.start()
            try:
                return run_function(driver, run_reporting, (None, worker_fn, queue))
            finally:
                done.set()
                forwarder.join()


def _forward(reporting: Reporting, done: threading.Event) -> None:
    while not done.wait(0.2):
        reporting.drain()
    reporting.drain()


__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayHostDiscovery", "TestDiscovery"]
