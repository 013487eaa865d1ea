"""`RayExecutor`: Horovod workers as Ray actors, placed together, running functions on demand.

`start()` reserves every worker's resources in one placement group, works out each worker's
slot from the node its bundle landed on (`placement.slots_by_node`), serves the job's rendezvous
store from this process, and creates one actor per slot with the slot's `HOROVOD_*` environment
(`horovod.runner.job.worker_env`, the very variables horovodrun gives a worker). `run`,
`execute`, `run_remote` and `execute_single` then call functions on those actors, any number of
times; `shutdown()` kills the actors and frees the placement group. A failed function fails the
call naming the rank, its node and its traceback (`results.collect`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from horovod.common import wire
from horovod.common.rendezvous import RendezvousServer
from horovod.ray import results
from horovod.ray.elastic import ElasticRayExecutor
from horovod.ray.placement import Layout, slots_by_node
from horovod.ray.settings import NO_SSH, ElasticRaySettings, RaySettings, ray_address, warn_ignored
from horovod.ray.worker import BaseHorovodWorker
from horovod.runner.job import worker_env
from horovod.runner.launchers import SECRET_KEY_ENV


class RayExecutor:
    """Runs Horovod workers as Ray actors; see docs/ray.md.

    Give `num_workers` (packed onto as few nodes as fit), or `num_hosts` with `num_workers_per_host`
    (each host's workers on a node of their own). `min_workers`/`max_workers` make the job elastic
    (an `ElasticRayExecutor` with these limits: `run` only).
    """

    def __init__(self, settings: RaySettings, num_workers: int | None = None, num_hosts: int | None = None,
                 num_workers_per_host: int = 1, cpus_per_worker: float = 1, use_gpu: bool = False,
                 gpus_per_worker: float | None = None, use_current_placement_group: bool = True,
                 min_workers: int | None = None, max_workers: int | None = None, reset_limit: int | None = None,
                 cooldown_range: tuple[int, int] | None = None, elastic_timeout: int = 600,
                 override_discovery: bool = True) -> None:
        elastic_mode = min_workers is not None or max_workers is not None
        if not override_discovery and not elastic_mode:
            warn_ignored("override_discovery=False", "only an elastic RayExecutor (min_workers/max_workers) "
                         "discovers hosts")
        self.settings = settings
        # min_workers/max_workers: Horovod's elastic RayExecutor, which is an ElasticRayExecutor.
        self._elastic: ElasticRayExecutor | None = None
        if elastic_mode:
            elastic = ElasticRaySettings(timeout_s=settings.timeout_s, nics=settings.nics,
                                         min_num_proc=min_workers or 1, max_num_proc=max_workers,
                                         reset_limit=reset_limit, elastic_timeout=elastic_timeout,
                                         cooldown_range=cooldown_range, discovery=getattr(settings, "discovery", None))
            self._elastic = ElasticRayExecutor(elastic, use_gpu, cpus_per_worker, gpus_per_worker,
                                               override_discovery=override_discovery)
            num_workers = num_workers or elastic.min_num_proc  # unused: only to check the other arguments
        self.layout = Layout.of(num_workers, num_hosts, num_workers_per_host, cpus_per_worker, use_gpu,
                                gpus_per_worker)
        self.use_current_placement_group = use_current_placement_group
        self.workers: list[Any] = []  # actor handles, by rank
        self.node_ids: list[str] = []  # the node of each rank
        self._placement_group: PlacementGroup | None = None
        self._own_placement_group = False
        self._store: RendezvousServer | None = None

    @staticmethod
    def create_settings(timeout_s: float = 30, ssh_identity_file: str | None = None, ssh_str: str | None = None,
                        placement_group_timeout_s: float = 100, nics: Sequence[str] | None = None) -> RaySettings:
        if timeout_s <= 0 or placement_group_timeout_s <= 0:
            raise ValueError("timeout_s and placement_group_timeout_s must be positive")
        if ssh_identity_file is not None or ssh_str is not None:
            warn_ignored("ssh_identity_file/ssh_str", NO_SSH)
        return RaySettings(timeout_s, ssh_identity_file, ssh_str, placement_group_timeout_s,
                           tuple(nics) if nics else None)

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, executable_cls: type | None = None, executable_args: list[Any] | None = None,
              executable_kwargs: dict[str, Any] | None = None,
              extra_env_vars: dict[str, str] | None = None) -> None:
        """Place the workers, start the store and the actors, and build `executable_cls` on each."""
        if self._elastic is not None:
            if executable_cls is not None or extra_env_vars:
                raise ValueError("an elastic RayExecutor (min_workers/max_workers) runs functions only: "
                                 "no executable_cls, and environment variables go to ElasticRayExecutor(env_vars=)")
            self._elastic.start()
            return
        if self.workers:
            raise RuntimeError("this RayExecutor is already started; call shutdown() first")
        address = ray_address()
        try:
            bundles = self._place()
            nodes = self._bundle_nodes()
            placed = [(slot, bundles[index]) for slot, index in slots_by_node([nodes[b] for b in bundles])]
            self.node_ids = [slot.hostname for slot, _ in placed]
            secret = wire.new_secret_key()
            self._store = RendezvousServer(secret, address)
            port = self._store.start()
            extra = {**self.settings.worker_env(), **{k: str(v) for k, v in (extra_env_vars or {}).items()}}
            for slot, bundle in placed:
                env = {**worker_env({}, extra, slot, address, port), SECRET_KEY_ENV: secret.hex()}
                self.workers.append(self._actor(bundle, env).remote(slot.rank, slot.size))
            ray.get([worker.start_executable.remote(executable_cls, list(executable_args or []),
                                                    dict(executable_kwargs or {})) for worker in self.workers],
                    timeout=self.settings.placement_group_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _place(self) -> list[int]:
        """The placement group's bundle of each worker (by rank order before slots are known)."""
        current = ray.util.get_current_placement_group() if self.use_current_placement_group else None
        wanted = self.layout.bundles()
        if current is not None:
            have = len(current.bundle_specs)
            if have < len(wanted):
                raise ValueError(f"the current placement group has {have} bundles, fewer than the {len(wanted)} "
                                 f"that {self.layout.describe()} need; use_current_placement_group=False makes "
                                 "a placement group of its own")
            self._placement_group = current
            first = have - len(wanted)  # the first bundles hold the caller (Tune's head bundle)
        else:
            self._placement_group = placement_group(wanted, strategy=self.layout.strategy())
            self._own_placement_group = True
            first = 0
            if not self._placement_group.wait(self.settings.placement_group_timeout_s):
                raise TimeoutError(f"Ray could not place {self.layout.describe()} within "
                                   f"{self.settings.placement_group_timeout_s:g} s (placement_group_timeout_s); "
                                   f"the cluster has {ray.cluster_resources()}")
        return [first + self.layout.bundle_of(worker) for worker in range(self.layout.num_workers)]

    def _bundle_nodes(self) -> dict[int, str]:
        table = placement_group_table(self._placement_group)
        return {int(index): node for index, node in table["bundles_to_node_id"].items()}

    def _actor(self, bundle: int, env: dict[str, str]) -> Any:
        return ray.remote(BaseHorovodWorker).options(
            num_cpus=self.layout.cpus_per_worker, num_gpus=self.layout.gpus_per_worker,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self._placement_group, bundle),
            runtime_env={"env_vars": env}, max_restarts=0)

    def shutdown(self) -> None:
        """Kill the actors (their processes end), free the placement group and stop the store."""
        for worker in self.workers:
            ray.kill(worker, no_restart=True)
        self.workers = []
        if self._placement_group is not None and self._own_placement_group:
            remove_placement_group(self._placement_group)
        self._placement_group, self._own_placement_group = None, False
        if self._store is not None:
            self._store.stop()
            self._store = None

    # -- calls ---------------------------------------------------------------------------------
    def _started(self) -> list[Any]:
        if self._elastic is not None:
            raise NotImplementedError("an elastic RayExecutor (min_workers/max_workers) only has run(); its "
                                      "workers come and go, so there are no actors to execute on")
        if not self.workers:
            raise RuntimeError("the RayExecutor is not started: call start() first")
        return self.workers

    def run_remote(self, fn: Callable[..., Any], args: list[Any] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[Any]:
        """`fn(*args, **kwargs)` on every worker; the object refs, by rank (`ray.get` them)."""
        call = _bind(fn, args, kwargs)
        return [worker.execute.remote(call) for worker in self._started()]

    def run(self, fn: Callable[..., Any], args: list[Any] | None = None, kwargs: dict[str, Any] | None = None,
            callbacks: list[Callable[[Any], None]] | None = None) -> list[Any]:
        """`fn(*args, **kwargs)` on every worker; the results by rank. `callbacks` get every value
        rank 0 passes to `horovod.ray.report` while `fn` runs. Elastic (min_workers/max_workers):
        `fn` is an elastic function, and the results are those of the final round's first
        `min_workers` ranks."""
        if self._elastic is not None:
            bound = _bind(fn, args, kwargs)
            return self._elastic.run(lambda: bound(None), callbacks)
        return self.execute(_bind(fn, args, kwargs), callbacks)

    def execute(self, fn: Callable[[Any], Any], callbacks: list[Callable[[Any], None]] | None = None) -> list[Any]:
        """`fn(executable)` on every worker (the `executable_cls` instance of `start`); results by rank."""
        workers = self._started()
        with results.Reporting(callbacks) as reporting:
            refs = [worker.execute.remote(fn, reporting.queue) for worker in workers]
            outcome = results.collect(refs, self.node_ids, reporting, self.settings.timeout_s)
        if outcome.stuck:
            self.shutdown()  # ranks still inside a collective with a failed peer: nothing else frees them
        return outcome.values_or_raise()

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(executable)` on the rank 0 worker only."""
        return ray.get(self._started()[0].execute.remote(fn))


def _bind(fn: Callable[..., Any], args: list[Any] | None, kwargs: dict[str, Any] | None) -> Callable[[Any], Any]:
    bound_args, bound_kwargs = list(args or []), dict(kwargs or {})
    return lambda _executable: fn(*bound_args, **bound_kwargs)


__all__ = ["RayExecutor", "RaySettings"]
