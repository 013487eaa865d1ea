"""The Spark examples of docs/spark.md, run (shortened) on the tests' Spark session."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import pytest

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "spark"


def _load(filename: str):
    """The example as a module whose functions travel to the workers by value (as from a script)."""
    spec = importlib.util.spec_from_file_location(f"spark_example_{Path(filename).stem}", EXAMPLES / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def test_spark_run_example(spark, capsys):
    pytest.importorskip("torch")
    results = _load("spark_run.py").main(spark, num_proc=2, steps=60)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(abs(r["weight"] - 3.0) < 0.05 and abs(r["bias"] + 1.0) < 0.05 for r in results)
    assert "[1]<stdout>:rank 1 of 2 (local rank 1)" in capsys.readouterr().out


def test_torch_estimator_example(spark, tmp_path):
    pytest.importorskip("torch")
    assert _load("torch_estimator.py").main(spark, num_proc=2, store_path=str(tmp_path), epochs=4) < 0.2


def test_keras_estimator_example(spark, tmp_path):
    pytest.importorskip("keras")
    assert _load("keras_estimator.py").main(spark, num_proc=2, store_path=str(tmp_path), epochs=4) > 0.9


def test_lightning_estimator_example(spark, tmp_path, capsys):
    pytest.importorskip("lightning")
    assert _load("lightning_estimator.py").main(spark, num_proc=2, store_path=str(tmp_path), epochs=4) > 0.9
    out = capsys.readouterr().out
    assert "[0]<stdout>:epoch 3 ended: val_loss=" in out and "checkpoint.ckpt" in out
