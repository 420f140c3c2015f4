"""The Jepsen-style checker of the replication suite: pure Python, no broker.

A history is what the producer learned (which keys it tried, which sends came back SEND_OK and
at which queue and queue offset, in the order they came back) and a read-back is what a member
serves (every stored message of the topic as (queue id, queue offset, key)). `check` compares
them:

- lost: an acknowledged key that is not stored at all (must be 0);
- misplaced: an acknowledged key not stored at the queue and offset its SEND_OK named (the
  acknowledged copy was lost and the key is only there from another, unacknowledged attempt;
  must be 0);
- order: per queue, acknowledged messages stored in an order other than the one they were
  acknowledged in (must be 0);
- holes: a queue whose offsets are not 0, 1, 2, ... without gaps (must be 0);
- phantoms: a stored key the producer never sent (must be 0);
- duplicates: extra stored copies of a key (retries create them: reported, allowed);
- unacked_present: stored keys that were sent but never acknowledged (allowed).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Ack:
    key: str
    queue: int
    offset: int  # the queue offset of the SEND_OK; -1 when the client did not say


@dataclass(frozen=True, order=True)
class Stored:
    queue: int
    offset: int
    key: str


@dataclass
class Report:
    acked: int = 0
    present: int = 0
    stored: int = 0
    lost: list = field(default_factory=list)
    misplaced: list = field(default_factory=list)
    order: list = field(default_factory=list)
    holes: list = field(default_factory=list)
    phantoms: list = field(default_factory=list)
    duplicates: int = 0
    duplicated_keys: int = 0
    unacked_present: int = 0

    def problems(self):
        """Every violation, as text; empty when the history is linearizable enough for us."""
        out = []
        for name in ("lost", "misplaced", "order", "holes", "phantoms"):
            items = getattr(self, name)
            if items:
                out.append(f"{len(items)} {name}, e.g. {items[:10]}")
        return out

    def summary(self):
        return (f"acked={self.acked} present={self.present} lost={len(self.lost)} "
                f"misplaced={len(self.misplaced)} order_violations={len(self.order)} "
                f"holes={len(self.holes)} phantoms={len(self.phantoms)} stored={self.stored} "
                f"duplicates={self.duplicates} (keys={self.duplicated_keys}) "
                f"unacked_present={self.unacked_present}")


def check(acks, stored, sent_keys=None):
    """acks: Ack list in the order the sends were acknowledged; stored: Stored list (any order);
    sent_keys: every key the producer tried (None: do not look for phantoms)."""
    report = Report(stored=len(stored))
    positions = defaultdict(list)  # key -> [(queue, offset)]
    at = {}  # (queue, offset) -> key
    by_queue = defaultdict(list)
    for s in stored:
        positions[s.key].append((s.queue, s.offset))
        at[(s.queue, s.offset)] = s.key
        by_queue[s.queue].append(s.offset)

    for queue, offsets in sorted(by_queue.items()):
        offsets.sort()
        expected = list(range(offsets[0], offsets[0] + len(offsets))) if offsets else []
        if offsets and (offsets[0] != 0 or offsets != expected):
            missing = sorted(set(range(0, offsets[-1] + 1)) - set(offsets))
            repeated = len(offsets) - len(set(offsets))
            report.holes.append((queue, f"missing offsets {missing[:10]}", f"repeated {repeated}"))

    acked_keys = []
    seen = set()
    for ack in acks:
        if ack.key not in seen:
            seen.add(ack.key)
            acked_keys.append(ack.key)
    report.acked = len(acked_keys)

    last_pos = {}  # queue -> (offset, key) of the previous acknowledged message
    for ack in acks:
        where = positions.get(ack.key)
        if not where:
            report.lost.append(ack.key)
            continue
        if ack.offset >= 0:
            if at.get((ack.queue, ack.offset)) != ack.key:
                report.misplaced.append((ack.key, (ack.queue, ack.offset), sorted(where),
                                         at.get((ack.queue, ack.offset))))
                continue
            offset = ack.offset
        else:
            in_queue = [o for q, o in where if q == ack.queue]
            if not in_queue:
                report.misplaced.append((ack.key, (ack.queue, None), sorted(where), None))
                continue
            offset = min(in_queue)
        previous = last_pos.get(ack.queue)
        if previous is not None and offset <= previous[0]:
            report.order.append((ack.queue, previous[1], previous[0], ack.key, offset))
        last_pos[ack.queue] = (offset, ack.key)
    report.present = sum(1 for k in acked_keys if k in positions)

    for key, where in positions.items():
        if len(where) > 1:
            report.duplicates += len(where) - 1
            report.duplicated_keys += 1
        if key not in seen:
            if sent_keys is not None and key not in sent_keys:
                report.phantoms.append(key)
            else:
                report.unacked_present += 1
    return report


@dataclass
class ConsumerReport:
    acked: int
    delivered_distinct: int
    deliveries: int
    skipped: list
    duplicates: int

    def summary(self):
        return (f"acked={self.acked} consumed_distinct={self.delivered_distinct} "
                f"deliveries={self.deliveries} skipped={len(self.skipped)} "
                f"duplicates={self.duplicates}")


def check_consumer(acks, delivered):
    """delivered: {key: times delivered}. Every acknowledged key must have been consumed at
    least once (redelivery allowed, skipping never)."""
    acked = []
    seen = set()
    for ack in acks:
        if ack.key not in seen:
            seen.add(ack.key)
            acked.append(ack.key)
    skipped = [k for k in acked if delivered.get(k, 0) == 0]
    deliveries = sum(delivered.values())
    return ConsumerReport(
        acked=len(acked),
        delivered_distinct=len(delivered),
        deliveries=deliveries,
        skipped=skipped,
        duplicates=deliveries - len(delivered),
    )


def longest_gap(ack_times, start=None, end=None):
    """The longest time between consecutive acknowledgements (seconds) whose later one falls in
    [start, end] (monotonic seconds); (gap, before, after)."""
    times = sorted(ack_times)
    best = (0.0, None, None)
    for before, after in zip(times, times[1:]):
        if start is not None and after < start:
            continue
        if end is not None and before > end:
            break
        if after - before > best[0]:
            best = (after - before, before, after)
    return best
