"""`horovodrun --config-file FILE`: tuning settings kept in YAML instead of on the command line.

The file only fills in argparse attributes; a flag given explicitly on the command line always
wins over the file, so a team can share one file and still override a knob for a single run.
Keys and sections are Horovod's; an unknown key is reported, not silently dropped.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

import yaml

log = logging.getLogger("horovod.runner")


def _identity(value: Any) -> Any:
    return value


def _negate(value: Any) -> Any:
    return not value


# (section, key) -> (argparse dest, expected YAML types, how the value maps onto the dest)
_KEYS: dict[tuple[str, str], tuple[str, tuple[type, ...], Callable[[Any], Any]]] = {}


def _section(section: str, types: dict[str, tuple[type, ...]], dests: dict[str, str] | None = None,
             negated: Iterable[str] = ()) -> None:
    for key, accepted in types.items():
        dest = (dests or {}).get(key, key)
        _KEYS[(section, key)] = (dest, accepted, _negate if key in negated else _identity)


_INT, _NUM, _BOOL, _STR = (int,), (int, float), (bool,), (str,)

_section("params", {
    "fusion_threshold_mb": _INT, "cycle_time_ms": _NUM, "cache_capacity": _INT,
    "hierarchical_allreduce": _BOOL, "hierarchical_allgather": _BOOL, "torus_allreduce": _BOOL,
})
_section(
    "autotune",
    {"enabled": _BOOL, "log_file": _STR, "warmup_samples": _INT, "steps_per_sample": _INT,
     "bayes_opt_max_samples": _INT, "gaussian_process_noise": _NUM},
    dests={"enabled": "autotune", "log_file": "autotune_log_file",
           "warmup_samples": "autotune_warmup_samples",
           "steps_per_sample": "autotune_steps_per_sample",
           "bayes_opt_max_samples": "autotune_bayes_opt_max_samples",
           "gaussian_process_noise": "autotune_gaussian_process_noise"},
)
_section("timeline", {"filename": _STR, "mark_cycles": _BOOL},
         dests={"filename": "timeline_filename", "mark_cycles": "timeline_mark_cycles"})
_section(
    "stall_check",
    {"enabled": _BOOL, "warning_time_seconds": _NUM, "shutdown_time_seconds": _NUM},
    dests={"enabled": "no_stall_check",
           "warning_time_seconds": "stall_check_warning_time_seconds",
           "shutdown_time_seconds": "stall_check_shutdown_time_seconds"},
    negated=("enabled",),
)
_section("library_options", {
    "mpi_threads_disable": _BOOL, "num_nccl_streams": _INT, "thread_affinity": (int, str),
    "gloo_timeout_seconds": _NUM,
})
_section("logging", {"level": _STR, "with_timestamp": _BOOL},
         dests={"level": "log_level", "with_timestamp": "log_with_timestamp"})

_CONTROLLER_DESTS = frozenset({"use_gloo", "use_mpi"})

#: Every argparse dest the config file can set (the launcher tracks which of them were explicit).
CONFIG_DESTS: frozenset[str] = frozenset(
    {dest for dest, _, _ in _KEYS.values()} | _CONTROLLER_DESTS
)


def key_of(dest: str) -> str | None:
    """The `section.key` of the file that sets argparse `dest`, or None when the file cannot."""
    return next((f"{section}.{key}" for (section, key), (d, _, _) in _KEYS.items() if d == dest), None)


def load(path: str) -> dict[str, Any]:
    """Read the YAML file; an empty file is an empty configuration."""
    with open(path, encoding="utf-8") as f:
        try:
            config = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ValueError(f"--config-file {path}: not valid YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"--config-file {path}: expected a mapping of sections at the top level")
    return config


def config_values(config: Mapping[str, Any], source: str = "config file") -> dict[str, Any]:
    """Translate the YAML mapping into {argparse dest: value}, checking every value's type."""
    values: dict[str, Any] = {}
    for section, body in config.items():
        if section == "controller":
            if body not in ("gloo", "mpi"):
                raise ValueError(f"{source}: controller must be 'gloo' or 'mpi', got {body!r}")
            values["use_gloo"] = body == "gloo"
            values["use_mpi"] = body == "mpi"
            continue
        if not isinstance(body, dict):
            log.warning("%s: ignoring unknown top-level entry %r", source, section)
            continue
        for key, value in body.items():
            entry = _KEYS.get((section, key))
            if entry is None:
                log.warning("%s: ignoring unknown key %s.%s", source, section, key)
                continue
            dest, accepted, convert = entry
            if value is None:
                continue
            # YAML booleans are ints to Python; keep `true` out of numeric settings.
            if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
                names = " or ".join(t.__name__ for t in accepted)
                raise ValueError(f"{source}: {section}.{key} must be {names}, got {value!r}")
            values[dest] = convert(value)
    return values


def apply(args: Any, config: Mapping[str, Any], explicit: Iterable[str], source: str = "config file") -> None:
    """Set the file's values on `args`, except for dests the user gave explicitly on the CLI."""
    keep = set(explicit)
    if keep & _CONTROLLER_DESTS:  # --gloo or --mpi on the CLI decides the controller outright
        keep |= _CONTROLLER_DESTS
    for dest, value in config_values(config, source).items():
        if dest not in keep:
            setattr(args, dest, value)
