"""Rebuilding a replica past the master's retention. Retention here is the disk-clean path
(--disk-clean-ratio far below the disk's use: every CommitLog file no consumer group still
needs goes at the next run, every 10 s), with 1 MiB segments, so the master deletes its first
segments within seconds.

- A replica whose disk is lost after the master deleted its first segments rebuilds from the
  master's oldest retained segment, rejoins the in-sync set, and serves each queue from its
  minimum offset exactly what the master serves.
- The master's retention keeps the segments a paused in-sync replica has not copied yet, up
  to --replica-retention-cap-bytes; past the cap it deletes them (logged, counted), and the
  replica, resumed, rebuilds from the master's oldest segment and rejoins."""

import os
import time

import pytest

import remoting
import wire
from conftest import PROBE_TOPIC, SEGMENT_SIZE
from quiver_e2e import wait_until
from workload import log

TOPIC = "RebuildTopic"
TOPIC_NOT_EXIST = 17
QUEUES = 4
BODY = "r" * (16 * 1024)
# Every file no group needs is deleted at each run; the disk is never "full".
RETENTION = {
    "--disk-clean-ratio": "0.0001",
    "--disk-force-clean-ratio": "1.0",
    "--disk-high-water-ratio": "1.0",
}


def start_group(group, overrides):
    for m in group.members:
        m.overrides = dict(overrides)
        m.start()
    master = group.wait_master(timeout=30)
    wire.create_topic(master.addr, PROBE_TOPIC)
    group.wait_writable(timeout=30)
    group.wait_in_sync(len(group.members), timeout=60)
    wire.create_topic(master.addr, TOPIC, QUEUES)
    return master


def produce(master, count, sent):
    """`count` acknowledged 16 KiB sends to `master`, round robin over the queues (a send the
    group answers otherwise than SEND_OK is retried); `sent` counts them across calls."""
    for _ in range(count):
        key = f"k-{sent[0]}"
        queue = sent[0] % QUEUES
        wait_until(lambda: wire.send(master.addr, TOPIC, key, BODY, queue_id=queue)[0] == wire.SUCCESS,
                   30, f"{key} acknowledged")
        sent[0] += 1


def oldest_segment(member):
    """The base offset of the member's oldest CommitLog file."""
    names = [n for n in os.listdir(os.path.join(member.data_dir, "commitlog")) if n.isdigit()]
    return min(int(n) for n in names)


def replica_log_end(master, replica):
    """The log end the master's status reports for `replica` (what it acknowledged)."""
    status = wire.status(master.addr) or {}
    mine = [r for r in status.get("replicas", []) if r.get("replicaId") == replica.id]
    return int(mine[0]["logEnd"]) if mine else None


def knows_topic(member):
    """The member serves pulls of TOPIC (a rebuilt replica copies topics from the master
    within a second of its start)."""
    code, _, _, _ = remoting.call(member.addr, wire.PULL_MESSAGE, {
        "consumerGroup": "quiver-replication-checker", "topic": TOPIC, "queueId": 0,
        "queueOffset": wire.min_offset(member.addr, TOPIC, 0), "maxMsgNums": 1, "sysFlag": 0,
        "commitOffset": -1, "suspendTimeoutMillis": 0, "subVersion": 0})
    return code != TOPIC_NOT_EXIST


def same_queues(master, replica):
    """Each queue read on both from the higher of their minimum offsets: the same messages,
    and the replica's minimum is past 0 on some queue (it did not copy from the start)."""
    wait_until(lambda: knows_topic(replica), 30, f"{replica} to copy {TOPIC}'s config")
    started_late = False
    for queue in range(QUEUES):
        first = max(wire.min_offset(master.addr, TOPIC, queue),
                    wire.min_offset(replica.addr, TOPIC, queue))
        started_late |= wire.min_offset(replica.addr, TOPIC, queue) > 0
        on_master = wire.read_queue(master.addr, TOPIC, queue, start=first)
        on_replica = wire.read_queue(replica.addr, TOPIC, queue, start=first)
        keys = lambda records: [(r["offset"], r["key"]) for r in records]
        assert keys(on_replica) == keys(on_master), (queue, first)
        assert on_master, f"queue {queue} read from {first} is empty"
    assert started_late, "the replica's queues all start at 0: it did not rebuild"


