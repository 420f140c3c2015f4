"""The nemesis checker on hand-made histories (no broker)."""

from nemesis_checker import AckRec, Delivery, Served, check_run, loss_windows


def ack(key, queue, offset, t=1.0):
    return AckRec(key, queue, offset, t - 0.01, t, "p")


def rows(queue, keys):
    return [(queue, i, k) for i, k in enumerate(keys)]


def deliver(queue, keys, t0=10.0, consumer="c"):
    return [Delivery(t0 + i * 0.01, consumer, queue, i, k) for i, k in enumerate(keys)]


def clean():
    acks = [ack("a-0", 0, 0), ack("a-1", 1, 0), ack("a-2", 0, 1)]
    final = {"m0": rows(0, ["a-0", "a-2"]) + rows(1, ["a-1"])}
    final["m1"] = list(final["m0"])
    final["m2"] = list(final["m0"])
    deliveries = deliver(0, ["a-0", "a-2"]) + deliver(1, ["a-1"], t0=11.0)
    commits = [(20.0, 0, 2), (20.0, 1, 1)]
    return acks, {"a-0", "a-1", "a-2", "a-3"}, final, deliveries, commits


def test_clean_run_passes():
    acks, sent, final, deliveries, commits = clean()
    report = check_run(acks, sent, [], final, "m0", deliveries, commits)
    assert report.violations() == {}, report.problems()
    assert (report.acked, report.duplicates, report.redeliveries, report.rewinds) == (3, 0, 0, 0)


def test_lost_when_the_acknowledged_offset_holds_another_key():
    acks, sent, final, deliveries, commits = clean()
    # The final master truncated a-2 and a later unacknowledged a-3 took offset 1 of queue 0.
    final = {m: [(q, o, "a-3" if (q, o) == (0, 1) else k) for q, o, k in r] for m, r in final.items()}
    report = check_run(acks, sent, [], final, "m0", deliveries, commits)
    assert [x[0] for x in report.lost] == ["a-2"]
    assert report.lost[0][4] == "a-3"
    # The consumer got a-2 at (0, 1) earlier: a conflict too.
    assert [(c[0], c[1]) for c in report.conflicts] == [(0, 1)]


def test_lost_key_present_elsewhere_is_still_lost():
    acks = [ack("a-0", 0, 0)]
    final = {"m0": [(0, 0, "x-9"), (0, 1, "a-0")]}
    report = check_run(acks, {"a-0", "x-9"}, [], final, "m0", [], [])
    assert report.lost and report.lost[0][5] == [(0, 1)]


def test_divergent_members():
    acks, sent, final, deliveries, commits = clean()
    final["m2"] = rows(0, ["a-0"]) + rows(1, ["a-1"])  # m2 lacks (0, 1)
    report = check_run(acks, sent, [], final, "m0", deliveries, commits)
    assert [(d[0], d[1]) for d in report.divergent] == [(0, 1)]
    assert report.divergent[0][2]["m2"] is None
    assert not report.lost


def test_conflict_between_two_reads_during_the_run():
    acks, sent, final, deliveries, commits = clean()
    served = [Served(5.0, "member-1", 1, 1, "a-3"), Served(6.0, "member-2", 1, 1, "a-3")]
    # Later the final state has nothing at (1, 1): a record served and truncated.
    report = check_run(acks, sent, served, final, "m0", deliveries, commits)
    assert report.conflicts == []  # served once, one key: no conflict ...
    served.append(Served(7.0, "member-0", 1, 1, "a-9"))
    report = check_run(acks, sent | {"a-9"}, served, final, "m0", deliveries, commits)
    assert [(c[0], c[1]) for c in report.conflicts] == [(1, 1)]
    assert set(report.conflicts[0][2]) == {"a-3", "a-9"}


def test_poll_skip_when_committed_offset_passed_an_undelivered_message():
    acks, sent, final, deliveries, commits = clean()
    deliveries = [d for d in deliveries if d.key != "a-2"]
    report = check_run(acks, sent, [], final, "m0", deliveries, commits)
    assert [s[0] for s in report.poll_skips] == ["a-2"]
    # Delivered only after the committed offset passed it: still a skip.
    late = deliveries + [Delivery(30.0, "c", 0, 1, "a-2")]
    report = check_run(acks, sent, [], final, "m0", late, commits)
    assert [s[0] for s in report.poll_skips] == ["a-2"] and report.poll_skips[0][4] == 30.0


