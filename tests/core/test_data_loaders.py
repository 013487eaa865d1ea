"""horovod.data on two real ranks: each rank loads its shard through an AsyncDataLoaderMixin
loader (background thread, bounded queue, one epoch ahead) and the allreduced sums match the
data; an error inside `_iterate` reaches the training loop; closing leaves no thread behind."""

from multirank import hvdrun

LOADERS = r'''
import threading
import numpy as np
import horovod.numpy as hvd
from horovod.data import AsyncDataLoaderMixin, BaseDataLoader

hvd.init()
r, n = hvd.rank(), hvd.size()

class ShardLoader(BaseDataLoader):
    def __init__(self, rows, batch_size, fail_at=None):
        self.rows, self.batch_size, self.fail_at, self.epochs = rows, batch_size, fail_at, 0
    def __len__(self):
        return -(-len(self.rows) // self.batch_size)
    def _iterate(self):
        self.epochs += 1
        for start in range(0, len(self.rows), self.batch_size):
            if self.fail_at is not None and start >= self.fail_at:
                raise IOError(f"cannot read rows from {start}")
            yield self.rows[start:start + self.batch_size]
    def _process_batch(self, batch):
        return batch * 2

class AsyncShardLoader(AsyncDataLoaderMixin, ShardLoader):
    pass

rows = np.arange(100, dtype=np.float64)[r::n]
sync, loader = ShardLoader(rows, 8), AsyncShardLoader(4, rows, 8)
sums = []
for epoch in range(3):
    batches = list(loader)
    sums.append(float(hvd.allreduce(np.array([sum(b.sum() for b in batches)]), op=hvd.Sum, name=f"e{epoch}")[0]))
same = all(np.array_equal(a, b) for a, b in zip(list(sync), list(loader)))
loader.close_async_loader()
alive_after_close = loader.thread.is_alive()

failing = AsyncShardLoader(2, rows, 8, fail_at=16)
try:
    list(failing)
    error = None
except IOError as exc:
    error = str(exc)
failing.close_async_loader()
plain = AsyncShardLoader(0, rows, 8)
report(sums=sums, same=same, length=len(loader), alive_after_close=alive_after_close, error=error,
       plain=float(sum(b.sum() for b in plain)), threads=[t.name for t in threading.enumerate()
                                                         if t.name == "horovod-async-loader"])
'''


def test_async_loaders_feed_every_rank_and_stop_cleanly():
    result = hvdrun(LOADERS, np=2, timeout=60).check()
    for rank in (0, 1):
        got = result.ranks[rank]
        assert got["sums"] == [2 * sum(range(100))] * 3
        assert got["same"] is True and got["length"] == 7
        assert got["alive_after_close"] is False and got["threads"] == []
        assert got["error"] == "cannot read rows from 16"
        assert got["plain"] == 2 * sum(range(rank, 100, 2))
