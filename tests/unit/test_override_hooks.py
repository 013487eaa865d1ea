"""The hooks a subclass must fill in say so by name when they are missing, instead of a bare
NotImplementedError; the autotune stage contract is abstract."""

from __future__ import annotations

import inspect

import pytest

from horovod.common.elastic import State
from horovod.data import BaseDataLoader


def test_state_hooks_name_the_class_and_what_to_define():
    class Half(State):
        pass

    state = Half(bcast_object=lambda obj: obj, get_rank=lambda: 0)
    for hook, what in (("save", "snapshot"), ("restore", "go back"), ("sync", "rank 0")):
        with pytest.raises(NotImplementedError, match=rf"Half must define {hook}\(\).*{what}"):
            getattr(state, hook)()


def test_data_loader_hooks_name_the_class_and_what_to_define():
    class Empty(BaseDataLoader):
        pass

    with pytest.raises(NotImplementedError, match=r"Empty must define __len__\(\)"):
        len(Empty())
    with pytest.raises(NotImplementedError, match=r"Empty must define _iterate\(\)"):
        next(iter(Empty()))


def test_torch_state_handler_sync_names_the_handler():
    pytest.importorskip("torch")
    import torch

    from horovod.torch.elastic.state import StateHandler

    class Partial(StateHandler):
        pass

    with pytest.raises(NotImplementedError, match=r"Partial must define sync\(\)"):
        Partial(torch.nn.Linear(1, 1)).sync()


def test_autotune_stages_must_propose():
    pytest.importorskip("sklearn")
    from horovod.common.engine import autotune

    stages = [cls for _, cls in inspect.getmembers(autotune, inspect.isclass)
              if cls.__module__ == autotune.__name__ and hasattr(cls, "propose")]
    abstract = [cls for cls in stages if inspect.isabstract(cls)]
    assert len(abstract) == 1 and abstract[0].__abstractmethods__ == {"propose"}, stages
    assert all(not inspect.isabstract(cls) for cls in stages if cls not in abstract)
