"""The estimators' data path: a DataFrame becomes Parquet in the store, each rank reads its rows.

On the driver, `prepare_data` keeps the feature and label columns (Spark ML vectors become
arrays), holds out the validation rows (a fraction, or a boolean column), and writes both sets as
Parquet under the store. On the executors `horovod.spark.common.reader` reads each rank's share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from horovod.spark.common.store import FilesystemStore


@dataclass(frozen=True)
class PreparedData:
    """Where a fit's data went, how many rows, each column's shape per row (() for a number) and
    its Spark type as the DataFrame had it (`column_types`: 'dense_vector' / 'sparse_vector' for
    ML vectors, else the type's simpleString, e.g. 'double', 'int'): the model's predictions
    take their label's type."""

    train_path: str
    val_path: str | None
    train_rows: int
    val_rows: int
    shapes: dict[str, tuple[int, ...]]
    column_types: dict[str, str]


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


def _column_types(df: Any, columns: Sequence[str]) -> dict[str, str]:
    """Each column's Spark type (an ML vector is dense or sparse by its first row's value)."""
    from pyspark.ml.linalg import SparseVector, VectorUDT

    types = {field.name: field.dataType for field in df.schema.fields}
    vectors = [col for col in columns if isinstance(types.get(col), VectorUDT)]
    first = df.select(vectors).first() if vectors else None
    return {col: ("sparse_vector" if first is not None and isinstance(first[col], SparseVector) else "dense_vector")
            if col in vectors else types[col].simpleString() for col in columns if col in types}


def prepare_data(df: Any, store: FilesystemStore, run_id: str, columns: Sequence[str],
                 validation: float | str | None, partitions: int, seed: int | None) -> PreparedData:
    """Write `columns` of the training (and validation) rows of `df` as Parquet in `store` for run
    `run_id`."""
    columns = list(dict.fromkeys(columns))
    column_types = _column_types(df, columns)
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
    train.repartition(partitions).write.mode("overwrite").parquet(store.get_full_path(train_path))
    val_path, val_rows = None, 0
    if val is not None:
        val_path = store.get_val_data_path(run_id)
        val.repartition(partitions).write.mode("overwrite").parquet(store.get_full_path(val_path))
        val_rows = store.get_parquet_dataset(val_path).count_rows()
    return PreparedData(train_path, val_path, store.get_parquet_dataset(train_path).count_rows(), val_rows, shapes,
                        column_types)

