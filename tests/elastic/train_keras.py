"""An elastic Keras `fit` run (TensorFlow backend) that records what it did, for tests/elastic.

    train_keras.py OUT_DIR EPOCHS

ELASTIC_KILL="<epoch>:<batch>:<rank>": that rank dies by SIGKILL there, once (a marker file in
OUT_DIR keeps a replacement from dying again). Rank 0 writes OUT_DIR/result.json at the end.
"""

import json
import os
import signal
import sys
import time

import keras
import numpy as np

import horovod.tensorflow.keras as hvd

out, epochs = sys.argv[1], int(sys.argv[2])
hvd.init()
x = (np.arange(64, dtype="float32") / 64).reshape(-1, 1)
model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0, sizes=[])
kill = [int(v) for v in os.environ["ELASTIC_KILL"].split(":")] if os.environ.get("ELASTIC_KILL") else None


class Record(keras.callbacks.Callback):
    def on_batch_end(self, batch, logs=None):
        state.sizes.append(hvd.size())
        marker = os.path.join(out, "killed")
        if kill == [state.epoch, batch, hvd.rank()] and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.02)


callbacks = [Record(), hvd.elastic.UpdateBatchStateCallback(state), hvd.elastic.UpdateEpochStateCallback(state),
             hvd.elastic.CommitStateCallback(state)]


@hvd.elastic.run
def train(state):
    model.fit(x, 2 * x + 1, batch_size=8, initial_epoch=state.epoch, epochs=epochs, shuffle=False, verbose=0,
              callbacks=callbacks)


train(state)
if hvd.rank() == 0:
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"epoch": state.epoch, "sizes": state.sizes,
                   "weights": [float(w) for w in np.ravel(model.get_weights()[0])]}, f)
