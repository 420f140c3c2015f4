"""The chart ships the operator's generated CRDs unchanged, and they are valid Kubernetes objects."""

import kubernetes_validate
import pytest
import yaml
from chartlib import CHART_CRDS_DIR, KUBE_VERSIONS, TOP_CRDS_DIR, crd_files

EXPECTED_CRDS = {"brokers.quiver.io", "consumergroups.quiver.io"}


def generated_crds():
    files = crd_files(TOP_CRDS_DIR)
    if not files:
        pytest.skip("crds/ holds no generated CRDs yet (the operator's crdgen writes them)")
    return files


def crd_documents(files):
    return [doc for text in files.values() for doc in yaml.safe_load_all(text) if doc]


def test_chart_crds_are_identical_copies_of_the_generated_crds():
    top = generated_crds()
    chart = crd_files(CHART_CRDS_DIR)
    assert sorted(chart) == sorted(top), "run: python e2e/chart/sync_generated.py"
    for name, text in top.items():
        assert chart[name] == text, (
            f"charts/quiver-operator/crds/{name} is stale; run: python e2e/chart/sync_generated.py"
        )


def test_both_crds_are_generated_with_status_subresources():
    crds = {doc["metadata"]["name"]: doc for doc in crd_documents(generated_crds())}
    assert set(crds) == EXPECTED_CRDS
    for crd in crds.values():
        assert crd["spec"]["group"] == "quiver.io"
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"]["status"] == {}
        assert version["schema"]["openAPIV3Schema"]["type"] == "object"
    assert crds["brokers.quiver.io"]["spec"]["names"]["kind"] == "Broker"
    assert crds["consumergroups.quiver.io"]["spec"]["names"]["kind"] == "ConsumerGroup"


def test_the_broker_crd_has_a_scale_subresource_with_a_selector():
    crds = {doc["metadata"]["name"]: doc for doc in crd_documents(generated_crds())}
    (version,) = crds["brokers.quiver.io"]["spec"]["versions"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.labelSelector",
    }
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["replicas"]["type"] == "integer"
    assert status["labelSelector"]["type"] == "string"


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_crds_are_valid_kubernetes_objects(kube_version):
    for crd in crd_documents(generated_crds()):
        try:
            kubernetes_validate.validate(crd, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{crd['metadata']['name']}: {path}: {error.message}")
