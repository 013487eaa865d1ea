"""The fuzz targets in CI: a short coverage-guided run of each, and every input that once crashed
one, replayed (the long runs, 100,000 executions per target: `run_fuzz.py`, docs/reliability.md)."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from horovod.common import wire
from horovod.common.bootstrap.store import decode_plan
from horovod.common.rendezvous import ROUNDS, RendezvousClient, RendezvousServer
from horovod.common.transport.tcp.mesh import greeting_problem
from multirank import child_env
from tests.fuzz import targets

RUN_FUZZ = Path(__file__).with_name("run_fuzz.py")


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_a_short_coverage_guided_run_finds_no_crash(name: str) -> None:
    pytest.importorskip("atheris", reason="atheris (the coverage-guided fuzzer) is not installed")
    done = subprocess.run([sys.executable, str(RUN_FUZZ), name, "-runs=400", "-timeout=10"],
                          capture_output=True, text=True, env=child_env(), timeout=120, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no crash" in done.stdout and "400 executions" in done.stdout, done.stdout


@pytest.mark.parametrize("name", sorted(targets.TARGETS))
def test_every_seed_passes_its_target(name: str) -> None:
    for seed in targets.seeds(name):
        targets.TARGETS[name](seed)


# Inputs the fuzzer once crashed a target with: each now meets the target's contract.
CRASHES = [
    ("elastic", b""),  # a round key that is not a number: ValueError from int('')
    ("elastic", b"r x 00"),  # the same, named
    ("elastic", b"r 080 00\nc 1 80054b022e"),  # '080': taken for round 80, whose plan is not there
    ("elastic", b"r 1 " + wire.encode([1, 2]).hex().encode()),  # a plan that is not a mapping: AttributeError
    ("elastic", b"r 1 " + wire.encode({"w": (1, 2)}).hex().encode()),  # too few fields: TypeError
    ("elastic", b"r 1 " + wire.encode({}).hex().encode() + b"\nc 1 " + wire.encode("2").hex().encode()),  # flags
    # LONG_BINPUT at memo index 875,903,285: the unpickler grew its memo past 4 GB (out of memory)
    ("elastic", base64.b64decode("ciAxIClyNTk1NAEANDJ+IClh")),
    ("mesh", base64.b64decode("ASQAAAAAAAAAgAWVFAAAAAAAAAApjAVoZWxsb3JLAktVAYwBeJQAAQAAAAAAHxQ=")),  # the same in a greeting
    ("store", base64.b64decode("ASEAAAAAAAAAgAWVFgAAAAAAAAAojANwdXSMAXOUjAFrcpR0lC4Bc5Qu")),  # ... in a store request
]


@pytest.mark.parametrize("name,data", CRASHES, ids=[f"{name}-{i}" for i, (name, _) in enumerate(CRASHES)])
def test_inputs_that_once_crashed_a_target_are_handled(name: str, data: bytes) -> None:
    targets.TARGETS[name](data)


def test_a_message_cannot_make_the_decoder_allocate_gigabytes() -> None:
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for data in (b")r5954",  # pickle: an empty tuple stored at memo index 875,903,285 (once 4 GB)
                 b"\x80\x05Np999999999\n.",  # pickle: None stored at memo index 999,999,999 (PUT)
                 b"\xdd\xff\xff\xff\xff",  # an array of 4,294,967,295 items in 5 bytes
                 b"\xdb\xff\xff\xff\xffabc"):  # a string of 4 GiB in 8 bytes
        with pytest.raises(wire.WireError, match="malformed message"):
            wire.decode(data)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: nothing grew
    message = ("put", "s", "r\x00\x00\x00\x01" * 100, b"r1234" * 1000, {"k": (1, 2.5, None, True)})
    assert wire.decode(wire.encode(message)) == message
    with pytest.raises(wire.WireError, match="extension type"):
        wire.decode(b"\xc7\x01\x05a")


def test_malformed_elastic_notifications_are_named_as_such() -> None:
    server = RendezvousServer(targets.KEY, "127.0.0.1", liveness_seconds=0)
    client = RendezvousClient("127.0.0.1", server.start(), targets.KEY, connect_timeout=5, liveness_seconds=0)
    try:
        server.put(ROUNDS, "080", b"")
        with pytest.raises(wire.WireError, match="round keys .* are not all numbers"):
            client.rounds()
        server.delete_scope(ROUNDS)
        server.put(ROUNDS, "3", b"")
        assert client.rounds() == [3]
    finally:
        client.close()
        server.stop()
    with pytest.raises(wire.WireError, match="malformed round plan"):
        decode_plan(wire.encode({"h:0": (0, 2, 0, 1, 0, 2, 7)}))  # a host name that is not a string


def test_a_greeting_must_come_from_a_higher_rank_of_this_round_still_to_connect() -> None:
    assert greeting_problem(("hello", 2, 5, "h"), rank=0, size=4, round_number=5, connected=()) is None
    assert "round 4" in greeting_problem(("hello", 2, 4, "h"), 0, 4, 5, ())
    assert "rank 2" in greeting_problem(("hello", 2, 5, "h"), 0, 4, 5, {2})
    assert "rank 0" in greeting_problem(("hello", 0, 5, "h"), 0, 4, 5, ())
    assert "unexpected greeting" in greeting_problem(("hello", True, 5, "h"), 0, 4, 5, ())  # bool is not a rank
    assert "unexpected greeting" in greeting_problem(["hello", 1, 5, "h"], 0, 4, 5, ())


def test_a_stopped_store_leaves_no_thread_behind() -> None:
    """Found by the store target: each stopped store left its accept thread blocked for good (100,000
    of them in the long run), which a process that runs many jobs (horovod.run) would pile up."""
    import threading
    import time

    before = set(threading.enumerate())

    def store_threads() -> list[str]:
        # Only the store's own threads started here: other tests' threads may come and go meanwhile.
        return [t.name for t in threading.enumerate() if t not in before and t.name.startswith("hvd-rendezvous")]

    server = RendezvousServer(targets.KEY, "127.0.0.1", liveness_seconds=0)
    client = RendezvousClient("127.0.0.1", server.start(), targets.KEY, connect_timeout=5, liveness_seconds=0)
    client.put("s", "k", b"v")
    assert store_threads()  # the accept loop and the client's connection
    server.stop()
    client.close()
    deadline = time.monotonic() + 5
    while store_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store_threads()
