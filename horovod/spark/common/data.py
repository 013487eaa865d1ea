"""The estimators' data path: a DataFrame becomes Parquet in the store, each rank reads its rows.

On the driver, `prepare_data` keeps the feature and label columns (Spark ML vectors become
arrays), holds out the validation rows (a fraction, or a boolean column), and writes both sets as
Parquet under the store. On the executors, `read_shard` reads one rank's contiguous share of the
rows with pyarrow's dataset reader (Petastorm, which Horovod used, is unmaintained) and gives a
numpy array per column: `(rows,)` for a number, `(rows, n)` for an array of n.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from horovod.common.partition import even_counts, offsets
from horovod.spark.common.store import FilesystemStore


@dataclass(frozen=True)
class PreparedData:
    """Where a fit's data went, how many rows, and each column's shape per row (() for a number)."""

    train_path: str
    val_path: str | None
    train_rows: int
    val_rows: int
    shapes: dict[str, tuple[int, ...]]


def _as_arrays(df: Any, columns: Sequence[str]) -> Any:
    """Spark ML vector columns as arrays of doubles; others as they are."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    types = {field.name: field.dataType for field in df.schema.fields}
    missing = [col for col in columns if col not in types]
    if missing:
        raise ValueError(f"the DataFrame has no column {', '.join(map(repr, missing))}; it has {', '.join(types)}")
    return df.select([vector_to_array(col).alias(col) if isinstance(types[col], VectorUDT) else col
                      for col in columns])


def _shapes(df: Any, columns: Sequence[str]) -> dict[str, tuple[int, ...]]:
    from pyspark.sql.types import ArrayType

    first = df.first()
    if first is None:
        raise ValueError("the DataFrame to fit on has no rows")
    types = {field.name: field.dataType for field in df.schema.fields}
    return {col: (len(first[col]),) if isinstance(types[col], ArrayType) else () for col in columns}


def prepare_data(df: Any, store: FilesystemStore, run_id: str, feature_cols: Sequence[str],
                 label_cols: Sequence[str], validation: float | str | None, partitions: int,
                 seed: int | None) -> PreparedData:
    """Write the training (and validation) rows of `df` as Parquet in `store` for run `run_id`."""
    columns = list(dict.fromkeys([*feature_cols, *label_cols]))
    if isinstance(validation, str):
        selected = _as_arrays(df, [*columns, validation])
        train, val = (selected.filter(~selected[validation]).drop(validation),
                      selected.filter(selected[validation]).drop(validation))
    elif validation:
        if not 0.0 < float(validation) < 1.0:
            raise ValueError(f"validation={validation!r}: give a fraction between 0 and 1, or a column name")
        train, val = _as_arrays(df, columns).randomSplit([1.0 - float(validation), float(validation)], seed=seed)
    else:
        train, val = _as_arrays(df, columns), None
    shapes = _shapes(train, columns)
    train_path = store.get_train_data_path(run_id)
    train.repartition(partitions).write.mode("overwrite").parquet(store.spark_path(train_path))
    val_path, val_rows = None, 0
    if val is not None:
        val_path = store.get_val_data_path(run_id)
        val.repartition(partitions).write.mode("overwrite").parquet(store.spark_path(val_path))
        val_rows = store.get_parquet_dataset(val_path).count_rows()
    return PreparedData(train_path, val_path, store.get_parquet_dataset(train_path).count_rows(), val_rows, shapes)


def read_shard(store: FilesystemStore, path: str, columns: Sequence[str], rank: int, size: int
               ) -> dict[str, np.ndarray]:
    """Rank `rank`'s contiguous share of the rows at `path` (of `size` even shares), by column."""
    table = store.get_parquet_dataset(path).to_table(columns=list(columns))
    counts = even_counts(table.num_rows, size)
    shard = table.slice(offsets(counts)[rank], counts[rank])
    return {col: column_array(shard.column(col).to_pylist()) for col in columns}


def column_array(values: Sequence[Any]) -> np.ndarray:
    """One column's values as an array: floating point as float32 (what models train in), integers
    (class labels) as they are."""
    array = np.asarray(values) if len(values) else np.zeros((0,), np.float32)
    return array.astype(np.float32) if array.dtype.kind == "f" else array


def epoch_batches(rows: int, batch_size: int, steps: int, shuffle: bool, rng: np.random.Generator
                  ) -> Iterator[np.ndarray]:
    """Row indices of `steps` batches of one epoch, going round the shard again when it is short:
    every rank takes the same number of steps (each step is a collective)."""
    order = rng.permutation(rows) if shuffle else np.arange(rows)
    order = np.resize(order, max(steps * batch_size, 1))
    for step in range(steps):
        yield order[step * batch_size:(step + 1) * batch_size]
