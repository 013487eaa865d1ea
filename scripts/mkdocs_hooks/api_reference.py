"""MkDocs hook: one API reference page per public module, generated from `API_MODULES`.

A new public module is one line below. Each page is `::: module` for mkdocstrings, which reads the
source statically (griffe): nothing is imported, so a module whose framework is missing from the
environment that builds the site (MXNet, say) is documented all the same. The pages are added to
the site's files and to the navigation entry named `NAV_TITLE` (which mkdocs.yml lists with the
reference's index page only).
"""

from __future__ import annotations

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

NAV_TITLE = "API reference"

# (module, what it is): in the order the reference lists them.
API_MODULES: list[tuple[str, str]] = [
    ("horovod", "`horovod.run` and the version"),
    ("horovod.torch", "PyTorch"),
    ("horovod.torch.elastic", "elastic training with PyTorch"),
    ("horovod.tensorflow", "TensorFlow"),
    ("horovod.tensorflow.elastic", "elastic training with TensorFlow"),
    ("horovod.tensorflow.keras", "Keras on TensorFlow (`tf.keras`)"),
    ("horovod.tensorflow.keras.callbacks", "Keras callbacks (`tf.keras`)"),
    ("horovod.tensorflow.keras.elastic", "elastic Keras (`tf.keras`)"),
    ("horovod.tensorflow.data.compute_service", "training from a tf.data service that a compute job runs"),
    ("horovod.keras", "Keras"),
    ("horovod.keras.callbacks", "Keras callbacks"),
    ("horovod.keras.elastic", "elastic Keras"),
    ("horovod.jax", "JAX"),
    ("horovod.mxnet", "MXNet"),
    ("horovod.numpy", "numpy arrays, no framework"),
    ("horovod.common", "what every framework module shares: lifecycle, topology, process sets, ops"),
    ("horovod.common.exceptions", "the errors a job raises"),
    ("horovod.common.process_sets", "process sets"),
    ("horovod.common.elastic", "elastic state and the retry loop, framework-neutral"),
    ("horovod.data", "data loaders"),
    ("horovod.runner", "`horovod.runner.run`: functions on several ranks from Python"),
    ("horovod.spark", "`horovod.spark.run` and `run_elastic`"),
    ("horovod.spark.torch", "the PyTorch estimator"),
    ("horovod.spark.keras", "the Keras estimator"),
    ("horovod.spark.lightning", "the Lightning estimator"),
    ("horovod.spark.common.store", "stores: where estimators keep data and checkpoints"),
    ("horovod.spark.common.backend", "backends: how estimators start their workers"),
    ("horovod.ray", "Ray: `RayExecutor`, `ElasticRayExecutor`"),
    ("horovod.ray.tune", "Ray Tune"),
]


def page_path(module: str) -> str:
    return f"api/{module}.md"


def _index() -> str:
    rows = "\n".join(f"| [`{module}`]({module}.md) | {what} |" for module, what in API_MODULES)
    return ("# API reference\n\nGenerated from the docstrings of each public module. Every framework "
            "module re-exports the names of `horovod.common` (`init`, `rank`, `size`, the process sets, "
            "the op constants), so `hvd.rank()` is on each framework's page.\n\n"
            f"| module | what |\n|---|---|\n{rows}\n")


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Fill the reference's navigation section with one entry per module."""
    for entry in config.nav or []:
        if isinstance(entry, dict) and NAV_TITLE in entry:
            entry[NAV_TITLE] = ["api/index.md", *({module: page_path(module)} for module, _ in API_MODULES)]
            return config
    raise ValueError(f"mkdocs.yml's nav has no {NAV_TITLE!r} section for the generated API pages")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "api/index.md", content=_index()))
    for module, what in API_MODULES:
        files.append(File.generated(config, page_path(module), content=f"# `{module}`\n\n{what}.\n\n::: {module}\n"))
    return files
