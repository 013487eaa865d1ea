"""Every manifest of examples/kubernetes validates offline, and a broken one does not."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from tests.kubernetes.manifests import EXAMPLES, documents, resource, validate

MANIFESTS = sorted(path.name for path in EXAMPLES.glob("*.yaml"))


def test_the_examples_are_all_here():
    assert MANIFESTS == ["elastic-mpijob.yaml", "indexed-job.yaml", "mpijob.yaml", "pytorchjob.yaml"]


@pytest.mark.parametrize("name", MANIFESTS)
def test_every_resource_validates(name):
    for doc in documents(name):
        validate(doc)


def _errors():
    kv = pytest.importorskip("kubernetes_validate")
    return (jsonschema.ValidationError, kv.ValidationError)


@pytest.mark.parametrize("name, kind, path, value", [
    ("mpijob.yaml", "MPIJob", ("spec", "slotsPerWorkers"), 1),  # a typo of slotsPerWorker
    ("mpijob.yaml", "MPIJob", ("spec", "mpiReplicaSpecs", "Workers"), {}),  # a replica type that is not one
    ("mpijob.yaml", "MPIJob", ("spec", "mpiImplementation"), "LAM"),
    ("pytorchjob.yaml", "PyTorchJob", ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0,
                                       "name"), "trainer"),  # the operator only runs a container named pytorch
    ("pytorchjob.yaml", "PyTorchJob", ("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0,
                                       "imagePullPolicy"), 3),  # inside the pod template: Kubernetes' own schema
    ("indexed-job.yaml", "Job", ("spec", "completionMode"), ["Indexed"]),
])
def test_a_broken_manifest_fails(name, kind, path, value):
    doc = copy.deepcopy(resource(name, kind))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(_errors()):
        validate(doc)
