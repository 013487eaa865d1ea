"""Where RayExecutor's workers go (pure: no cluster): bundles and strategy from the arguments, and
each worker's slot from the node it landed on."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="horovod.ray needs the [ray] extra")

from horovod.ray.placement import Layout, slots_by_node  # noqa: E402


def test_slots_follow_the_nodes_in_the_order_they_first_appear():
    by_rank = slots_by_node(["b", "a", "b", "a", "b"])  # the node of each placed worker
    assert [(s.hostname, s.rank, s.local_rank, s.local_size, s.cross_rank, s.cross_size, worker)
            for s, worker in by_rank] == [
        ("b", 0, 0, 3, 0, 2, 0), ("b", 1, 1, 3, 0, 2, 2), ("b", 2, 2, 3, 0, 1, 4),
        ("a", 3, 0, 2, 1, 2, 1), ("a", 4, 1, 2, 1, 2, 3)]
    assert {s.size for s, _ in by_rank} == {5}


def test_layouts():
    packed = Layout.of(3, None, 1, 2, False, None)
    assert packed.bundles() == [{"CPU": 2}] * 3 and packed.strategy() == "PACK"
    assert [packed.bundle_of(w) for w in range(3)] == [0, 1, 2]
    spread = Layout.of(None, 2, 3, 1, True, 0.5)
    assert spread.bundles() == [{"CPU": 3, "GPU": 1.5}] * 2 and spread.strategy() == "STRICT_SPREAD"
    assert [spread.bundle_of(w) for w in range(6)] == [0, 0, 0, 1, 1, 1]
    assert spread.describe() == "6 workers with 1 CPU and 0.5 GPU each (3 per node)"
    assert Layout.of(1, None, 1, 1, True, None).gpus_per_worker == 1


@pytest.mark.parametrize("args, message", [
    ((None, None, 1, 1, False, None), "either num_workers or num_hosts"),
    ((2, 2, 1, 1, False, None), "either num_workers or num_hosts"),
    ((0, None, 1, 1, False, None), "num_workers=0"),
    ((None, 2, 0, 1, False, None), "num_workers_per_host=0"),
    ((1, None, 1, 0, False, None), "cpus_per_worker=0"),
    ((1, None, 1, 1, False, 1), "use_gpu=True"),
])
def test_contradictions_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        Layout.of(*args)


def test_horovod_options_that_mean_nothing_on_ray_say_so():
    from horovod.ray import ElasticRayExecutor, RayExecutor
    from horovod.ray.tune import DistributedTrainableCreator

    with pytest.warns(UserWarning, match=r"ssh_identity_file/ssh_str has no effect here: Ray starts the workers"):
        settings = RayExecutor.create_settings(ssh_identity_file="~/.ssh/id_rsa")
    with pytest.warns(UserWarning, match=r"override_discovery=False has no effect here: only an elastic RayExecutor"):
        RayExecutor(settings, num_workers=1, override_discovery=False)
    with pytest.warns(UserWarning, match=r"ssh_identity_file has no effect here"):
        elastic = ElasticRayExecutor.create_settings(ssh_identity_file="key")
    with pytest.raises(ValueError, match=r"override_discovery=False needs a discovery of your own"):
        ElasticRayExecutor(elastic, override_discovery=False)
    with pytest.warns(UserWarning, match=r"ssh_port has no effect here"):
        ElasticRayExecutor.create_settings(ssh_port=22)
    with pytest.warns(UserWarning, match=r"replicate_pem=True has no effect here"):
        DistributedTrainableCreator(lambda config: None, replicate_pem=True)
