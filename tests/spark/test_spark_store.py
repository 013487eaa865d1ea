"""The estimators' stores: the path layout, file access through fsspec, Parquet through pyarrow."""

from __future__ import annotations

import pickle

import pytest

fsspec = pytest.importorskip("fsspec")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_local_store_layout_and_files(tmp_path):
    from horovod.spark.common.store import LocalStore, Store

    store = Store.create(f"file://{tmp_path}/prefix")
    assert isinstance(store, LocalStore) and store.prefix_path == f"{tmp_path}/prefix"
    assert store.get_train_data_path(3) == f"{tmp_path}/prefix/intermediate_train_data.3"
    assert store.get_val_data_path() == f"{tmp_path}/prefix/intermediate_val_data"
    assert store.get_checkpoint_path("r1") == f"{tmp_path}/prefix/runs/r1/checkpoint"
    assert store.get_logs_path("r1") == f"{tmp_path}/prefix/runs/r1/logs"
    path = store.get_checkpoint_path("r1")
    assert not store.exists(path)
    store.write(path, b"weights")
    assert store.exists(path) and store.read(path) == b"weights"
    with store.get_local_output_dir_fn("r2")() as run_dir:
        assert run_dir == store.get_run_path("r2")
    clone = pickle.loads(pickle.dumps(store))  # travels to the executors without its file system
    assert clone.read(path) == b"weights"


def test_any_fsspec_url_is_a_filesystem_store_with_parquet_datasets():
    from horovod.spark.common.data import read_shard
    from horovod.spark.common.store import FilesystemStore, LocalStore, Store

    store = Store.create("memory://khorovod-store-test")
    assert type(store) is FilesystemStore and not isinstance(store, LocalStore)
    data = store.get_train_data_path("run")
    store.fs.makedirs(data, exist_ok=True)
    with store.fs.open(f"{data}/part-0.parquet", "wb") as f:
        pq.write_table(pa.table({"x": [[float(i), float(-i)] for i in range(5)], "y": list(range(5))}), f)
    store.write_text(f"{data}/_SUCCESS", "")
    assert store.is_parquet_dataset(data) and store.get_parquet_dataset(data).count_rows() == 5
    first, second = (read_shard(store, data, ["x", "y"], rank, 2) for rank in (0, 1))
    assert first["x"].shape == (3, 2) and first["x"].dtype.name == "float32"
    assert second["y"].tolist() == [3, 4] and second["y"].dtype.kind == "i"
    store.delete(data)
    assert not store.exists(data)
