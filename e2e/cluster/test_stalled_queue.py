"""One queue stuck behind healthy ones: a group consumes two topics; `live` keeps being produced
and read by a connected member, while `stuck` (one queue) gets messages nobody reads. After the
group's window the ConsumerGroup names that queue in `status.stalledQueues` with
`QueuesStalled=True` (reason `QueueCommitsNotMoving`: the group as a whole is not Stalled, its
commits move), a Warning event says so, and the operator's metrics count it
(`quiver_consumer_group_stalled_queues`) and say since when
(`quiver_consumer_queue_stalled_since_timestamp_seconds`, the series QuiverConsumerQueueStalled
alerts on). Once the queue is read, all of it clears.

The lag interval is 5 s (conftest) and the group's window `lagThresholds.windowSeconds` is 60 s,
so the queue is named within one window and a few polls of its first unread poll, never before
the window has passed."""

import re
import subprocess
import threading
from datetime import datetime

from kube import apply, condition_details, get, wait_for, wait_for_event, wait_for_object
from scenario import (STEP_S, broker_manifest, group_manifest, metric_samples, operator_metrics,
                      status, wait_broker_ready, wait_group_ready)

WINDOW_S = 60
STUCK_UNREAD = 7
LIVE_BATCH = 5
LIVE_EVERY_S = 3
CONSUMER_IDLE_S = 30


