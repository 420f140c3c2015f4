"""Rollout: a pod template change replaces the brokers one at a time from the highest ordinal.

A `kubectl get pods --watch` records every pod change, so "never two brokers not Ready at once"
is judged on every transition, not on samples; the StatefulSet partition and status.rollout are
polled while the rollout runs."""

import json
import time

from kube import PodWatch, get, has_condition, merge_patch, wait_for_object
from scenario import (STEP_S, broker_manifest, describe_broker, is_settled, pod_names,
                      pod_selector, statefulset_partition, status, wait_broker_ready)

BROKER = "roll"
REPLICAS = 3
ROLLOUT_S = 600
# The pod template field changed: the default grace is 60 s, so any other value is a new template.
NEW_GRACE_S = 45


def sample_rollout(namespace):
    """One poll: StatefulSet partition and revisions, and the Broker's status.rollout."""
    sts = get(namespace, "statefulset", BROKER)
    broker = get(namespace, "broker", BROKER)
    sts_status = sts.get("status") or {}
    return {
        "partition": statefulset_partition(sts),
        "updateRevision": sts_status.get("updateRevision"),
        "currentRevision": sts_status.get("currentRevision"),
        "updatedReplicas": sts_status.get("updatedReplicas"),
        "rollout": status(broker).get("rollout"),
        "settled": has_condition(broker, "Ready", "True") and is_settled(broker)
        and not status(broker).get("rollout")
        and sts_status.get("updateRevision") == sts_status.get("currentRevision")
        and sts_status.get("updatedReplicas") == REPLICAS,
    }


def test_rollout_replaces_one_broker_at_a_time_from_the_highest_ordinal(namespace, brokers):
    brokers(broker_manifest(BROKER, REPLICAS))
    wait_broker_ready(namespace, BROKER, REPLICAS)
    names = pod_names(BROKER, REPLICAS)
    before = get(namespace, "statefulset", BROKER)
    old_revision = before["status"]["currentRevision"]

    with PodWatch(namespace, pod_selector(BROKER)) as watch:
        since = watch.wait_all_ready(names, 60)
        merge_patch(namespace, "broker", BROKER,
                    {"spec": {"podTemplate": {"terminationGracePeriodSeconds": NEW_GRACE_S}}})
        samples = []
        deadline = time.monotonic() + ROLLOUT_S
        while True:
            samples.append(sample_rollout(namespace))
            if samples[-1]["settled"] and samples[-1]["updateRevision"] != old_revision:
                break
            assert time.monotonic() < deadline, (
                f"rollout not finished after {ROLLOUT_S}s; last samples "
                f"{json.dumps(samples[-3:], indent=1)}\n{describe_broker(namespace, BROKER)}")
            time.sleep(1)
        worst, when = watch.max_not_ready(names, since)
        order = watch.first_seen_on_other_revision(old_revision)

    assert worst <= 1, f"{worst} brokers not Ready at once (t={when[0]}s: {when[1]})"
    rolling = [s for s in samples if s["updateRevision"] != old_revision]
    partitions = [s["partition"] for s in rolling]
    stepped = [p for i, p in enumerate(partitions) if i == 0 or p != partitions[i - 1]]
    assert stepped == sorted(stepped, reverse=True) and stepped[-1] == 0, (
        f"the partition only steps down to 0: {stepped}")
    assert REPLICAS - 1 in stepped, f"the rollout starts at the highest ordinal: {stepped}"
    assert order == names[::-1], f"pods replaced from the highest ordinal: {order}"
    progress = [s["rollout"] for s in samples if s["rollout"]]
    assert progress, f"status.rollout shown while rolling: {json.dumps(samples, indent=1)}"
    assert all({"partition", "updatedReplicas"} <= set(p) for p in progress), progress
    assert [p["partition"] for p in progress] == sorted((p["partition"] for p in progress),
                                                        reverse=True), progress

    broker = wait_for_object(namespace, "broker", BROKER, "Ready at the new generation",
                             lambda b: has_condition(b, "Ready", "True") and is_settled(b), STEP_S)
    assert has_condition(broker, "Progressing", "False"), json.dumps(broker["status"])
    assert "rollout" not in broker["status"], json.dumps(broker["status"])
    sts = get(namespace, "statefulset", BROKER)
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == NEW_GRACE_S, f"the StatefulSet runs the new template: grace {grace}"
