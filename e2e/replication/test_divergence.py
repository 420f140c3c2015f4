"""Divergence: a master that stored messages its replicas never confirmed is deposed, the group
moves on without them, and when it comes back it drops them (truncates to the new epoch's log)
instead of serving them or handing them to the others.

    replicas SIGSTOP -> X sent to the master (never SEND_OK) -> master SIGSTOP -> replicas
    SIGCONT -> a replica becomes master of a new epoch -> Y sent and acknowledged -> old master
    SIGCONT -> it follows the new epoch, in sync.

Afterwards every member serves exactly what was acknowledged (before and Y) at the queue
offsets its SEND_OKs named, plus at most the X the new master itself holds, at the same places:
an X can reach a replica when the master's answer to the fetch it had parked lands in the
stopped replica's socket buffer (the kernel receives for a stopped process) and the replica
appends it once resumed. It was never acknowledged, so surviving is allowed; what is never
allowed is a member serving an X the group's log does not hold. The old master's CommitLog
holds no X below its log end except those survivors.
"""

import os
import threading
import time

import pytest

import remoting
import wire
from quiver_e2e import wait_until
from workload import log

TOPIC = "DivTopic"
QUEUES = 4


def raw_send_all(addr, prefix, count, concurrent=False):
    """Sends prefix-0.. to queue i % QUEUES; {key: (code, remark, queue, offset) or error}."""
    results = {}

    def one(i):
        key = f"{prefix}-{i}"
        try:
            results[key] = wire.send(addr, TOPIC, key, f"{prefix}-body-{i}-" + "v" * 200,
                                     queue_id=i % QUEUES, timeout=15)
        except OSError as error:
            results[key] = ("error", str(error), -1, -1)

    if concurrent:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    else:
        for i in range(count):
            one(i)
    return results


def commitlog_hits(data_dir, needle):
    """CommitLog byte positions where `needle` occurs in the member's segment files."""
    hits = []
    directory = os.path.join(data_dir, "commitlog")
    for name in sorted(os.listdir(directory)):
        if not name.isdigit():
            continue
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        at = data.find(needle)
        while at >= 0:
            hits.append(int(name) + at)
            at = data.find(needle, at + 1)
    return hits


@pytest.mark.timeout(240)
def test_unconfirmed_tail_of_a_deposed_master_is_dropped(group):
    group.start()
    old = group.master()
    _, old_epoch, _ = old.view()
    replicas = [m for m in group.members if m is not old]
    wire.create_topic(old.addr, TOPIC, QUEUES)
    for m in group.members:
        wait_until(lambda m=m: _routes(m), 30, f"{m} to route {TOPIC}")

    before = raw_send_all(old.addr, "b", 8)
    assert all(r[0] == wire.SUCCESS for r in before.values()), before
    group.wait_in_sync(3, timeout=30)

    # X: the replicas cannot confirm it.
    for r in replicas:
        r.pause()
    x = raw_send_all(old.addr, "x", 4, concurrent=True)
    log(f"X sent to the master {old} with both replicas stopped: "
        + "; ".join(f"{k}: code {v[0]} {v[1]!r}" for k, v in sorted(x.items())))
    acked_x = [k for k, v in x.items() if v[0] == wire.SUCCESS]
    assert not acked_x, f"sends acknowledged (SEND_OK) with both replicas stopped: {acked_x}"
    stored_x = [k for k in x if commitlog_hits(old.data_dir, _body_mark(k))]
    log(f"X in the old master's CommitLog before it was stopped: {sorted(stored_x)}")

    old.pause()
    for r in replicas:
        r.resume()
    new = group.wait_writable(exclude=(old.id,), min_epoch=old_epoch + 1, timeout=30)
    _, new_epoch, _ = new.view()
    log(f"{new} is writable as master of epoch {new_epoch} (was {old} of epoch {old_epoch})")

    y = raw_send_all(new.addr, "y", 6)
    assert all(r[0] == wire.SUCCESS for r in y.values()), y

    old.resume()
    group.wait(lambda: old.view()[:2] == ("replica", new_epoch), 60,
               f"{old} to follow epoch {new_epoch}")
    group.wait_in_sync(3, timeout=60)
    log(f"{old} is a replica of epoch {new_epoch}; all 3 in sync: {group.views()}")

    acked = {k: [(v[2], v[3])] for k, v in list(before.items()) + list(y.items())}
    survivors = {k: v for k, v in _served(new).items() if k.startswith("x-")}
    if survivors:
        log(f"X the new master {new} holds (reached a replica before its stop took hold; never "
            f"acknowledged): {survivors}")
    acked.update(survivors)
    for m in group.members:
        # A replica learns how far the log is confirmed from its next fetch answer, and serves
        # reads only below that: its view may trail the master's briefly.
        started = time.monotonic()
        served = wait_until(lambda m=m: _served_if(m, acked), 15,
                            f"{m} to serve exactly the acknowledged messages {sorted(acked)} "
                            f"(it serves {_served(m)})")
        log(f"{m} ({m.view()[0]}) serves {sorted(served)} "
            f"(after {time.monotonic() - started:.2f} s)")

    status = wire.status(old.addr)
    log(f"old master's status: {status}")
    log_end = None
    if status:
        for replica in status.get("replicas", []):
            if replica.get("replicaId") == old.id:
                log_end = replica.get("logEnd")
    if log_end is None:
        log_end = int(old.metric("quiver_replication_confirmed_offset") or 0)
    for key in x:
        if key in survivors:
            continue
        hits = commitlog_hits(old.data_dir, _body_mark(key))
        live = [h for h in hits if h < log_end]
        assert not live, f"the old master's CommitLog still holds {key} at {live} (log end {log_end})"
        if hits:
            log(f"{key}: stale bytes past the old master's log end {log_end} at {hits} (not served)")
    group.assert_no_panic()


def _served(member):
    """{key: [(queue, offset)]} of what the member serves from offset 0."""
    served = {}
    for r in wire.read_topic(member.addr, TOPIC, QUEUES):
        served.setdefault(r["key"], []).append((r["queue"], r["offset"]))
    return served


def _served_if(member, expected):
    """The member's reads once they are `expected`; fails at once on an X not expected."""
    served = _served(member)
    foreign = [k for k in served if k.startswith("x-") and k not in expected]
    assert not foreign, f"{member} serves X the group's log does not hold: {served}"
    return served if served == expected else None


def _body_mark(key):
    """The start of the body raw_send_all gave `key` (unique in the CommitLog)."""
    prefix, i = key.split("-")
    return f"{prefix}-body-{i}-".encode()


def _routes(member):
    try:
        code, _, _, _ = remoting.call(member.addr, remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": TOPIC})
    except OSError:
        return False
    return code == 0
