"""After every broker pod is deleted (a full outage), the pods come back together: the
StatefulSet's pod management is Parallel, so a new pod does not wait for the one before it to
be Ready (under OrderedReady no two new pods are ever starting at once)."""

import time

from kube import describe_pods, get, kubectl, list_objects, pod_is_ready
from scenario import broker_manifest, pod_selector, wait_broker_ready

BROKER = "outage"
REPLICAS = 3
RECOVERY_S = 420


def test_after_a_full_outage_every_broker_starts_at_once(namespace, brokers):
    brokers(broker_manifest(BROKER, REPLICAS))
    wait_broker_ready(namespace, BROKER, REPLICAS)
    sts = get(namespace, "statefulset", BROKER)
    assert sts["spec"]["podManagementPolicy"] == "Parallel", sts["spec"]
    before = {pod["metadata"]["uid"] for pod in list_objects(namespace, "pods", pod_selector(BROKER))}
    assert len(before) == REPLICAS, before

    kubectl(namespace, "delete", "pods", "-l", pod_selector(BROKER), "--wait=false")
    starting_at_once = 0
    deadline = time.monotonic() + RECOVERY_S
    while True:
        pods = list_objects(namespace, "pods", pod_selector(BROKER))
        new = [pod for pod in pods if pod["metadata"]["uid"] not in before]
        starting_at_once = max(starting_at_once, sum(not pod_is_ready(pod) for pod in new))
        if len(new) == REPLICAS and all(pod_is_ready(pod) for pod in new):
            break
        assert time.monotonic() < deadline, (
            f"not every broker back after {RECOVERY_S}s\n{describe_pods(namespace, pod_selector(BROKER))}")
        time.sleep(0.5)
    assert starting_at_once >= 2, (
        f"at most {starting_at_once} new pod starting at once: created one after another")
    wait_broker_ready(namespace, BROKER, REPLICAS)
