"""Jobs started by a real `mpirun`, with no horovodrun and no rendezvous store of ours."""

import re
import time

import pytest

from mpirunner import mpirun

pytestmark = pytest.mark.skipif(not __import__("mpirunner").MPIRUN.exists(), reason="no mpirun next to python")


def test_every_collective_runs_through_mpi_on_four_ranks():
    result = mpirun("""
        import numpy as np
        import horovod.numpy as hvd
        from horovod.common.reduce_ops import BFLOAT16
        hvd.init()
        r, n = hvd.rank(), hvd.size()
        x = np.arange(6, dtype=np.float32) + r
        out = dict(
            topo=[r, n, hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
            mpi=[hvd.mpi_enabled(), hvd.gloo_enabled(), hvd.mpi_threads_supported(), hvd.mpi_built()],
            avg=hvd.allreduce(x, name="avg"),
            mn=hvd.allreduce(x, op=hvd.Min, name="min"),
            ints=hvd.allreduce(np.array([r, 2 * r], np.int64), op=hvd.Sum, name="ints"),
            half=hvd.allreduce(x.astype(np.float16), op=hvd.Sum, name="half"),
            flags=hvd.allreduce(np.array([r == 1, False]), op=hvd.Sum, name="flags"),
            gather=hvd.allgather(np.full((r + 1, 2), r, np.int32), name="gather"),
            bcast=hvd.broadcast(x, 2, name="bcast"),
            a2a=hvd.alltoall(np.arange(n, dtype=np.float64) + 10 * r, name="a2a"),
            rs=hvd.reducescatter(np.ones(8, np.float32) * r, op=hvd.Sum, name="rs"),
            grouped=hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name="grp"),
        )
        if BFLOAT16 is not None:
            out["bf16"] = hvd.allreduce(np.ones(3, BFLOAT16) * (r + 1), op=hvd.Sum, name="bf").astype(np.float32)
        report(**out)
        hvd.shutdown()
    """, np=4).check()
    for r, got in result.every_rank(4):
        assert got["topo"] == [r, 4, r, 4, 0, 1]  # one host: every rank is local
        assert got["mpi"] == [True, False, True, True]
        assert got["avg"] == [1.5 + i for i in range(6)]
        assert got["mn"] == list(range(6))
        assert got["ints"] == [6, 12]
        assert got["half"] == [6 + 4 * i for i in range(6)]
        assert got["flags"] == [True, False]
        assert got["gather"] == [[k, k] for k in range(4) for _ in range(k + 1)]
        assert got["bcast"] == [2 + i for i in range(6)]
        assert got["a2a"] == [10 * k + r for k in range(4)]
        assert got["rs"] == [6.0, 6.0]
        assert got["grouped"] == [[6 + 4 * i for i in range(6)], [12 + 8 * i for i in range(6)]]
        if "bf16" in got:
            assert got["bf16"] == [10.0, 10.0, 10.0]


