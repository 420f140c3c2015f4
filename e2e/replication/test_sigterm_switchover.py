"""Controlled shutdown: SIGTERM on the master of a sync group under a steady producer hands
mastership to an in-sync replica before the process stops (a shutdown switchover, not an
election after the master timeout); SIGTERM on a replica stops it at once. Both exit 0.

The producer sends raw frames one at a time (a new key per attempt) to the master a route
answer names, and records which member answered each send: so the new master's first SEND_OK
is known, and every failed send can be placed against the SIGTERM and that first SEND_OK."""

import threading
import time

import pytest

import wire
from checker import Ack, check
from nemesis import route_master
from quiver_e2e import wait_until
from workload import log, stored

TOPIC = "ShutdownTopic"
QUEUES = 4
HANDED_OVER = "mastership handed over; stopping"
STOPPED_PLAINLY = "stopping plainly"


class Send:
    """One attempt: its key, queue, when it was tried and answered, by whom, and the answer."""

    def __init__(self, key, queue, addr, tried, done, code, remark, offset):
        self.key, self.queue, self.addr = key, queue, addr
        self.tried, self.done = tried, done
        self.code, self.remark, self.offset = code, remark, offset

    @property
    def ok(self):
        return self.code == wire.SUCCESS

    def __repr__(self):
        return (f"{self.key}@{self.addr} code {self.code} {self.remark[:60]!r} "
                f"tried {self.tried:.3f} answered {self.done:.3f}")


class RouteProducer(threading.Thread):
    """Sends one message at a time to the master the members' routes name, up to `rate` a
    second; after any answer but SEND_OK (or no answer) it looks the master up again."""

    def __init__(self, group, rate=100.0):
        super().__init__(daemon=True)
        self.group = group
        self.rate = rate
        self.sends = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.error = None

    def acked(self, addr=None):
        with self.lock:
            return sum(1 for s in self.sends if s.ok and addr in (None, s.addr))

    def run(self):
        try:
            self._produce()
        except Exception as error:  # shown by stop()
            self.error = f"{type(error).__name__}: {error}"

    def _produce(self):
        master = None
        n = 0
        while not self.stopping.wait(1.0 / self.rate):
            if master is None:
                live = [m.addr for m in self.group.members if m.alive()]
                master = route_master(live, TOPIC)
                if master is None:
                    continue
            key, queue = f"k-{n}", n % QUEUES
            n += 1
            tried = time.monotonic()
            try:
                code, remark, _, offset = wire.send(master, TOPIC, key, f"body-{key}",
                                                    queue_id=queue, timeout=10)
            except (OSError, ValueError) as error:
                code, remark, offset = None, f"{type(error).__name__}: {error}", -1
            send = Send(key, queue, master, tried, time.monotonic(), code, remark, offset)
            with self.lock:
                self.sends.append(send)
            if not send.ok:
                master = None

    def stop(self):
        self.stopping.set()
        self.join(30)
        assert self.error is None, f"producer failed: {self.error}"
        with self.lock:
            return list(self.sends)


def start_group_with_producer(group):
    group.start()
    wire.create_topic(group.master().addr, TOPIC, QUEUES)
    for m in group.members:
        wait_until(lambda m=m: route_master([m.addr], TOPIC), 30, f"{m} to route {TOPIC}")
    producer = RouteProducer(group)
    producer.start()
    wait_until(lambda: producer.acked() >= 200, 60, "200 acknowledged sends before the SIGTERM")
    return producer


def assert_nothing_acknowledged_lost(member, sends):
    acks = [Ack(s.key, s.queue, s.offset) for s in sorted(sends, key=lambda s: s.done) if s.ok]
    contents, _ = stored(member.addr, TOPIC, QUEUES)
    report = check(acks, contents, {s.key for s in sends})
    log(f"checker on {member}: {report.summary()}")
    assert not report.problems(), report.problems()


def switchovers(members, cause):
    return sum(m.metric("quiver_replication_switchovers_total", cause=cause) or 0
               for m in members if m.alive())


def consensus_leader(group):
    return next((m for m in group.members
                 if m.metric("quiver_replication_consensus_leader") == 1), None)


