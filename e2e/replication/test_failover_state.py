"""What a new master needs survives a failover: consumer offsets committed on the master (their
state log records travel with the CommitLog), group deletions reach every member, and a
commit sent to a replica is refused with 14 SERVICE_NOT_AVAILABLE naming the master."""

import pytest

import remoting
import wire
from quiver_e2e import wait_until

TOPIC = "StateTopic"
GROUP = "StateConsumers"
QUEUES = 4
QUERY_CONSUMER_OFFSET = 14
DELETE_SUBSCRIPTIONGROUP = 207
SYSTEM_BUSY = 2


def commit(addr, queue, offset, group=GROUP):
    """(code, remark) of UPDATE_CONSUMER_OFFSET."""
    code, remark, _, _ = remoting.call(addr, wire.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": queue, "commitOffset": offset})
    return code, remark or ""


def query(addr, queue, group=GROUP):
    """(code, committed offset or None) of QUERY_CONSUMER_OFFSET without a zero default."""
    code, _, ext, _ = remoting.call(addr, QUERY_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": TOPIC, "queueId": queue, "setZeroIfNotFound": "false"})
    return code, (int(ext["offset"]) if code == wire.SUCCESS else None)


def fill(master, per_queue):
    for i in range(per_queue * QUEUES):
        code, remark, _, _ = wire.send(master.addr, TOPIC, f"k{i}", f"m{i}", queue_id=i % QUEUES)
        assert code == wire.SUCCESS, f"send {i}: code {code} {remark}"


def started(group):
    group.start()
    master = group.master()
    wire.create_topic(master.addr, TOPIC, QUEUES)
    return master


@pytest.mark.timeout(240)
def test_commits_answered_before_a_kill9_of_the_master_survive_the_failover(group):
    master = started(group)
    _, epoch, _ = master.view()
    fill(master, 100)
    # Committed round by round, so each queue's last commit comes just before the kill.
    last = {queue: 0 for queue in range(QUEUES)}
    for step in range(1, 11):
        for queue in range(QUEUES):
            code, remark = commit(master.addr, queue, step * 9)
            assert code == wire.SUCCESS, f"commit {queue}: code {code} {remark}"
            last[queue] = step * 9
    master.kill9()
    new = group.wait_writable(exclude=(master.id,), min_epoch=epoch + 1, timeout=60)
    after = {queue: query(new.addr, queue)[1] for queue in range(QUEUES)}
    redelivered = sum(last[q] - (after[q] or 0) for q in range(QUEUES))
    print(f"failover {master} -> {new}: {sum(last.values())} committed, "
          f"{redelivered} re-delivered")
    assert after == last
    group.assert_no_panic()


@pytest.mark.timeout(240)
def test_a_commit_or_group_deletion_sent_to_a_replica_is_refused_naming_the_master(group):
    master = started(group)
    fill(master, 5)
    replica = next(m for m in group.members if m is not master)
    code, remark = commit(replica.addr, 0, 3)
    assert code == wire.SERVICE_NOT_AVAILABLE, f"commit on {replica}: code {code} {remark}"
    assert "master" in remark and master.addr in remark, remark
    code, remark, _, _ = remoting.call(replica.addr, DELETE_SUBSCRIPTIONGROUP, {
        "groupName": GROUP, "cleanOffset": "true"})
    assert code == wire.SERVICE_NOT_AVAILABLE, f"delete on {replica}: code {code} {remark}"
    assert master.addr in (remark or ""), remark
    # The master took neither.
    assert query(master.addr, 0)[0] != wire.SUCCESS


@pytest.mark.timeout(240)
def test_a_group_deletion_reaches_every_replica(group):
    master = started(group)
    fill(master, 5)
    for queue in range(QUEUES):
        assert commit(master.addr, queue, 4)[0] == wire.SUCCESS
    replicas = [m for m in group.members if m is not master]
    for m in replicas:
        wait_until(lambda m=m: all(query(m.addr, q) == (wire.SUCCESS, 4) for q in range(QUEUES)),
                   30, f"{m} to hold the group's offsets")
    code, remark, _, _ = remoting.call(master.addr, DELETE_SUBSCRIPTIONGROUP, {
        "groupName": GROUP, "cleanOffset": "true"})
    assert code == wire.SUCCESS, f"delete: code {code} {remark}"
    # A replica without the group's offsets refuses the query (ask the master).
    for m in replicas:
        wait_until(lambda m=m: all(query(m.addr, q)[0] == SYSTEM_BUSY for q in range(QUEUES)),
                   30, f"{m} to drop the deleted group's offsets")