def test_process_sets_and_a_job_over_a_subset_of_the_world():
    result = mpirun("""
        import numpy as np
        from mpi4py import MPI
        import horovod.numpy as hvd
        world = MPI.COMM_WORLD
        try:
            hvd.init(comm=[0, 2])  # a job of MPI_COMM_WORLD ranks 0 and 2
        except ValueError as exc:
            report(outside=str(exc))
        else:
            report(sub=[hvd.rank(), hvd.size()], sum=hvd.allreduce(np.array([world.rank]), op=hvd.Sum, name="s"))
            hvd.shutdown()
        evens = world.Create_group(world.group.Incl([0, 2]))  # MPI_COMM_NULL on ranks 1 and 3
        halves = hvd.ProcessSet(evens)
        odd = hvd.ProcessSet([1, 3])
        hvd.init(process_sets=[halves, odd])
        out = dict(ranks=[halves.ranks, odd.ranks], ids=[halves.process_set_id, odd.process_set_id])
        mine = halves if world.rank % 2 == 0 else odd
        out["in_set"] = hvd.allreduce(np.array([world.rank]), op=hvd.Sum, name="set", process_set=mine)
        report(**out)
        hvd.shutdown()
    """, np=4).check()
    for r, got in result.every_rank(4):
        if r in (0, 2):
            assert got["sub"] == [r // 2, 2] and got["sum"] == [2]
        else:
            assert "is not part of the job" in got["outside"]
        assert got["ranks"] == [[0, 2], [1, 3]] and got["ids"] == [1, 2]
        assert got["in_set"] == ([2] if r % 2 == 0 else [4])


def test_init_with_an_mpi_communicator():
    result = mpirun("""
        import numpy as np
        from mpi4py import MPI
        import horovod.numpy as hvd
        half = MPI.COMM_WORLD.Split(color=MPI.COMM_WORLD.rank // 2, key=MPI.COMM_WORLD.rank)
        hvd.init(comm=half)
        report(me=[hvd.rank(), hvd.size()], total=hvd.allreduce(np.array([MPI.COMM_WORLD.rank]), op=hvd.Sum))
        hvd.shutdown()
        hvd.init()  # again, now over the whole world: a new round
        report(again=[hvd.rank(), hvd.size()])
        hvd.shutdown()
    """, np=4).check()
    for r, got in result.every_rank(4):
        assert got["me"] == [r % 2, 2]
        assert got["total"] == ([1] if r < 2 else [5])
        assert got["again"] == [r, 4]


def test_a_mismatch_raises_on_every_rank_and_the_job_goes_on():
    result = mpirun("""
        import numpy as np
        import horovod.numpy as hvd
        hvd.init()
        try:
            hvd.allreduce(np.ones(2 + hvd.rank(), np.float32), name="bad")
        except Exception as exc:
            report(error=type(exc).__name__, text=str(exc))
        report(after=hvd.allreduce(np.ones(2), op=hvd.Sum, name="good"))
        hvd.shutdown()
    """, np=2).check()
    for _, got in result.every_rank(2):
        assert got["error"] == "HorovodInternalError"
        assert "bad" in got["text"] and "shape" in got["text"].lower()
        assert got["after"] == [2.0, 2.0]


def test_a_rank_that_dies_ends_the_job_within_seconds_naming_it():
    start = time.monotonic()
    result = mpirun("""
        import os, time
        import numpy as np
        import horovod.numpy as hvd
        hvd.init()
        for step in range(1000):
            if step == 3 and hvd.rank() == 1:
                os._exit(3)
            hvd.allreduce(np.ones(4), name="step")
            time.sleep(0.01)
    """, np=3, timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 30
    text = result.stdout + result.stderr
    assert re.search(r"Process name: +\[prterun-[^\]]*,1\]\s+Exit code: +3", text), text


def test_a_rank_whose_init_fails_ends_the_job_instead_of_hanging():
    """Rank 1's hvd.init() raises while rank 0 waits for it inside MPI: the uncaught exception
    aborts the MPI job (rank 1 would otherwise wait in MPI_Finalize, and mpirun for it)."""
    start = time.monotonic()
    result = mpirun("""
        import os
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            os.environ["HOROVOD_CPU_OPERATIONS"] = "tcp"  # no store under mpirun: init() refuses it
        import horovod.numpy as hvd
        hvd.init()
        report(joined=True)
    """, np=2, timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - start < 45  # generous: the machine is shared; the hang it replaces is unbounded
    assert "has no rendezvous store" in result.stderr
    assert "rank 1 failed in hvd.init(); aborting the MPI job" in result.stderr
    assert 1 not in result.ranks


INIT_ERROR = """
    import horovod.numpy as hvd
    try:
        hvd.init()
    except (ValueError, RuntimeError) as exc:
        report(error=str(exc))
"""


def test_mpi_operations_under_our_launcher_say_what_is_missing():
    from multirank import hvdrun

    result = hvdrun(INIT_ERROR, np=2, env={"HOROVOD_CPU_OPERATIONS": "mpi"})
    for _, got in result.every_rank(2):
        assert "needs a job that MPI started" in got["error"]


def test_an_mpi_without_thread_support_is_refused_saying_why():
    # mpi4py's own setting forces MPI_THREAD_SINGLE, as an MPI built without threads would give.
    result = mpirun(INIT_ERROR, np=2, args=["-x", "MPI4PY_RC_THREAD_LEVEL=single"]).check()
    for _, got in result.every_rank(2):
        assert "gives only MPI_THREAD_SINGLE" in got["error"] and "MPI_THREAD_MULTIPLE" in got["error"]


WITHOUT_MPI4PY = """
    import sys
    sys.modules["mpi4py"] = None  # as where mpi4py is not installed: importing it fails
    import numpy as np
    import horovod.numpy as hvd
    try:
        hvd.init()
    except ImportError as exc:
        report(error=str(exc))
    else:
        report(slot=[hvd.rank(), hvd.size(), hvd.local_rank(), hvd.mpi_built()],
               total=hvd.allreduce(np.ones(2), op=hvd.Sum))
"""


def test_without_mpi4py_a_job_of_one_runs_from_the_launchers_variables():
    result = mpirun(WITHOUT_MPI4PY, np=1).check()
    assert result.ranks[0] == {"rank": 0, "slot": [0, 1, 0, False], "total": [1.0, 1.0]}


def test_without_mpi4py_every_rank_says_what_to_install_instead_of_hanging():
    start = time.monotonic()
    result = mpirun(WITHOUT_MPI4PY, np=3, timeout=60).check()
    assert time.monotonic() - start < 30
    for r, got in result.every_rank(3):  # rank and size came from Open MPI's variables
        assert got["error"].startswith(f"rank {r} of 3: mpirun (Open MPI) started this job"), got
        assert "mpi4py is not installed" in got["error"] and "pip install 'khorovod[mpi]'" in got["error"]