def epoch_s(rfc3339):
    """Seconds since the epoch of an RFC 3339 time (nanoseconds cut to microseconds)."""
    text = re.sub(r"(\.\d{6})\d+", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


class LiveTraffic:
    """A member of the group consuming `topic` in the toolbox pod for as long as messages keep
    coming, and a thread producing a batch to it every few seconds: the group's commits move and
    it has a connected member. Use as a context manager."""

    def __init__(self, namespace, cli, broker, topic, group):
        self.namespace, self.cli, self.broker = namespace, cli, broker
        self.topic, self.group = topic, group
        self.stop = threading.Event()
        self.errors = []
        self.produced = 0
        self.consumer = None
        self.feeder = None

    def __enter__(self):
        self.consumer = subprocess.Popen(
            ["kubectl", "--namespace", self.namespace, "exec", "toolbox", "--", "/tmp/quiver",
             "--server", f"{self.broker}.{self.namespace}.svc:10911",
             "consume", "-t", self.topic, "-g", self.group, "--from", "first", "--mode", "count",
             "--idle-timeout-secs", str(CONSUMER_IDLE_S)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()
        return self

    def _feed(self):
        while not self.stop.is_set():
            try:
                self.cli.produce(self.broker, self.topic, LIVE_BATCH, "live")
                self.produced += LIVE_BATCH
            except AssertionError as error:
                self.errors.append(str(error))
            self.stop.wait(LIVE_EVERY_S)

    def check(self):
        """Fails if the feeder could not produce or the member is gone."""
        assert not self.errors, f"producing to {self.topic} failed: {self.errors[-1]}"
        assert self.consumer.poll() is None, (
            f"the {self.topic} member ended early: {self.consumer.communicate()}")

    def finish(self):
        """Stops producing and waits for the member to go idle and end; returns what it read."""
        self.stop.set()
        self.feeder.join(timeout=60)
        try:
            out, err = self.consumer.communicate(timeout=CONSUMER_IDLE_S + 90)
        except subprocess.TimeoutExpired as timeout:
            raise AssertionError(f"the {self.topic} member did not end once idle: {timeout}") from None
        assert self.consumer.returncode == 0, f"the {self.topic} member failed: {out}\n{err}"
        return int(out.strip().split()[-1])

    def __exit__(self, *exc):
        self.stop.set()
        if self.feeder is not None:
            self.feeder.join(timeout=60)
        if self.consumer is not None and self.consumer.poll() is None:
            self.consumer.terminate()
            try:
                self.consumer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.consumer.kill()
                self.consumer.wait(timeout=10)
        return False


def stalled_series(namespace, operator, broker, group):
    text = operator_metrics(namespace, operator)
    series = {"namespace": namespace, "cluster": broker, "consumer_group": group}
    count = metric_samples(text, "quiver_consumer_group_stalled_queues", **series)
    since = metric_samples(text, "quiver_consumer_queue_stalled_since_timestamp_seconds", **series)
    return count, since, text


def lines_about(text, group):
    return [line for line in text.splitlines() if "stalled" in line and group in line]


def test_a_stuck_queue_behind_healthy_ones_is_named(namespace, operator, brokers, cli):
    broker, group = "stall", "stall-billing"
    brokers(broker_manifest(broker, 1, topics=[("live", 4), ("stuck", 1)]))
    wait_broker_ready(namespace, broker, 1)
    apply(namespace, group_manifest(group, broker, ["live", "stuck"],
                                    lagThresholds={"windowSeconds": WINDOW_S}))
    wait_group_ready(namespace, group)
    # The group commits on the stuck queue once, so its lag is known from then on.
    cli.wait_route(broker, "stuck", 1)
    cli.produce(broker, "stuck", 5, "read-once")
    assert cli.consume(broker, "stuck", group, 5) == 5, "the stuck queue's first messages are read"
    cli.wait_route(broker, "live", 1)

    with LiveTraffic(namespace, cli, broker, "live", group) as live:
        wait_for("the live member to commit on every live queue",
                 lambda: live.check() is None and all(
                     row["consumer_offset"] is not None for row in cli.lag_rows(broker, group, "live")),
                 STEP_S, state=lambda: cli.lag_rows(broker, group, "live"))
        cli.produce(broker, "stuck", STUCK_UNREAD, "never-read")

        found = wait_for_object(namespace, "consumergroup", group, "the stuck queue named",
                                lambda g: status(g).get("stalledQueues"), WINDOW_S + STEP_S)
        live.check()
        group_status = status(found)
        stalled = group_status["stalledQueues"]
        assert [(q["topic"], q["broker"], q["queueId"], q["lag"], q["committedOffset"])
                for q in stalled] == [("stuck", f"{broker}-0", 0, STUCK_UNREAD, 5)], (
            f"only the stuck queue, with its lag and unmoved commit: {group_status}")
        assert group_status.get("stalledQueueCount") == 1, group_status
        queues_stalled = condition_details(found, "QueuesStalled")
        assert (queues_stalled.get("status"), queues_stalled.get("reason")) == (
            "True", "QueueCommitsNotMoving"), group_status
        assert f"stuck queue 0 on {broker}-0 ({STUCK_UNREAD} messages" in queues_stalled["message"], (
            queues_stalled)
        # The group as a whole consumes: not Stalled, a member connected, commits after the
        # stuck queue's run began.
        assert condition_details(found, "Stalled").get("status") == "False", group_status
        assert condition_details(found, "Consuming").get("reason") in ("Progressing", "FallingBehind"), (
            group_status)
        assert (group_status.get("members") or 0) >= 1, group_status
        since = epoch_s(stalled[0]["since"])
        assert epoch_s(group_status["lastCommitTime"]) > since, (
            f"the live queues committed while the stuck one did not: {group_status}")
        # Named only once a whole window without a commit had passed (operator times both,
        # the condition's at whole seconds).
        assert epoch_s(queues_stalled["lastTransitionTime"]) - since >= WINDOW_S - 1, queues_stalled

        wait_for_event(namespace, found, "Warning QueuesStalled",
                       lambda e: e["type"] == "Warning" and e["reason"] == "QueuesStalled"
                       and "stuck queue 0" in e["message"], 60)
        count, since_series, _ = wait_for(
            "the stalled queue on the operator's /metrics",
            lambda: (seen := stalled_series(namespace, operator, broker, group))[0] == [1.0] and seen,
            60, state=lambda: lines_about(operator_metrics(namespace, operator), group))
        text = operator_metrics(namespace, operator)
        stuck_since = metric_samples(text, "quiver_consumer_queue_stalled_since_timestamp_seconds",
                                     namespace=namespace, cluster=broker, consumer_group=group,
                                     topic="stuck", broker=f"{broker}-0", queue_id=0)
        assert stuck_since == [float(int(since))], (stuck_since, stalled[0]["since"])
        assert len(since_series) == 1, f"no live queue has a stalled series: {lines_about(text, group)}"

        read_live = live.finish()
        assert read_live >= live.produced > 0, (
            f"the live member read what was produced meanwhile: {read_live} of {live.produced}")

    # The stuck queue is read: no queue is named any more and the count goes to 0.
    assert cli.consume(broker, "stuck", group, STUCK_UNREAD) == STUCK_UNREAD, "the stuck queue is read"
    found = wait_for_object(namespace, "consumergroup", group, "no stalled queue after the read",
                            lambda g: condition_details(g, "QueuesStalled").get("status") == "False",
                            STEP_S)
    assert not status(found).get("stalledQueues"), status(found)
    assert condition_details(found, "QueuesStalled").get("reason") == "NoQueueStalled", status(found)
    wait_for("the stalled count at 0 and no stalled-since series",
             lambda: stalled_series(namespace, operator, broker, group)[:2] == ([0.0], []), 60,
             state=lambda: lines_about(operator_metrics(namespace, operator), group))
    assert get(namespace, "consumergroup", group)["status"].get("stalledQueueCount") == 0
