"""Keras' LossScaleOptimizer and DistributedOptimizer, nested either way, on 2 real ranks: the
same weights as one process training with LossScaleOptimizer on the whole batches; and, with
DistributedOptimizer outside, an overflow on one rank skips the step on every rank."""

import pytest

tf = pytest.importorskip("tensorflow")

from tfrun import IDENTITY_HELPERS, ok, results, run_tf  # noqa: E402

SNIPPET = IDENTITY_HELPERS + r'''
import horovod.tensorflow.keras as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

def scaled(optimizer):
    return keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0 ** 10)

def train(optimizer, poisoned_row=None):
    """This rank's shards with `optimizer`, and one process with LossScaleOptimizer on the whole
    batches; `poisoned_row` (of the whole data) is made infinite: its step overflows."""
    x, y = dataset()
    if poisoned_row is not None:
        x[poisoned_row, 0] = np.inf
    model = make_model()
    model.compile(optimizer=optimizer, loss=loss, auto_scale_loss=False)
    model.fit(shard(x, r, n, 4), shard(y, r, n, 4), batch_size=4, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    reference = make_model()
    reference.compile(optimizer=scaled(keras.optimizers.SGD(0.1)), loss=loss)
    reference.fit(x, y, batch_size=n * 4, epochs=2, shuffle=False, verbose=0)
    scale = model.optimizer.inner_optimizer.dynamic_scale if poisoned_row is not None else None
    return {"weights": max_diff(model.get_weights(), reference.get_weights()),
            "scale": None if scale is None else float(keras.ops.convert_to_numpy(scale)),
            "reference_scale": float(keras.ops.convert_to_numpy(reference.optimizer.dynamic_scale))}

@check("distributed_around_loss_scale")
def _():
    return train(hvd.DistributedOptimizer(scaled(keras.optimizers.SGD(0.1))))

@check("loss_scale_around_distributed")
def _():
    return train(scaled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))))

@check("overflow_on_one_rank")
def _():
    return train(hvd.DistributedOptimizer(scaled(keras.optimizers.SGD(0.1))), poisoned_row=12)  # rank 1's rows
'''


def test_loss_scale_optimizer_nested_either_way():
    run = run_tf(SNIPPET)
    for rank in range(2):
        got = results(run, rank)
        assert ok(got["distributed_around_loss_scale"])["weights"] < 1e-5, got
        assert ok(got["loss_scale_around_distributed"])["weights"] < 1e-5, got
        overflow = ok(got["overflow_on_one_rank"])
        assert overflow["weights"] < 1e-5, got  # both ranks skipped that step, as the one process did
        assert overflow["scale"] == overflow["reference_scale"] == 2.0 ** 8, got  # halved once per epoch
