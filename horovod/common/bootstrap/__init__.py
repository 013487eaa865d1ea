"""Bootstraps: who this process is in the job, which store it meets in, which round (see `base`)."""

from horovod.common.bootstrap.base import Bootstrap, Membership
from horovod.common.bootstrap.registry import create, join

__all__ = ["Bootstrap", "Membership", "create", "join"]
