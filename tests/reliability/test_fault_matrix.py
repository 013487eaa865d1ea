"""Fault injection: a rank dies (SIGKILL, os._exit, an uncaught exception) at each point of a
small training run, on the shared-memory, TCP and two-host data paths, through our horovodrun.

Why a matrix: each point of the run has its own wait (rendezvous, mesh set-up, negotiation, a
32 MiB transfer, an idle engine between steps), and each way of dying looks different to peers
(a closed socket, an exit status, an announced shutdown). Every combination must end the same
way: every survivor raises HorovodInternalError naming the dead rank within the bound, horovodrun
exits non-zero naming it, and nothing is left behind (processes, /dev/shm segments, threads or
sockets in the survivors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from leftovers import shm_segments, wait_for_no_processes
from multirank import hvdrun

# HOROVOD_FAILURE_DETECTION_SECONDS' default. A crashed peer closes its sockets, so the survivors
# learn of it in milliseconds; the bound is what a survivor may take at worst on a loaded machine.
BOUND_SECONDS = 5.0

WORKER = r'''
import os, signal, subprocess, sys, threading, time
import numpy as np

FAULT, POINT = os.environ["FAULT"], os.environ["POINT"]
VICTIM, STAMP = int(os.environ["VICTIM"]), os.environ["STAMP"]
rank = int(os.environ["HOROVOD_RANK"])
victim = rank == VICTIM
child = subprocess.Popen(["sleep", "300"])  # the launcher must not leave this one behind either
report(pid=os.getpid(), child=child.pid)
if not victim:
    # horovodrun stops survivors once the victim is gone; ignoring its SIGTERM lets them show
    # that they notice the failure by themselves, within the bound (they exit on their own).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def fault():
    """Record the time of death for the test, then die the way this case asks for."""
    with open(STAMP + ".tmp", "w") as f:
        f.write(repr(time.time()))
    os.rename(STAMP + ".tmp", STAMP)
    if FAULT == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if FAULT == "exit":
        os._exit(3)
    raise RuntimeError(f"injected fault on rank {rank} at {POINT}")


def open_sockets():
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count


baseline = set(threading.enumerate())
import horovod.numpy as hvd
from horovod.common import basics

BIG = 8 << 20  # float32 elements: 32 MiB


def run():
    if victim and POINT == "before_init":
        fault()
    hvd.init()
    if victim and POINT == "after_init":
        fault()
    if POINT == "after_init":
        hvd.allreduce(np.ones(4), name="first")
        return
    hvd.allreduce(np.ones(4), name="warmup")
    if POINT == "negotiation":
        if victim:  # the others' op waits in negotiation for this rank, which never submits it
            time.sleep(0.3)
            fault()
        hvd.allreduce(np.ones(4), name="small")
    elif POINT == "large_allreduce":
        handle = hvd.allreduce_async(np.ones(BIG, np.float32), name="big", op=hvd.Sum)
        if victim:
            engine = basics.runtime().engine
            deadline = time.monotonic() + 5
            while not getattr(engine, "_executing", None) and time.monotonic() < deadline:
                time.sleep(0.0002)
            report(mid_op=bool(getattr(engine, "_executing", None)))
            time.sleep(0.001)  # let some of the 32 MiB move
            fault()
        hvd.synchronize(handle)
        for _ in range(20):  # after an announced exit the next one fails
            hvd.allreduce(np.ones(BIG, np.float32), name="big", op=hvd.Sum)
    elif POINT == "between_steps":
        w = np.zeros(16, np.float32)
        for step in range(20):
            if victim and step == 3:
                fault()
            grad = np.full(16, rank + step, np.float32)
            w -= 0.1 * hvd.allreduce(grad, name="grad")
    elif POINT == "torch_steps":  # a real PyTorch training loop, gradients reduced by the optimizer
        import torch
        import horovod.torch as thvd
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                        named_parameters=model.named_parameters())
        thvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for step in range(50):
            if victim and step == 3:
                fault()
            opt.zero_grad()
            model(torch.randn(16, 32)).pow(2).mean().backward()
            opt.step()


error = caught = None
try:
    run()
except Exception as exc:  # anything but HorovodInternalError fails the test, with this text
    if victim:
        raise  # the injected exception: uncaught, as in a real crash
    caught, error = time.time(), f"{type(exc).__name__}: {exc}"
report(error=error, caught=caught)
hvd.shutdown()
report(threads=sorted(t.name for t in set(threading.enumerate()) - baseline), sockets=open_sockets())
'''

POINTS = ("before_init", "after_init", "negotiation", "large_allreduce", "between_steps")
FAULTS = ("sigkill", "exit", "raise")
# The op a survivor is waiting for when the victim dies (None: no op is in flight yet).
OP_IN_FLIGHT = {"before_init": None, "after_init": None, "negotiation": "allreduce.small",
                "large_allreduce": "allreduce.big", "between_steps": "allreduce.grad", "torch_steps": "allreduce"}
TWO_HOSTS = ["-H", "localhost:2,127.0.0.1:2"]


@dataclass(frozen=True)
class Case:
    path: str  # shm (the default, auto), tcp, or two-hosts (shm within, TCP across)
    np: int
    point: str
    fault: str
    victim: int

    def __str__(self) -> str:
        return f"{self.path}-np{self.np}-{self.point}-{self.fault}-victim{self.victim}"


def _cases() -> list[Case]:
    cases = []
    # Shared memory, 3 ranks: every point with every fault, each point killing every rank once.
    for p, point in enumerate(POINTS):
        for f, fault in enumerate(FAULTS):
            cases.append(Case("shm", 3, point, fault, (p + f) % 3))
    # TCP, 2 ranks: every point, the faults and victims taking turns.
    for p, point in enumerate(POINTS):
        cases.append(Case("tcp", 2, point, FAULTS[p % 3], p % 2))
    # Two emulated hosts of two ranks: the hierarchical paths.
    cases.append(Case("two-hosts", 4, "large_allreduce", "sigkill", 3))
    cases.append(Case("two-hosts", 4, "negotiation", "exit", 0))
    cases.append(Case("two-hosts", 4, "between_steps", "raise", 2))
    # PyTorch with DistributedOptimizer (slower to start: one case).
    cases.append(Case("shm", 2, "torch_steps", "sigkill", 1))
    return cases


def _blamed(error: str, own_rank: int) -> set[int]:
    return {int(r) for r in re.findall(r"\brank (\d+)", error)} - {own_rank}


@pytest.mark.parametrize("case", _cases(), ids=str)
def test_every_survivor_fails_fast_naming_the_dead_rank_and_nothing_is_left(case: Case, tmp_path) -> None:
    stamp = tmp_path / "fault-time"
    env = {"FAULT": case.fault, "POINT": case.point, "VICTIM": str(case.victim), "STAMP": str(stamp)}
    if case.path == "tcp":
        env["HOROVOD_CPU_OPERATIONS"] = "tcp"
    args = TWO_HOSTS if case.path == "two-hosts" else []
    result = hvdrun(WORKER, np=case.np, env=env, args=args, timeout=60)
    output = f"{result.stdout}\n{result.stderr}"

    assert result.returncode != 0, output
    fault_time = float(stamp.read_text())
    if case.point == "large_allreduce":
        assert result.ranks[case.victim].get("mid_op"), "the victim did not die in the middle of the op"
    op = OP_IN_FLIGHT[case.point]
    for rank in range(case.np):
        if rank == case.victim:
            continue
        values = result.ranks.get(rank, {})
        error = values.get("error")
        assert error is not None, f"rank {rank} never noticed that rank {case.victim} died:\n{output}"
        assert error.startswith("HorovodInternalError: "), error
        assert _blamed(error, rank) == {case.victim}, error
        if op is not None:
            assert op in error, error
        assert values["caught"] - fault_time < BOUND_SECONDS, (values["caught"] - fault_time, error)
        assert values["threads"] == [], values["threads"]
        assert values["sockets"] == 0

    summary = result.stderr[result.stderr.index("Horovod detected that one or more processes"):]
    cause = {"sigkill": "killed by signal SIGKILL", "exit": "exit code 3", "raise": "exit code 1"}[case.fault]
    assert f"rank {case.victim} on host" in summary and cause in summary, summary
    if case.fault == "raise":
        assert f"injected fault on rank {case.victim} at {case.point}" in summary, summary

    workers = [values["pid"] for values in result.ranks.values()]
    children = [values["child"] for values in result.ranks.values()]
    assert len(workers) == case.np
    assert wait_for_no_processes(workers + children, groups=workers) == []
    assert shm_segments(workers) == []
