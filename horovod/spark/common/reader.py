"""A rank's reader of the Parquet rows the estimator wrote: the knobs Horovod gives Petastorm.

Horovod reads the training data with Petastorm; its reader parameters mean the same here, on
pyarrow (Petastorm 0.13.1 pins `setuptools<70`, which would downgrade the installed setuptools,
and reads through pyarrow's legacy `ParquetDataset` API):

- `reader_pool_type` / `train_reader_num_workers` / `val_reader_num_workers`: the Parquet files of
  a rank's shard are read by a pool of that many workers, threads (`'thread'`) or processes
  (`'process'`, started with `mp_start_method`); `'dummy'` reads them one after the other.
- `inmemory_cache_all`: the shard is read once and kept in memory; otherwise it is read from the
  store again every epoch.
- `shuffle_buffer_size`: rows leave a buffer of that many rows (filled in file order) at random;
  0 turns shuffling off; None shuffles the whole shard.
- `transformation_fn` (with `transformation_edit_fields` / `transformation_removed_fields`): a
  function from one pandas DataFrame to another, applied to the rows of each file as they are read.

A rank's shard is its contiguous, even share of all the rows (ranks differ by at most one row).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import cloudpickle
import numpy as np

from horovod.common.partition import even_counts, offsets
from horovod.spark.common.store import FilesystemStore

POOL_TYPES = ("thread", "process", "dummy")


@dataclass(frozen=True)
class ReaderOptions:
    """The estimator's reader parameters, as a rank's reader takes them."""

    pool_type: str = "thread"
    train_workers: int = 2
    val_workers: int = 2
    cache_all: bool = False
    shuffle_buffer_size: int | None = None
    mp_start_method: str | None = None
    transformation_fn: Callable[[Any], Any] | None = None
    edit_fields: Sequence[tuple[str, Any, Sequence[int], bool]] | None = None
    removed_fields: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.pool_type not in POOL_TYPES:
            raise ValueError(f"reader_pool_type={self.pool_type!r}: give one of {', '.join(map(repr, POOL_TYPES))}")
        for name, workers in (("train_reader_num_workers", self.train_workers),
                              ("val_reader_num_workers", self.val_workers)):
            if int(workers) < 1:
                raise ValueError(f"{name}={workers!r}: give at least 1")
        if self.shuffle_buffer_size is not None and int(self.shuffle_buffer_size) < 0:
            raise ValueError(f"shuffle_buffer_size={self.shuffle_buffer_size!r}: give 0 (no shuffling) or more")


@dataclass(frozen=True)
class _Piece:
    """Rows [start, start + length) of one Parquet file."""

    path: str
    start: int
    length: int


def column_array(values: Sequence[Any]) -> np.ndarray:
    """One column's values as an array: floating point as float32 (what models train in), integers
    (class labels) as they are."""
    array = np.asarray(values) if len(values) else np.zeros((0,), np.float32)
    return array.astype(np.float32) if array.dtype.kind == "f" else array


def _read_piece(store: FilesystemStore, piece: _Piece, columns: Sequence[str],
                options: ReaderOptions) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    with store.fs.open(piece.path, "rb") as f:
        table = pq.read_table(f).slice(piece.start, piece.length)
    if options.transformation_fn is None:
        missing = [col for col in columns if col not in table.column_names]
        if missing:
            raise ValueError(f"{piece.path} has no column {', '.join(missing)}")
        return {col: column_array(table.column(col).to_pylist()) for col in columns}
    frame = options.transformation_fn(table.to_pandas())
    for name in options.removed_fields or ():
        frame = frame.drop(columns=name, errors="ignore")
    missing = [col for col in columns if col not in frame.columns]
    if missing:
        raise ValueError(f"after transformation_fn the rows have no column {', '.join(missing)}; "
                         f"they have {', '.join(map(str, frame.columns))}")
    arrays = {col: column_array(frame[col].tolist()) for col in columns}
    for name, dtype, shape, _nullable in options.edit_fields or ():
        if name in arrays:
            arrays[name] = arrays[name].astype(dtype).reshape((-1, *shape))
    return arrays


def _read_pickled_piece(task: bytes) -> dict[str, np.ndarray]:
    return _read_piece(*cloudpickle.loads(task))


class ShardReader:
    """One rank's rows of the Parquet data at `path`, read as `ReaderOptions` say."""

    def __init__(self, store: FilesystemStore, path: str, columns: Sequence[str], rank: int, size: int,
                 options: ReaderOptions, workers: int) -> None:
        self.store, self.columns, self.options, self.workers = store, list(columns), options, int(workers)
        self.pieces = self._shard_pieces(path, rank, size)
        self.rows = sum(piece.length for piece in self.pieces)
        self._cached: dict[str, np.ndarray] | None = None

    def _shard_pieces(self, path: str, rank: int, size: int) -> list[_Piece]:
        dataset = self.store.get_parquet_dataset(path)
        files = [(fragment.path, fragment.count_rows()) for fragment in dataset.get_fragments()]
        counts = even_counts(sum(rows for _, rows in files), size)
        begin = offsets(counts)[rank]
        end = begin + counts[rank]
        pieces, position = [], 0
        for file, rows in files:
            start, stop = max(begin, position), min(end, position + rows)
            if start < stop:
                pieces.append(_Piece(file, start - position, stop - start))
            position += rows
        return pieces

    def _read(self) -> dict[str, np.ndarray]:
        read = lambda piece: _read_piece(self.store, piece, self.columns, self.options)  # noqa: E731
        if self.options.pool_type == "dummy" or len(self.pieces) <= 1:
            parts = [read(piece) for piece in self.pieces]
        elif self.options.pool_type == "thread":
            with concurrent.futures.ThreadPoolExecutor(self.workers) as pool:
                parts = list(pool.map(read, self.pieces))
        else:
            context = multiprocessing.get_context(self.options.mp_start_method)
            # cloudpickle: transformation_fn may be a closure or a lambda, which pickle cannot send.
            tasks = [cloudpickle.dumps((self.store, piece, self.columns, self.options)) for piece in self.pieces]
            with concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context) as pool:
                parts = list(pool.map(_read_pickled_piece, tasks))
        if not parts:
            return {col: np.zeros((0,), np.float32) for col in self.columns}
        return {col: np.concatenate([part[col] for part in parts]) for col in self.columns}

    def arrays(self) -> dict[str, np.ndarray]:
        """The shard by column: kept after the first read with `inmemory_cache_all`, else read anew."""
        if self._cached is not None:
            return self._cached
        arrays = self._read()
        if self.options.cache_all:
            self._cached = arrays
        return arrays

    def epoch(self, batch_size: int, steps: int, shuffle: bool, rng: np.random.Generator
              ) -> Iterator[dict[str, np.ndarray]]:
        """`steps` batches of one epoch (going round the shard again when it is short: every rank
        takes the same number of steps, each a collective)."""
        arrays = self.arrays()
        for index in epoch_batches(self.rows, batch_size, steps, self._order(shuffle, rng)):
            yield {col: values[index] for col, values in arrays.items()}

    def _order(self, shuffle: bool, rng: np.random.Generator) -> np.ndarray:
        buffer = self.options.shuffle_buffer_size
        if not shuffle or buffer == 0:
            return np.arange(self.rows)
        if buffer is None or buffer >= self.rows:
            return rng.permutation(self.rows)
        return buffered_order(self.rows, int(buffer), rng)


def buffered_order(rows: int, buffer: int, rng: np.random.Generator) -> np.ndarray:
    """The order rows leave a shuffling buffer of `buffer` rows that is filled in read order: each
    row out is a random one of the buffer, and the next row read takes its place."""
    pending = list(range(min(buffer, rows)))
    upcoming = len(pending)
    order = np.empty(rows, dtype=np.int64)
    for position in range(rows):
        slot = int(rng.integers(len(pending)))
        order[position] = pending[slot]
        if upcoming < rows:
            pending[slot] = upcoming
            upcoming += 1
        else:
            pending[slot] = pending[-1]
            pending.pop()
    return order


def epoch_batches(rows: int, batch_size: int, steps: int, order: np.ndarray) -> Iterator[np.ndarray]:
    """Row indices of `steps` batches taken from `order`, going round it again when it is short."""
    order = np.resize(order, max(steps * batch_size, 1)) if rows else np.zeros(0, dtype=np.int64)
    for step in range(steps):
        yield order[step * batch_size:(step + 1) * batch_size]

