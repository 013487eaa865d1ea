"""horovod.torch in one process (size 1): adapters, argument checks, the optimizer wrapper.

HOROVOD_ELASTIC=1 makes DistributedOptimizer install its hooks even at size 1, so its
bookkeeping (accumulation, partial cycles, unused parameters) is exercised here without ranks.
"""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import horovod.torch as hvd  # noqa: E402
from horovod.torch import _bridge  # noqa: E402
from horovod.torch.optimizer import _make_buckets  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def single_rank():
    hvd.init()
    yield
    hvd.shutdown()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


# -- adapters ----------------------------------------------------------------------------------------------
ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
              torch.float32, torch.float64, torch.bool]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_cpu_tensors_are_shared_not_copied(dtype):
    t = torch.zeros(2, 3, dtype=dtype)
    assert _bridge.checked(t, "allreduce", "x") is t
    array = _bridge.host_array(t)
    assert array.__array_interface__["data"][0] == t.data_ptr()
    back = _bridge.to_tensor(array, t.device)
    assert back.dtype == dtype and back.data_ptr() == t.data_ptr()


def test_bfloat16_values_survive_the_numpy_view():
    t = torch.tensor([1.5, -2.25, 3e38], dtype=torch.bfloat16)
    assert torch.equal(_bridge.to_tensor(_bridge.host_array(t).copy(), t.device), t)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.uint16, torch.float8_e4m3fn])
def test_unsupported_dtype_is_a_value_error(dtype):
    with pytest.raises(ValueError, match="not supported"):
        hvd.allreduce(torch.zeros(2).to(dtype))


def test_argument_errors_are_value_errors():
    with pytest.raises(ValueError, match="not contiguous"):
        hvd.allreduce(torch.zeros(3, 4).t())
    with pytest.raises(ValueError, match="not contiguous"):
        hvd.broadcast_(torch.zeros(3, 4)[:, ::2], 0)
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.zeros(3).to_sparse())
    with pytest.raises(ValueError, match="torch.Tensor"):
        hvd.allreduce(np.zeros(3))
    with pytest.raises(ValueError, match="not a member"):
        hvd.broadcast(torch.zeros(2), root_rank=3)


def test_size_one_collectives_and_handles():
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(hvd.allreduce(x), x)
    assert hvd.allreduce_(x) is x
    assert torch.equal(hvd.allgather(x), x)
    assert torch.equal(hvd.broadcast(x, 0), x)
    out, splits = hvd.alltoall(x, splits=[2])
    assert torch.equal(out, x) and splits.tolist() == [2] and splits.dtype == torch.int32
    assert torch.equal(hvd.reducescatter(x, op=hvd.Sum), x)
    handle = hvd.grouped_allreduce_async([x, x + 1])
    assert isinstance(handle, int)
    result = hvd.synchronize(handle)
    assert torch.equal(result[1], x + 1)
    assert hvd.synchronize(handle) is None  # already consumed
    with pytest.raises(ValueError, match="handle"):
        hvd.poll(handle)
    handle = hvd.allreduce_async(x)
    hvd.init()  # already running: a no-op for the job, but handles of the past are forgotten
    assert hvd.synchronize(handle) is None
    assert hvd.join() == 0
    hvd.barrier()


def test_in_place_ops_bump_the_autograd_version():
    x = torch.ones(3)
    before = x._version
    hvd.allreduce_(x)
    hvd.broadcast_(x, 0)
    assert x._version == before + 2


def test_deprecated_average_argument():
    with pytest.warns(DeprecationWarning, match="^Parameter `average` has been replaced with `op`"):
        assert torch.equal(hvd.allreduce(torch.ones(2), average=False), torch.ones(2))
    with pytest.raises(ValueError, match="^The op parameter supersedes average. Please provide only one of them"):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


def test_adasum_optimizer_on_one_rank_is_the_wrapped_optimizer():
    """Adasum of one rank's delta is that delta: the step equals plain SGD's, and the wrapper
    passes for the wrapped class."""
    plain, wrapped = make_model(), make_model()
    x = torch.randn(8, 4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9), op=hvd.Adasum)
    ref = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    assert isinstance(opt, torch.optim.SGD)
    assert list(opt._parameter_names.values()) == [f"allreduce.noname.0.{i}" for i in range(4)]
    named = hvd.DistributedOptimizer(torch.optim.SGD(wrapped.parameters(), lr=0.1), op=hvd.Adasum,
                                     named_parameters=wrapped.named_parameters())
    assert sorted(named._parameter_names.values()) == sorted(n for n, _ in wrapped.named_parameters())
    for _ in range(2):
        for model, optimizer in ((plain, ref), (wrapped, opt)):
            optimizer.zero_grad()
            model(x).pow(2).sum().backward()
            optimizer.step()
    for a, b in zip(plain.parameters(), wrapped.parameters()):
        torch.testing.assert_close(a, b)


