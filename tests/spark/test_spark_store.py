"""The estimators' stores: Horovod's layout and methods, Store.create's choice, file access through
fsspec, Parquet through pyarrow; HDFS as far as it goes without a Hadoop cluster; DBFS's paths."""

from __future__ import annotations

import base64
import os
import pickle

import pytest

fsspec = pytest.importorskip("fsspec")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def test_local_store_layout_and_files(tmp_path):
    from horovod.spark.common.store import LocalStore, Store, checkpoint_file

    store = Store.create(f"file://{tmp_path}/prefix")
    assert isinstance(store, LocalStore) and store.prefix_path == f"{tmp_path}/prefix"
    assert store.get_train_data_path(3) == f"{tmp_path}/prefix/intermediate_train_data.3"
    assert store.get_val_data_path() == f"{tmp_path}/prefix/intermediate_val_data"
    assert store.get_test_data_path(1) == f"{tmp_path}/prefix/intermediate_test_data.1"
    assert store.get_runs_path() == f"{tmp_path}/prefix/runs" and store.saving_runs()
    # Horovod's layout: the checkpoint path is the run's directory; the file in it is `checkpoint`.
    assert store.get_checkpoint_path("r1") == f"{tmp_path}/prefix/runs/r1"
    assert store.get_checkpoint_filename() == "checkpoint" and store.get_logs_subdir() == "logs"
    assert store.get_logs_path("r1") == f"{tmp_path}/prefix/runs/r1/logs"
    assert store.get_full_path(store.get_run_path("r1")) == f"file://{tmp_path}/prefix/runs/r1"
    path = checkpoint_file(store, "r1")
    assert path == f"{tmp_path}/prefix/runs/r1/checkpoint" and not store.exists(path)
    store.write(path, b"weights")
    assert store.exists(path) and store.read(path) == b"weights"
    clone = pickle.loads(pickle.dumps(store))  # travels to the executors without its file system
    assert clone.read(path) == b"weights"

    store.write(f"{store.get_checkpoint_path('r1')}/epoch=1.ckpt", b"1")
    store.write(f"{store.get_checkpoint_path('r1')}/epoch=0.ckpt", b"0")
    assert [os.path.basename(p) for p in store.get_checkpoints("r1")] == ["epoch=0.ckpt", "epoch=1.ckpt"]
    assert store.get_checkpoints("r1", suffix=".nothing") == [] and store.get_checkpoints("absent") == []

    # A run's output is written to a local directory, then synced into the run's directory.
    with store.get_local_output_dir_fn("r2")() as run_dir:
        os.makedirs(f"{run_dir}/logs")
        with open(f"{run_dir}/logs/events", "w") as f:
            f.write("e")
        store.sync_fn("r2")(run_dir)
    assert store.read(f"{store.get_logs_path('r2')}/events") == b"e"
    remote = store.to_remote("r2", 4)
    assert remote.train_data_path.endswith("intermediate_train_data.4") and remote.logs_subdir == "logs"

    no_runs = Store.create(str(tmp_path / "norun"), save_runs=False)
    assert no_runs.get_checkpoint_path("r") is None and no_runs.get_logs_path("r") is None
    with pytest.raises(ValueError, match="save_runs=False"):
        checkpoint_file(no_runs, "r")


def test_any_fsspec_url_is_a_filesystem_store_with_parquet_datasets():
    from horovod.spark.common.reader import ReaderOptions, ShardReader
    from horovod.spark.common.store import FilesystemStore, LocalStore, Store

    store = Store.create("memory://khorovod-store-test")
    assert type(store) is FilesystemStore and not isinstance(store, LocalStore)
    data = store.get_train_data_path("run")
    store.fs.makedirs(data, exist_ok=True)
    with store.fs.open(f"{data}/part-0.parquet", "wb") as f:
        pq.write_table(pa.table({"x": [[float(i), float(-i)] for i in range(5)], "y": list(range(5))}), f)
    store.write_text(f"{data}/_SUCCESS", "")
    assert store.is_parquet_dataset(data) and store.get_parquet_dataset(data).count_rows() == 5
    first, second = (ShardReader(store, data, ["x", "y"], rank, 2, ReaderOptions(), 1).arrays() for rank in (0, 1))
    assert first["x"].shape == (3, 2) and first["x"].dtype.name == "float32"
    assert second["y"].tolist() == [3, 4] and second["y"].dtype.kind == "i"
    store.delete(data)
    assert not store.exists(data)


