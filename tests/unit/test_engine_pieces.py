"""Pure pieces of the engine: fusion planning, validation, readiness, the response cache."""

import pytest

from horovod.common.engine.coordinator import Coordinator, stall_message, validate
from horovod.common.engine.fusion import PACK_BELOW_BYTES, plan_fusion
from horovod.common.engine.handles import Entry, Handle
from horovod.common.engine.messages import OpType, Request, Response
from horovod.common.engine.readiness import (BLOCKED, EAGER, FORCE_SLOW, HAS_UNCACHED, JOINED, SHUTDOWN, agree, bits,
                                              decode_status, encode_status)
from horovod.common.engine.response_cache import ResponseCache
from horovod.common.engine.state import SetState, ShutdownState
from horovod.common.reduce_ops import Average, Max, Sum


def ar(name, count, dtype="float32", op=Sum, pre=1.0):
    return Response(OpType.ALLREDUCE, [name], dtype, [(count,)], reduce_op=op, prescale=pre)


class TestFusion:
    def test_fuses_compatible_allreduces_up_to_the_threshold(self):
        plan = plan_fusion([ar("a", 10), ar("b", 10), ar("c", 10)], threshold_bytes=80)
        assert [r.names for r in plan] == [["a", "b"], ["c"]]
        assert plan[0].shapes == [(10,), (10,)]

    def test_zero_threshold_disables_fusion(self):
        plan = plan_fusion([ar("a", 1), ar("b", 1)], threshold_bytes=0)
        assert [r.names for r in plan] == [["a"], ["b"]]

    def test_looks_past_other_dtypes_and_keeps_order_of_first_members(self):
        plan = plan_fusion([ar("a", 1), ar("h", 1, "float16"), ar("b", 1), ar("i", 1, "float16")], 1 << 20)
        assert [r.names for r in plan] == [["a", "b"], ["h", "i"]]

    def test_never_fuses_different_ops_scales_or_other_collectives(self):
        gather = Response(OpType.ALLGATHER, ["g"], "float32", [(1,)], first_dims=[[1, 1]])
        plan = plan_fusion([ar("a", 1), ar("m", 1, op=Max), gather, ar("p", 1, pre=2.0), ar("b", 1)], 1 << 20)
        assert [r.names for r in plan] == [["a", "b"], ["m"], ["g"], ["p"]]

    def test_a_tensor_bigger_than_the_threshold_travels_alone(self):
        plan = plan_fusion([ar("big", 1000), ar("a", 1)], threshold_bytes=64)
        assert [r.names for r in plan] == [["big"], ["a"]]

    def test_a_tensor_too_big_to_be_worth_copying_travels_alone_under_the_threshold(self):
        big = PACK_BELOW_BYTES // 4  # float32 elements
        plan = plan_fusion([ar("a", 1), ar("big", big), ar("b", 1), ar("just_under", big - 1)], 1 << 26)
        assert [r.names for r in plan] == [["a", "b", "just_under"], ["big"]]


def req(rank, name="allreduce.x", op=OpType.ALLREDUCE, dtype="float32", shape=(2,), **kw):
    return Request(rank, op, name, dtype, shape, **kw)


class TestValidation:
    def test_agreeing_requests_pass(self):
        assert validate("t", {0: req(0), 1: req(1)}, (0, 1), []) == ""

    def test_messages_group_ranks_by_value(self):
        message = validate("t", {0: req(0), 1: req(1, dtype="int32"), 2: req(2)}, (0, 1, 2), [])
        assert message.startswith("ALLREDUCE t: mismatched data types")
        assert "ranks [0, 2]: float32; rank 1: int32" in message

    def test_allgather_may_differ_in_dim0_only(self):
        ok = {0: req(0, op=OpType.ALLGATHER, shape=(1, 3)), 1: req(1, op=OpType.ALLGATHER, shape=(5, 3))}
        assert validate("g", ok, (0, 1), []) == ""
        bad = {0: req(0, op=OpType.ALLGATHER, shape=(1, 3)), 1: req(1, op=OpType.ALLGATHER, shape=(1, 4))}
        assert "trailing dimensions" in validate("g", bad, (0, 1), [])

    def test_only_allreduce_runs_with_joined_ranks(self):
        message = validate("b", {0: req(0, op=OpType.BROADCAST, root_rank=0)}, (0, 1), [1])
        assert "join" in message and "ranks [1]" in message

    def test_broadcast_root_and_scale_factor_mismatches(self):
        roots = {0: req(0, op=OpType.BROADCAST, root_rank=0), 1: req(1, op=OpType.BROADCAST, root_rank=1)}
        assert "root ranks" in validate("b", roots, (0, 1), [])
        scales = {0: req(0, prescale=1.0), 1: req(1, prescale=0.5)}
        assert "prescale" in validate("s", scales, (0, 1), [])


