"""`horovod.runner.run`: a Python function on every rank, results back in rank order."""

from __future__ import annotations

import os
import threading
import warnings

import pytest

from horovod.runner import run

pytestmark = pytest.mark.timeout(20)


def test_results_in_rank_order(capsys):
    def work(scale, offset=0):
        rank = int(os.environ["HOROVOD_RANK"])
        print("working on", rank)
        return {"rank": rank * scale + offset, "size": int(os.environ["HOROVOD_SIZE"])}

    results = run(work, args=(10,), kwargs={"offset": 1}, num_proc=3)
    assert results == [{"rank": 1, "size": 3}, {"rank": 11, "size": 3}, {"rank": 21, "size": 3}]
    out = capsys.readouterr().out
    assert "[2]<stdout>:working on 2" in out


def test_lambda_on_simulated_hosts():
    results = run(lambda: (os.environ["HOROVOD_HOSTNAME"], os.environ["HOROVOD_CROSS_RANK"]),
                  hosts="localhost:1,127.0.0.1:1")
    assert results == [("localhost", "0"), ("127.0.0.1", "1")]


def test_failing_function_names_the_rank():
    def work():
        if os.environ["HOROVOD_RANK"] == "1":
            raise ValueError("bad batch on purpose")
        return "ok"

    with pytest.raises(RuntimeError) as info:
        run(work, num_proc=2)
    message = str(info.value)
    assert message.startswith("Horovod detected that one or more processes exited with non-zero status")
    assert "rank 1 on host localhost" in message and "exit code 1" in message
    assert "ValueError: bad batch on purpose" in message


def test_unpicklable_result_is_a_failure():
    with pytest.raises(RuntimeError, match=r"rank 0 .*exit code 1(.|\n)*(pickle|Pickl)"):
        run(lambda: (x for x in ()), num_proc=1)


def test_disable_cache_warns_as_the_flag_does(caplog):
    # horovod.run(..., disable_cache=True), as Horovod's API takes it: the job runs, and the warning
    # is the one horovodrun --disable-cache gives
    with caplog.at_level("WARNING", logger="horovod.runner"):
        assert run(lambda: int(os.environ["HOROVOD_RANK"]), num_proc=2, disable_cache=True) == [0, 1]
    warned = [r.getMessage() for r in caplog.records if "--disable-cache" in r.getMessage()]
    assert warned == ["--disable-cache is accepted but has no effect here: this launcher keeps no cache to disable"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="horovod.runner"):
        run(lambda: 0, num_proc=1, disable_cache=False)
    assert not [r for r in caplog.records if "--disable-cache" in r.getMessage()]


def test_np_is_a_deprecated_alias():
    with pytest.warns(DeprecationWarning, match="np= is deprecated"):
        assert run(lambda: 7, np=2) == [7, 7]
    with pytest.raises(ValueError, match="not both"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(lambda: 0, num_proc=1, np=1)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"hosts": "localhost:1", "hostfile": "hosts.txt"}, ValueError, "mutually exclusive"),
    ({"min_num_proc": 3, "max_np": 2}, ValueError, "--min-np 3 is larger than --max-np 2"),
    ({"host_discovery_script": "/nonexistent/d.sh"}, RuntimeError, "cannot run host discovery script"),
    ({"use_gloo": True, "use_mpi": True}, ValueError, "not both"),
    ({"num_proc": 3, "hosts": "localhost:2"}, ValueError, r"Requested more processes \(3\)"),
])
def test_argument_errors(kwargs, error, message):
    with pytest.raises(error, match=message), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run(lambda: None, **kwargs)


def test_output_filename(tmp_path):
    assert run(lambda: print("hello"), num_proc=1, output_filename=str(tmp_path)) == [None]
    assert (tmp_path / "rank.0" / "stdout").read_text() == "hello\n"


def test_run_from_a_thread_other_than_main():
    # Signal handlers can only be installed by the main thread; run() must work without them.
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("r", run(lambda: 1, num_proc=2)))
    thread.start()
    thread.join(15)
    assert box["r"] == [1, 1]