def test_compression_round_trips():
    x = torch.tensor([1.0, 2.5, -3.0])
    for compressor, wire in [(hvd.Compression.fp16, torch.float16), (hvd.Compression.bf16, torch.bfloat16)]:
        sent, ctx = compressor.compress(x)
        assert sent.dtype == wire
        assert compressor.decompress(sent, ctx).dtype == torch.float32
        ints, ctx = compressor.compress(torch.arange(3))
        assert ints.dtype == torch.int64 and compressor.decompress(ints, ctx).dtype == torch.int64
    sent, ctx = hvd.Compression.none.compress(x)
    assert sent is x and hvd.Compression.none.decompress(sent, ctx) is x
    assert hvd.allreduce(x, compression=hvd.Compression.fp16).dtype == torch.float32


# -- DistributedOptimizer: construction ---------------------------------------------------------------------
def test_optimizer_argument_errors():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="must be unique. Found duplicates: 0.weight"):
        hvd.DistributedOptimizer(sgd, named_parameters=[named[0], ("0.weight", named[1][1])] + named[2:])
    with pytest.raises(ValueError, match="parameters were not named. Python object ids: .* The 2 unnamed"):
        hvd.DistributedOptimizer(sgd, named_parameters=named[:2])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="^gradient_predivide_factor not supported with op != Average"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups"):
        hvd.DistributedOptimizer(sgd, groups="two")
    with pytest.warns(DeprecationWarning, match="^Parameter `num_groups` has been replaced by `groups`"):
        hvd.DistributedOptimizer(sgd, num_groups=2)


def test_wrapper_is_the_users_optimizer():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and isinstance(opt, torch.optim.Optimizer)
    assert opt.__class__ is torch.optim.SGD and type(opt).__name__ == "SGD"
    assert opt.param_groups is sgd.param_groups and opt.state is sgd.state and opt.defaults is sgd.defaults
    assert "SGD" in repr(opt)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.randn(5, 4)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the scheduler must see optimizer.step() before its own step
        opt.step()
        scheduler.step()
    assert sgd.param_groups[0]["lr"] == pytest.approx(0.05)
    assert len(sgd.state) == 4  # momentum buffers live in the user's optimizer
    opt.load_state_dict(sgd.state_dict())


def test_buckets():
    from horovod.common.gradients import GradientReducer

    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(5)]
    names = {p: f"p{i}" for i, p in enumerate(params)}
    sizes = lambda groups: [len(b.params) for b in _make_buckets(params, GradientReducer("t", groups=groups), names)]  # noqa: E731
    assert sizes(None) == [1] * 5
    assert sizes(2) == [3, 2]
    assert sizes(9) == [1] * 5
    explicit = _make_buckets(params, GradientReducer("t", groups=[[params[3], params[1]]]), names)
    assert [b.name for b in explicit] == ["p3", "p0", "p2", "p4"]
    assert [len(b.params) for b in explicit] == [2, 1, 1, 1]


# -- DistributedOptimizer: one rank behaves like the plain optimizer ----------------------------------------
def train(opt_factory, steps, passes=1, distributed=None, model_seed=0):
    torch.manual_seed(1)
    data = [torch.randn(6, 4) for _ in range(steps * passes)]
    model = make_model(model_seed)
    opt = opt_factory(model.parameters())
    if distributed is not None:
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), **distributed)
    batches = iter(data)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(passes):
            (model(next(batches)) ** 2).mean().backward()
        opt.step()
    return model, opt


@pytest.fixture
def hooks_at_size_one(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    yield
    # A test may drop an optimizer whose gradient allreduces are still in flight; restart so the
    # next test's identically named ops never meet them.
    hvd.shutdown()
    hvd.init()


@pytest.mark.parametrize("kwargs", [{}, {"backward_passes_per_step": 2}, {"groups": 2},
                                    {"compression": hvd.Compression.bf16}])
def test_size_one_matches_the_plain_optimizer(hooks_at_size_one, kwargs):
    adam = lambda p: torch.optim.Adam(p, lr=0.01)  # noqa: E731
    passes = kwargs.get("backward_passes_per_step", 1)
    plain, _ = train(adam, 3, passes)
    dist, opt = train(adam, 3, passes, distributed=kwargs)
    tol = 1e-2 if "compression" in kwargs else 0
    for a, b in zip(plain.parameters(), dist.parameters()):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_grad_scaler_with_synchronize_and_skip(hooks_at_size_one):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(3, 4)).float().pow(2).mean()
            scaler.scale(loss).backward()
            opt.synchronize()
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
            scaler.update()
    assert scaler.get_scale() == 65536.0 and all(torch.isfinite(p).all() for p in model.parameters())