class TestCoordinator:
    def test_ready_when_every_member_submitted_in_arrival_order(self):
        coordinator = Coordinator((0, 1))
        assert coordinator.add([req(0, "a"), req(0, "b")]) == []
        assert coordinator.add([req(1, "b"), req(1, "a")]) == ["b", "a"]
        responses = coordinator.build_responses(["b", "a"])
        assert [r.names for r in responses] == [["b"], ["a"]] and not coordinator.table

    def test_joined_ranks_count_as_submitted_and_join_completes_with_last_rank(self):
        coordinator = Coordinator((0, 1, 2))
        coordinator.add([req(0, "a")])
        coordinator.add([Request(2, OpType.JOIN, "join.noname")])
        assert coordinator.add([req(1, "a")]) == ["a"]
        coordinator.add([Request(0, OpType.JOIN, "join.noname")])
        coordinator.add([Request(1, OpType.JOIN, "join.noname")])
        responses = coordinator.build_responses(["a"])
        assert responses[-1].op_type == OpType.JOIN and responses[-1].last_joined_rank == 1
        assert coordinator.joined == []

    def test_stalled_lists_missing_ranks(self):
        coordinator = Coordinator((0, 1, 2))
        coordinator.add([req(0, "a")], now=0.0)
        coordinator.add([req(1, "a")], now=5.0)
        assert coordinator.stalled(now=61.0, older_than=60.0) == {"a": [2]}
        assert coordinator.stalled(now=30.0, older_than=60.0) == {}
        message = stall_message({"a": [2], "b": [1, 2]}, 60, shutting_down=True)
        assert "  1: [b]" in message and "  2: [a, b]" in message and "Shutting down" in message


class TestResponseCache:
    def test_hit_miss_and_invalid(self):
        cache = ResponseCache(4)
        request = req(0, "a")
        assert cache.lookup(request) == ("miss", -1)
        cache.put(ar("a", 2), request)
        assert cache.lookup(request) == ("hit", 0)
        assert cache.lookup(req(0, "a", shape=(3,))) == ("invalid", 0)

    def test_identical_puts_give_identical_bits_with_eviction_and_reuse(self):
        caches = [ResponseCache(2), ResponseCache(2)]
        for cache in caches:
            for name in ["a", "b", "c"]:       # "a" is evicted, its bit reused by "c"
                cache.put(ar(name, 1), req(0, name))
            cache.erase_bit(cache.lookup(req(0, "b"))[1])
            cache.put(ar("d", 1), req(0, "d"))
        bits = [[c.lookup(req(0, n)) for n in "abcd"] for c in caches]
        assert bits[0] == bits[1]
        assert bits[0][0] == ("miss", -1) and bits[0][1] == ("miss", -1)
        assert {bits[0][2][1], bits[0][3][1]} == {0, 1}

    def test_disabled_cache_never_hits(self):
        cache = ResponseCache(0)
        cache.put(ar("a", 1), req(0, "a"))
        assert not cache.enabled and cache.lookup(req(0, "a")) == ("miss", -1)


def test_messages_round_trip_through_the_wire_codec():
    from horovod.common import wire

    request = Request(3, OpType.ALLTOALL, "alltoall.x", "float16", (4, 2), -1, Average, 1.0, 0.5, (1, 3))
    assert Request.from_wire(wire.decode(wire.encode(request.to_wire()))) == request
    response = Response(OpType.ALLGATHER, ["a", "b"], "int8", [(1, 2), (3, 2)], [[1, 2], [3, 4]])
    assert Response.from_wire(wire.decode(wire.encode(response.to_wire()))) == response