@pytest.mark.timeout(420)
def test_a_replica_that_lost_its_disk_rebuilds_from_the_oldest_segment(group):
    master = start_group(group, RETENTION)
    sent = [0]
    produce(master, 5 * 64, sent)  # 5 MiB: five segments
    wait_until(lambda: oldest_segment(master) >= 2 * SEGMENT_SIZE, 60,
               "the master's retention to delete its first two segments")
    victim = next(m for m in group.members if m is not master)
    victim.kill9()
    victim.start(wipe=True)
    group.wait_rejoined(victim, timeout=120)
    wait_until(lambda: victim.metric("quiver_replication_rebuilding") == 0, 60,
               f"{victim} to finish its rebuild")
    assert victim.metric("quiver_replication_rebuilds_total") == 1
    assert "rebuilding from the master's oldest segment" in victim.log_text()
    log(f"{victim} lost its disk and rebuilt from {oldest_segment(victim)} (the master's "
        f"oldest now {oldest_segment(master)}): back in sync, {group.views()}")
    produce(master, 64, sent)
    wait_until(lambda: wire.max_offset(victim.addr, TOPIC, 0) == wire.max_offset(master.addr, TOPIC, 0),
               60, f"{victim} to copy the sends after its rebuild")
    same_queues(master, victim)
    group.assert_no_panic()


@pytest.mark.timeout(420)
def test_retention_holds_what_a_paused_in_sync_replica_needs_up_to_the_cap(group):
    overrides = dict(RETENTION)
    overrides.update({
        # Async: sends go on while the replica is paused; a long lag bound keeps it in sync.
        "--replication": "async",
        "--min-in-sync-replicas": "1",
        "--replica-lag-max-ms": "600000",
        "--replica-retention-cap-bytes": str(3 * SEGMENT_SIZE),
    })
    master = start_group(group, overrides)
    sent = [0]
    produce(master, 96, sent)  # 1.5 MiB
    victim = next(m for m in group.members if m is not master)
    wait_until(lambda: replica_log_end(master, victim) == int(master.metric(
        "quiver_replication_confirmed_offset") or -1), 30, f"{victim} to catch up")
    victim.pause()
    needed = replica_log_end(master, victim)
    produce(master, 128, sent)  # 2 MiB more: the segments after `needed` stay under the cap
    wait_until(lambda: (master.metric("quiver_replication_retention_held_bytes") or 0) > 0, 60,
               "the master's retention to hold segments for the paused replica")
    assert oldest_segment(master) <= needed, (oldest_segment(master), needed)
    assert oldest_segment(master) > 0, "the segments the replica has copied go"
    assert (master.metric("quiver_replication_retention_cap_hits_total", cause="cap") or 0) == 0
    status = wire.status(master.addr)
    assert victim.id in status["inSyncReplicas"], status
    log(f"the master holds {master.metric('quiver_replication_retention_held_bytes')} bytes "
        f"for {victim} (paused at {needed}); its oldest segment is {oldest_segment(master)}")

    produce(master, 192, sent)  # 3 MiB more: what the replica needs passes the cap
    wait_until(lambda: (master.metric("quiver_replication_retention_cap_hits_total", cause="cap")
                        or 0) > 0, 60, "the cap to bite")
    wait_until(lambda: oldest_segment(master) > needed, 30, "the master to delete past the hold")
    assert "past the replica retention cap" in master.log_text()
    held = master.metric("quiver_replication_retention_held_bytes")
    assert 0 < held <= 3 * SEGMENT_SIZE, held
    log(f"the cap bit: the master's oldest segment is {oldest_segment(master)}, past {needed}; "
        f"{held} bytes still held")

    victim.resume()
    wait_until(lambda: (victim.metric("quiver_replication_rebuilds_total") or 0) == 1, 60,
               f"{victim} to rebuild from the master's oldest segment")
    group.wait_rejoined(victim, timeout=120)
    wait_until(lambda: victim.metric("quiver_replication_rebuilding") == 0, 60,
               f"{victim} to finish its rebuild")
    wait_until(lambda: replica_log_end(master, victim) == master.metric(
        "quiver_replication_confirmed_offset"), 60, f"{victim} to catch up")
    same_queues(master, victim)
    group.assert_no_panic()
