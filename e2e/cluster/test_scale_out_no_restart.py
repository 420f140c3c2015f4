"""Scaling a Broker restarts none of the brokers that stay: 2 -> 3 starts the third pod and leaves
the first two running (same pod uids, same pod template hash), and they learn the new broker from
their config file (the ConfigMap the kubelet refreshes, re-read by the broker), so every broker's
route lists all three; 3 -> 2 drains and removes only the third pod, and the routes drop it."""

from kube import get, holds_for, list_objects, wait_for
from scenario import (broker_manifest, describe_broker, pod_selector, scale_broker,
                      wait_broker_ready)

TEMPLATE_HASH = "quiver.io/template-hash"
# The kubelet refreshes a mounted ConfigMap within its sync period plus its cache TTL (about a
# minute each by default); the broker looks at its file every 2 s and polls peers every 2 s.
PEERS_S = 240


def pod_uids(namespace, broker):
    pods = list_objects(namespace, "pod", pod_selector(broker))
    return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}


def template_hash(namespace, broker):
    sts = get(namespace, "statefulset", broker)
    return ((sts["spec"]["template"].get("metadata") or {}).get("annotations") or {}).get(
        TEMPLATE_HASH)


def wait_routes(namespace, cli, broker, replicas):
    """Waits until the route of `events` names exactly the first `replicas` brokers, then checks
    it keeps doing so for a while: the client Service spreads the lookups over every broker, so
    each broker answers some of them."""
    expected = [f"{broker}-{ordinal}" for ordinal in range(replicas)]
    cli.wait_route(broker, "events", replicas, timeout_s=PEERS_S)
    holds_for(f"every broker's route of events on {expected}",
              lambda: cli.route_brokers(broker, "events") == expected, 30,
              state=lambda: cli.route_brokers(broker, "events"))


def test_scaling_out_and_in_restarts_no_staying_broker(namespace, brokers, cli):
    broker = "scale-steady"
    brokers(broker_manifest(broker, 2))
    wait_broker_ready(namespace, broker, 2)
    staying = pod_uids(namespace, broker)
    assert sorted(staying) == [f"{broker}-0", f"{broker}-1"], staying
    hash_before = template_hash(namespace, broker)
    assert hash_before, "no template hash on the StatefulSet"
    wait_routes(namespace, cli, broker, 2)

    scale_broker(namespace, broker, 3)
    wait_broker_ready(namespace, broker, 3)
    uids = pod_uids(namespace, broker)
    assert {name: uids.get(name) for name in staying} == staying, (
        f"a staying broker restarted: {uids}\n{describe_broker(namespace, broker)}")
    assert f"{broker}-2" in uids, uids
    assert template_hash(namespace, broker) == hash_before
    wait_routes(namespace, cli, broker, 3)

    # Nothing was stored on the leaving broker: the drain ends at once.
    scale_broker(namespace, broker, 2)
    wait_broker_ready(namespace, broker, 2)
    wait_for(f"{broker}-2 gone", lambda: f"{broker}-2" not in pod_uids(namespace, broker), 120,
             state=lambda: pod_uids(namespace, broker))
    assert pod_uids(namespace, broker) == staying, describe_broker(namespace, broker)
    assert template_hash(namespace, broker) == hash_before
    wait_routes(namespace, cli, broker, 2)
