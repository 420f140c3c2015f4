"""Every pod the chart renders meets the Kubernetes "restricted" Pod Security profile, so the
chart installs into a namespace labelled pod-security.kubernetes.io/enforce: restricted. The
broker pods the operator makes are checked by operator/src/desired.rs's tests."""

import pytest
from chartlib import ALL_FEATURES_VALUES, load_values, manifests

VALUE_SETS = {
    "defaults": None,
    "all-features": load_values(ALL_FEATURES_VALUES),
    "namespaced-no-leader-election": {"watchNamespace": "messaging", "leaderElection": {"enabled": False}},
}
# The volume types the restricted profile allows.
ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}


def pod_specs(objects):
    """(kind/name, pod spec) of every workload."""
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", spec["template"]["spec"]
        elif obj["kind"] == "CronJob":
            yield f"CronJob/{obj['metadata']['name']}", spec["jobTemplate"]["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield f"Pod/{obj['metadata']['name']}", spec


def restricted_violations(pod):
    """What in `pod` the restricted profile (Pod Security Standards, v1.29+) forbids."""
    found = []
    pod_context = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(field)
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    containers = (pod.get("initContainers") or []) + pod["containers"] + (pod.get("ephemeralContainers") or [])
    for container in containers:
        context = container.get("securityContext") or {}
        name = container["name"]
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities must drop ALL")
        if not set(capabilities.get("add") or []) <= {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {capabilities['add']}")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            found.append(f"{name}: runAsNonRoot must be true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile")) or {}
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            found.append(f"{name}: hostPort")
        if context.get("readOnlyRootFilesystem") is not True:
            # Not required by the profile, but what this chart promises.
            found.append(f"{name}: readOnlyRootFilesystem must be true")
    return found


@pytest.mark.parametrize("values_name", sorted(VALUE_SETS))
def test_every_rendered_pod_meets_the_restricted_profile(values_name):
    specs = list(pod_specs(manifests(VALUE_SETS[values_name])))
    assert specs, "the chart renders at least the operator Deployment"
    for name, pod in specs:
        assert restricted_violations(pod) == [], name


def test_the_check_catches_a_weakened_pod():
    values = {"securityContext": {"allowPrivilegeEscalation": True}, "podSecurityContext": {"seccompProfile": None}}
    ((_, pod),) = [spec for spec in pod_specs(manifests(values)) if spec[0].startswith("Deployment/")]
    violations = restricted_violations(pod)
    assert any("allowPrivilegeEscalation" in v for v in violations), violations
    assert any("seccompProfile" in v for v in violations), violations
