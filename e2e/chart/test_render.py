"""What the chart renders: the right objects for each mode, a hardened Deployment, least-privilege
RBAC, monitors that select what they should."""

import json

import pytest
from chartlib import (
    ALL_FEATURES_VALUES,
    DASHBOARD_FILE,
    NAMESPACE,
    by_kind,
    load_values,
    manifests,
    render,
)

# What the operator calls, as operator/src/scenarios/broker_rbac.rs derives it from the requests the
# code makes (that test fails when _rbac.tpl differs): watches Brokers and ConsumerGroups, patches
# ConsumerGroups (finalizer) and both statuses, applies the objects a Broker turns into with
# server-side apply (create when new) and watches their metadata, deletes a NetworkPolicy the spec
# dropped and an older operator's StatefulSet (orphaning its pods) to create it again, expands volume claims, deletes a pod stuck at an outdated revision, records events. Nothing else, no wildcard.
MANAGED_RULES = {
    ("quiver.io", "brokers"): {"get", "list", "watch"},
    ("quiver.io", "consumergroups"): {"get", "list", "watch", "patch"},
    ("quiver.io", "brokers/status"): {"patch"},
    ("quiver.io", "consumergroups/status"): {"patch"},
    ("apps", "statefulsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"list", "watch", "create", "patch"},
    ("", "configmaps"): {"list", "watch", "create", "patch"},
    ("policy", "poddisruptionbudgets"): {"list", "watch", "create", "patch", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "persistentvolumeclaims"): {"get", "patch"},
    # spec.security: the referenced Secrets are read and watched, never written.
    ("", "secrets"): {"get", "list", "watch"},
    ("", "pods"): {"list", "delete"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
# Cluster-scoped, so a ClusterRole in both modes: the StorageClass check before a volume expansion.
CLUSTER_RULES = {("storage.k8s.io", "storageclasses"): {"list"}}
LEADER_ELECTION_RULES = {("coordination.k8s.io", "leases"): {"get", "create", "patch"}}
# Pod labels the operator puts on broker pods (operator/src/desired.rs).
BROKER_POD_LABELS = {"app.kubernetes.io/name": "quiver-broker", "app.kubernetes.io/instance": "any"}


def flatten_rules(rules):
    """(apiGroup, resource) -> verbs; fails on wildcards or resourceNames tricks."""
    table = {}
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in table, f"{group}/{resource} granted twice"
                table[(group, resource)] = set(rule["verbs"])
    return table


def kinds(objects):
    return sorted(o["kind"] for o in objects)


def operator_container(objects):
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_defaults_render_the_cluster_wide_operator_and_nothing_optional():
    objects = manifests()
    assert kinds(objects) == sorted(
        [
            "Deployment",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
        ]
    )
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "quiver-operator"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "quiver"


def test_all_features_render_monitors_rules_dashboard_and_a_namespaced_role():
    objects = manifests(load_values(ALL_FEATURES_VALUES))
    assert kinds(objects) == sorted(
        [
            "Deployment",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceMonitor",
            "PodMonitor",
            "PrometheusRule",
            "ConfigMap",
            "NetworkPolicy",
        ]
    )


def test_deployment_is_hardened_and_passes_the_operator_contract_flags():
    deployment, container = operator_container(manifests())
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["image"] == "ghcr.io/quiver-mq/quiver-operator:0.1.0"
    assert container["args"] == [
        "--http-listen",
        "0.0.0.0:8080",
        "--leader-election",
        "true",
        "--lag-interval-seconds",
        "30",
        "--operator-pod-labels",
        "app.kubernetes.io/instance=quiver,app.kubernetes.io/name=quiver-operator",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["RUST_LOG"]["value"] == "info" and env["QUIVER_LOG_FORMAT"]["value"] == "json"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_namespaced_install_passes_the_namespace_and_pins_the_image_digest():
    _, container = operator_container(manifests(load_values(ALL_FEATURES_VALUES)))
    assert container["args"][-2:] == ["--namespace", "messaging"]
    assert "--lag-interval-seconds" in container["args"]
    assert container["image"].startswith("ghcr.io/quiver-mq/quiver-operator@sha256:")


def test_leader_election_off_drops_its_role_and_flag():
    objects = manifests({"leaderElection": {"enabled": False}})
    _, container = operator_container(objects)
    assert container["args"][2:4] == ["--leader-election", "false"]
    assert by_kind(objects, "Role") == []


def cluster_roles_and_bindings(objects):
    """Each ClusterRole by name, with the ClusterRoleBinding that grants it."""
    roles = {r["metadata"]["name"]: r for r in by_kind(objects, "ClusterRole")}
    bindings = {b["roleRef"]["name"]: b for b in by_kind(objects, "ClusterRoleBinding")}
    assert set(roles) == set(bindings), (roles, bindings)
    return {name: (roles[name], bindings[name]) for name in roles}


def test_cluster_wide_rbac_grants_exactly_what_the_operator_uses():
    objects = manifests()
    granted = cluster_roles_and_bindings(objects)
    assert {name: flatten_rules(role["rules"]) for name, (role, _) in granted.items()} == {
        "quiver-quiver-operator": MANAGED_RULES,
        "quiver-quiver-operator-cluster-reads": CLUSTER_RULES,
    }
    (lease_role,) = by_kind(objects, "Role")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert flatten_rules(lease_role["rules"]) == LEADER_ELECTION_RULES
    (service_account,) = by_kind(objects, "ServiceAccount")
    for name, (_, binding) in granted.items():
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": service_account["metadata"]["name"], "namespace": NAMESPACE}
        ]


def test_namespaced_rbac_uses_roles_and_a_cluster_role_only_for_storage_classes():
    objects = manifests({"watchNamespace": "messaging"})
    granted = cluster_roles_and_bindings(objects)
    assert {name: flatten_rules(role["rules"]) for name, (role, _) in granted.items()} == {
        "quiver-quiver-operator-cluster-reads": CLUSTER_RULES
    }
    roles = {r["metadata"]["name"]: r for r in by_kind(objects, "Role")}
    assert flatten_rules(roles["quiver-quiver-operator"]["rules"]) == MANAGED_RULES
    # With --namespace the operator keeps its Lease in the watched namespace.
    lease_role = roles["quiver-quiver-operator-leader-election"]
    assert flatten_rules(lease_role["rules"]) == LEADER_ELECTION_RULES
    assert {r["metadata"]["namespace"] for r in roles.values()} == {"messaging"}
    for binding in by_kind(objects, "RoleBinding"):
        assert binding["metadata"]["namespace"] == "messaging"
        assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_rbac_off_renders_no_roles():
    objects = manifests({"rbac": {"create": False}})
    assert not [o for o in objects if o["kind"].endswith(("Role", "RoleBinding"))]


def test_metrics_service_selects_the_operator_pod_and_the_service_monitor_selects_the_service():
    objects = manifests(load_values(ALL_FEATURES_VALUES))
    deployment, _ = operator_container(objects)
    (service,) = by_kind(objects, "Service")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 9090, "targetPort": "http", "protocol": "TCP"}]
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    # The operator's group series keep their own namespace label.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "quiver-operator"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_network_policy_admits_only_the_monitoring_namespaces_to_the_operator_http_port():
    objects = manifests(load_values(ALL_FEATURES_VALUES))
    deployment, container = operator_container(objects)
    (policy,) = by_kind(objects, "NetworkPolicy")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert "http" in [port["name"] for port in container["ports"]]
    assert not by_kind(manifests(), "NetworkPolicy"), "off by default"


def test_broker_pod_monitor_selects_the_pods_the_operator_creates():
    objects = manifests(load_values(ALL_FEATURES_VALUES))
    (monitor,) = by_kind(objects, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= BROKER_POD_LABELS.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["messaging"]}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    # job="quiver-broker", the default prometheusRule.brokerJob.
    assert BROKER_POD_LABELS[monitor["spec"]["jobLabel"]] == "quiver-broker"
    cluster_wide = by_kind(manifests({"metrics": {"brokerPodMonitor": {"enabled": True}}}), "PodMonitor")[0]
    assert cluster_wide["spec"]["namespaceSelector"] == {"any": True}
    # Brokers serving HTTP over TLS (spec.security.tls.http) are scraped over HTTPS.
    endpoint = monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "quiver-secure-tls", "key": "ca.crt"}
    plain = cluster_wide["spec"]["podMetricsEndpoints"][0]
    assert plain["scheme"] == "http" and "tlsConfig" not in plain