class TestReadiness:
    """The fast path's decision from every member's (flags, ready bits, stale bits)."""

    def test_a_tensor_is_ready_when_every_member_has_it(self):
        decision = agree((0, 1, 2), [(0, 0b111, 0), (0, 0b101, 0), (0, 0b1101, 0)], num_bits=4)
        assert decision == ([0, 2], [], False, [])

    def test_one_missing_member_holds_a_tensor_back(self):
        ready, _, slow_path, _ = agree((0, 1), [(0, 0b11, 0), (0, 0, 0)], num_bits=2)
        assert ready == [] and not slow_path

    def test_joined_members_do_not_hold_tensors_back(self):
        ready, _, _, _ = agree((0, 1, 2), [(0, 0b11, 0), (JOINED, 0, 0), (0, 0b10, 0)], num_bits=2)
        assert ready == [1]

    def test_when_every_member_has_joined_nothing_is_ready(self):
        ready, _, slow_path, _ = agree((0, 1), [(JOINED, 0b1, 0), (JOINED, 0b1, 0)], num_bits=1)
        assert ready == [] and not slow_path

    def test_a_stale_bit_anywhere_is_not_ready_and_forces_the_slow_path(self):
        ready, stale, slow_path, _ = agree((0, 1), [(0, 0b011, 0b100), (0, 0b111, 0b001)], num_bits=3)
        assert ready == [1] and stale == [0, 2] and slow_path

    @pytest.mark.parametrize("flag", [HAS_UNCACHED, FORCE_SLOW])
    def test_uncached_or_forced_work_on_any_member_takes_the_slow_path(self, flag):
        ready, _, slow_path, _ = agree((0, 1), [(0, 0b1, 0), (flag, 0b1, 0)], num_bits=1)
        assert ready == [0] and slow_path

    def test_shutdown_flags_name_the_global_ranks_that_leave(self):
        _, _, slow_path, shut_down = agree((3, 5, 7), [(SHUTDOWN, 0, 0), (0, 0, 0), (SHUTDOWN | JOINED, 0, 0)],
                                           num_bits=0)
        assert shut_down == [3, 7] and not slow_path

    def test_each_set_decides_over_its_own_members_and_cache(self):
        # Two sets, two caches: the same bit means different tensors, so they are decided apart.
        whole = agree((0, 1, 2), [(0, 0b1, 0), (0, 0b1, 0), (0, 0b0, 0)], num_bits=1)
        pair = agree((0, 1), [(0, 0b1, 0), (0, 0b1, 0)], num_bits=1)
        assert whole[0] == [] and pair[0] == [0]

    def test_bits_lists_set_bits_in_ascending_order(self):
        assert bits(0) == [] and bits(0b1010_0001) == [0, 5, 7] and bits(1 << 70) == [70]

    @pytest.mark.parametrize("status", [(0, 0, 0, []), (HAS_UNCACHED, 0b1011, 0, []),
                                        (JOINED | SHUTDOWN, 1 << 1500, (1 << 9) | 1, []),
                                        (BLOCKED, 0b1, 0, ["allreduce.a", "barrier.noname"])])
    def test_a_status_crosses_the_wire_unchanged(self, status):
        data = encode_status(*status)
        assert decode_status(data) == status and decode_status(bytearray(data)) == status

    def test_an_eager_status_carries_its_contribution_after_the_bitsets(self):
        contribution = bytes(range(40))  # whatever its bytes, they are not read as waits
        assert decode_status(encode_status(EAGER, 0b100, 0, []) + contribution) == (EAGER, 0b100, 0, [])

    @pytest.mark.parametrize("data", [b"", b"\x00\x01", encode_status(0, 1 << 40, 0, [])[:-1],
                                      encode_status(BLOCKED, 1, 0, ["a"])[:9] + b"\x80\x05K\x01.",
                                      encode_status(BLOCKED, 1, 0, [])[:10] + __import__("pickle").dumps([1, 2])])
    def test_a_malformed_status_is_refused(self, data):
        from horovod.common.wire import WireError

        with pytest.raises(WireError, match="malformed"):
            decode_status(data)


class TestSetState:
    def test_the_first_member_coordinates_and_pending_work_is_taken_once(self):
        state = SetState.for_members(2, (1, 3), rank=1, cache_capacity=8, timeline=None)
        assert state.coordinator is not None and state.cache.capacity == 8
        assert SetState.for_members(2, (1, 3), rank=3, cache_capacity=8, timeline=None).coordinator is None
        entries = [Entry(req(1, f"allreduce.{n}"), None, None, Handle(1, False, n)) for n in "abc"]
        state.new.append(entries[0])
        state.unsent["allreduce.b"] = (entries[1], 0.0)
        state.waiting["allreduce.c"] = entries[2]
        state.names.update(e.name for e in entries)
        assert state.has_pending()
        assert state.take_pending() == entries
        assert state.take_pending() == [] and not state.names and not state.has_pending()

    def test_the_shutdown_error_names_the_ranks_that_left(self):
        message = str(ShutdownState().error({3, 1}, "allreduce.x"))
        assert message.startswith("allreduce.x: rank 1, 3 has shut down")

    def test_a_rank_that_left_with_an_error_is_named_as_failed(self):
        state = ShutdownState(ranks={1, 3}, failed={3})
        message = str(state.error({1, 3}, "allreduce.x"))
        assert message.startswith("allreduce.x: rank 3 failed (an exception escaped its script")
        assert not ShutdownState(requested=True).failing
        assert ShutdownState(requested=True, wait_for_peers=False).failing
