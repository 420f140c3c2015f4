"""A full disk never crashes the broker.

Each test mounts a 48 MiB tmpfs, starts quiver-broker on it (--segment-size 16 MiB,
--disk-check-interval-ms 200) and drives it with the stock Apache client. What must hold:
above the high-water ratio (0.90) sends are refused with SERVICE_NOT_AVAILABLE (14) and a
remark naming the data directory and its usage; the process never dies; pulls, offset commits
and admin reads keep working; writes resume by themselves once there is space; a start on a
full, deleted or read-only disk comes up read-only and serves reads; nothing acknowledged is
lost.
"""

import os
import shutil
import time

import pytest

from disk_helpers import (
    PERCENT,
    SERVICE_NOT_AVAILABLE,
    commit_offsets,
    fill,
    poll,
    raw_send,
    start_reader,
    stored_count,
)
from quiver_e2e import wait_until

TOPIC = "DiskTopic"
BIGGER_MIB = 96
RESUME_WITHIN_S = 5  # "within a few seconds": 25 disk checks at 200 ms
DRAIN_WITHIN_S = 180


def fill_until_refused(broker, disk, name):
    """One producer sends 1 KiB messages until 5 sends in a row fail; returns what it recorded."""
    result = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, f"{name}.txt"))
    broker.assert_alive(f"while one producer filled the {disk.size_mib} MiB tmpfs ({result.summary()})")
    assert result.stop == "refused", f"the producer never met a refusal: {result.summary()}\n{result.output}"
    # 48 MiB at 90% holds about 35,000 1 KiB messages; far fewer means something else failed.
    assert len(result.acked) > 10_000, f"refused far too early: {result.summary()}"
    return result


def assert_send_refused(broker, disk, key, words=(), names_dir=True):
    """A send (raw remoting, so the broker's own code and remark show) is refused with code 14
    and a remark naming the data directory (`names_dir`) and saying `words`; returns it."""
    code, remark = raw_send(broker.addr, TOPIC, key, "refused?")
    assert code == SERVICE_NOT_AVAILABLE, (
        f"send while the disk is full: expected code {SERVICE_NOT_AVAILABLE} (SERVICE_NOT_AVAILABLE), "
        f"got {code} remark {remark!r}; df: {disk.usage()}")
    assert not names_dir or disk.data_dir in remark, f"the remark does not name the data directory {disk.data_dir}: {remark!r}"
    for word in words:
        assert word in remark.lower(), f"the remark does not say {word!r}: {remark!r}"
    return remark


def assert_full_disk_refusal(broker, disk, key):
    remark = assert_send_refused(broker, disk, key)
    assert PERCENT.search(remark), f"the remark does not give the disk's usage percent: {remark!r}"
    return remark


def assert_read_only_ready(broker, *words):
    status, body = broker.http("/readyz")
    assert status == 200, f"/readyz answered {status}: {body!r}"
    assert body.startswith("ready"), f"/readyz body does not start with 'ready': {body!r}"
    assert "read-only" in body, f"/readyz does not say read-only: {body!r}"
    for word in words:
        assert word in body.lower(), f"/readyz does not say {word!r}: {body!r}"
    return body


def assert_not_writable(broker, *reasons):
    assert broker.metric_value("quiver_store_writable") == 0, _metrics(broker, "quiver_store_")
    refusals = {r: broker.metric_value("quiver_store_write_refusals_total", reason=r) or 0 for r in reasons}
    assert sum(refusals.values()) > 0, (
        f"no quiver_store_write_refusals_total with reason in {reasons}: {_metrics(broker, 'quiver_store_')}")
    return refusals


def _metrics(broker, prefix):
    _, text = broker.http("/metrics")
    return "\n".join(line for line in text.splitlines() if prefix in line) or f"(no {prefix}* metric)"


def wait_send_accepted(broker, key, within):
    """Sends (raw) until the broker accepts; returns seconds taken."""
    def attempt():
        code, remark = raw_send(broker.addr, TOPIC, key, f"body of {key}")
        return code == 0, (code, remark)

    took, _ = poll(attempt, within, f"a send to be accepted again within {within}s")
    return took


def send_more(broker, disk, name, first, count):
    """The stock client sends `count` more messages; all must be acknowledged."""
    more = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, f"{name}.txt"), first=first,
                max_count=count, fail_streak=3, deadline_s=120)
    assert len(more.acked) == count, f"sends after space came back: {more.summary()}"
    return more.acked