def test_partial_accumulation_cycle_is_reduced_and_resets(hooks_at_size_one):
    """Three passes per step, but the epoch ends after two: no error, and the next cycle is full."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=3)
    for passes in (3, 2, 3, 1, 3):
        opt.zero_grad()
        for _ in range(passes):
            model(torch.randn(2, 4)).sum().backward()
        opt.step()
    model(torch.randn(2, 4)).sum().backward()
    opt.set_backward_passes_per_step(1)  # resets the counters
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step=1"):
        model(torch.randn(2, 4)).sum().backward()


def test_unused_parameters_get_zero_gradients(hooks_at_size_one):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model[0](torch.randn(2, 4)).sum().backward()  # the second layer takes no part
    opt.step()
    assert torch.equal(model[2].weight.grad, torch.zeros_like(model[2].weight))


def test_zero_grad_after_backward_starts_a_clean_cycle(hooks_at_size_one):
    # backward() returns with its reductions finished, so zero_grad() races with nothing; a step
    # that never came (a GradScaler skipped it) leaves no pass counted towards the next one.
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(2, 4)).sum().backward()
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()  # would be a second pass of backward_passes_per_step=1
    opt.step()


def test_skip_synchronize_and_explicit_synchronize(hooks_at_size_one, monkeypatch):
    from horovod.torch import optimizer as optimizer_module

    launches = []
    real_start = optimizer_module.start
    monkeypatch.setattr(optimizer_module, "start", lambda *a, **k: launches.append(1) or real_start(*a, **k))
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(2, 4)).sum().backward()
    opt.synchronize()
    assert len(launches) == 4
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    clipped = [p.grad.clone() for p in model.parameters()]
    opt.step()  # already reduced: steps with the clipped gradients, no second reduction
    assert len(launches) == 4
    assert all(torch.equal(c, p.grad) for c, p in zip(clipped, model.parameters()))
    opt.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    assert len(launches) == 8
    opt.step()  # no backward since the last step: reduces again, as every rank must
    assert len(launches) == 12


def test_sparse_gradients(hooks_at_size_one):
    for as_dense in (False, True):
        emb = torch.nn.Embedding(10, 3, sparse=True)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), sparse_as_dense=as_dense)
        emb(torch.tensor([1, 2, 2])).sum().backward()
        opt.synchronize()
        assert emb.weight.grad.is_sparse  # reduced dense or gathered: handed back sparse either way
        assert emb.weight.grad.to_dense()[2].tolist() == [2.0, 2.0, 2.0]
        with opt.skip_synchronize():
            opt.step()


def test_add_param_group_is_reduced_too(hooks_at_size_one):
    """The added group's gradients are counted by its hooks like the others: a second pass
    is refused (on 2 ranks, test_torch_optimizer checks that they end up averaged)."""
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model[0].parameters(), lr=0.1))
    opt.add_param_group({"params": list(model[2].parameters())})
    assert [opt._parameter_names[p] for p in model[2].parameters()] == ["allreduce.noname.1.0",
                                                                         "allreduce.noname.1.1"]
    hidden = torch.randn(2, 3)
    model[2](hidden).sum().backward()  # only the added group has gradients
    with pytest.raises(AssertionError, match="more than backward_passes_per_step=1"):
        model[2](hidden).sum().backward()
    opt.step()


def test_dropped_wrapper_leaves_no_active_hooks(hooks_at_size_one):
    import gc

    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    del opt
    gc.collect()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))  # same names again
    assert len(model[0].weight._post_accumulate_grad_hooks) == 1  # the dropped wrapper's hook is gone
    model(torch.randn(2, 4)).sum().backward()
    opt.step()


# -- helpers and SyncBatchNorm at size 1 -------------------------------------------------------------------
def test_broadcast_helpers_at_size_one():
    model, opt = train(lambda p: torch.optim.Adam(p, lr=0.01), 2)
    before = {k: v.clone() for k, v in opt.state_dict()["state"][0].items()}
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    after = opt.state_dict()["state"][0]
    assert all(torch.equal(before[k], after[k]) for k in before)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=0)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=0)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="^invalid params of type: <class 'int'>. broadcast_parameters expects"):
        hvd.broadcast_parameters(5, root_rank=0)
    with pytest.raises(ValueError, match="state_dict"):
        hvd.broadcast_parameters(torch.zeros(2), root_rank=0)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1}
    assert hvd.allgather_object("x") == ["x"]


def test_sync_batch_norm_at_size_one_is_batch_norm():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5)
    sync, plain = hvd.SyncBatchNorm(3), torch.nn.BatchNorm1d(3)
    torch.testing.assert_close(sync(x), plain(x))
    torch.testing.assert_close(sync.running_var, plain.running_var)
    with pytest.raises(ValueError, match="at least 2"):
        sync(torch.randn(4))


def test_gpu_gradients_travel_in_buckets_by_size_from_the_last_parameter():
    from horovod.torch.optimizer import size_buckets

    mib = 1 << 20
    # DDP's rule: the first bucket closes at 1 MiB, the others at 25 MiB; the last parameters go first.
    assert size_buckets([4 * mib, 4 * mib, 20 * mib, 512, 40 * 1024]) == [(4, 3, 2), (1, 0)]
    assert size_buckets([10, 10], first=15, rest=100) == [(1, 0)]
    assert size_buckets([]) == []
