"""Jepsen-style: kill -9 of the master under load, again and again, once with its disk lost.

A producer with retries (the stock client) sends unique keys while a nemesis kills the current
master, waits for a new one to take writes, and restarts the killed member (it rejoins as a
replica); in one round its data directory is deleted first. Afterwards every acknowledged
message must be stored, at the queue offset its SEND_OK named and in acknowledgement order, on
every member, and a consumer group that consumed throughout must have received each of them.
"""

import random
import time

import pytest

import wire
from checker import check, check_consumer
from quiver_e2e import wait_until
from workload import ConsumerProcess, ProducerDriver, log, post_mortem, stored, wait_placed

TOPIC = "JepsenTopic"
GROUP = "JepsenConsumers"
QUEUES = 4
ROUNDS = 5
DISK_LOSS_ROUND = 2


@pytest.mark.timeout(480)
def test_kill9_master_rounds(group, work_dir):
    rng = random.Random()
    group.start()
    master = group.master()
    wire.create_topic(master.addr, TOPIC, QUEUES)
    wire.commit_offsets(master.addr, GROUP, TOPIC, QUEUES, 0)
    # Topics (and offsets) reach the replicas within a second: every member routes the topic.
    for m in group.members:
        wait_until(lambda m=m: TOPIC in _routes(m), 30, f"{m} to route {TOPIC}")

    consumer = ConsumerProcess(group.namesrv, GROUP, TOPIC, work_dir)
    group.start_monitor()
    try:
        _rounds_then_check(group, work_dir, consumer, rng)
    finally:
        consumer.shutdown()
        log(f"split-brain monitor: {group.stop_monitor()}")
    assert not group.same_epoch_masters, (
        f"two members claimed to be master of the same epoch: {group.same_epoch_masters[:5]}")
    group.assert_no_panic()


def _rounds_then_check(group, work_dir, consumer, rng):
    master = group.master()
    producer = None
    failovers = []
    kills = []
    elections = []
    try:
        wait_placed(master, QUEUES)
        producer = ProducerDriver(group.namesrv, TOPIC, QUEUES, work_dir).start()
        wait_until(lambda: producer.acked() >= 100, 60, "the first 100 acknowledged sends")

        for round_no in range(ROUNDS):
            time.sleep(rng.uniform(1, 4))  # the nemesis's schedule, not a wait for a condition
            victim = group.master()
            assert victim is not None, f"no master before round {round_no}: {group.views()}"
            _, epoch, _ = victim.view()
            acked_before = producer.acked()
            killed_at = time.monotonic()
            victim.kill9()
            group.wait_master(exclude=(victim.id,), min_epoch=epoch + 1, timeout=30)
            elected = time.monotonic() - killed_at
            new_master = group.wait_writable(exclude=(victim.id,), min_epoch=epoch + 1, timeout=30)
            failover = time.monotonic() - killed_at
            _, new_epoch, _ = new_master.view()
            disk_loss = round_no == DISK_LOSS_ROUND
            victim.start(wipe=disk_loss)
            restarted_at = time.monotonic()
            group.wait_rejoined(victim, timeout=90)
            catch_up = time.monotonic() - restarted_at
            role = victim.view()[0]
            failovers.append(failover)
            kills.append(killed_at)
            elections.append(elected)
            log(f"round {round_no}: killed {victim} (master of epoch {epoch}, {acked_before} acked "
                f"so far){' and deleted its data directory' if disk_loss else ''}; {new_master} "
                f"master of epoch {new_epoch} after {elected:.2f} s, writable (a probe send "
                f"acknowledged) after {failover:.2f} s; the killed "
                f"member back as {role} and all 3 in sync {catch_up:.2f} s after its restart")
            assert role == "replica", f"{victim} rejoined as {role}: {group.views()}"
        wait_until(lambda: producer.acked() >= acked_before + 50, 60, "sends after the last round")
    except AssertionError:
        if producer is not None:
            post_mortem(group, TOPIC, QUEUES, producer.stop())
        raise
    finally:
        history = producer.stop() if producer else None

    log(f"failover times (kill -9 to a writable new master): "
        f"{', '.join(f'{f:.2f}s' for f in failovers)}; max {max(failovers):.2f}s; "
        f"kill -9 to a member claiming master: {', '.join(f'{e:.2f}s' for e in elections)}")
    log(f"producer: {history.summary()}; generations (processes) {producer.generations}")
    outages = [min((t for s, t in zip(history.ack_started, history.ack_times) if s > k),
                   default=float("nan")) - k for k in kills]
    log(f"outage seen by the producer per round (kill -9 to the first SEND_OK of a send begun "
        f"after it, including the client's send timeout and fresh-route restart): "
        f"{', '.join(f'{o:.2f}s' for o in outages)}")

    master = group.wait_in_sync(3, timeout=90)
    contents, _ = stored(master.addr, TOPIC, QUEUES)
    report = check(history.acks, contents, history.sent)
    log(f"checker on the master {master}: {report.summary()}")
    assert not report.problems(), report.problems()
    for m in group.members:
        if m is master:
            continue
        # A replica serves reads below the confirmed offset it learned from its last fetch
        # answer: its view may trail the master's briefly.
        started = time.monotonic()
        wait_until(lambda m=m: sorted(stored(m.addr, TOPIC, QUEUES)[0]) == sorted(contents), 15,
                   f"{m} to serve what the master {master} serves "
                   f"({_first_difference(stored(m.addr, TOPIC, QUEUES)[0], contents)})")
        log(f"{m} serves the master's {len(contents)} messages "
            f"(after {time.monotonic() - started:.2f} s)")
    log("every member serves the same messages at the same queue offsets")

    acked_keys = [a.key for a in history.acks]
    try:
        wait_until(lambda: consumer.has_all(acked_keys), 180,
                   "the consumer group to receive every acknowledged message")
    finally:
        consumed = check_consumer(history.acks, consumer.refresh())
        log(f"consumer group {GROUP}: {consumed.summary()}")
    assert not consumed.skipped, f"acknowledged but never consumed: {consumed.skipped[:20]}"


def _routes(member):
    import remoting
    try:
        code, _, _, _ = remoting.call(member.addr, remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
    except OSError:
        return ""
    return TOPIC if code == 0 else ""


def _first_difference(a, b):
    a, b = sorted(a), sorted(b)
    for x, y in zip(a, b):
        if x != y:
            return f"first difference: {x} vs {y}"
    return f"one is a prefix of the other ({len(a)} vs {len(b)})"