def drain(broker, group, expected, within=DRAIN_WITHIN_S):
    """A new consumer group reads the topic from its start and must read back every key of
    `expected` with its body."""
    commit_offsets(broker.addr, group, TOPIC, 0)
    reader, consumer = start_reader(broker.addr, group, TOPIC)
    try:
        wait_until(lambda: reader.has_all(expected), within,
                   f"{len(expected)} acknowledged messages read back (read {reader.count()})")
    finally:
        consumer.shutdown()
    reader.check(expected)
    return reader


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_fill_until_refused_then_resume(make_broker, disk, flush_mode):
    broker = make_broker(flush_mode=flush_mode, early_retention=False).start()
    result = fill_until_refused(broker, disk, "fill")
    expected = dict(result.acked)

    remark = assert_full_disk_refusal(broker, disk, "probe-refused-1")
    ready_body = assert_read_only_ready(broker)
    refusals = assert_not_writable(broker, "disk-high-water", "no-space")
    ratio = broker.metric_value("quiver_store_disk_used_ratio")
    used_ratio = disk.usage()[2]
    assert ratio is not None and abs(ratio - used_ratio) < 0.05, (
        f"quiver_store_disk_used_ratio {ratio} while df says {used_ratio:.3f}")
    # Admin reads keep working: the queues hold at least every acknowledged message.
    assert stored_count(broker.addr, TOPIC) >= len(expected)

    # Pulls and offset commits keep working during the refusal.
    group = f"DiskReader{flush_mode}"
    commit_offsets(broker.addr, group, TOPIC, 0)
    reader, consumer = start_reader(broker.addr, group, TOPIC)
    try:
        wait_until(lambda: reader.count() >= 1000, 60, "a consumer to read 1,000 messages during the refusal")
        wait_until(lambda: (broker.metric_value("quiver_consumer_committed_offset", consumer_group=group) or 0) > 0,
                   30, "the consumer's offset commits during the refusal")
        # Still refused: the reading above happened while sends were refused.
        assert_full_disk_refusal(broker, disk, "probe-refused-2")
        broker.assert_alive("while a consumer read from the full disk")

        # Space appears: sends resume by themselves, without a restart.
        disk.resize(BIGGER_MIB)
        took = wait_send_accepted(broker, "probe-accepted", RESUME_WITHIN_S)
        expected["probe-accepted"] = "body of probe-accepted"
        assert broker.metric_value("quiver_store_writable") == 1
        expected.update(send_more(broker, disk, "more", result.next_index, 200))
        status, body = broker.http("/readyz")
        assert status == 200 and "read-only" not in body, f"/readyz once writable again: {status} {body!r}"

        wait_until(lambda: reader.has_all(expected), DRAIN_WITHIN_S,
                   f"{len(expected)} acknowledged messages read back (read {reader.count()})")
    finally:
        consumer.shutdown()
    reader.check(expected)
    broker.assert_alive("at the end")
    assert "panicked" not in broker.log_text()
    print(f"\n{result.summary()}\nremark: {remark!r}\n/readyz: {ready_body!r}\n"
          f"refusals: {refusals}; resumed {took:.1f}s after the remount")


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_enospc_without_high_water_then_resume(make_broker, disk, flush_mode):
    """--disk-high-water-ratio 1.0: no early refusal, so writes run into ENOSPC itself (the
    original SIGBUS): they must be refused as no-space, a restart on the 100% full disk comes
    up read-only, and after growing the disk nothing acknowledged is lost."""
    broker = make_broker(flush_mode=flush_mode, early_retention=False,
                         more=["--disk-high-water-ratio", "1.0"]).start()
    result = fill_until_refused(broker, disk, "fill")
    expected = dict(result.acked)
    remark = assert_full_disk_refusal(broker, disk, "probe-refused")
    ready_body = assert_read_only_ready(broker)
    refusals = assert_not_writable(broker, "no-space")
    time.sleep(1)  # a few disk checks and flushes on the full file system
    broker.assert_alive("refusing on ENOSPC")

    # The original bug's second half: a restart on the 100% full disk died in recovery too.
    assert broker.stop() == 0, f"SIGTERM on a full disk: {broker.exit_description()}"
    broker.start()
    restarted_body = assert_read_only_ready(broker)
    assert_full_disk_refusal(broker, disk, "probe-refused-after-restart")

    disk.resize(BIGGER_MIB)
    wait_send_accepted(broker, "probe-accepted", RESUME_WITHIN_S)
    expected["probe-accepted"] = "body of probe-accepted"
    expected.update(send_more(broker, disk, "more", result.next_index, 200))
    drain(broker, f"DiskEnospcReader{flush_mode}", expected)
    broker.assert_alive("at the end")
    assert "panicked" not in broker.log_text()
    print(f"\n{result.summary()}\nremark: {remark!r}\n/readyz: {ready_body!r}\nrefusals: {refusals}\n"
          f"/readyz after the restart: {restarted_body!r}")


