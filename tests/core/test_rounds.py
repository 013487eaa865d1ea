"""Rounds with real processes: a harness serves the store and plans each round, the workers
`init()` -> collectives -> `shutdown()` -> `init()` again with another membership.

Round 1: workers 0, 1, 2 as ranks 0, 1, 2. Round 2: worker 1 has left; the survivors take new
ranks (2 -> 0, 0 -> 1). Round 3: worker 3, started only now, joins them as rank 0."""

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

    def start(self, worker: int, rounds: int) -> None:
        env = child_env({**self.env, "HOROVOD_LOCAL_RANK": str(worker)})
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


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_workers_leave_and_join_between_rounds_and_get_exact_results(transport):
    key = wire.new_secret_key()
    server = RendezvousServer(key)
    port = server.start()
    workers = Workers(WORKER, {"HOROVOD_BOOTSTRAP": "store", "HOROVOD_HOSTNAME": "localhost",
                               "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
                               "_HOROVOD_SECRET_KEY": key.hex(), "HOROVOD_CPU_OPERATIONS": transport})
    try:
        for worker in ROUNDS[0]:
            workers.start(worker, rounds=sum(worker in members for members in ROUNDS))
        for number, members in enumerate(ROUNDS, start=1):
            if number == 3:
                workers.start(3, rounds=1)  # a newcomer: it never saw rounds 1 and 2
            assert publish_round(server, plan(members)) == number
            found = workers.collect(len(members))
            assert sorted(found) == sorted(members)
            for rank, worker in enumerate(members):
                assert found[worker] == dict(
                    worker=worker, round=number, rank=rank, size=len(members),
                    sum=[sum(w + 1 for w in members)], gathered=members, root=[members[0]],
                    global_set=list(range(len(members))))
        assert workers.stop() == [0, 0, 0, 0]
    finally:
        for proc in workers.procs:
            if proc.poll() is None:
                proc.kill()
        server.stop()
