"""The estimators' reader (horovod.spark.common.reader) on Parquet files in a store: Horovod's
reader parameters (pool type and workers, in-memory cache, shuffle buffer, transformation)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from horovod.spark.common.reader import ReaderOptions, ShardReader, buffered_order
from horovod.spark.common.store import LocalStore


@pytest.fixture
def dataset(tmp_path):
    """30 rows in three Parquet files, as Spark writes them: x = row number, v = [x, -x]."""
    store = LocalStore(str(tmp_path))
    path = store.get_train_data_path("run")
    (tmp_path / "intermediate_train_data.run").mkdir()
    for part in range(3):
        rows = range(part * 10, part * 10 + 10)
        table = pa.table({"x": [float(r) for r in rows], "v": [[float(r), -float(r)] for r in rows],
                          "label": list(rows)})
        pq.write_table(table, f"{path}/part-{part:05d}.parquet")
    (tmp_path / "intermediate_train_data.run" / "_SUCCESS").touch()
    return store, path


@pytest.mark.parametrize("pool", ["thread", "process", "dummy"])
def test_each_pool_reads_the_ranks_even_contiguous_shares(dataset, pool):
    store, path = dataset
    options = ReaderOptions(pool_type=pool, train_workers=2)
    shares = [ShardReader(store, path, ["x", "v", "label"], rank, 4, options, 2).arrays() for rank in range(4)]
    assert [len(share["x"]) for share in shares] == [8, 8, 7, 7]
    np.testing.assert_array_equal(np.concatenate([s["x"] for s in shares]), np.arange(30, dtype=np.float32))
    assert shares[1]["v"].shape == (8, 2) and shares[1]["v"].dtype == np.float32
    assert shares[0]["label"].dtype.kind == "i"


def test_inmemory_cache_all_reads_once_else_every_epoch(dataset, tmp_path):
    store, path = dataset
    cached = ShardReader(store, path, ["x"], 0, 1, ReaderOptions(cache_all=True), 1)
    uncached = ShardReader(store, path, ["x"], 0, 1, ReaderOptions(cache_all=False), 1)
    rng = np.random.default_rng(0)
    assert sum(len(b["x"]) for b in cached.epoch(10, 3, True, rng)) == 30
    assert sum(len(b["x"]) for b in uncached.epoch(10, 3, True, rng)) == 30
    for part in (tmp_path / "intermediate_train_data.run").glob("*.parquet"):
        part.unlink()  # the store loses the data: only the cache still has it
    assert sum(len(b["x"]) for b in cached.epoch(10, 3, True, rng)) == 30
    with pytest.raises(FileNotFoundError):
        list(uncached.epoch(10, 3, True, rng))


def test_shuffle_buffer_size_bounds_how_far_rows_move(dataset):
    store, path = dataset

    def order(buffer, shuffle=True):
        reader = ShardReader(store, path, ["x"], 0, 1, ReaderOptions(shuffle_buffer_size=buffer), 1)
        return np.concatenate([b["x"] for b in reader.epoch(30, 1, shuffle, np.random.default_rng(1))])

    np.testing.assert_array_equal(order(0), np.arange(30))  # Horovod: 0 turns shuffling off
    np.testing.assert_array_equal(order(None, shuffle=False), np.arange(30))
    np.testing.assert_array_equal(order(1), np.arange(30))  # a buffer of one row cannot reorder
    full = order(None)
    assert sorted(full) == list(range(30)) and not np.array_equal(full, np.arange(30))
    # With a buffer of b rows, the row at position p was read among the first p + b rows.
    for buffer in (2, 5):
        rows = buffered_order(1000, buffer, np.random.default_rng(buffer))
        assert sorted(rows) == list(range(1000))
        assert all(row < position + buffer for position, row in enumerate(rows))
        assert not np.array_equal(rows, np.arange(1000))


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_transformation_fn_with_edit_and_removed_fields(dataset, pool):
    store, path = dataset

    def double(frame):
        frame["x"] = frame["x"] * 2
        frame["flat"] = [list(v) * 2 for v in frame["v"]]
        return frame

    options = ReaderOptions(pool_type=pool, transformation_fn=double, edit_fields=[("flat", np.float64, (2, 2), False)],
                            removed_fields=["v"])
    arrays = ShardReader(store, path, ["x", "flat"], 0, 1, options, 1).arrays()
    np.testing.assert_array_equal(arrays["x"], np.arange(30) * 2)
    assert arrays["flat"].shape == (30, 2, 2) and arrays["flat"].dtype == np.float64
    with pytest.raises(ValueError, match="after transformation_fn the rows have no column v"):
        ShardReader(store, path, ["v"], 0, 1, options, 1).arrays()


def test_bad_reader_parameters_are_clear_errors():
    with pytest.raises(ValueError, match="reader_pool_type='threads': give one of 'thread', 'process', 'dummy'"):
        ReaderOptions(pool_type="threads")
    with pytest.raises(ValueError, match="train_reader_num_workers=0"):
        ReaderOptions(train_workers=0)
    with pytest.raises(ValueError, match="shuffle_buffer_size=-1"):
        ReaderOptions(shuffle_buffer_size=-1)
