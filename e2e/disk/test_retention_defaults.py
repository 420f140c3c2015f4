"""The default disk ratios on the same 48 MiB tmpfs: retention frees space early, the broker
never dies, and a group with committed offsets is protected up to --disk-force-clean-ratio.

Documented behaviour (docs/OPERATIONS.md, docs/CONFIGURATION.md, docs/METRICS.md): above
--disk-clean-ratio (0.75) retention deletes, every 10 s, the CommitLog files every group with
committed offsets has read (all of them while there is no such group); above
--disk-force-clean-ratio (0.85) the oldest file goes even if a group has not read it. So with the defaults acknowledged messages nobody consumed
ARE deleted: these tests pin that down rather than the no-loss promise of test_full_disk.py.
"""

import os

from disk_helpers import commit_offsets, fill, poll, raw_send, start_reader
from quiver_e2e import wait_until

TOPIC = "DiskTopic"
CAPACITY = 40_000  # 1 KiB messages 48 MiB holds, roughly


def deleted(broker, reason):
    return broker.metric_value("quiver_store_segments_deleted_total", reason=reason) or 0


def resumes(broker, within):
    def attempt():
        code, remark = raw_send(broker.addr, TOPIC, "probe", "probe")
        return code == 0, (code, remark)

    return poll(attempt, within, "sends to be accepted again after retention ran")[0]


def produce_through_refusals(broker, disk, total, rounds=8):
    """Sends until `total` messages are acknowledged; after a refusal, waits for retention to
    make room (it runs every 10 s) and goes on. Returns every acknowledged key and body."""
    acked, next_index, refusals = {}, 0, 0
    for round_ in range(rounds):
        result = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, f"round-{round_}.txt"),
                      first=next_index, max_count=total - len(acked), deadline_s=180)
        broker.assert_alive(f"during round {round_} ({result.summary()})")
        acked.update(result.acked)
        next_index = result.next_index
        if len(acked) >= total:
            return acked, refusals
        assert result.stop == "refused", result.summary()
        refusals += 1
        resumes(broker, 20)
    raise AssertionError(f"only {len(acked)} of {total} acknowledged in {rounds} rounds")


def test_no_group_retention_frees_the_disk(make_broker, disk):
    """No group has committed offsets: retention deletes files above 0.75 as read by all; a
    producer sends 2.5 times what the disk holds and the broker stays up and writable."""
    broker = make_broker().start()
    acked, refusals = produce_through_refusals(broker, disk, int(CAPACITY * 2.5))
    broker.assert_alive("after 2.5 disks' worth of sends")
    assert deleted(broker, "disk-clean") >= 2, _store_metrics(broker)
    assert deleted(broker, "disk-force-clean") == 0, _store_metrics(broker)
    used = disk.usage()[2]
    assert used <= 0.95, f"the disk is {used:.0%} used after retention"

    # The newest messages are still there; a group starting at offset 0 is moved on to the
    # oldest message kept and reads through to the end.
    newest = dict(sorted(acked.items(), key=lambda kv: int(kv[0][2:]))[-5_000:])
    commit_offsets(broker.addr, "DiskLateReader", TOPIC, 0)
    reader, consumer = start_reader(broker.addr, "DiskLateReader", TOPIC)
    try:
        wait_until(lambda: reader.has_all(newest), 120, "the newest 5,000 messages read back")
    finally:
        consumer.shutdown()
    reader.check(newest)
    print(f"\n{len(acked)} acknowledged through {refusals} refusals; {_store_metrics(broker)}")


def test_a_group_with_offsets_is_protected_until_force_clean(make_broker, disk):
    """A group committed offset 0 and reads nothing: disk-clean never deletes what it has not
    read; past 0.85 force-clean deletes the oldest file anyway (counted), which lifts the
    refusal without a restart or more space."""
    broker = make_broker().start()
    # The topic must exist before offsets can be committed on its queues.
    first = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, "first.txt"), max_count=10,
                 fail_streak=3, deadline_s=60)
    assert len(first.acked) == 10, first.summary()
    commit_offsets(broker.addr, "DiskLaggard", TOPIC, 0)

    result = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, "fill.txt"), first=10)
    broker.assert_alive(f"while filling ({result.summary()})")
    assert result.stop == "refused", f"never refused: {result.summary()}"
    wait_until(lambda: deleted(broker, "disk-force-clean") >= 1, 30,
               "force-clean to delete the oldest file above 0.85")
    resumes(broker, 15)
    assert deleted(broker, "disk-clean") == 0, (
        f"disk-clean deleted files the group had not read: {_store_metrics(broker)}")
    broker.assert_alive("after force-clean")
    assert "panicked" not in broker.log_text()
    print(f"\n{result.summary()}; {_store_metrics(broker)}")


def _store_metrics(broker):
    _, text = broker.http("/metrics")
    return "; ".join(line for line in text.splitlines()
                     if line.startswith(("quiver_store_segments_deleted_total", "quiver_store_writable",
                                         "quiver_store_disk_used_ratio", "quiver_store_write_refusals_total")))
