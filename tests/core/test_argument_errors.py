"""Every frontend's bad-argument errors on 2 real ranks, against Horovod's types: the table is
tests/support/argument_errors.py; this job runs numpy, torch, TensorFlow, Keras and JAX together."""

import pytest

from argument_errors import MAIN, check, snippet
from multirank import hvdrun


def test_main_frontends_raise_horovods_types_with_clear_messages_on_every_rank():
    for module in ("torch", "tensorflow", "jax", "optax"):
        pytest.importorskip(module)
    result = hvdrun(snippet(MAIN), np=2, timeout=240).check()
    for rank in (0, 1):
        problems = check(result.ranks[rank]["results"], MAIN)
        assert not problems, f"rank {rank}:\n" + "\n".join(problems)
