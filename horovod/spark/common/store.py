"""Where an estimator keeps what it makes: the training data as Parquet, checkpoints, logs, runs.

`Store.create(prefix_path)` picks the store for a path: `HDFSStore` for `hdfs://`, `DBFSLocalStore`
for Databricks' `dbfs:/` (or `/dbfs/` where that mount exists), `LocalStore` for a local path,
and `FilesystemStore` for any other URL fsspec can open (`s3://` with s3fs, `gs://`, `memory://`,
...). Every store is a `FilesystemStore`: its file system is an fsspec one (HDFS's is pyarrow's
`HadoopFileSystem` seen through fsspec), so no client for any file system is written here. A store
pickles without its file system (it travels to the Spark executors) and opens it again where it
is used.

Layout under the prefix, as Horovod's: `intermediate_train_data.<idx>`, `intermediate_val_data.<idx>`,
`intermediate_test_data.<idx>`, and `runs/<run_id>/` (the checkpoint path) holding the checkpoint
file (`checkpoint`; `checkpoint.tf` on DBFS), Lightning's `*.ckpt` files and `logs/`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import posixpath
import re
import tempfile
import types
from typing import Any, Callable, Iterator

import fsspec


class Store:
    """The interface every estimator uses; `Store.create` gives the right one for a path."""

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> "FilesystemStore":
        """The store for `prefix_path` (see the module's docstring for which)."""
        if HDFSStore.matches(prefix_path):
            return HDFSStore(prefix_path, *args, **kwargs)
        if DBFSLocalStore.matches_dbfs(prefix_path) and (prefix_path.startswith("dbfs:/")
                                                         or os.path.isdir(DBFSLocalStore.mount_point)):
            return DBFSLocalStore(prefix_path, *args, **kwargs)
        if fsspec.core.split_protocol(prefix_path)[0] in (None, "file", "local"):
            return LocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)


