"""Horovod's log format (`[time: LEVEL file:line] msg`) on Python's logging, set by HOROVOD_LOG_*."""

from __future__ import annotations

import logging
import sys

_LEVELS = {
    "trace": 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}
logging.addLevelName(5, "TRACE")

log = logging.getLogger("horovod")


class _HorovodFormatter(logging.Formatter):
    def __init__(self, hide_time: bool) -> None:
        self.hide_time = hide_time
        super().__init__()

    def format(self, record: logging.LogRecord) -> str:
        where = f"{record.levelname} {record.filename}:{record.lineno}"
        if self.hide_time:
            line = f"[{where}] {record.getMessage()}"
        else:
            stamp = self.formatTime(record, "%Y-%m-%d %H:%M:%S") + f".{int(record.msecs * 1000):06d}"
            line = f"[{stamp}: {where}] {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


def configure(level: str, hide_time: bool) -> None:
    """Trace/debug/info go to stdout and warnings or worse to stderr, as Horovod's core does."""
    log.handlers.clear()
    log.setLevel(_LEVELS.get(level, logging.WARNING))
    log.propagate = False
    formatter = _HorovodFormatter(hide_time)
    low = logging.StreamHandler(sys.stdout)
    low.addFilter(_BelowWarning())
    high = logging.StreamHandler(sys.stderr)
    high.setLevel(logging.WARNING)
    for handler in (low, high):
        handler.setFormatter(formatter)
        log.addHandler(handler)
