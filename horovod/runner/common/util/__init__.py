"""Horovod's `horovod.runner.common.util` package: the helpers scripts import from it (`env`)."""
