"""Lifecycle and coordination: topology, process sets, join, shutdown/re-init, dead ranks,
the stall inspector and the timeline, on real ranks."""

import json
import os
import subprocess
import sys
import time

from multirank import REPO, child_env, hvdrun

TOPOLOGY = r'''
import horovod.numpy as hvd
hvd.init()
report(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
       cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), homogeneous=hvd.is_homogeneous())
'''


def test_topology_on_two_simulated_hosts():
    result = hvdrun(TOPOLOGY, np=4, args=["-H", "localhost:2,127.0.0.1:2"]).check()
    for rank in range(4):
        values = result.ranks[rank]
        assert values["rank"] == rank and values["size"] == 4
        assert values["local_rank"] == rank % 2 and values["local_size"] == 2
        assert values["cross_rank"] == rank // 2 and values["cross_size"] == 2
        assert values["homogeneous"] is True


def test_a_script_without_launcher_is_a_job_of_size_one():
    code = ("import numpy as np, horovod.numpy as hvd\nhvd.init()\n"
            "print(hvd.size(), hvd.rank(), hvd.allreduce(np.ones(2) * 3).tolist(), hvd.allgather(np.ones((2, 1))).shape,"
            " hvd.broadcast_object({'a': 1}), hvd.join())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=child_env()).stdout
    assert out.strip() == "1 0 [3.0, 3.0] (2, 1) {'a': 1} 0"


PROCESS_SETS = r'''
import numpy as np
import horovod.numpy as hvd
evens, odds = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])
hvd.init(process_sets=[evens, odds])
r = hvd.rank()
mine = evens if r % 2 == 0 else odds
values = {"ids": [evens.process_set_id, odds.process_set_id], "set_rank": mine.rank(), "set_size": mine.size(),
          "included_evens": evens.included()}
values["sum"] = hvd.allreduce(np.array([r]), op=hvd.Sum, process_set=mine).tolist()
values["gather"] = hvd.allgather(np.array([r]), process_set=mine).tolist()
values["bcast"] = hvd.broadcast(np.array([r]), root_rank=mine.ranks[-1], process_set=mine).tolist()
values["global"] = hvd.allreduce(np.array([r]), op=hvd.Sum).tolist()
try:
    hvd.allreduce(np.array([r]), process_set=odds if mine is evens else evens)
except ValueError as exc:
    values["not_member"] = str(exc)
try:
    hvd.add_process_set([0, 1])
except ValueError as exc:
    values["static_only"] = str(exc)
report(**values)
'''


def test_static_process_sets_run_collectives_over_their_members_only():
    result = hvdrun(PROCESS_SETS, np=4).check()
    for rank in range(4):
        values = result.ranks[rank]
        members = [0, 2] if rank % 2 == 0 else [1, 3]
        assert values["ids"] == [1, 2]
        assert values["set_rank"] == members.index(rank) and values["set_size"] == 2
        assert values["included_evens"] is (rank % 2 == 0)
        assert values["sum"] == [sum(members)] and values["gather"] == members
        assert values["bcast"] == [members[-1]] and values["global"] == [6]
        assert "not a member" in values["not_member"]
        assert "HOROVOD_DYNAMIC_PROCESS_SETS" in values["static_only"]


DYNAMIC = r'''
import numpy as np
import horovod.numpy as hvd
hvd.init(process_sets="dynamic")
r = hvd.rank()
first = hvd.add_process_set([0, 1])
values = {"id": first.process_set_id}
if r in (0, 1):
    values["sum"] = hvd.allreduce(np.array([r + 1]), op=hvd.Sum, process_set=first).tolist()
try:
    hvd.add_process_set(hvd.ProcessSet([1, 0]))
except ValueError as exc:
    values["duplicate"] = str(exc)
values["removed"] = hvd.remove_process_set(first)
values["global_removed"] = hvd.remove_process_set(hvd.global_process_set)
second = hvd.add_process_set([1, 2])
values["reused_id"] = second.process_set_id
if r in (1, 2):
    values["sum2"] = hvd.allreduce(np.array([r]), op=hvd.Sum, process_set=second).tolist()
report(**values)
'''


def test_dynamic_process_sets_add_use_remove_and_reuse_ids():
    result = hvdrun(DYNAMIC, np=3).check()
    for rank in range(3):
        values = result.ranks[rank]
        assert values["id"] == 1 and values["removed"] is True and values["global_removed"] is False
        assert "already exists" in values["duplicate"]
        assert values["reused_id"] == 1
        if rank in (0, 1):
            assert values["sum"] == [3]
        if rank in (1, 2):
            assert values["sum2"] == [3]


JOIN = r'''
import time
import numpy as np
import horovod.numpy as hvd
hvd.init()
r, n = hvd.rank(), hvd.size()
batches = 2 + r            # uneven data: rank r has 2 + r batches
sums = []
for step in range(batches):
    sums.append(hvd.allreduce(np.ones(3) * (r + 1), name="grad", op=hvd.Sum).tolist())
averages = []
if r == n - 1:
    averages.append(hvd.allreduce(np.full(2, float(n)), name="avg").tolist())
last = hvd.join()
report(sums=sums, last=last, averages=averages)
'''


def test_join_lets_ranks_with_less_data_contribute_zeros():
    result = hvdrun(JOIN, np=3).check()
    for rank in range(3):
        values = result.ranks[rank]
        # the rank with the most batches needs everyone else joined before it can finish
        assert values["last"] == 2
        expected = [[6.0] * 3, [6.0] * 3, [5.0] * 3, [3.0] * 3][: 2 + rank]
        assert values["sums"] == expected
    # Average still divides by the full set size: joined ranks contribute zeros.
    assert result.ranks[2]["averages"] == [[1.0, 1.0]]


REINIT = r'''
import numpy as np
import horovod.numpy as hvd
values = []
for round_ in range(3):
    hvd.init()
    hvd.init()   # idempotent
    values.append(hvd.allreduce(np.ones(2) * round_, op=hvd.Sum, name="same_name").tolist())
    hvd.shutdown()
    values.append(hvd.is_initialized())
report(values=values)
'''


def test_init_again_after_shutdown():
    result = hvdrun(REINIT, np=2).check()
    for rank in (0, 1):
        assert result.ranks[rank]["values"] == [[0.0, 0.0], False, [2.0, 2.0], False, [4.0, 4.0], False]


KILLED = r'''
import os, signal, time
import numpy as np
import horovod.numpy as hvd
# horovodrun stops the survivors as soon as rank 1 dies; ignore its SIGTERM so this test measures
# the engine's own detection (horovodrun still SIGKILLs 5 s later, so nothing is left behind).
signal.signal(signal.SIGTERM, signal.SIG_IGN)
hvd.init()
r = hvd.rank()
hvd.allreduce(np.ones(4), name="warmup")
if r == 1:
    time.sleep(0.3)
    os.kill(os.getpid(), 9)
start = time.monotonic()
try:
    hvd.allreduce(np.ones(1 << 20), name="big")
    report(error=None)
except hvd.HorovodInternalError as exc:
    report(error=str(exc), seconds=time.monotonic() - start)
    raise
'''


def test_a_killed_rank_makes_the_others_fail_fast_naming_it():
    result = hvdrun(KILLED, np=3)
    assert result.returncode != 0
    for rank in (0, 2):
        values = result.ranks[rank]
        assert "rank 1" in values["error"] and "allreduce.big" in values["error"]
        assert values["seconds"] < 10
    assert "rank 1" in result.stderr and "SIGKILL" in result.stderr


STALL = r'''
import time
import numpy as np
import horovod.numpy as hvd
hvd.init()
if hvd.rank() == 0:
    hvd.allreduce(np.ones(2), name="late_one")
else:
    time.sleep(2.5)
    hvd.allreduce(np.ones(2), name="late_one")
report(done=True)
'''


def test_stall_inspector_warns_listing_missing_ranks_and_tensors():
    result = hvdrun(STALL, np=2, env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"}).check()
    assert result.ranks[0]["done"] and result.ranks[1]["done"]
    warning = result.output_of(0)
    assert "Missing ranks" in warning and "1: [allreduce.late_one]" in warning


TIMELINE = r'''
import json, os, time
import numpy as np
import horovod.numpy as hvd
hvd.init()
for step in range(3):
    hvd.grouped_allreduce([np.ones(5), np.ones(7)], name="g", op=hvd.Sum)
    hvd.allgather(np.ones((2, 2)), name="ag")
if hvd.rank() == 0:
    path = os.environ["HOROVOD_TIMELINE"]
    time.sleep(0.3)
    mid = json.load(open(path))   # valid JSON while the job runs
    hvd.stop_timeline()
    hvd.start_timeline(path + ".2", mark_cycles=True)
hvd.allreduce(np.ones(3), name="second_file")
if hvd.rank() == 0:
    hvd.stop_timeline()
    report(mid=len(mid), path=path)
'''


def test_timeline_is_valid_chrome_tracing_json_with_negotiation_and_ops(tmp_path):
    path = tmp_path / "timeline.json"
    result = hvdrun(TIMELINE, np=2, args=["--timeline-filename", str(path), "--timeline-mark-cycles"]).check()
    assert result.ranks[0]["mid"] > 0
    events = json.loads(path.read_text())
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"] != 0}
    assert {"grouped_allreduce.g_1of2", "grouped_allreduce.g_2of2", "allgather.ag"} <= names
    kinds = {e["name"] for e in events if e.get("ph") == "B"}
    assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "NEGOTIATE_ALLGATHER", "ALLGATHER"} <= kinds
    assert any(e.get("name") == "CYCLE_START" for e in events)
    ends = [e for e in events if e.get("ph") == "E" and e.get("args", {}).get("dtype") == "float64"]
    assert ends and all("shape" in e["args"] for e in ends)
    second = json.loads((tmp_path / "timeline.json.2").read_text())
    assert any(e.get("name") == "CYCLE_START" for e in second)
    assert any(e.get("args", {}).get("name") == "allreduce.second_file" for e in second)


def test_stall_check_can_be_disabled():
    result = hvdrun(STALL, np=2, env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_CHECK_DISABLE": "1"}).check()
    assert result.ranks[0]["done"] and "Missing ranks" not in result.stderr + result.stdout