def place_master(group, leads_consensus):
    """Moves mastership (planned switchovers) so that the master does, or does not, lead
    the group's consensus (a leader that stops leaves the others to elect another one);
    (the master, how many planned switchovers the live members have counted by then)."""
    placing = {"counted": switchovers(group.members, "planned"), "handed": 0}

    def placed():
        master, leader = group.master(), consensus_leader(group)
        if master is None or leader is None:
            return None
        if (master is leader) == leads_consensus:
            return master
        if master is leader:
            # A planned switchover takes the consensus leadership along with mastership, so
            # only a crash separates them: the others elect both anew, independently.
            log(f"{master} is master and consensus leader: kill -9 and restart to separate them")
            _, epoch, _ = master.view()
            master.kill9()
            group.wait_writable(exclude=(master.id,), min_epoch=epoch + 1, timeout=30)
            master.start()
            group.wait_in_sync(3, timeout=60)
            placing.update(counted=switchovers(group.members, "planned"), handed=0)
            return None
        code, remark = wire.switchover(master.addr, leader.id, timeout_ms=3000)
        log(f"switchover {master} -> {leader} to place the master: code {code} {remark}")
        if code == wire.SUCCESS:
            placing["handed"] += 1
        return None
    master = group.wait(placed, 150, f"a master that {'leads' if leads_consensus else 'does not lead'} "
                                     f"the consensus")
    return master, placing["counted"] + placing["handed"]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("leads_consensus", [False, True], ids=["follower", "consensus-leader"])
def test_sigterm_on_the_master_hands_over_before_it_stops(group, leads_consensus):
    producer = start_group_with_producer(group)
    try:
        old, planned = place_master(group, leads_consensus)
        # Steady again after any placing switchover: the master takes the producer's sends.
        assert group.wait_writable(timeout=30) is old, f"the master moved: {group.views()}"
        acked = producer.acked(old.addr)
        wait_until(lambda: producer.acked(old.addr) >= acked + 100, 60,
                   f"100 sends acknowledged by {old} before the SIGTERM")
        steady_from = time.monotonic()
        _, epoch, _ = old.view()
        assert switchovers(group.members, "planned") == planned, (
            f"{planned} planned switchover(s) placed the master; the members counted "
            f"{switchovers(group.members, 'planned')}")
        others = [m for m in group.members if m is not old]
        failovers_before = switchovers(others, "failover")
        led_consensus = consensus_leader(group) is old
        term_at = time.monotonic()
        exit_code = old.stop(timeout=60)
        stopped_at = time.monotonic()
        new = group.wait_writable(exclude=(old.id,), min_epoch=epoch + 1, timeout=30)
        acked = producer.acked(new.addr)
        wait_until(lambda: producer.acked(new.addr) >= acked + 200, 60,
                   f"200 sends acknowledged by the new master {new}")
    finally:
        sends = producer.stop()
    log(f"SIGTERM of {old} (consensus leader: {led_consensus}): exit code {exit_code} after "
        f"{stopped_at - term_at:.3f} s; new master {new}; sends {len(sends)}, "
        f"acknowledged {sum(s.ok for s in sends)}")

    assert exit_code == 0, f"{old} exited with {exit_code} after SIGTERM:\n{old.log_tail()}"
    text = old.log_text()
    assert HANDED_OVER in text and STOPPED_PLAINLY not in text, (
        f"{old} did not hand over before stopping:\n{old.log_tail()}")
    assert switchovers(others, "failover") == failovers_before, (
        f"the group elected after the SIGTERM instead of taking the handover: {group.views()}")

    first_new = min(s.done for s in sends if s.ok and s.addr == new.addr and s.tried >= term_at)
    failed = [s for s in sends if not s.ok and s.done >= steady_from]
    log(f"failed sends: {len(failed)}, all within the handover: SIGTERM at {term_at:.3f}, "
        f"first SEND_OK on the new master at {first_new:.3f} "
        f"({(first_new - term_at) * 1000:.0f} ms later)")
    # A send in flight at the SIGTERM may fail (its master was deposed before every in-sync
    # member confirmed it); none fails before it, none tried after the new master's first.
    before = [s for s in failed if s.done < term_at]
    after = [s for s in failed if s.tried > first_new]
    assert not before, f"sends failed before the SIGTERM: {before[:5]}"
    assert not after, f"sends failed after the new master took its first: {after[:5]}"
    assert_nothing_acknowledged_lost(new, sends)
    group.assert_no_panic()


@pytest.mark.timeout(240)
def test_sigterm_on_a_replica_stops_it_at_once_and_the_group_keeps_taking_writes(group):
    producer = start_group_with_producer(group)
    try:
        master = group.master()
        replica = next(m for m in group.members if m is not master)
        exit_code = replica.stop(timeout=60)
        acked_at_exit = producer.acked(master.addr)
        wait_until(lambda: producer.acked(master.addr) >= acked_at_exit + 200, 60,
                   f"200 more sends acknowledged by {master} without {replica}")
    finally:
        sends = producer.stop()
    log(f"SIGTERM of the replica {replica}: exit code {exit_code}; sends {len(sends)}, "
        f"acknowledged {sum(s.ok for s in sends)}, failed {sum(not s.ok for s in sends)}")
    assert exit_code == 0, f"{replica} exited with {exit_code} after SIGTERM:\n{replica.log_tail()}"
    assert "handing mastership over" not in replica.log_text(), replica.log_tail()
    assert group.master() is master, f"mastership moved: {group.views()}"
    assert_nothing_acknowledged_lost(master, sends)
    group.assert_no_panic()