def test_dashboard_config_map_carries_the_dashboard_json_in_its_namespace():
    objects = manifests(load_values(ALL_FEATURES_VALUES))
    (config_map,) = by_kind(objects, "ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["quiver.json"]) == json.loads(DASHBOARD_FILE.read_text())


def test_prometheus_rule_uses_the_configured_thresholds():
    objects = manifests(load_values(ALL_FEATURES_VALUES))
    (rule,) = by_kind(objects, "PrometheusRule")
    lag = rule["spec"]["groups"][0]["rules"][0]
    assert lag["alert"] == "QuiverConsumerLagHigh"
    assert lag["expr"].endswith("> 5000")
    assert lag["for"] == "5m"
    assert lag["labels"]["severity"] == "critical"


@pytest.mark.parametrize("values", [None, {"watchNamespace": "messaging", "prometheusRule": {"enabled": True}}])
def test_notes_tell_the_user_what_to_do_next(values):
    notes = render(values)["quiver-operator/templates/NOTES.txt"]
    assert "rollout status deployment/quiver-quiver-operator" in notes
    assert "examples/broker-minimal.yaml" in notes
    assert "/metrics" in notes


def test_the_operator_names_its_pod_labels_for_the_brokers_network_policies():
    (deployment,) = by_kind(manifests(), "Deployment")
    pod = deployment["spec"]["template"]
    args = pod["spec"]["containers"][0]["args"]
    value = args[args.index("--operator-pod-labels") + 1]
    labels = dict(pair.split("=", 1) for pair in value.split(","))
    # Exactly the Deployment's selector, which every operator pod carries.
    assert labels == deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= pod["metadata"]["labels"].items()
