"""The checker itself, on hand-made histories (no broker)."""

from checker import Ack, Stored, check, check_consumer, longest_gap


def stored_queue(queue, keys):
    return [Stored(queue, i, k) for i, k in enumerate(keys)]


def test_clean_history_passes():
    acks = [Ack("k-0", 0, 0), Ack("k-1", 1, 0), Ack("k-2", 0, 1)]
    stored = stored_queue(0, ["k-0", "k-2"]) + stored_queue(1, ["k-1"])
    report = check(acks, stored, {"k-0", "k-1", "k-2"})
    assert report.problems() == []
    assert (report.acked, report.present, report.duplicates, report.unacked_present) == (3, 3, 0, 0)


def test_lost_acknowledged_message():
    acks = [Ack("k-0", 0, 0), Ack("k-1", 0, 1)]
    report = check(acks, stored_queue(0, ["k-0"]), {"k-0", "k-1"})
    assert report.lost == ["k-1"]
    assert any("lost" in p for p in report.problems())


def test_duplicates_and_unacked_are_allowed_but_counted():
    # k-1 was retried: its first attempt was stored (unacknowledged), the retry acknowledged.
    # k-3 was sent, never acknowledged, but stored.
    acks = [Ack("k-0", 0, 0), Ack("k-1", 0, 2)]
    stored = stored_queue(0, ["k-0", "k-1", "k-1", "k-3"])
    report = check(acks, stored, {"k-0", "k-1", "k-3"})
    assert report.problems() == []
    assert (report.duplicates, report.duplicated_keys, report.unacked_present) == (1, 1, 1)


def test_ack_whose_offset_holds_another_message_is_misplaced():
    # The acknowledged copy at offset 1 was truncated by a failover; a later, unacknowledged
    # attempt of the same key now sits at offset 3, and offset 1 holds k-2.
    acks = [Ack("k-0", 0, 0), Ack("k-1", 0, 1)]
    stored = stored_queue(0, ["k-0", "k-2", "k-4", "k-1"])
    report = check(acks, stored, {"k-0", "k-1", "k-2", "k-4"})
    assert [m[0] for m in report.misplaced] == ["k-1"]
    assert report.problems()


def test_order_violation_within_a_queue():
    # Acknowledged k-0 then k-1 on queue 0, stored the other way round.
    acks = [Ack("k-0", 0, -1), Ack("k-1", 0, -1)]
    stored = stored_queue(0, ["k-1", "k-0"])
    report = check(acks, stored, {"k-0", "k-1"})
    assert len(report.order) == 1
    # Different queues are not ordered against each other.
    acks = [Ack("k-0", 0, -1), Ack("k-1", 1, -1)]
    stored = [Stored(1, 0, "k-1"), Stored(0, 0, "k-0")]
    assert check(acks, stored).order == []


def test_order_violation_with_offsets():
    acks = [Ack("k-0", 2, 1), Ack("k-1", 2, 0)]
    report = check(acks, stored_queue(2, ["k-1", "k-0"]), {"k-0", "k-1"})
    assert report.order and not report.misplaced and not report.lost


def test_holes_and_phantoms():
    stored = [Stored(0, 0, "k-0"), Stored(0, 2, "k-1"), Stored(1, 0, "zz")]
    report = check([Ack("k-0", 0, 0)], stored, {"k-0", "k-1"})
    assert len(report.holes) == 1 and report.holes[0][0] == 0
    assert report.phantoms == ["zz"]
    # A queue starting above 0 has lost its head.
    assert check([], [Stored(3, 1, "k-0")], {"k-0"}).holes


def test_consumer_check():
    acks = [Ack("k-0", 0, 0), Ack("k-1", 0, 1), Ack("k-2", 1, 0)]
    report = check_consumer(acks, {"k-0": 2, "k-1": 1, "k-9": 1})
    assert report.skipped == ["k-2"]
    assert report.duplicates == 1 and report.deliveries == 4
    assert check_consumer(acks, {"k-0": 1, "k-1": 1, "k-2": 3}).skipped == []


def test_longest_gap():
    assert longest_gap([0.0, 0.1, 0.2, 1.5, 1.6])[0] == 1.5 - 0.2
    gap = longest_gap([0.0, 5.0, 5.1, 5.3, 5.4], start=5.05)
    assert round(gap[0], 3) == 0.2
    assert longest_gap([])[0] == 0.0


def test_producer_history_parsing():
    from workload import History
    lines = ["try 0 1.0", "ack 0 0 0 1.5 ID0", "try 1 2.0", "fail 1 3.0 ProducerSendOrderlyFailed: x",
             "try 1 4.0", "notok 1 SEND_FLUSH_SLAVE_TIMEOUT 7.0", "try 1 8.0", "ack 1 1 0 8.2 ID1",
             "try 2 9.0", "ack 2 2"]  # the last line cut short by a kill
    h = History(lines)
    assert [a.key for a in h.acks] == ["k-0", "k-1"]
    assert h.ack_started == [1.0, 8.0] and h.next_key == 2
    assert h.sent == {"k-0", "k-1", "k-2"}
    assert len(h.failures) == 1 and h.not_ok[0][1] == "SEND_FLUSH_SLAVE_TIMEOUT"
