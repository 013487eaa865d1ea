"""The timeline file: valid Chrome-tracing JSON at every flush, in Horovod's layout."""

from __future__ import annotations

import json
import threading
import time

import pytest

from horovod.common.timeline import Timeline

W1 = "allreduce.grad.w1"
W2 = "allreduce.grad.w2"


@pytest.fixture
def timeline():
    tl = Timeline()
    yield tl
    tl.stop()


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def wait_for(path, predicate, timeout=2.0):
    """Poll the file (loading it each time: it must always parse) until predicate holds."""
    deadline = time.monotonic() + timeout
    while True:
        events = load(path)
        if predicate(events) or time.monotonic() > deadline:
            return events
        time.sleep(0.01)


def run_allreduce(tl, name, ranks=(0, 1), shape=(3, 4)):
    tl.negotiate_start(name, "ALLREDUCE")
    for rank in ranks:
        tl.negotiate_rank_ready(name, rank)
    tl.negotiate_end(name)
    tl.start_op(name, "ALLREDUCE")
    tl.activity_start(name, "MEMCPY_IN_FUSION_BUFFER")
    tl.activity_end(name)
    tl.activity_start(name, "TCP_ALLREDUCE")
    tl.activity_end(name)
    tl.end_op(name, "float32", shape)


def pids_by_name(events):
    """Tensor name -> pid, from the process_name metadata (pid 0 is Horovod itself)."""
    return {e["args"]["name"]: e["pid"] for e in events
            if e.get("name") == "process_name" and e["pid"] != 0}


def trace_events(events):
    return [e for e in events if e["ph"] != "M"]


def assert_balanced(events):
    stacks = {}
    for e in events:
        if e["ph"] == "B":
            stacks.setdefault(e["pid"], []).append(e["name"])
        elif e["ph"] == "E":
            assert stacks.get(e["pid"]), f"E without B: {e}"
            assert stacks[e["pid"]].pop() == e["name"]
    assert all(not s for s in stacks.values()), stacks


