"""Settings from HOROVOD_* variables, and the authenticated wire's refusal of bad input."""

import socket
import threading

import pytest
from hypothesis import given, settings, strategies as st

from horovod.common import wire
from horovod.common.settings import DEFAULT_FUSION_THRESHOLD, Settings


def test_defaults_match_horovod():
    s = Settings.from_env({})
    assert s.fusion_threshold == DEFAULT_FUSION_THRESHOLD == 128 * 1024 * 1024
    assert s.cycle_time_ms == 1.0 and s.cache_capacity == 1024
    assert s.stall_check_time_seconds == 60 and s.stall_shutdown_time_seconds == 0
    assert not s.stall_check_disable and s.topology.size == 1 and s.topology.hostname == "localhost"


def test_values_are_read_and_validated():
    s = Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CYCLE_TIME": "2.5", "HOROVOD_RANK": "1",
                           "HOROVOD_SIZE": "2", "HOROVOD_LOG_LEVEL": "DEBUG", "HOROVOD_STALL_CHECK_DISABLE": "1",
                           "_HOROVOD_SECRET_KEY": "ab" * 32})
    assert (s.fusion_threshold, s.cycle_time_ms, s.topology.rank, s.log_level) == (1024, 2.5, 1, "debug")
    assert s.stall_check_disable and s.secret_key == bytes.fromhex("ab" * 32)
    with pytest.raises(ValueError, match="must be >= 0"):
        Settings.from_env({"HOROVOD_CACHE_CAPACITY": "-1"})
    with pytest.raises(ValueError, match="not a number"):
        Settings.from_env({"HOROVOD_CYCLE_TIME": "fast"})
    with pytest.raises(ValueError, match="must be < HOROVOD_SIZE"):
        Settings.from_env({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "2"})
    assert Settings.from_env({"HOROVOD_LOG_LEVEL": "chatty"}).log_level == "warning"
    # unset: the TensorFlow adapter decides by the cores a rank has (tensorflow/backward_overlap.py)
    assert [Settings.from_env(env).tf_overlap_backward for env in
            ({}, {"HOROVOD_TF_OVERLAP_BACKWARD": "1"}, {"HOROVOD_TF_OVERLAP_BACKWARD": "0"})] == [None, True, False]
    assert [Settings.from_env(env).torch_overlap_backward for env in
            ({}, {"HOROVOD_TORCH_OVERLAP_BACKWARD": "1"}, {"HOROVOD_TORCH_OVERLAP_BACKWARD": "0"})] == [None, True, False]


def _pair(key_a: bytes, key_b: bytes):
    a, b = socket.socketpair()
    outcome = {}

    def accept():
        try:
            wire.handshake(b, key_b, initiator=False)
            outcome["b"] = "ok"
        except wire.WireError as exc:
            outcome["b"] = type(exc).__name__
    thread = threading.Thread(target=accept)
    thread.start()
    try:
        wire.handshake(a, key_a, initiator=True)
        outcome["a"] = "ok"
    except wire.WireError as exc:
        outcome["a"] = type(exc).__name__
        a.close()
    thread.join(5)
    return outcome, a, b


def test_handshake_accepts_the_job_key_and_refuses_any_other():
    key = wire.new_secret_key()
    assert _pair(key, key)[0] == {"a": "ok", "b": "ok"}
    outcome, _, _ = _pair(key, wire.new_secret_key())
    assert outcome["a"] == "AuthenticationError"


def test_frames_over_the_limit_are_refused_before_allocation():
    a, b = socket.socketpair()
    a.sendall(wire._LEN.pack(1 << 40))
    with pytest.raises(wire.WireError, match="above the"):
        wire.recv_frame(b, max_bytes=1 << 20)


def test_decoder_refuses_objects_that_reference_globals():
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    with pytest.raises(wire.WireError, match="malformed message"):
        wire.decode(pickle.dumps(Evil()))  # a pickle is not a message: nothing of it runs
    assert wire.decode(wire.encode(("ok", [1, 2.5, b"x", None, {"k": (True,)}]))) == ("ok", (1, 2.5, b"x", None, {"k": (True,)}))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=256))
def test_decoding_random_bytes_never_crashes_with_anything_but_wire_error(data):
    try:
        wire.decode(data)
    except wire.WireError:
        pass


def test_start_and_peer_timeouts_grow_with_the_job_unless_set():
    from horovod.common.settings import scaled_timeout

    assert scaled_timeout(ranks=4, hosts=2) == 30.0  # small jobs keep Horovod's 30 s
    assert scaled_timeout(ranks=512, hosts=64) == 116.0  # 1 s per host + 0.1 s per rank
    big = Settings.from_env({"HOROVOD_RANK": "9", "HOROVOD_SIZE": "512", "HOROVOD_LOCAL_SIZE": "8"})
    assert (big.start_timeout, big.peer_timeout_seconds) == (116.0, 116.0)
    pinned = Settings.from_env({"HOROVOD_RANK": "9", "HOROVOD_SIZE": "512", "HOROVOD_LOCAL_SIZE": "8",
                                "HOROVOD_START_TIMEOUT": "45", "HOROVOD_GLOO_TIMEOUT_SECONDS": "20"})
    assert (pinned.start_timeout, pinned.peer_timeout_seconds) == (45.0, 20.0)
    # Before it joins, a process torchrun or mpirun started knows the job's size from their variables.
    torch = Settings.from_env({"RANK": "3", "WORLD_SIZE": "400", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
                               "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert torch.start_timeout == 90.0  # 50 hosts + 40
    mpi = Settings.from_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1000",
                             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert mpi.peer_timeout_seconds == 350.0  # 250 hosts + 100
