"""The nemesis checker: pure Python, no broker. It judges a whole run by every delivery's
(queue, queue offset, key), not by keys alone.

Inputs (all times are CLOCK_MONOTONIC seconds, shared by every process of the machine):

- acks: `AckRec` per acknowledged send (SEND_OK): key, queue, queue offset, when it was sent and
  acknowledged, and by which producer. A retried message gets a new key, so a key is
  acknowledged at most once.
- sent: every key any producer tried (acknowledged or not).
- served: `Served` per record any reader saw during the run (raw PULL from offset 0 on each
  member, and every delivery to the consumer group): time, source, queue, offset, key.
- final: {member: [(queue, offset, key)]}, what each member serves after the final heal and
  catch-up, and `final_master`, the member that was master then.
- deliveries: `Delivery` per message the consumer group was given, in the order the (single
  consume thread) consumer got them: time, consumer, queue, offset, key.
- commits: (time, queue, committed offset) samples of the group's committed offsets
  (QUERY_CONSUMER_OFFSET on the master during the run, and at the end).
- loss_windows: None in sync mode (no acknowledged message may be lost); in async mode the
  [start, end] intervals in which an acknowledged message may be lost (see `check`).

What is checked (each must be empty/0 unless said otherwise):

- lost: acknowledged, but the final master does not hold the key at the queue offset its
  SEND_OK named (the key may be elsewhere: a retry's copy is not the acknowledged one). In
  async mode only the losses outside every loss window count as violations; the others are
  counted and reported. The broker decided an acknowledgement somewhere between the send
  and the answer's arrival: a loss is within a window when that interval meets it.
- divergent: a (queue, offset) that members serve with different keys, or that one member serves
  and another does not, after the final heal and catch-up.
- conflicts: a (queue, offset) served with two different keys at any time during the run, by
  any member or to the consumer (a record served and later truncated and replaced is a bug:
  reads see only what every in-sync member holds).
- poll_skips: an acknowledged (queue, offset, key) not delivered to the consumer group before the
  first sample in which the group's committed offset of that queue was past the offset (in
  async mode, messages lost within a loss window are left out of this and of `undelivered`).
- undelivered: an acknowledged message the consumer group never received by the end.
- non_monotonic: per consumer and queue, in delivery order, a FIRST delivery of an offset below an
  offset already delivered. The rule for resets: after a rebalance, a restart or a failover the
  consumer starts again from the group's committed offset, which may be behind what it already
  consumed, so going back is allowed when what comes back is a redelivery (that (queue, offset)
  was delivered before with the same key). New data behind the consumer's front is not:
  it means the queue was served out of order or the consumer was made to skip it earlier.
- holes: a queue of the final master whose offsets are not 0, 1, 2, ... (must be 0);
- phantoms: a served key nobody sent.
- duplicates (extra stored copies of a key on the final master) and redeliveries (deliveries to
  the group beyond the first per (queue, offset)) are counted and reported, not violations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AckRec:
    key: str
    queue: int
    offset: int
    sent_at: float
    acked_at: float
    producer: str = ""


@dataclass(frozen=True)
class Served:
    t: float
    source: str
    queue: int
    offset: int
    key: str


@dataclass(frozen=True)
class Delivery:
    t: float
    consumer: str
    queue: int
    offset: int
    key: str


@dataclass
class NemesisReport:
    acked: int = 0
    sent: int = 0
    final_master: str = ""
    final_stored: int = 0
    lost: list = field(default_factory=list)  # (key, queue, offset, acked_at, what is there, where the key is)
    lost_in_window: list = field(default_factory=list)
    divergent: list = field(default_factory=list)  # (queue, offset, {member: key or None})
    conflicts: list = field(default_factory=list)  # (queue, offset, {key: [(source, t)]})
    poll_skips: list = field(default_factory=list)
    undelivered: list = field(default_factory=list)
    non_monotonic: list = field(default_factory=list)
    rewinds: int = 0
    holes: list = field(default_factory=list)
    phantoms: list = field(default_factory=list)
    duplicates: int = 0
    redeliveries: int = 0
    unacked_present: int = 0
    served_records: int = 0
    deliveries: int = 0
    async_mode: bool = False

    def violations(self):
        """{name: items} of every check that must be empty (in async mode, losses inside a
        loss window are allowed)."""
        out = {}
        for name in ("lost", "divergent", "conflicts", "poll_skips", "undelivered",
                     "non_monotonic", "holes", "phantoms"):
            items = getattr(self, name)
            if items:
                out[name] = items
        return out

    def problems(self, limit=10):
        return [f"{len(items)} {name}, e.g. {items[:limit]}" for name, items in self.violations().items()]

    def summary(self):
        loss = (f"lost={len(self.lost)}" if not self.async_mode else
                f"lost_outside_window={len(self.lost)} lost_in_window={len(self.lost_in_window)}")
        return (f"acked={self.acked} sent={self.sent} {loss} divergent={len(self.divergent)} "
                f"conflicts={len(self.conflicts)} poll_skips={len(self.poll_skips)} "
                f"undelivered={len(self.undelivered)} non_monotonic={len(self.non_monotonic)} "
                f"holes={len(self.holes)} phantoms={len(self.phantoms)} "
                f"duplicates={self.duplicates} unacked_present={self.unacked_present} "
                f"deliveries={self.deliveries} redeliveries={self.redeliveries} "
                f"rewinds={self.rewinds} served_records={self.served_records} "
                f"final_master={self.final_master} final_stored={self.final_stored}")


def in_windows(t, windows):
    return any(start <= t <= end for start, end in windows)


def acknowledged_in_windows(sent_at, acked_at, windows):
    """Whether the broker may have decided the acknowledgement within a window: the client
    only knows it happened between sending and receiving the answer (a master paused, or
    cut off, between deciding and the answer reaching the client answers late)."""
    return any(sent_at <= end and start <= acked_at for start, end in windows)


def check_run(acks, sent, served, final, final_master, deliveries, commits, loss_windows=None):
    report = NemesisReport(acked=len(acks), sent=len(sent), final_master=final_master,
                           async_mode=loss_windows is not None)
    master_rows = final.get(final_master, [])
    report.final_stored = len(master_rows)
    at = {}  # (queue, offset) -> key on the final master
    where = defaultdict(list)  # key -> [(queue, offset)] on the final master
    by_queue = defaultdict(list)
    for queue, offset, key in master_rows:
        at[(queue, offset)] = key
        where[key].append((queue, offset))
        by_queue[queue].append(offset)

    # Holes of the final master.
    for queue, offsets in sorted(by_queue.items()):
        offsets.sort()
        if offsets != list(range(len(offsets))):
            missing = sorted(set(range(offsets[-1] + 1)) - set(offsets))
            report.holes.append((queue, f"missing {missing[:10]}",
                                 f"repeated {len(offsets) - len(set(offsets))}"))

    # Lost: the acknowledged (queue, offset) does not hold the key on the final master.
    acked_keys = set()
    for ack in acks:
        acked_keys.add(ack.key)
        if at.get((ack.queue, ack.offset)) == ack.key:
            continue
        item = (ack.key, ack.queue, ack.offset, round(ack.acked_at, 3),
                at.get((ack.queue, ack.offset)), sorted(where.get(ack.key, [])))
        if loss_windows is not None and acknowledged_in_windows(ack.sent_at, ack.acked_at,
                                                                loss_windows):
            report.lost_in_window.append(item)
        else:
            report.lost.append(item)

    for key, places in where.items():
        if len(places) > 1:
            report.duplicates += len(places) - 1
        if key not in acked_keys and key in sent:
            report.unacked_present += 1

    # Divergence after the final heal: every member must serve the same map.
    maps = {m: {(q, o): k for q, o, k in rows} for m, rows in final.items()}
    positions = set()
    for rows in maps.values():
        positions.update(rows)
    for pos in sorted(positions):
        seen = {m: rows.get(pos) for m, rows in sorted(maps.items())}
        if len(set(seen.values())) > 1:
            report.divergent.append((pos[0], pos[1], seen))

    # Conflicts: one (queue, offset), two keys, ever.
    keys_at = defaultdict(lambda: defaultdict(list))
    everything = list(served) + [Served(d.t, f"consumer:{d.consumer}", d.queue, d.offset, d.key)
                                 for d in deliveries]
    everything += [Served(float("inf"), f"final:{m}", q, o, k) for m, rows in final.items()
                   for q, o, k in rows]
    report.served_records = len(everything)
    for s in everything:
        sources = keys_at[(s.queue, s.offset)][s.key]
        if len(sources) < 5:
            sources.append((s.source, round(s.t, 3)))
        if s.key not in sent and not s.key.startswith(("probe-", "post-mortem")):
            report.phantoms.append((s.key, s.queue, s.offset, s.source))
    for pos, keys in sorted(keys_at.items()):
        if len(keys) > 1:
            report.conflicts.append((pos[0], pos[1], {k: v for k, v in keys.items()}))
    report.phantoms = sorted(set(report.phantoms))

    # The consumer group.
    report.deliveries = len(deliveries)
    first_delivery = {}  # (queue, offset, key) -> earliest time
    for d in deliveries:
        k = (d.queue, d.offset, d.key)
        if k in first_delivery:
            report.redeliveries += 1
            first_delivery[k] = min(first_delivery[k], d.t)
        else:
            first_delivery[k] = d.t
    delivered_keys = {d.key for d in deliveries}
    passed = defaultdict(list)  # queue -> [(t, committed)] in time order
    for t, queue, committed in sorted(commits):
        passed[queue].append((t, committed))
    allowed_loss = {item[0] for item in report.lost_in_window}
    for ack in acks:
        if ack.key in allowed_loss:
            continue  # async: lost within its window, so neither delivered nor skipped
        when = first_delivery.get((ack.queue, ack.offset, ack.key))
        passed_at = next((t for t, c in passed.get(ack.queue, []) if c > ack.offset), None)
        if passed_at is not None and (when is None or when > passed_at):
            report.poll_skips.append((ack.key, ack.queue, ack.offset, round(passed_at, 3),
                                      None if when is None else round(when, 3)))
        elif ack.key not in delivered_keys:
            report.undelivered.append((ack.key, ack.queue, ack.offset))

    front = {}  # (consumer, queue) -> highest offset delivered
    given = set()  # (consumer, queue, offset, key) delivered before
    for d in deliveries:
        stream = (d.consumer, d.queue)
        top = front.get(stream)
        if top is not None and d.offset <= top:
            if (d.consumer, d.queue, d.offset, d.key) in given:
                report.rewinds += 1
            else:
                report.non_monotonic.append((d.consumer, d.queue, top, d.offset, d.key, round(d.t, 3)))
        front[stream] = max(top if top is not None else -1, d.offset)
        given.add((d.consumer, d.queue, d.offset, d.key))
    return report


def loss_windows(faults, lag_max_s, master_timeout_s, slack_s=0.2):
    """Async mode: the intervals in which an acknowledged message may be lost, one per fault
    that took the master away: what it acknowledged within --replica-lag-max-ms before the
    fault began (the bound docs/REPLICATION.md states). For a partition the cut-off master lives on and may
    still acknowledge until it finds it cannot reach a quorum, --master-timeout-ms after the
    cut: the window runs until then. `slack_s` covers an answer already on its way when the
    fault began (the client's ack time is when it read the answer). faults: [(start, kind)]
    with kind "kill", "pause" or "partition"."""
    out = []
    for start, kind in faults:
        end = start + (master_timeout_s if kind == "partition" else 0.0) + slack_s
        out.append((start - lag_max_s, end))
    return out
