"""Run by test_spark_store_s3.py with the S3 environment's Python (scripts/setup-s3-venv.sh: s3fs
cannot live in the main one): Horovod's store, created for an s3:// prefix, against the S3
server at argv[1]. Prints "S3 STORE OK" when every check held; an assertion says which did not."""

from __future__ import annotations

import os
import sys


def main(endpoint: str) -> None:
    import s3fs

    from horovod.spark.common.store import FilesystemStore, Store, checkpoint_file

    options = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}
    s3fs.S3FileSystem(**options).mkdir("khorovod-store")  # a bucket
    store = Store.create("s3://khorovod-store/experiments", storage_options=options)
    assert type(store) is FilesystemStore, type(store)
    assert isinstance(store.get_filesystem(), s3fs.S3FileSystem)
    assert store.get_train_data_path(1) == "s3://khorovod-store/experiments/intermediate_train_data.1"

    # What an estimator does with a run: its checkpoint, written then read back.
    run_id = "run-1"
    path = checkpoint_file(store, run_id)
    assert path == "s3://khorovod-store/experiments/runs/run-1/checkpoint", path
    store.write(path, b"model bytes")
    assert store.exists(path) and store.read(path) == b"model bytes"

    # Lightning's way: checkpoints written locally, synced to the run's directory, then found.
    with store.get_local_output_dir_fn(run_id)() as local:
        for name in ("epoch=0.ckpt", "epoch=1.ckpt", "notes.txt"):
            with open(os.path.join(local, name), "w") as f:
                f.write(name)
        os.makedirs(os.path.join(local, store.get_logs_subdir()))
        with open(os.path.join(local, store.get_logs_subdir(), "events"), "w") as f:
            f.write("log")
        store.sync_fn(run_id)(local)
    found = [name.rsplit("/", 1)[1] for name in store.get_checkpoints(run_id)]
    assert found == ["epoch=0.ckpt", "epoch=1.ckpt"], store.get_checkpoints(run_id)
    assert store.read(store.get_checkpoints(run_id)[1]) == b"epoch=1.ckpt"
    assert store.read(store.get_logs_path(run_id) + "/events") == b"log"

    # A store travels to the workers pickled and opens its file system again there.
    import cloudpickle

    again = cloudpickle.loads(cloudpickle.dumps(store))
    assert again.read(path) == b"model bytes"
    store.delete(store.get_run_path(run_id))
    assert not store.exists(path) and store.get_checkpoints(run_id) == []
    print("S3 STORE OK", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
