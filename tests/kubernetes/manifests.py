"""The manifests of examples/kubernetes, read and checked offline against the published schemas.

Kubernetes' own kinds (Job, Service, ConfigMap, RBAC) are checked by `kubernetes-validate`
(Kubernetes' OpenAPI schemas, strict: unknown fields fail). The operators' kinds (MPIJob,
PyTorchJob) are checked against the schemas in tests/kubernetes/schemas, whose pod templates are
Kubernetes' own PodTemplateSpec from the same package.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "kubernetes"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBERNETES_VERSION = "1.30"
OPERATOR_SCHEMAS = {("kubeflow.org/v2beta1", "MPIJob"): "mpijob-kubeflow.org-v2beta1.json",
                    ("kubeflow.org/v1", "PyTorchJob"): "pytorchjob-kubeflow.org-v1.json"}


def documents(name: str) -> list[dict[str, Any]]:
    """Every resource of examples/kubernetes/<name>."""
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def resource(name: str, kind: str) -> dict[str, Any]:
    return next(doc for doc in documents(name) if doc["kind"] == kind)


@lru_cache(maxsize=None)
def _operator_validator(api_version: str, kind: str) -> Any:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    strict = sorted(p for p in (Path(kv.__file__).parent / "kubernetes-json-schema").iterdir()
                    if p.name.startswith(f"v{KUBERNETES_VERSION}.") and p.name.endswith("-local-strict"))[-1]
    contents = [json.loads((strict / "_definitions.json").read_text())]
    contents += [json.loads(path.read_text()) for path in SCHEMAS.glob("*.json")]
    registry = Registry().with_resources((doc["$id"], Resource.from_contents(doc)) for doc in contents)
    schema = json.loads((SCHEMAS / OPERATOR_SCHEMAS[(api_version, kind)]).read_text())
    return Draft202012Validator(schema, registry=registry)


def validate(doc: dict[str, Any]) -> None:
    """Raise (jsonschema's or kubernetes-validate's ValidationError) when `doc` breaks its schema."""
    key = (doc["apiVersion"], doc["kind"])
    if key in OPERATOR_SCHEMAS:
        _operator_validator(*key).validate(doc)
        return
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (the test extra)")
    kv.validate(doc, KUBERNETES_VERSION, strict=True)
