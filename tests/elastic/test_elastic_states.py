"""State objects in one process (a job of size 1): commit, restore, attribute handling, callbacks.
Their behaviour across processes is what test_elastic_jobs.py checks."""

from __future__ import annotations

import pytest

import horovod.common.basics as basics


@pytest.fixture
def initialized():
    basics.init()
    yield
    basics.shutdown()


def test_object_state_rolls_back_to_the_last_commit_and_runs_reset_callbacks(initialized):
    import horovod.torch as hvd

    state = hvd.elastic.ObjectState(epoch=0, history=[])
    calls = []
    state.register_reset_callbacks([lambda: calls.append(state.epoch)])
    state.epoch, state.history = 1, [1]
    state.commit()
    state.epoch = 2
    state.history.append(2)
    state.restore()
    assert (state.epoch, state.history) == (1, [1])
    state.on_reset()
    assert calls == [1]


def test_torch_state_restores_model_optimizer_and_sampler(initialized):
    torch = pytest.importorskip("torch")
    import horovod.torch as hvd

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, batch=0)
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    sampler.record_batch(0, 4)
    state.batch = 1
    state.restore()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert optimizer.state_dict()["state"] == {} and state.batch == 0
    assert sampler.processed_num == 0 and list(sampler) == list(range(10))
    # A handled attribute takes the new object: commit and restore act on it from then on, and no
    # longer on the old one.
    replacement = torch.nn.Linear(2, 1)
    state.model = replacement
    assert state.model is replacement
    state.commit()
    committed = [p.detach().clone() for p in replacement.parameters()]
    old_values = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in (*replacement.parameters(), *model.parameters()):
            p.add_(1.0)
    state.restore()
    assert all(torch.equal(a, b) for a, b in zip(committed, replacement.parameters()))
    assert all(torch.equal(a + 1.0, b) for a, b in zip(old_values, model.parameters()))


def test_tensorflow_state_and_keras_state_restore_variables(initialized):
    pytest.importorskip("tensorflow", reason="TensorFlow states")
    import keras
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow as hvd
    import horovod.tensorflow.keras as khvd

    variable = tf.Variable(1.0)
    state = hvd.elastic.TensorFlowState([variable], epoch=0)
    variable.assign(5.0)
    state.restore()
    assert float(variable.numpy()) == 1.0
    variable.assign(3.0)
    state.commit()
    variable.assign(4.0)
    state.restore()
    assert float(variable.numpy()) == 3.0

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=khvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    kstate = khvd.elastic.KerasState(model, epoch=0)
    weights = [w.copy() for w in model.get_weights()]
    model.fit(np.ones((1, 1)), np.full((1, 1), 3.0), verbose=0, callbacks=[khvd.elastic.UpdateEpochStateCallback(kstate)])
    assert kstate.epoch == 1
    kstate.restore()
    assert all((a == b).all() for a, b in zip(weights, model.get_weights())) and kstate.epoch == 0
