"""What the scenarios share: Broker and ConsumerGroup manifests, their waits, and the quiver CLI
run in the toolbox pod against one Broker's client Service."""

import json
import os
import re

from kube import (delete, describe_pods, drop_finalizers, get, has_condition, kubectl, list_objects,
                  merge_patch, summary, wait_for, wait_for_object, wait_gone)

API_VERSION = "quiver.io/v1alpha1"
PAUSE_ANNOTATION = "quiver.io/paused"
FORCE_SCALE_DOWN_ANNOTATION = "quiver.io/force-scale-down"

# Bounds of the waits, generous for a laptop cluster pulling nothing (images preloaded).
BROKER_READY_S = 420
STEP_S = 180


def broker_manifest(name, replicas, topics=(("events", 4),), size="1Gi", storage_class=None,
                    volume_policy="Delete", **spec):
    """A Broker running QUIVER_BROKER_IMAGE; `spec` adds or overrides spec fields."""
    storage = {"size": size, "retentionPolicy": volume_policy}
    if storage_class:
        storage["storageClassName"] = storage_class
    body = {
        "replicas": replicas,
        "image": os.environ["QUIVER_BROKER_IMAGE"],
        "storage": storage,
        "topics": [{"name": topic, "queues": queues} for topic, queues in topics],
    }
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "Broker", "metadata": {"name": name}, "spec": body}


def group_manifest(name, broker, topics, **spec):
    body = {"brokerRef": broker, "topics": list(topics)}
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "ConsumerGroup", "metadata": {"name": name},
            "spec": body}


def status(obj):
    return (obj or {}).get("status") or {}


def is_settled(obj):
    """The status describes the current spec."""
    return status(obj).get("observedGeneration") == obj["metadata"].get("generation")


def wait_broker_ready(namespace, name, replicas, timeout_s=BROKER_READY_S):
    """Ready=True with `replicas` Ready brokers, for the current generation; returns the Broker.
    On timeout the error shows the Broker, its StatefulSet and its pods."""
    return wait_for_object(
        namespace, "broker", name, f"Ready with {replicas} ready brokers at the current generation",
        lambda b: has_condition(b, "Ready", "True") and is_settled(b)
        and status(b).get("readyReplicas") == replicas
        and status(b).get("currentReplicas") == replicas,
        timeout_s,
        context=lambda: describe_workload(namespace, name),
    )


def wait_group_ready(namespace, name, timeout_s=STEP_S):
    return wait_for_object(namespace, "consumergroup", name, "Ready at the current generation",
                           lambda g: has_condition(g, "Ready", "True") and is_settled(g), timeout_s)


def statefulset_partition(sts):
    strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
    return (strategy.get("rollingUpdate") or {}).get("partition", 0)


def pod_selector(broker):
    return f"app.kubernetes.io/name=quiver-broker,app.kubernetes.io/instance={broker}"


def pod_names(broker, replicas):
    return [f"{broker}-{ordinal}" for ordinal in range(replicas)]


def scale_broker(namespace, name, replicas):
    merge_patch(namespace, "broker", name, {"spec": {"replicas": replicas}})


def remove_broker(namespace, name, timeout_s=240):
    """Deletes the Broker's ConsumerGroups, then the Broker, and waits until both are gone. A
    group whose finalizer cannot complete (the test broke its broker) is released by removing
    the finalizer, so the namespace can go; that is said on stdout."""
    for group in list_objects(namespace, "consumergroups"):
        if (group.get("spec") or {}).get("brokerRef") != name:
            continue
        group_name = group["metadata"]["name"]
        delete(namespace, "consumergroup", group_name)
        try:
            wait_gone(namespace, "consumergroup", group_name, 90)
        except AssertionError as error:
            print(f"cleanup: releasing the finalizer of ConsumerGroup {group_name}: {error}")
            drop_finalizers(namespace, "consumergroup", group_name)
    delete(namespace, "broker", name)
    wait_gone(namespace, "broker", name, timeout_s)
    # The garbage collector removes the StatefulSet and its pods after the Broker: wait, so the
    # next scenario does not share a small cluster with brokers still stopping.
    wait_for(f"the pods of Broker {name} to be gone",
             lambda: not list_objects(namespace, "pods", pod_selector(name)), timeout_s,
             state=lambda: [p["metadata"]["name"] for p in
                            list_objects(namespace, "pods", pod_selector(name))])


