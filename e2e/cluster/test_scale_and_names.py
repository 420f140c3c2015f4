"""`kubectl scale broker` through the Broker's scale subresource, and Broker names.

The scale subresource reads and writes spec.replicas (the operator scales as for any edit) and
reports the Broker's replicas and its pods' selector, what an HPA or KEDA use; a Broker name over
51 characters is refused by the CRD's CEL rule with the limit and why, one of 51 runs."""

import json

import pytest

from kube import apply, kubectl, list_objects, run
from scenario import broker_manifest, pod_selector, wait_broker_ready

MAX_NAME = 51


def scale_of(namespace, name):
    """The Broker's autoscaling/v1 Scale."""
    path = f"/apis/quiver.io/v1alpha1/namespaces/{namespace}/brokers/{name}/scale"
    return json.loads(run("kubectl", "get", "--raw", path))


def selector_labels(selector):
    return set(selector.split(","))


def test_kubectl_scale_scales_the_broker_through_its_scale_subresource(namespace, brokers):
    name = "scaled"
    brokers(broker_manifest(name, 1))
    wait_broker_ready(namespace, name, 1)
    scale = scale_of(namespace, name)
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (1, 1), scale
    assert selector_labels(scale["status"]["selector"]) == selector_labels(pod_selector(name))

    kubectl(namespace, "scale", "broker", name, "--replicas", "2")
    wait_broker_ready(namespace, name, 2)
    scale = scale_of(namespace, name)
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, 2), scale
    selected = list_objects(namespace, "pod", scale["status"]["selector"])
    assert sorted(pod["metadata"]["name"] for pod in selected) == [f"{name}-0", f"{name}-1"]

    with pytest.raises(AssertionError) as refused:
        kubectl(namespace, "scale", "broker", name, "--replicas", "0")
    assert "replicas must be at least 1" in str(refused.value)

    # Nothing was stored on the leaving broker: the drain ends at once.
    kubectl(namespace, "scale", "broker", name, "--replicas", "1")
    wait_broker_ready(namespace, name, 1)
    scale = scale_of(namespace, name)
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (1, 1), scale


def test_a_name_over_the_limit_is_refused_and_one_at_it_runs(namespace, brokers):
    over = "n" * (MAX_NAME + 1)
    with pytest.raises(AssertionError) as refused:
        apply(namespace, broker_manifest(over, 1))
    assert "metadata.name must be at most 51 characters" in str(refused.value)
    assert "controller-revision-hash" in str(refused.value)

    at = "n" * MAX_NAME
    brokers(broker_manifest(at, 1))
    wait_broker_ready(namespace, at, 1)
    pods = list_objects(namespace, "pod", pod_selector(at))
    assert [pod["metadata"]["name"] for pod in pods] == [f"{at}-0"]
