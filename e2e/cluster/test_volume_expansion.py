"""Volume expansion: a larger spec.storage.size resizes the claims when their StorageClass allows
expansion; when it does not, the operator says so (VolumeExpansion=False,
StorageClassForbidsExpansion, a Warning event) instead of failing on the claim patch.

The refusing class is a copy of the cluster's default class (same provisioner and parameters)
with allowVolumeExpansion: false, created for this test and removed after it."""

import json
import uuid

import pytest

from kube import (condition_details, get, has_condition, holds_for, merge_patch, quantity_bytes,
                  run, wait_for_event, wait_for_object)
from scenario import STEP_S, broker_manifest, status, wait_broker_ready

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
RESIZE_S = 420


def storage_classes():
    return json.loads(run("kubectl", "get", "storageclass", "-o", "json"))["items"]


def default_class():
    for sc in storage_classes():
        if (sc["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true":
            return sc
    return None


def expandable_class():
    """The default class if it allows expansion, else any class that does, else None."""
    default = default_class()
    if default is not None and default.get("allowVolumeExpansion"):
        return default
    return next((sc for sc in storage_classes() if sc.get("allowVolumeExpansion")), None)


@pytest.fixture
def refusing_class():
    """A copy of the default StorageClass that forbids expansion; deleted after the test (ask
    for it before `brokers`, so the class outlives the Broker whose claims use it)."""
    default = default_class()
    if default is None:
        pytest.skip("the cluster has no default StorageClass to copy")
    name = f"quiver-e2e-no-expansion-{uuid.uuid4().hex[:6]}"
    copy = {key: default[key] for key in ("provisioner", "parameters", "reclaimPolicy",
                                          "volumeBindingMode", "mountOptions") if key in default}
    copy.update({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                 "metadata": {"name": name}, "allowVolumeExpansion": False, "reclaimPolicy": "Delete"})
    run("kubectl", "apply", "-f", "-", input_text=json.dumps(copy))
    try:
        yield name
    finally:
        run("kubectl", "delete", "storageclass", name, "--ignore-not-found", check=False)


def claim_request(namespace, claim):
    return get(namespace, "persistentvolumeclaim", claim)["spec"]["resources"]["requests"]["storage"]


def claim_capacity(namespace, claim):
    return ((get(namespace, "persistentvolumeclaim", claim).get("status") or {})
            .get("capacity") or {}).get("storage", "0")


def test_volume_expansion_resizes_the_claims(namespace, brokers):
    sc = expandable_class()
    if sc is None:
        pytest.skip("no StorageClass with allowVolumeExpansion: true (kind's and k3d's "
                    "local-path class cannot expand; install a CSI driver that can)")
    default = default_class()
    is_default = default is not None and default["metadata"]["name"] == sc["metadata"]["name"]
    broker, claim = "expand", "data-expand-0"
    brokers(broker_manifest(broker, 1, size="1Gi",
                            storage_class=None if is_default else sc["metadata"]["name"]))
    wait_broker_ready(namespace, broker, 1)

    merge_patch(namespace, "broker", broker, {"spec": {"storage": {"size": "2Gi"}}})
    wait_for_object(namespace, "persistentvolumeclaim", claim, "requests 2Gi",
                    lambda c: quantity_bytes(c["spec"]["resources"]["requests"]["storage"])
                    >= quantity_bytes("2Gi"), STEP_S)
    wait_for_object(namespace, "persistentvolumeclaim", claim, "capacity of 2Gi",
                    lambda c: quantity_bytes(((c.get("status") or {}).get("capacity") or {})
                                             .get("storage", "0")) >= quantity_bytes("2Gi"),
                    RESIZE_S)
    found = wait_for_object(namespace, "broker", broker, "status.storage with every claim resized",
                            lambda b: status(b).get("storage") == {
                                "requested": "2Gi", "resizedClaims": 1, "totalClaims": 1},
                            STEP_S)
    found = wait_for_object(namespace, "broker", broker, "VolumeExpansion=True VolumesExpanded",
                            lambda b: has_condition(b, "VolumeExpansion", "True", "VolumesExpanded"),
                            STEP_S)
    assert "2Gi" in condition_details(found, "VolumeExpansion").get("message", ""), (
        condition_details(found, "VolumeExpansion"))
    wait_broker_ready(namespace, broker, 1)


def test_volume_expansion_refused_by_the_storage_class(namespace, refusing_class, brokers):
    broker, claim = "noexpand", "data-noexpand-0"
    brokers(broker_manifest(broker, 1, size="1Gi", storage_class=refusing_class))
    wait_broker_ready(namespace, broker, 1)
    requested = claim_request(namespace, claim)

    merge_patch(namespace, "broker", broker, {"spec": {"storage": {"size": "2Gi"}}})
    found = wait_for_object(
        namespace, "broker", broker, "VolumeExpansion=False reason StorageClassForbidsExpansion",
        lambda b: has_condition(b, "VolumeExpansion", "False", "StorageClassForbidsExpansion"),
        STEP_S)
    message = condition_details(found, "VolumeExpansion").get("message", "")
    assert refusing_class in message, f"the condition names the class: {message!r}"
    wait_for_event(namespace, found, "Warning StorageClassForbidsExpansion",
                   lambda e: e["type"] == "Warning"
                   and e["reason"] == "StorageClassForbidsExpansion", 60)
    holds_for("the claim keeping its size (no patch the API server would reject)",
              lambda: claim_request(namespace, claim) == requested, 10,
              state=lambda: f"request {claim_request(namespace, claim)}, "
                            f"capacity {claim_capacity(namespace, claim)}")
    still = get(namespace, "broker", broker)
    assert has_condition(still, "Ready", "True"), f"the brokers keep running: {status(still)}"