class QuiverCli:
    """The quiver CLI in the toolbox pod, pointed at one Broker's client Service."""

    def __init__(self, namespace):
        self.namespace = namespace

    def __call__(self, broker, *args, timeout=120):
        return kubectl(self.namespace, "exec", "toolbox", "--", "/tmp/quiver",
                       "--server", f"{broker}.{self.namespace}.svc:10911", *args, timeout=timeout)

    def produce(self, broker, topic, count, body="e2e"):
        self(broker, "produce", "-t", topic, "--repeat", str(count), "--quiet", body)

    def consume(self, broker, topic, group, most, idle_s=20):
        """Consumes up to `most` messages as `group` (from the first offset when it has no
        commit) and returns how many arrived; stops after `idle_s` without a message."""
        out = self(broker, "consume", "-t", topic, "-g", group, "--from", "first",
                   "--mode", "count", "--max", str(most), "--idle-timeout-secs", str(idle_s),
                   timeout=180 + idle_s)
        return int(out.strip().split()[-1])

    def lag_rows(self, broker, group, topic=None):
        """Per-queue rows of `quiver lag`: broker, queue_id, broker_offset, consumer_offset."""
        args = ["--output", "json", "lag", "-g", group]
        if topic:
            args += ["-t", topic]
        return json.loads(self(broker, *args))

    def known_groups(self, broker):
        """Groups the brokers report lag rows for (`quiver lag` over every known group)."""
        return sorted({row["group"] for row in json.loads(self(broker, "--output", "json", "lag"))})

    def stored_on(self, broker, topic, broker_name):
        """Messages of `topic` stored on one broker (max offsets, read through a group that never
        commits, so nothing is created)."""
        rows = self.lag_rows(broker, "quiver-e2e-offset-probe", topic)
        return sum(row["broker_offset"] for row in rows if row["broker"] == broker_name)

    def route_brokers(self, broker, topic):
        route = json.loads(self(broker, "--output", "json", "topics", "route", topic))
        return sorted(route.get("brokers") or {})

    def wait_route(self, broker, topic, replicas, timeout_s=120):
        """Waits until the topic's route names every broker (routes spread between peers)."""
        expected = [f"{broker}-{ordinal}" for ordinal in range(replicas)]
        wait_for(f"route of {topic} on {expected}",
                 lambda: self.route_brokers(broker, topic) == expected, timeout_s,
                 state=lambda: self.route_brokers(broker, topic))


def describe_broker(namespace, name):
    """Broker status, StatefulSet and pods, for failure messages."""
    return f"Broker: {summary(get(namespace, 'broker', name))}\n{describe_workload(namespace, name)}"


def describe_workload(namespace, name):
    """The Broker's StatefulSet (replicas, partition, status) and pods, for failure messages."""
    sts = get(namespace, "statefulset", name) or {}
    return (f"StatefulSet: replicas={(sts.get('spec') or {}).get('replicas')} "
            f"partition={statefulset_partition(sts) if sts else None} status={sts.get('status')}\n"
            f"pods:\n{describe_pods(namespace, pod_selector(name))}")


def operator_metrics(namespace, operator):
    """The operator's /metrics text, through the API server's service proxy."""
    return kubectl(namespace, "get", "--raw",
                   f"/api/v1/namespaces/{namespace}/services/{operator}-metrics:http/proxy/metrics")


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_samples(text, name, **labels):
    """Values of the samples of metric `name` whose labels include `labels`, in any order."""
    values = []
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if not found or found.group(1) != name:
            continue
        sample_labels = dict(_LABEL.findall(found.group(2) or ""))
        if all(sample_labels.get(key) == str(value) for key, value in labels.items()):
            values.append(float(found.group(3)))
    return values