def test_header_is_valid_json_right_after_start(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    assert timeline.active and not timeline.mark_cycles
    events = load(path)
    assert len(events) == 2
    name, sort = events
    assert name["name"] == "process_name" and name["ph"] == "M" and name["pid"] == 0
    assert name["args"]["name"] == "Horovod"
    started = name["args"]["start_time_since_epoch_in_micros"]
    assert isinstance(started, int) and abs(started - time.time() * 1e6) < 60e6
    assert sort == {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}


def test_events_are_flushed_while_active(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    run_allreduce(timeline, W1)
    events = wait_for(path, lambda ev: any(e.get("args", {}).get("dtype") for e in ev))
    assert any(e["ph"] == "E" and e.get("args", {}).get("dtype") == "float32" for e in events)
    assert timeline.active
    timeline.stop()
    assert not timeline.active
    assert load(path) == events  # nothing left to add, file still valid


def test_pid_per_tensor_in_order_of_first_appearance(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    run_allreduce(timeline, W2)
    run_allreduce(timeline, W1)
    run_allreduce(timeline, W2)
    timeline.stop()
    events = load(path)
    assert pids_by_name(events) == {W2: 1, W1: 2}
    sorts = [e for e in events if e["name"] == "process_sort_index"]
    assert [(e["pid"], e["args"]["sort_index"]) for e in sorts] == [(0, 0), (1, 1), (2, 2)]
    for e in trace_events(events):
        assert e["pid"] in (1, 2) and e["tid"] == 0 and isinstance(e["ts"], int)
    # each process is announced before its first event
    first_meta = next(i for i, e in enumerate(events) if e.get("pid") == 2)
    assert events[first_meta]["name"] == "process_name"


def test_slices_of_an_allreduce(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    run_allreduce(timeline, W1, ranks=(1, 0, 2))
    timeline.stop()
    events = trace_events(load(path))
    assert [(e["ph"], e["name"]) for e in events] == [
        ("B", "NEGOTIATE_ALLREDUCE"),
        ("X", "1"), ("X", "0"), ("X", "2"),
        ("E", "NEGOTIATE_ALLREDUCE"),
        ("B", "ALLREDUCE"),
        ("B", "MEMCPY_IN_FUSION_BUFFER"), ("E", "MEMCPY_IN_FUSION_BUFFER"),
        ("B", "TCP_ALLREDUCE"), ("E", "TCP_ALLREDUCE"),
        ("E", "ALLREDUCE"),
    ]
    assert all(e["dur"] == 0 for e in events if e["ph"] == "X")
    assert events[-1]["args"] == {"dtype": "float32", "shape": "[3, 4]"}
    assert_balanced(events)
    stamps = [e["ts"] for e in events]
    assert stamps == sorted(stamps) and stamps[0] >= 0


def test_type_names_are_upper_cased(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    timeline.negotiate_start("b", "broadcast")
    timeline.negotiate_end("b")
    timeline.start_op("b", "broadcast")
    timeline.end_op("b", "int64", ())
    timeline.stop()
    events = trace_events(load(path))
    assert [e["name"] for e in events] == ["NEGOTIATE_BROADCAST"] * 2 + ["BROADCAST"] * 2
    assert events[-1]["args"] == {"dtype": "int64", "shape": "[]"}


def test_fused_activities(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    names = [W1, W2]
    for name in names:
        timeline.start_op(name, "ALLREDUCE")
    timeline.activity_start_all(names, "MEMCPY_IN_FUSION_BUFFER")
    timeline.activity_end_all(names)
    for name in names:
        timeline.end_op(name, "float16", [7])
    timeline.stop()
    events = load(path)
    pids = pids_by_name(events)
    for name in names:
        mine = [(e["ph"], e["name"]) for e in trace_events(events) if e["pid"] == pids[name]]
        assert mine == [("B", "ALLREDUCE"), ("B", "MEMCPY_IN_FUSION_BUFFER"),
                        ("E", "MEMCPY_IN_FUSION_BUFFER"), ("E", "ALLREDUCE")]
    assert_balanced(trace_events(events))


def test_end_op_closes_activities_left_open(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    timeline.start_op(W1, "ALLGATHER")
    timeline.activity_start(W1, "WAIT_FOR_DATA")
    timeline.end_op(W1, "float32", (2,))
    timeline.stop()
    events = trace_events(load(path))
    assert [(e["ph"], e["name"]) for e in events] == [
        ("B", "ALLGATHER"), ("B", "WAIT_FOR_DATA"), ("E", "WAIT_FOR_DATA"), ("E", "ALLGATHER")]
    assert events[-1]["args"]["shape"] == "[2]"


def test_stop_closes_open_slices_and_drops_unmatched_ends(timeline, tmp_path):
    path = tmp_path / "tl.json"
    timeline.start(str(path))
    timeline.activity_end(W1)  # its B happened before start: dropped
    timeline.end_op(W2, "float32", (1,))
    timeline.start_op(W1, "ALLREDUCE")
    timeline.activity_start(W1, "TCP_ALLREDUCE")
    timeline.stop()
    events = trace_events(load(path))
    assert [(e["ph"], e["name"]) for e in events] == [
        ("B", "ALLREDUCE"), ("B", "TCP_ALLREDUCE"), ("E", "TCP_ALLREDUCE"), ("E", "ALLREDUCE")]


def test_cycle_marks_only_when_asked(timeline, tmp_path):
    plain, marked = tmp_path / "plain.json", tmp_path / "marked.json"
    timeline.start(str(plain))
    timeline.mark_cycle_start()
    run_allreduce(timeline, W1)
    timeline.stop()
    assert not any(e["name"] == "CYCLE_START" for e in load(plain))

    timeline.start(str(marked), mark_cycles=True)
    assert timeline.mark_cycles
    timeline.mark_cycle_start()
    run_allreduce(timeline, W1)
    timeline.mark_cycle_start()
    timeline.stop()
    assert not timeline.mark_cycles
    cycles = [e for e in load(marked) if e["name"] == "CYCLE_START"]
    assert len(cycles) == 2
    assert all(e["ph"] == "i" and e["s"] == "g" and isinstance(e["ts"], int) for e in cycles)


def test_start_stop_start_with_a_new_file(timeline, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    timeline.start(str(first))
    run_allreduce(timeline, W1)
    timeline.stop()
    before = first.read_bytes()

    timeline.start(str(second))
    run_allreduce(timeline, W2)
    timeline.stop()
    assert first.read_bytes() == before
    events = load(second)
    assert events[0]["name"] == "process_name" and events[0]["pid"] == 0
    assert pids_by_name(events) == {W2: 1}  # pids start again in each file


def test_start_while_active_switches_files(timeline, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    timeline.start(str(first))
    timeline.start_op(W1, "ALLREDUCE")
    timeline.start(str(second))
    timeline.end_op(W1, "float32", (1,))  # began in the first file: not in the second
    run_allreduce(timeline, W2)
    timeline.stop()
    assert [(e["ph"], e["name"]) for e in trace_events(load(first))] == [
        ("B", "ALLREDUCE"), ("E", "ALLREDUCE")]
    assert pids_by_name(load(second)) == {W2: 1}


def test_start_truncates_an_existing_file(timeline, tmp_path):
    path = tmp_path / "tl.json"
    path.write_text("x" * 10000)
    timeline.start(str(path))
    timeline.stop()
    assert len(load(path)) == 2


def test_inactive_calls_write_nothing(tmp_path):
    tl = Timeline()
    assert not tl.active and not tl.mark_cycles
    run_allreduce(tl, W1)
    tl.mark_cycle_start()
    tl.activity_start_all([W1], "QUEUE")
    tl.activity_end_all([W1])
    tl.stop()  # harmless when inactive
    assert list(tmp_path.iterdir()) == []

    path = tmp_path / "tl.json"
    tl.start(str(path), mark_cycles=True)
    tl.stop()
    before = path.read_bytes()
    run_allreduce(tl, W1)
    tl.mark_cycle_start()
    time.sleep(0.15)
    assert path.read_bytes() == before


def test_unwritable_path_raises_and_stays_inactive(tmp_path):
    tl = Timeline()
    with pytest.raises(OSError):
        tl.start(str(tmp_path / "missing" / "tl.json"))
    assert not tl.active
    run_allreduce(tl, W1)
    tl.stop()


def test_names_are_escaped(timeline, tmp_path):
    path = tmp_path / "tl.json"
    odd = ['grad "w"\\1', "градиент.é", "tab\tnew\nline", "\u2603\U0001f600", "ctl\x01"]
    timeline.start(str(path))
    for name in odd:
        run_allreduce(timeline, name)
    timeline.activity_start(odd[0], 'ACT "quoted"')
    timeline.activity_end(odd[0])
    timeline.stop()
    events = load(path)
    assert list(pids_by_name(events)) == odd
    assert any(e["name"] == 'ACT "quoted"' for e in events)


def test_engine_thread_racing_start_stop(tmp_path):
    """The engine keeps emitting while the user thread switches files: every file stays valid."""
    tl = Timeline()
    done = threading.Event()

    def engine():
        i = 0
        while not done.is_set():
            name = f"allreduce.t{i % 5}"
            run_allreduce(tl, name)
            tl.mark_cycle_start()
            i += 1
            if i % 50 == 0:
                time.sleep(0.001)

    worker = threading.Thread(target=engine)
    worker.start()
    paths = [tmp_path / f"tl{i}.json" for i in range(4)]
    try:
        for path in paths:
            tl.start(str(path), mark_cycles=True)
            time.sleep(0.03)
            load(path)
            time.sleep(0.03)
            tl.stop()
    finally:
        done.set()
        worker.join()
        tl.stop()
    for path in paths:
        events = load(path)
        body = trace_events(events)
        assert body, path
        assert_balanced(body)
        stamps = [e["ts"] for e in body]
        assert stamps == sorted(stamps)
        assert set(pids_by_name(events)) <= {f"allreduce.t{i}" for i in range(5)}