def test_hdfs_store_paths_without_a_hadoop_cluster():
    """What HDFSStore does before it connects. Not tested here (no Hadoop, no libhdfs): reading and
    writing through pyarrow's HadoopFileSystem."""
    from horovod.spark.common.store import HDFSStore, Store

    store = Store.create("hdfs://namenode01:8020/user/test/horovod")
    assert isinstance(store, HDFSStore)
    assert store.hdfs_kwargs["host"] == "namenode01" and store.hdfs_kwargs["port"] == 8020
    run = store.get_run_path("r")
    assert run == "hdfs://namenode01:8020/user/test/horovod/runs/r"
    assert store.get_localized_path(run) == "/user/test/horovod/runs/r"
    assert store.get_full_path("/user/x") == "hdfs://namenode01:8020/user/x"
    default = HDFSStore("hdfs:///user/test/horovod", user="alice")
    assert default.hdfs_kwargs["host"] == "default" and default.hdfs_kwargs["port"] == 0
    assert default.get_train_data_path() == "hdfs:///user/test/horovod/intermediate_train_data"
    assert default.get_localized_path(default.get_train_data_path()) == "/user/test/horovod/intermediate_train_data"
    bare = HDFSStore("/user/test/horovod", host="nn", port=9000)
    assert bare.hdfs_kwargs["host"] == "nn" and bare.get_full_path("/a") == "hdfs:///a"
    with pytest.raises(ValueError, match="Mismatched HDFS namespace for URL: s3://b/x"):
        HDFSStore("s3://b/x")
    pickle.loads(pickle.dumps(store))  # no connection is made until a file is touched
    with pytest.raises(Exception):  # no libhdfs / Hadoop here: the connection fails, loudly
        store.exists(run)


def test_dbfs_local_store_layout(tmp_path):
    from horovod.spark.common.store import DBFSLocalStore, Store

    assert isinstance(Store.create("dbfs:/ml/horovod"), DBFSLocalStore)
    for path in ("/dbfs/ml/h", "dbfs:/ml/h", "file:/dbfs/ml/h", "file:///dbfs/ml/h"):
        assert DBFSLocalStore.matches_dbfs(path) and DBFSLocalStore.normalize_path(path) == "/dbfs/ml/h"
    assert not DBFSLocalStore.matches_dbfs("dbfs://ml/h")
    with pytest.raises(ValueError, match="The provided path is not a DBFS path: /tmp/x"):
        DBFSLocalStore("/tmp/x")
    store = DBFSLocalStore("dbfs:/ml/horovod")
    assert store.prefix_path == "/dbfs/ml/horovod" and store.get_checkpoint_filename() == "checkpoint.tf"
    assert store.get_full_path(store.get_run_path("r")) == "file:///dbfs/ml/horovod/runs/r"

    class MountedHere(DBFSLocalStore):
        mount_point = str(tmp_path)  # the FUSE mount stands here, as on a Databricks machine

    mounted = MountedHere("dbfs:/ml/horovod")
    assert mounted.prefix_path == f"{tmp_path}/ml/horovod"
    mounted.write(f"{mounted.get_checkpoint_path('r')}/checkpoint.tf", b"model")
    assert (tmp_path / "ml/horovod/runs/r/checkpoint.tf").read_bytes() == b"model"


def test_read_serialized_keras_model(tmp_path):
    keras = pytest.importorskip("keras")
    from horovod.spark.common.store import LocalStore
    from horovod.spark.keras.serialization import model_from_bytes, model_to_bytes

    store = LocalStore(str(tmp_path))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    store.write(f"{tmp_path}/full", model_to_bytes(model))
    loaded = model_from_bytes(base64.b64decode(store.read_serialized_keras_model(f"{tmp_path}/full", None, {})))
    assert loaded.layers[0].get_weights()[0].tolist() == model.layers[0].get_weights()[0].tolist()
    model.save_weights(f"{tmp_path}/w.weights.h5")
    other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    restored = model_from_bytes(base64.b64decode(store.read_serialized_keras_model(f"{tmp_path}/w.weights.h5",
                                                                                   other, None)))
    assert restored.layers[0].get_weights()[0].tolist() == model.layers[0].get_weights()[0].tolist()