class FilesystemStore(Store):
    """A store on any file system fsspec can open, under `prefix_path`."""

    def __init__(self, prefix_path: str, train_path: str | None = None, val_path: str | None = None,
                 test_path: str | None = None, runs_path: str | None = None, save_runs: bool = True,
                 storage_options: dict[str, Any] | None = None, checkpoint_filename: str | None = None) -> None:
        self.prefix_path = prefix_path.rstrip("/")
        self._train_path = train_path or self._join("intermediate_train_data")
        self._val_path = val_path or self._join("intermediate_val_data")
        self._test_path = test_path or self._join("intermediate_test_data")
        self._runs_path = runs_path or self._join("runs")
        self._save_runs = save_runs
        self.storage_options = dict(storage_options or {})
        self.checkpoint_filename = checkpoint_filename or "checkpoint"
        self._fs: fsspec.AbstractFileSystem | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}  # the file system is opened again where it is used

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            self._fs = self._open_filesystem()
        return self._fs

    def _open_filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.core.url_to_fs(self.prefix_path, **self.storage_options)[0]

    def get_filesystem(self) -> fsspec.AbstractFileSystem:
        return self.fs

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.prefix_path, *parts)

    @staticmethod
    def _indexed(path: str, idx: int | str | None) -> str:
        return f"{path}.{idx}" if idx is not None else path

    # Paths (Horovod's names).
    def get_train_data_path(self, idx: int | str | None = None) -> str:
        return self._indexed(self._train_path, idx)

    def get_val_data_path(self, idx: int | str | None = None) -> str:
        return self._indexed(self._val_path, idx)

    def get_test_data_path(self, idx: int | str | None = None) -> str:
        return self._indexed(self._test_path, idx)

    def saving_runs(self) -> bool:
        return self._save_runs

    def get_runs_path(self) -> str:
        return self._runs_path

    def get_run_path(self, run_id: str) -> str:
        return posixpath.join(self._runs_path, run_id)

    def get_checkpoint_path(self, run_id: str) -> str | None:
        """The run's directory, where its checkpoint file(s) go (None when runs are not saved)."""
        return self.get_run_path(run_id) if self._save_runs else None

    def get_checkpoint_filename(self) -> str:
        return self.checkpoint_filename

    def get_checkpoints(self, run_id: str, suffix: str = ".ckpt") -> list[str]:
        """The run's checkpoint files ending in `suffix` (Lightning's), sorted."""
        directory = self.get_checkpoint_path(run_id)
        if directory is None or not self.exists(directory):
            return []
        return sorted(name for name in self.fs.ls(self.get_localized_path(directory), detail=False)
                      if name.endswith(suffix))

    def get_logs_subdir(self) -> str:
        return "logs"

    def get_logs_path(self, run_id: str) -> str | None:
        return posixpath.join(self.get_run_path(run_id), self.get_logs_subdir()) if self._save_runs else None

    def get_full_path(self, path: str) -> str:
        """`path` as Spark's readers and writers name it (a URL with its scheme)."""
        return path if "://" in path else self.fs.unstrip_protocol(path)

    def get_full_path_fn(self) -> Callable[[str], str]:
        return self.get_full_path

    def get_localized_path(self, path: str) -> str:
        """`path` as the store's file system names it (no scheme)."""
        return fsspec.core.strip_protocol(path) if "://" in path else path

    # Files.
    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(self.get_localized_path(path)))

    def read(self, path: str) -> bytes:
        with self.fs.open(self.get_localized_path(path), "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        path = self.get_localized_path(path)
        self.fs.makedirs(posixpath.dirname(path) or ".", exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def write_text(self, path: str, text: str) -> None:
        self.write(path, text.encode("utf-8"))

    def delete(self, path: str) -> None:
        if self.exists(path):
            self.fs.rm(self.get_localized_path(path), recursive=True)

    def read_serialized_keras_model(self, ckpt_path: str, model: Any, custom_objects: dict[str, Any] | None
                                    ) -> str:
        """The Keras model checkpointed at `ckpt_path`, as base64 of its `.keras` file. A checkpoint
        of weights only (`save_weights_only`) is loaded into `model`, which gives the structure."""
        from horovod.spark.keras.serialization import model_from_bytes, model_to_bytes

        data = self.read(ckpt_path)
        if data.startswith(b"\x89HDF"):  # an .h5 file of weights
            with tempfile.TemporaryDirectory() as tmp:
                local = os.path.join(tmp, "checkpoint.weights.h5")
                with open(local, "wb") as f:
                    f.write(data)
                model.load_weights(local)
            data = model_to_bytes(model)
        else:
            data = model_to_bytes(model_from_bytes(data, compile=True, custom_objects=custom_objects))
        return base64.b64encode(data).decode("ascii")

    # Datasets.
    def is_parquet_dataset(self, path: str) -> bool:
        """A directory of Parquet files, as Spark writes one (it marks it finished with `_SUCCESS`)."""
        return self.exists(posixpath.join(path, "_SUCCESS"))

    def get_parquet_dataset(self, path: str) -> Any:
        """The Parquet data at `path` as a `pyarrow.dataset.Dataset` (read lazily)."""
        import pyarrow.dataset as ds

        return ds.dataset(self.get_localized_path(path), format="parquet", filesystem=self.fs,
                          exclude_invalid_files=True)

    # Runs.
    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        """A context manager giving a local directory to write a run's output into (then `sync_fn`)."""

        @contextlib.contextmanager
        def local_run_path() -> Iterator[str]:
            with tempfile.TemporaryDirectory() as tmp:
                yield tmp

        return local_run_path

    def sync_fn(self, run_id: str) -> Callable[[str], None]:
        """A function that copies a local directory's contents into the run's directory."""
        run_path = self.get_localized_path(self.get_run_path(run_id))

        def sync(local_run_path: str) -> None:
            self.fs.makedirs(run_path, exist_ok=True)
            self.fs.put(local_run_path.rstrip("/") + "/", run_path, recursive=True)

        return sync

    def to_remote(self, run_id: str, dataset_idx: int | str | None) -> Any:
        """The store's paths for one run and dataset as plain attributes (Horovod's remote view)."""
        return types.SimpleNamespace(
            train_data_path=self.get_train_data_path(dataset_idx), val_data_path=self.get_val_data_path(dataset_idx),
            test_data_path=self.get_test_data_path(dataset_idx), saving_runs=self.saving_runs(),
            runs_path=self.get_runs_path(), run_path=self.get_run_path(run_id),
            checkpoint_path=self.get_checkpoint_path(run_id), logs_path=self.get_logs_path(run_id),
            checkpoint_filename=self.get_checkpoint_filename(), logs_subdir=self.get_logs_subdir(),
            get_local_output_dir=self.get_local_output_dir_fn(run_id), sync=self.sync_fn(run_id))


def checkpoint_file(store: FilesystemStore, run_id: str) -> str:
    """Where the estimators keep a run's last checkpoint: the checkpoint file in the run's directory."""
    directory = store.get_checkpoint_path(run_id)
    if directory is None:
        raise ValueError("the store was made with save_runs=False: it keeps no checkpoints")
    return posixpath.join(directory, store.get_checkpoint_filename())


class LocalStore(FilesystemStore):
    """A store in a directory every executor sees at the same path (one machine, or a shared mount)."""

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        path = fsspec.core.split_protocol(prefix_path)[1]
        super().__init__(os.path.abspath(path), *args, **kwargs)


class HDFSStore(FilesystemStore):
    """A store on HDFS, reached with pyarrow's `HadoopFileSystem` (libhdfs and a Hadoop client
    configuration on every machine, as for Horovod).

    `prefix_path` is `hdfs://<namenode>:<port>/path`, `hdfs:///path` (the configured default name
    node) or `/path`. `host`/`port` override the URL's; `user`, `kerb_ticket` and `extra_conf`
    go to `HadoopFileSystem`. Spark is given full `hdfs://` URLs; the file system the paths without
    them. `driver` is accepted for Horovod's signature (pyarrow has only libhdfs).
    """

    FS_PREFIX = "hdfs://"
    _URL = re.compile(r"^(?P<scheme>[a-zA-Z][\w+.-]*://)?(?P<host>[^/:]+)?(?::(?P<port>\d+))?(?P<path>/.*)?$")

    def __init__(self, prefix_path: str, host: str | None = None, port: int | None = None, user: str | None = None,
                 kerb_ticket: str | None = None, driver: str = "libhdfs", extra_conf: dict[str, str] | None = None,
                 *args: Any, **kwargs: Any) -> None:
        scheme, url_host, url_port, path = self.parse_url(prefix_path)
        if scheme is not None and scheme != self.FS_PREFIX:
            raise ValueError(f"Mismatched HDFS namespace for URL: {prefix_path}. Found {scheme} but expected "
                             f"{self.FS_PREFIX}")
        if not path:
            raise ValueError(f"Failed to parse path from URL: {prefix_path}")
        authority = f"{url_host or ''}{f':{url_port}' if url_port else ''}"
        self._url_prefix = f"{self.FS_PREFIX}{authority}"
        self.hdfs_kwargs = dict(host=host or url_host or "default", port=int(port or url_port or 0), user=user,
                                kerb_ticket=kerb_ticket, extra_conf=extra_conf)
        super().__init__(self._url_prefix + path, *args, **kwargs)

    @classmethod
    def parse_url(cls, url: str) -> tuple[str | None, str | None, int | None, str | None]:
        """(scheme, host, port, path) of an HDFS URL or path."""
        match = cls._URL.match(url)
        if match is None:
            raise ValueError(f"Failed to parse path from URL: {url}")
        port = match.group("port")
        return match.group("scheme"), match.group("host"), int(port) if port else None, match.group("path")

    @classmethod
    def matches(cls, path: str) -> bool:
        return path.startswith(cls.FS_PREFIX)

    def _open_filesystem(self) -> fsspec.AbstractFileSystem:
        from fsspec.implementations.arrow import ArrowFSWrapper
        from pyarrow.fs import HadoopFileSystem

        return ArrowFSWrapper(HadoopFileSystem(**self.hdfs_kwargs))

    def get_full_path(self, path: str) -> str:
        return path if self.matches(path) else self._url_prefix + path

    def get_localized_path(self, path: str) -> str:
        return path[len(self._url_prefix):] if path.startswith(self._url_prefix) else path


class DBFSLocalStore(FilesystemStore):
    """A store on Databricks' file system through its local FUSE mount (`/dbfs/...`).

    `prefix_path` may be `/dbfs/...`, `dbfs:/...`, `file:/dbfs/...` or `file:///dbfs/...`; the
    store works on the `/dbfs/...` paths (`mount_point` says where the mount is) and gives Spark
    `file:///dbfs/...` URLs. Checkpoints are named `checkpoint.tf`, as in Horovod.
    """

    mount_point = "/dbfs"
    DBFS_PATH_FORMAT_ERROR = ("The provided path is not a DBFS path: {}, Please provide a path starting with "
                              "`/dbfs/...` or `dbfs:/...` or `file:/dbfs/...` or `file:///dbfs/...`.")

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("checkpoint_filename", "checkpoint.tf")
        super().__init__(self.get_localized_path(prefix_path), *args, **kwargs)

    @classmethod
    def matches_dbfs(cls, path: str) -> bool:
        return ((path.startswith("dbfs:/") and not path.startswith("dbfs://")) or path.startswith("/dbfs/")
                or path.startswith("file:///dbfs/") or path.startswith("file:/dbfs/"))

    @classmethod
    def normalize_path(cls, path: str) -> str:
        """`path` in the form `/dbfs/...`."""
        if not cls.matches_dbfs(path):
            raise ValueError(cls.DBFS_PATH_FORMAT_ERROR.format(path))
        return "/dbfs/" + path.split("/dbfs/", 1)[1] if "/dbfs/" in path else "/dbfs/" + path[len("dbfs:/"):]

    def get_localized_path(self, path: str) -> str:
        if path.startswith(self.mount_point.rstrip("/") + "/") and not self.matches_dbfs(path):
            return path  # already under a mount point other than /dbfs
        return self.mount_point.rstrip("/") + self.normalize_path(path)[len("/dbfs"):]

    def get_full_path(self, path: str) -> str:
        return "file://" + self.get_localized_path(path)

    def _open_filesystem(self) -> fsspec.AbstractFileSystem:
        return fsspec.filesystem("file")
