"""Pause: with quiver.io/paused=true a spec change is not applied to the StatefulSet and the Broker
says Paused=True; removing the annotation applies it."""

from kube import (annotate, condition_details, get, has_condition, holds_for, merge_patch,
                  wait_for_object)
from scenario import (PAUSE_ANNOTATION, STEP_S, broker_manifest, describe_broker, is_settled,
                      status, wait_broker_ready)

BROKER = "paused"
HELD_S = 30  # several reconcile periods (10 s while progressing) and watch events
NEW_GRACE_S = 40


def statefulset_shape(namespace):
    """What a spec change would alter: generation, template hash and the changed field."""
    sts = get(namespace, "statefulset", BROKER)
    template = sts["spec"]["template"]
    return {
        "generation": sts["metadata"]["generation"],
        "annotations": (template.get("metadata") or {}).get("annotations"),
        "grace": template["spec"].get("terminationGracePeriodSeconds"),
    }


def test_pause_holds_spec_changes_until_removed(namespace, brokers):
    brokers(broker_manifest(BROKER, 1))
    wait_broker_ready(namespace, BROKER, 1)

    annotate(namespace, "broker", BROKER, PAUSE_ANNOTATION, "true")
    wait_for_object(namespace, "broker", BROKER, "Paused=True",
                    lambda b: has_condition(b, "Paused", "True"), STEP_S)
    before = statefulset_shape(namespace)
    merge_patch(namespace, "broker", BROKER,
                {"spec": {"podTemplate": {"terminationGracePeriodSeconds": NEW_GRACE_S}}})
    holds_for("the StatefulSet unchanged while paused",
              lambda: statefulset_shape(namespace) == before, HELD_S,
              state=lambda: f"before {before}, now {statefulset_shape(namespace)}")
    paused = get(namespace, "broker", BROKER)
    assert has_condition(paused, "Paused", "True"), condition_details(paused, "Paused")
    assert has_condition(paused, "Progressing", "False", "Paused"), (
        condition_details(paused, "Progressing"))
    assert not is_settled(paused), (
        f"a paused Broker does not claim to observe the new generation: {status(paused)}")

    annotate(namespace, "broker", BROKER, PAUSE_ANNOTATION, None)
    wait_for_object(namespace, "statefulset", BROKER, "the held change applied",
                    lambda sts: sts["spec"]["template"]["spec"].get("terminationGracePeriodSeconds")
                    == NEW_GRACE_S, STEP_S)
    resumed = wait_broker_ready(namespace, BROKER, 1)
    assert has_condition(resumed, "Paused", "False"), (
        f"{condition_details(resumed, 'Paused')}\n{describe_broker(namespace, BROKER)}")
