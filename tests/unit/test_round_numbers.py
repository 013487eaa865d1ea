"""Round numbers and bootstraps without worker processes: the pure numbering rules, the store's
join/open operations over a real connection, and the bootstraps' answers."""

import pytest

from horovod.common import wire
from horovod.common.bootstrap import create
from horovod.common.bootstrap.env import EnvBootstrap
from horovod.common.bootstrap.store import StoreBootstrap, decode_plan, encode_plan, publish_round, worker_id
from horovod.common.rendezvous import JOINED, RendezvousClient, RendezvousServer
from horovod.common.rounds import RoundBook, newest_round
from horovod.common.settings import Settings, Topology


def test_a_fixed_group_joins_round_after_round():
    book = RoundBook()
    assert [book.join(str(r), 3) for r in range(3)] == [1, 1, 1]
    assert [book.join(str(r), 3) for r in (2, 0, 1)] == [2, 2, 2]


def test_a_fast_member_goes_ahead_and_the_others_follow():
    book = RoundBook()
    assert book.join("0", 2) == 1
    assert book.join("0", 2) == 2  # re-initialised before rank 1 came: that round is over for it
    assert book.join("1", 2) == 1
    assert book.join("1", 2) == 2


def test_a_replacement_meets_the_survivors_in_their_round():
    book = RoundBook()
    for rank in range(3):
        book.join(str(rank), 3)
    assert book.join("0", 3) == book.join("2", 3) == 2  # survivors re-initialise
    assert book.join("1", 3) == 2  # a new process for rank 1 never saw round 1, and still meets them


def test_planned_rounds_share_the_numbering_and_take_no_joins():
    book = RoundBook()
    assert book.join("0", 2) == 1
    assert book.open(["host:0", "host:1"]) == 2
    assert book.join("1", 2) == 1
    assert book.join("0", 2) == 3
    with pytest.raises(ValueError):
        book.join("0", 0)
    with pytest.raises(ValueError):
        book.open([])


def test_a_worker_looks_at_the_newest_round_since_its_last():
    assert newest_round([], after=0) is None
    assert newest_round([1, 2, 3], after=0) == 3
    assert newest_round([1, 2], after=2) is None
    assert newest_round([3, 1, 4], after=3) == 4


def test_plans_round_trip_and_name_workers_by_host_and_slot():
    slot = Topology(rank=1, size=2, local_rank=0, local_size=1, cross_rank=1, cross_size=2, hostname="b")
    assert decode_plan(encode_plan({"b:0": slot})) == {"b:0": slot}
    assert worker_id(slot) == "b:0"


def test_bootstraps_are_chosen_by_settings():
    assert Settings.from_env({}).bootstrap == "env"
    assert Settings.from_env({"HOROVOD_BOOTSTRAP": " Store "}).bootstrap == "store"
    assert isinstance(create("env"), EnvBootstrap) and isinstance(create("store"), StoreBootstrap)
    assert Settings.from_env({"OMPI_COMM_WORLD_SIZE": "2"}).bootstrap == "mpi"  # started by mpirun
    assert Settings.from_env({"PMIX_RANK": "0"}).bootstrap == "mpi"
    assert Settings.from_env({"SLURM_PROCID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}).bootstrap == "mpi"
    assert Settings.from_env({"HOROVOD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}).bootstrap == "env"
    with pytest.raises(ValueError, match="HOROVOD_BOOTSTRAP='nope'.*env, mpi, store"):
        create("nope")


def test_a_single_rank_needs_no_store_and_counts_its_own_rounds():
    membership = EnvBootstrap().join(Settings.from_env({}), previous_round=4)
    assert membership.round == 5 and membership.rendezvous is None and membership.topology.size == 1
    with pytest.raises(ValueError, match="HOROVOD_SIZE=2 but no rendezvous store"):
        EnvBootstrap().join(Settings.from_env({"HOROVOD_SIZE": "2"}), previous_round=0)


@pytest.fixture
def store():
    key = wire.new_secret_key()
    server = RendezvousServer(key)
    port = server.start()
    env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
           "_HOROVOD_SECRET_KEY": key.hex(), "HOROVOD_START_TIMEOUT": "2"}
    yield server, env
    server.stop()


def test_the_store_hands_out_rounds_to_launcher_ranks(store):
    server, env = store
    memberships = [EnvBootstrap().join(Settings.from_env({**env, "HOROVOD_RANK": str(r), "HOROVOD_SIZE": "2"}), 0)
                   for r in (0, 1)]
    try:
        assert [m.round for m in memberships] == [1, 1]
        assert server.keys(JOINED) == ["0", "1"]
        client = RendezvousClient("127.0.0.1", server.address[1], bytes.fromhex(env["_HOROVOD_SECRET_KEY"]))
        assert client.join_round("0", 2) == 2
        client.close()
    finally:
        for membership in memberships:
            membership.close()


def test_a_worker_takes_its_slot_from_the_newest_plan_that_includes_it(store):
    server, env = store
    worker = {**env, "HOROVOD_BOOTSTRAP": "store", "HOROVOD_HOSTNAME": "a", "HOROVOD_LOCAL_RANK": "1"}
    mine = Topology(rank=1, size=2, hostname="a", local_rank=1, local_size=2)
    publish_round(server, {"a:0": Topology(rank=0, size=1, hostname="a")})  # round 1, without it
    assert publish_round(server, {"a:0": Topology(size=2, hostname="a", local_size=2), "a:1": mine}) == 2
    membership = StoreBootstrap().join(Settings.from_env(worker), previous_round=0)
    try:
        assert (membership.round, membership.topology) == (2, mine)
        assert server.get(JOINED, "1") == b""
    finally:
        membership.close()
    with pytest.raises(TimeoutError, match="worker a:1 found no round after round 2"):
        StoreBootstrap().join(Settings.from_env({**worker, "HOROVOD_START_TIMEOUT": "0.3"}), previous_round=2)


def test_the_global_set_is_the_rounds_and_dynamic_sets_are_a_setting(monkeypatch):
    import os

    import horovod.numpy as hvd
    from horovod.common import runtime

    monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)
    assert hvd.global_process_set.ranks == [] and hvd.global_process_set.process_set_id == 0
    hvd.init(process_sets="dynamic")
    try:
        assert runtime.current().settings.dynamic_process_sets
        assert "HOROVOD_DYNAMIC_PROCESS_SETS" not in os.environ  # the library never writes the environment
        members = hvd.global_process_set
        assert (members.ranks, members.size(), members.rank()) == ([0], 1, 0)
        with pytest.raises(AttributeError):
            hvd.global_process_set.ranks = [0, 1]
    finally:
        hvd.shutdown()
    assert hvd.global_process_set.ranks == []
