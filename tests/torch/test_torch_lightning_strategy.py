"""The Lightning strategy that the Spark estimators give their Trainer, on 2 real CPU ranks without
Spark: rank 0's weights broadcast, gradients averaged, and `self.log(..., sync_dist=True)` giving
every rank the same value (Lightning ignores `sync_dist` unless the strategy says it is
distributed). tests/torch/test_torch_cuda.py runs the same job on a GPU."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")

import lightning_job  # noqa: E402
from multirank import hvdrun  # noqa: E402

ON_THE_CPU = r'''
import torch
import horovod.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
dev = torch.device("cpu")


def routes():
    return {}
''' + lightning_job.fit("cpu")


def test_the_lightning_strategy_trains_and_syncs_logged_values():
    result = hvdrun(ON_THE_CPU, np=2, timeout=180).check()
    lightning_job.check(result, "cpu", {})