def test_undelivered_without_commit_past_it():
    acks, sent, final, deliveries, commits = clean()
    deliveries = [d for d in deliveries if d.key != "a-2"]
    report = check_run(acks, sent, [], final, "m0", deliveries, [(20.0, 0, 1), (20.0, 1, 1)])
    assert report.poll_skips == [] and [u[0] for u in report.undelivered] == ["a-2"]


def test_non_monotonic_and_allowed_rewinds():
    acks, sent, final, deliveries, commits = clean()
    # A rewind that replays (0, 0) after (0, 1): allowed, counted.
    replay = deliveries + [Delivery(12.0, "c", 0, 0, "a-0"), Delivery(12.1, "c", 0, 1, "a-2")]
    report = check_run(acks, sent, [], final, "m0", replay, commits)
    assert report.non_monotonic == [] and report.rewinds == 2 and report.redeliveries == 2
    # First delivery of (0, 0) after (0, 1): out of order.
    swapped = [Delivery(10.0, "c", 0, 1, "a-2"), Delivery(10.1, "c", 0, 0, "a-0"),
               Delivery(11.0, "c", 1, 0, "a-1")]
    report = check_run(acks, sent, [], final, "m0", swapped, commits)
    assert [(n[1], n[2], n[3]) for n in report.non_monotonic] == [(0, 1, 0)]
    # Streams of two consumers are separate.
    two = [Delivery(10.0, "c1", 0, 1, "a-2"), Delivery(10.1, "c2", 0, 0, "a-0"),
           Delivery(11.0, "c1", 1, 0, "a-1")]
    assert check_run(acks, sent, [], final, "m0", two, commits).non_monotonic == []


def test_holes_phantoms_duplicates():
    acks = [ack("a-0", 0, 0)]
    final = {"m0": [(0, 0, "a-0"), (0, 2, "a-0"), (1, 0, "zz")]}
    report = check_run(acks, {"a-0"}, [], final, "m0", [], [])
    assert report.holes and report.holes[0][0] == 0
    assert [p[0] for p in report.phantoms] == ["zz"]
    assert report.duplicates == 1


def test_an_async_answer_delayed_past_the_window_counts_by_when_it_was_sent():
    # Sent just before the kill's window closed, answered 4 s later (the master was paused
    # between deciding and answering): the broker decided within the window.
    late = AckRec("late", 0, 0, 10.1, 14.5, "p")
    # Sent after the window closed: the broker cannot have decided within it.
    after = AckRec("after", 0, 1, 10.5, 14.5, "p")
    windows = loss_windows([(10.0, "kill")], lag_max_s=1.0, master_timeout_s=1.0)
    report = check_run([late, after], {"late", "after"}, [], {"m0": []}, "m0", [], [],
                       loss_windows=windows)
    assert [x[0] for x in report.lost_in_window] == ["late"]
    assert [x[0] for x in report.lost] == ["after"]


def test_async_losses_inside_the_window_are_allowed_and_counted():
    acks = [ack("a-0", 0, 0, t=1.0), ack("a-1", 0, 1, t=9.5), ack("a-2", 0, 2, t=12.0)]
    final = {"m0": rows(0, ["a-0"])}
    windows = loss_windows([(10.0, "kill")], lag_max_s=1.0, master_timeout_s=1.0)
    report = check_run(acks, {"a-0", "a-1", "a-2"}, [], final, "m0",
                       deliver(0, ["a-0", "a-1", "a-2"]), [], loss_windows=windows)
    assert [x[0] for x in report.lost_in_window] == ["a-1"]
    assert [x[0] for x in report.lost] == ["a-2"]  # acknowledged after the kill: outside
    assert "lost" in report.violations()
    # A partition's window runs until the master timeout after the cut.
    windows = loss_windows([(10.0, "partition")], lag_max_s=1.0, master_timeout_s=3.0)
    report = check_run(acks, {"a-0", "a-1", "a-2"}, [], final, "m0",
                       deliver(0, ["a-0", "a-1", "a-2"]), [], loss_windows=windows)
    assert report.lost == [] and len(report.lost_in_window) == 2
    # A message lost within its window is neither a poll skip nor undelivered, even when the
    # group's committed offset passed its offset.
    report = check_run(acks, {"a-0", "a-1", "a-2"}, [], final, "m0", deliver(0, ["a-0"]),
                       [(20.0, 0, 3)], loss_windows=windows)
    assert report.violations() == {}, report.problems()
    # Sync mode: every loss counts.
    report = check_run(acks, {"a-0", "a-1", "a-2"}, [], final, "m0",
                       deliver(0, ["a-0", "a-1", "a-2"]), [])
    assert len(report.lost) == 2 and report.lost_in_window == []
