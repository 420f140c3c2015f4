"""Disk loss of a replica (kill -9, data directory deleted, restart on the same ports): it must
rejoin in sync, copying the whole log, and the group must still fail over afterwards without
losing an acknowledged message. Both replicas lose their disk in turn, so whichever member
leads the consensus group, a member it was replicating to comes back empty."""

import time

import pytest

import remoting
import wire
from checker import check
from quiver_e2e import wait_until
from workload import ProducerDriver, log, post_mortem, stored

TOPIC = "DiskLossTopic"
QUEUES = 4


@pytest.mark.timeout(300)
def test_replica_disk_loss_then_failover(group, work_dir):
    group.start()
    master = group.master()
    wire.create_topic(master.addr, TOPIC, QUEUES)
    for m in group.members:
        wait_until(lambda m=m: _routes(m), 30, f"{m} to route {TOPIC}")

    producer = ProducerDriver(group.namesrv, TOPIC, QUEUES, work_dir).start()
    try:
        wait_until(lambda: producer.acked() >= 300, 60, "300 acknowledged sends")
        for victim in [m for m in group.members if m is not master]:
            acked = producer.acked()
            victim.kill9()
            victim.start(wipe=True)
            started = time.monotonic()
            group.wait_rejoined(victim, timeout=60)
            log(f"{victim} (replica) lost its disk with {acked} acknowledged; back in sync "
                f"{time.monotonic() - started:.2f} s after its restart: {group.views()}")
            wait_until(lambda a=producer.acked(): producer.acked() >= a + 100, 60,
                       "100 acknowledged sends after the rejoin")
        _, epoch, _ = master.view()
        killed_at = time.monotonic()
        master.kill9()
        new = group.wait_writable(exclude=(master.id,), min_epoch=epoch + 1, timeout=30)
        log(f"killed the master {master}: {new} writable after {time.monotonic() - killed_at:.2f} s")
        master.start()
        group.wait_rejoined(master, timeout=60)
        wait_until(lambda a=producer.acked(): producer.acked() >= a + 100, 60,
                   "100 acknowledged sends after the failover")
    except AssertionError:
        post_mortem(group, TOPIC, QUEUES, producer.stop())
        raise
    finally:
        history = producer.stop()
    log(f"producer: {history.summary()}; generations (processes) {producer.generations}")

    master = group.wait_in_sync(3, timeout=60)
    contents, _ = stored(master.addr, TOPIC, QUEUES)
    report = check(history.acks, contents, history.sent)
    log(f"checker on the master {master}: {report.summary()}")
    assert not report.problems(), report.problems()
    group.assert_no_panic()


def _routes(member):
    try:
        code, _, _, _ = remoting.call(member.addr, remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
    except OSError:
        return False
    return code == 0
