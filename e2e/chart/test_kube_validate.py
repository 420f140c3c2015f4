"""Every rendered manifest against the Kubernetes OpenAPI schemas (kubernetes-validate, strict) at
the oldest and newest supported versions; prometheus-operator kinds against their CRD schemas."""

import jsonschema
import kubernetes_validate
import pytest
from chartlib import ALL_FEATURES_VALUES, KUBE_VERSIONS, load_values, manifests, strict_monitoring_schema

MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")

VALUE_SETS = {
    "defaults": None,
    "all-features": load_values(ALL_FEATURES_VALUES),
    "namespaced-no-leader-election": {"watchNamespace": "messaging", "leaderElection": {"enabled": False}},
    "cluster-wide-monitoring": {
        "metrics": {"serviceMonitor": {"enabled": True}, "brokerPodMonitor": {"enabled": True}},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True},
    },
}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("values_name", sorted(VALUE_SETS))
def test_rendered_manifests_are_valid_kubernetes_objects(values_name, kube_version):
    objects = manifests(VALUE_SETS[values_name])
    checked = 0
    for obj in objects:
        if obj["kind"] in MONITORING_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {error.message}")
        checked += 1
    assert checked >= 5  # at least Deployment, ServiceAccount, Service and RBAC


@pytest.mark.parametrize("kind", MONITORING_KINDS)
def test_prometheus_operator_objects_match_their_crd_schemas(kind):
    schema = strict_monitoring_schema(kind)
    (obj,) = [o for o in manifests(load_values(ALL_FEATURES_VALUES)) if o["kind"] == kind]
    jsonschema.validate(obj, schema)


def test_monitoring_schema_rejects_unknown_fields():
    schema = strict_monitoring_schema("PodMonitor")
    (obj,) = [o for o in manifests(load_values(ALL_FEATURES_VALUES)) if o["kind"] == "PodMonitor"]
    obj["spec"]["podMetricsEndpoints"][0]["scrapeEvery"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="scrapeEvery"):
        jsonschema.validate(obj, schema)


def test_kubernetes_validate_rejects_an_invalid_deployment():
    (deployment,) = [o for o in manifests() if o["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
