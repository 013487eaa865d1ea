"""Data loader bases of Horovod's `horovod.data`: `BaseDataLoader` and `AsyncDataLoaderMixin`."""

from horovod.data.data_loader_base import AsyncDataLoaderMixin, BaseDataLoader

__all__ = ["AsyncDataLoaderMixin", "BaseDataLoader"]