def test_restart_on_full_disk(make_broker, disk):
    broker = make_broker(early_retention=False).start()
    result = fill_until_refused(broker, disk, "fill")
    expected = dict(result.acked)
    assert_full_disk_refusal(broker, disk, "probe-before-stop")

    code = broker.stop()
    assert code == 0, f"SIGTERM on a full disk: {broker.exit_description()}\n{broker.log_tail(40)}"
    assert disk.usage()[2] >= 0.85, f"the disk is no longer full after the stop: {disk.usage()}"

    broker.start()  # ready (/readyz 200) within e2e/broker's normal 30 s start timeout
    assert_read_only_ready(broker)
    assert_full_disk_refusal(broker, disk, "probe-after-restart")
    assert_not_writable(broker, "disk-high-water", "no-space")

    drain(broker, "DiskRestartReader", expected)
    assert_full_disk_refusal(broker, disk, "probe-after-drain")

    disk.resize(BIGGER_MIB)
    wait_send_accepted(broker, "probe-accepted", RESUME_WITHIN_S)
    send_more(broker, disk, "more", result.next_index, 100)
    broker.assert_alive("at the end")


def test_kill9_during_refusal_then_restart_with_space(make_broker, disk):
    broker = make_broker(early_retention=False).start()
    result = fill_until_refused(broker, disk, "fill")
    expected = dict(result.acked)
    assert_full_disk_refusal(broker, disk, "probe-before-kill")

    broker.kill9()
    disk.resize(BIGGER_MIB)
    broker.start()
    wait_send_accepted(broker, "probe-accepted", RESUME_WITHIN_S)
    expected["probe-accepted"] = "body of probe-accepted"
    drain(broker, "DiskKillReader", expected)
    broker.assert_alive("at the end")


def test_data_directory_deleted_while_running(make_broker, disk):
    broker = make_broker().start()
    before = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, "before.txt"), max_count=200,
                  fail_streak=3, deadline_s=120)
    assert len(before.acked) == 200, before.summary()

    shutil.rmtree(disk.data_dir)

    def attempt():
        code, remark = raw_send(broker.addr, TOPIC, "probe-deleted", "x")
        return code != 0, (code, remark)

    _, (code, remark) = poll(attempt, 10, "a send to be refused after rm -rf of the data directory")
    assert "deleted" in remark.lower(), f"refused with code {code}, remark {remark!r}: does not say deleted"
    assert code == SERVICE_NOT_AVAILABLE, f"refused with code {code} (expected 14), remark {remark!r}"
    time.sleep(2)  # some disk checks and flushes later
    broker.assert_alive("after its data directory was deleted")
    status, body = broker.http("/readyz")
    assert "deleted" in body.lower(), f"/readyz ({status}) does not say the data directory was deleted: {body!r}"
    print(f"\nremark: {remark!r}\n/readyz {status}: {body!r}")
    assert_not_writable(broker, "data-dir-gone")
    # The stock client is refused too.
    after = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, "after.txt"), first=1000,
                 max_count=3, fail_streak=3, deadline_s=60)
    assert not after.acked, f"sends acknowledged after the data directory was deleted: {after.summary()}"
    broker.assert_alive("at the end")


def test_start_on_read_only_file_system(make_broker, disk):
    broker = make_broker().start()
    before = fill(broker.addr, TOPIC, os.path.join(disk.work_dir, "before.txt"), max_count=300,
                  fail_streak=3, deadline_s=120)
    assert len(before.acked) == 300, before.summary()
    assert broker.stop() == 0, broker.exit_description()

    disk.remount_read_only()
    broker.start()
    assert_read_only_ready(broker)
    remark = assert_send_refused(broker, disk, "probe-ro", words=("read-only",), names_dir=False)
    assert_not_writable(broker, "read-only-fs")
    print(f"\nremark: {remark!r}\n/readyz: {broker.http('/readyz')}")
    drain(broker, "DiskReadOnlyReader", before.acked)
    broker.assert_alive(f"serving a read-only file system (remark {remark!r})")
