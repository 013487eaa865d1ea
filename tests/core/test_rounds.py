"""Rounds with real processes: a harness serves the store, the workers `init()` -> collectives ->
`shutdown()` -> `init()` again with another membership.

Planned rounds (`HOROVOD_BOOTSTRAP=store`): round 1, workers 0, 1, 2 as ranks 0, 1, 2; round 2,
worker 1 has left and the survivors take new ranks (2 -> 0, 0 -> 1); round 3, worker 3, started
only now, joins them as rank 0. Launcher slots (`env`): a replacement for rank 1, started after
round 1, meets rank 0 in round 2."""

import json
import queue
import subprocess
import sys
import threading

import pytest

from multirank import child_env
from horovod.common import wire
from horovod.common.bootstrap.store import publish_round
from horovod.common.rendezvous import RendezvousServer
from horovod.common.settings import Topology

WORKER = r'''
import json, sys
import numpy as np
import horovod.numpy as hvd
from horovod.common import runtime

me, rounds = int(sys.argv[1]), int(sys.argv[2])
for _ in range(rounds):
    hvd.init()
    print("RESULT:" + json.dumps(dict(
        worker=me, round=runtime.current().round, rank=hvd.rank(), size=hvd.size(),
        sum=hvd.allreduce(np.array([me + 1]), op=hvd.Sum, name="sum").tolist(),
        gathered=hvd.allgather(np.array([me]), name="who").tolist(),
        root=hvd.broadcast(np.array([me]), root_rank=0, name="root").tolist(),
        global_set=hvd.global_process_set.ranks)), flush=True)
    hvd.shutdown()
'''
# Which workers take part in each round, in rank order.
ROUNDS = [[0, 1, 2], [2, 0], [3, 0, 2]]
TIMEOUT = 60.0


def plan(workers: list[int]) -> dict[str, Topology]:
    size = len(workers)
    return {f"localhost:{worker}": Topology(rank=rank, size=size, local_rank=rank, local_size=size,
                                            hostname="localhost")
            for rank, worker in enumerate(workers)}


class Workers:
    """Worker processes whose RESULT lines arrive on one queue."""

    def __init__(self, script: str, env: dict[str, str]) -> None:
        self.script, self.env = script, env
        self.procs: list[subprocess.Popen] = []
        self.results: queue.Queue = queue.Queue()

    def start(self, worker: int, rounds: int, **env: str) -> None:
        env = child_env({**self.env, "HOROVOD_LOCAL_RANK": str(worker), **env})
        proc = subprocess.Popen([sys.executable, "-c", self.script, str(worker), str(rounds)], env=env,
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("RESULT:"):
                self.results.put(json.loads(line[len("RESULT:"):]))

    def collect(self, count: int) -> dict[int, dict]:
        found = {}
        for _ in range(count):
            values = self.results.get(timeout=TIMEOUT)
            found[values["worker"]] = values
        return found

    def stop(self) -> list[int | None]:
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=TIMEOUT))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(proc.wait())
        return codes


    def kill_leftovers(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()


def expected(worker: int, number: int, members: list[int]) -> dict:
    """What `worker` reports in round `number` of `members` (in rank order)."""
    return dict(worker=worker, round=number, rank=members.index(worker), size=len(members),
                sum=[sum(w + 1 for w in members)], gathered=members, root=[members[0]],
                global_set=list(range(len(members))))


@pytest.fixture
def store():
    key = wire.new_secret_key()
    server = RendezvousServer(key)
    port = server.start()
    yield server, {"HOROVOD_HOSTNAME": "localhost", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
                   "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port), "_HOROVOD_SECRET_KEY": key.hex()}
    server.stop()


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_workers_leave_and_join_between_rounds_and_get_exact_results(store, transport):
    server, env = store
    workers = Workers(WORKER, {**env, "HOROVOD_BOOTSTRAP": "store", "HOROVOD_CPU_OPERATIONS": transport})
    try:
        for worker in ROUNDS[0]:
            workers.start(worker, rounds=sum(worker in members for members in ROUNDS))
        for number, members in enumerate(ROUNDS, start=1):
            if number == 3:
                workers.start(3, rounds=1)  # a newcomer: it never saw rounds 1 and 2
            assert publish_round(server, plan(members)) == number
            found = workers.collect(len(members))
            assert sorted(found) == sorted(members)
            assert found == {worker: expected(worker, number, members) for worker in members}
        assert workers.stop() == [0, 0, 0, 0]
    finally:
        workers.kill_leftovers()


def test_a_replacement_started_later_meets_the_survivor_in_the_next_round(store):
    _, env = store
    workers = Workers(WORKER, {**env, "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2"})
    try:
        workers.start(0, rounds=2, HOROVOD_RANK="0", HOROVOD_LOCAL_RANK="0")
        workers.start(1, rounds=1, HOROVOD_RANK="1", HOROVOD_LOCAL_RANK="1")
        assert workers.collect(2) == {worker: expected(worker, 1, [0, 1]) for worker in (0, 1)}
        workers.start(2, rounds=1, HOROVOD_RANK="1", HOROVOD_LOCAL_RANK="1")  # a new process for rank 1
        assert workers.collect(2) == {worker: expected(worker, 2, [0, 2]) for worker in (0, 2)}
        assert workers.stop() == [0, 0, 0]
    finally:
        workers.kill_leftovers()
