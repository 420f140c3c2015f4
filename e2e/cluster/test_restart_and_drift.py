"""Restarts and changes behind the operator: the quiver.io/restart annotation restarts every broker
one at a time from the highest ordinal (status.restart InProgress then Completed, events
RestartStarted and RestartCompleted); an env var added with `kubectl set env sts` and a
`kubectl rollout restart sts` are named in a TemplateDrift Warning and undone, the StatefulSet
back to the Broker's template and every pod on it again."""

from kube import (PodWatch, annotate, get, kubectl, list_objects, wait_for, wait_for_event,
                  wait_for_object)
from scenario import (STEP_S, broker_manifest, describe_broker, pod_names, pod_selector, status,
                      wait_broker_ready)

REPLICAS = 3
RESTART_ANNOTATION = "quiver.io/restart"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
RESTART_S = 600


def pod_uids(namespace, broker):
    pods = list_objects(namespace, "pod", pod_selector(broker))
    return {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}


def all_pods(namespace, broker, check):
    pods = list_objects(namespace, "pod", pod_selector(broker))
    return len(pods) == REPLICAS and all(check(pod) for pod in pods)


def test_the_restart_annotation_restarts_every_broker_one_at_a_time(namespace, brokers):
    broker = "restart"
    brokers(broker_manifest(broker, REPLICAS))
    wait_broker_ready(namespace, broker, REPLICAS)
    names = pod_names(broker, REPLICAS)
    before = pod_uids(namespace, broker)

    with PodWatch(namespace, pod_selector(broker)) as watch:
        since = watch.wait_all_ready(names, 60)
        annotate(namespace, "broker", broker, RESTART_ANNOTATION, "e2e-1")
        restarted = wait_for_object(
            namespace, "broker", broker, "status.restart Completed",
            lambda b: (status(b).get("restart") or {}).get("state") == "Completed"
            and (status(b).get("restart") or {}).get("token") == "e2e-1",
            RESTART_S, context=lambda: describe_broker(namespace, broker))
        worst, when = watch.max_not_ready(names, since)

    assert worst <= 1, f"{worst} brokers not Ready at once (t={when[0]}s: {when[1]})"
    after = pod_uids(namespace, broker)
    assert all(after.get(name) != uid for name, uid in before.items()), (before, after)
    wait_for_event(namespace, restarted, "RestartStarted", lambda e: e["reason"] == "RestartStarted",
                   STEP_S)
    wait_for_event(namespace, restarted, "RestartCompleted",
                   lambda e: e["reason"] == "RestartCompleted", STEP_S)


def test_an_env_var_set_behind_the_operator_is_named_and_undone(namespace, brokers):
    broker = "drift-env"
    brokers(broker_manifest(broker, REPLICAS))
    ready = wait_broker_ready(namespace, broker, REPLICAS)
    kubectl(namespace, "set", "env", f"statefulset/{broker}", "QUIVER_E2E_DRIFT=1")

    wait_for_event(namespace, ready, "TemplateDrift naming the env var",
                   lambda e: e["reason"] == "TemplateDrift" and "QUIVER_E2E_DRIFT" in e["message"],
                   STEP_S)
    env_of = lambda container: {var["name"] for var in container.get("env") or []}
    wait_for_object(namespace, "statefulset", broker, "the env var gone from the template",
                    lambda sts: "QUIVER_E2E_DRIFT" not in env_of(
                        sts["spec"]["template"]["spec"]["containers"][0]), STEP_S)
    wait_for("every pod without the env var, Ready",
             lambda: all_pods(namespace, broker, lambda pod: "QUIVER_E2E_DRIFT" not in env_of(
                 pod["spec"]["containers"][0])), RESTART_S,
             state=lambda: describe_broker(namespace, broker))
    wait_broker_ready(namespace, broker, REPLICAS)


def test_a_rollout_restart_behind_the_operator_is_named_and_undone(namespace, brokers):
    broker = "drift-restart"
    brokers(broker_manifest(broker, REPLICAS))
    ready = wait_broker_ready(namespace, broker, REPLICAS)
    kubectl(namespace, "rollout", "restart", f"statefulset/{broker}")

    wait_for_event(namespace, ready, "TemplateDrift naming restartedAt",
                   lambda e: e["reason"] == "TemplateDrift" and RESTARTED_AT in e["message"],
                   STEP_S)
    annotations_of = lambda obj: (obj.get("metadata") or {}).get("annotations") or {}
    wait_for_object(namespace, "statefulset", broker, "restartedAt gone from the template",
                    lambda sts: RESTARTED_AT not in annotations_of(sts["spec"]["template"]),
                    STEP_S)
    wait_for("every pod without restartedAt, Ready",
             lambda: all_pods(namespace, broker,
                              lambda pod: RESTARTED_AT not in annotations_of(pod)),
             RESTART_S, state=lambda: describe_broker(namespace, broker))
    sts = get(namespace, "statefulset", broker)
    assert RESTARTED_AT not in annotations_of(sts["spec"]["template"]), sts["spec"]["template"]
    wait_broker_ready(namespace, broker, REPLICAS)
