"""A rollout stuck on an image that cannot run, then fixed by editing the CR alone.

The new image is the broker image's repository with a tag that does not exist, so the updated
pod (the highest ordinal) never becomes Ready. Past spec.progressDeadlineSeconds the Broker
shows Degraded=True (ProgressDeadlineExceeded) and a Warning event. Setting the good image back
must be enough: the operator deletes the stuck pod of the outdated revision itself, with a
StuckPodDeleted Warning event (the StatefulSet controller would wait for it forever,
kubernetes/kubernetes#67250); this test never deletes a pod.

Setting the previous image back is the fix people make, and it is the hard case: the template
returns to the StatefulSet's current revision, so updateRevision == currentRevision while the
stuck pod still runs the bad revision."""

import os
import time
import uuid

from kube import (condition_details, get, has_condition, merge_patch, split_image,
                  wait_for_event, wait_for_object)
from scenario import (BROKER_READY_S, broker_manifest, describe_workload, is_settled, status,
                      wait_broker_ready)

BROKER = "stuck"
REPLICAS = 2
DEADLINE_S = 60
# The deadline, a reconcile period (10 s) and the time to pull-fail the image.
DEGRADED_WITHIN_S = DEADLINE_S + 120


def bad_image():
    repository, _ = split_image(os.environ["QUIVER_BROKER_IMAGE"])
    return f"{repository}:quiver-e2e-no-such-tag-{uuid.uuid4().hex[:6]}"


def pod(namespace, ordinal):
    return get(namespace, "pod", f"{BROKER}-{ordinal}")


def test_stuck_rollout_is_reported_and_fixed_by_editing_the_broker(namespace, brokers):
    good_image = os.environ["QUIVER_BROKER_IMAGE"]
    brokers(broker_manifest(BROKER, REPLICAS, progressDeadlineSeconds=DEADLINE_S))
    wait_broker_ready(namespace, BROKER, REPLICAS)
    first_pod_uid = pod(namespace, 0)["metadata"]["uid"]

    image = bad_image()
    changed_at = time.monotonic()
    merge_patch(namespace, "broker", BROKER, {"spec": {"image": image}})
    broker = wait_for_object(
        namespace, "broker", BROKER, "Degraded=True reason ProgressDeadlineExceeded",
        lambda b: has_condition(b, "Degraded", "True", "ProgressDeadlineExceeded"),
        DEGRADED_WITHIN_S, context=lambda: describe_workload(namespace, BROKER))
    waited = time.monotonic() - changed_at
    assert waited >= DEADLINE_S - 5, (
        f"Degraded after {waited:.0f}s, before the {DEADLINE_S}s deadline: "
        f"{condition_details(broker, 'Degraded')}")
    wait_for_event(namespace, broker, "Warning ProgressDeadlineExceeded",
                   lambda e: e["type"] == "Warning" and e["reason"] == "ProgressDeadlineExceeded",
                   60)
    stuck = pod(namespace, REPLICAS - 1)
    stuck_images = [c["image"] for c in stuck["spec"]["containers"]]
    assert stuck_images == [image], f"the highest ordinal was updated first: {stuck_images}"
    kept = pod(namespace, 0)
    assert kept["metadata"]["uid"] == first_pod_uid, "the stuck rollout went no further than one pod"
    assert has_condition(broker, "Ready", "False"), f"1/{REPLICAS} ready: {status(broker)}"

    merge_patch(namespace, "broker", BROKER, {"spec": {"image": good_image}})
    broker = wait_broker_ready(namespace, BROKER, REPLICAS, BROKER_READY_S)
    assert is_settled(broker), status(broker)
    assert has_condition(broker, "Degraded", "False"), condition_details(broker, "Degraded")
    replaced = pod(namespace, REPLICAS - 1)
    assert replaced["metadata"]["uid"] != stuck["metadata"]["uid"], (
        "the stuck pod was replaced (by the operator: this test deletes no pod)")
    stuck_name = stuck["metadata"]["name"]
    wait_for_event(namespace, broker, f"Warning StuckPodDeleted naming {stuck_name}",
                   lambda e: e["type"] == "Warning" and e["reason"] == "StuckPodDeleted"
                   and stuck_name in e["message"], 60)
    images = {p["metadata"]["name"]: [c["image"] for c in p["spec"]["containers"]]
              for p in (pod(namespace, o) for o in range(REPLICAS))}
    assert all(i == [good_image] for i in images.values()), f"every broker on the good image: {images}"
    assert pod(namespace, 0)["metadata"]["uid"] == first_pod_uid, (
        "the broker that never left the good revision was not restarted")
