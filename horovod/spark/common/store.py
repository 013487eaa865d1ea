"""Where an estimator keeps what it makes: the training data as Parquet, checkpoints, logs, runs.

`Store.create(prefix_path)` picks the store for a path. Every store here is a `FilesystemStore`:
the file system behind a URL comes from fsspec (`file://` or a plain path, and whatever fsspec
reaches with its optional packages: `hdfs://` through pyarrow, `s3://` through s3fs, ...), so no
client for any file system is written here. A store pickles to its prefix alone (it travels to
the Spark executors) and opens its file system again where it is used.

Layout under the prefix, as Horovod's:
`intermediate_train_data.<idx>`, `intermediate_val_data.<idx>`, `intermediate_test_data.<idx>`,
and `runs/<run_id>/` holding `checkpoint.<ext>` and `logs/`.
"""

from __future__ import annotations

import abc
import contextlib
import os
import posixpath
from typing import Any, Callable

import fsspec


class Store(abc.ABC):
    """The interface every estimator uses; `Store.create` gives the right one for a path."""

    @staticmethod
    def create(prefix_path: str, *args: Any, **kwargs: Any) -> "Store":
        """The store for `prefix_path`: a `LocalStore` for a local path, else a `FilesystemStore`."""
        protocol = fsspec.core.split_protocol(prefix_path)[0]
        if protocol in (None, "file", "local"):
            return LocalStore(prefix_path, *args, **kwargs)
        return FilesystemStore(prefix_path, *args, **kwargs)

    @abc.abstractmethod
    def get_train_data_path(self, idx: int | str | None = None) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def get_val_data_path(self, idx: int | str | None = None) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def get_test_data_path(self, idx: int | str | None = None) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def get_runs_path(self) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def get_run_path(self, run_id: str) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def get_checkpoint_path(self, run_id: str) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def get_logs_path(self, run_id: str) -> str:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def read(self, path: str) -> bytes:
        """Defined by each concrete class."""

    @abc.abstractmethod
    def write(self, path: str, data: bytes) -> None:
        """Defined by each concrete class."""


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
        self._storage_options = dict(storage_options or {})
        self._checkpoint_filename = checkpoint_filename
        self._fs: fsspec.AbstractFileSystem | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None}  # the file system is opened again where it is used

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            self._fs = fsspec.core.url_to_fs(self.prefix_path, **self._storage_options)[0]
        return self._fs

    def _join(self, *parts: str) -> str:
        return posixpath.join(self.prefix_path, *parts)

    @staticmethod
    def _indexed(path: str, idx: int | str | None) -> str:
        return f"{path}.{idx}" if idx is not None else path

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

    def get_checkpoint_filename(self) -> str:
        return self._checkpoint_filename or "checkpoint"

    def get_checkpoint_path(self, run_id: str) -> str:
        return posixpath.join(self.get_run_path(run_id), self.get_checkpoint_filename())

    def get_logs_path(self, run_id: str) -> str:
        return posixpath.join(self.get_run_path(run_id), "logs")

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def read(self, path: str) -> bytes:
        with self.fs.open(path, "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        self.fs.makedirs(posixpath.dirname(path) or ".", exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(data)

    def write_text(self, path: str, text: str) -> None:
        self.write(path, text.encode("utf-8"))

    def is_parquet_dataset(self, path: str) -> bool:
        """A directory of Parquet files, as Spark writes one (it marks it finished with `_SUCCESS`)."""
        return self.exists(posixpath.join(path, "_SUCCESS"))

    def get_parquet_dataset(self, path: str) -> Any:
        """The Parquet data at `path` as a `pyarrow.dataset.Dataset` (read lazily)."""
        import pyarrow.dataset as ds

        # pyarrow wants the path as the file system names it (fsspec's methods take either form).
        return ds.dataset(fsspec.core.strip_protocol(path), format="parquet",
                          filesystem=self.fs, exclude_invalid_files=True)

    def delete(self, path: str) -> None:
        if self.exists(path):
            self.fs.rm(path, recursive=True)

    def sync_fn(self, run_id: str) -> Callable[[str], None]:
        """A function that copies a local directory into the run's directory of the store."""
        run_path = self.get_run_path(run_id)

        def sync(local_run_path: str) -> None:
            self.fs.put(local_run_path.rstrip("/") + "/", run_path, recursive=True)

        return sync

    def spark_path(self, path: str) -> str:
        """The same path as Spark's readers and writers name it (a URL with its scheme)."""
        return path if "://" in path else self.fs.unstrip_protocol(path)


class LocalStore(FilesystemStore):
    """A store in a directory every executor sees at the same path (one machine, or a shared mount)."""

    def __init__(self, prefix_path: str, *args: Any, **kwargs: Any) -> None:
        path = fsspec.core.split_protocol(prefix_path)[1]
        super().__init__(os.path.abspath(path), *args, **kwargs)

    def get_local_output_dir_fn(self, run_id: str) -> Callable[[], Any]:
        """Horovod's helper: a context manager giving the run's own directory to write into."""
        run_path = self.get_run_path(run_id)

        @contextlib.contextmanager
        def local_run_path() -> Any:
            os.makedirs(run_path, exist_ok=True)
            yield run_path

        return local_run_path
