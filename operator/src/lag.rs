//! Lag computation (pure): per queue, per topic, per group, and the judgement of a group's
//! progress over a wall-clock window.

use crate::admin::{QueueConsumeStats, QueueOffset};
use std::collections::BTreeMap;

/// Lag of one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueLag {
    /// The group committed on this queue.
    Known {
        /// max(0, maxOffset - committedOffset).
        messages: u64,
        /// now - store time of the first unconsumed message; 0 when caught up; `None` when
        /// messages are pending but the broker did not say when the first was stored.
        latency_ms: Option<u64>,
    },
    /// Nothing committed: lag is unknown, neither zero nor the whole queue.
    Unknown,
}

/// Identity of a queue across brokers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    /// Topic name.
    pub topic: String,
    /// Broker name.
    pub broker: String,
    /// Queue id.
    pub queue_id: i32,
}

/// One queue's lag and committed offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueLagSample {
    /// Which queue.
    pub key: QueueKey,
    /// Its lag.
    pub lag: QueueLag,
    /// The committed offset, when there is one.
    pub committed: Option<QueueOffset>,
}

/// Lag of one topic: sums over queues with a commit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicLag {
    /// Sum of known queue lags; `None` when no queue has a commit.
    pub messages: Option<u64>,
    /// Largest known queue latency; `None` when unknown.
    pub latency_ms: Option<u64>,
    /// Sum of committed offsets (moves when the group commits).
    pub committed_sum: u64,
    /// Queues without a commit.
    pub uncommitted_queues: u32,
}

/// Lag of a group over all the brokers polled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupLag {
    /// Per-topic totals.
    pub topics: BTreeMap<String, TopicLag>,
    /// Every queue, sorted by key.
    pub queues: Vec<QueueLagSample>,
}

/// Lag of one queue from its stats at `now_ms`.
pub fn queue_lag(stats: &QueueConsumeStats, now_ms: i64) -> QueueLag {
    let Some(committed) = stats.consumer_offset else {
        return QueueLag::Unknown;
    };
    let messages = stats.broker_offset.0.saturating_sub(committed.0);
    let latency_ms = if messages == 0 {
        Some(0)
    } else {
        stats
            .oldest_unconsumed_store_ms
            .map(|stored_ms| u64::try_from(now_ms - stored_ms).unwrap_or(0))
    };
    QueueLag::Known {
        messages,
        latency_ms,
    }
}

/// Lag of a group from the consume stats of every broker; only `topics` when not empty.
pub fn group_lag<'a>(
    stats: impl IntoIterator<Item = &'a QueueConsumeStats>,
    topics: &[String],
    now_ms: i64,
) -> GroupLag {
    let mut lag = GroupLag::default();
    for queue in stats {
        if !topics.is_empty() && !topics.contains(&queue.topic) {
            continue;
        }
        let sample = QueueLagSample {
            key: QueueKey {
                topic: queue.topic.clone(),
                broker: queue.broker_name.clone(),
                queue_id: queue.queue_id,
            },
            lag: queue_lag(queue, now_ms),
            committed: queue.consumer_offset,
        };
        let topic = lag.topics.entry(queue.topic.clone()).or_default();
        match sample.lag {
            QueueLag::Known { messages, .. } => {
                topic.messages = Some(topic.messages.unwrap_or(0) + messages);
                topic.committed_sum += sample.committed.map_or(0, |offset| offset.0);
            }
            QueueLag::Unknown => topic.uncommitted_queues += 1,
        }
        lag.queues.push(sample);
    }
    for (name, topic) in lag.topics.iter_mut() {
        // One lagging queue without a store time makes the topic's latency unknown.
        let known_latencies: Option<Vec<u64>> = lag
            .queues
            .iter()
            .filter(|sample| sample.key.topic == *name)
            .filter_map(|sample| match sample.lag {
                QueueLag::Known { latency_ms, .. } => Some(latency_ms),
                QueueLag::Unknown => None,
            })
            .collect();
        topic.latency_ms = known_latencies.and_then(|latencies| latencies.into_iter().max());
    }
    lag.queues.sort_by(|a, b| a.key.cmp(&b.key));
    lag
}

impl GroupLag {
    /// Sum of known lag over topics; `None` when nothing was committed anywhere.
    pub fn total_messages(&self) -> Option<u64> {
        self.topics
            .values()
            .filter_map(|topic| topic.messages)
            .reduce(|a, b| a + b)
    }

    /// Largest known latency over topics.
    pub fn max_latency_ms(&self) -> Option<u64> {
        self.topics
            .values()
            .filter_map(|topic| topic.latency_ms)
            .max()
    }

    /// The `limit` queues with the most known lag (non-zero only), most first.
    pub fn top_queues(&self, limit: usize) -> Vec<(&QueueKey, u64)> {
        let mut lagging: Vec<(&QueueKey, u64)> = self
            .queues
            .iter()
            .filter_map(|sample| match sample.lag {
                QueueLag::Known { messages, .. } if messages > 0 => Some((&sample.key, messages)),
                _ => None,
            })
            .collect();
        lagging.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        lagging.truncate(limit);
        lagging
    }
}

/// One complete poll of a group (every broker answered, lag known): what it is judged on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// When it was taken, ms since the epoch.
    pub at_ms: i64,
    /// Committed offsets summed over the group's queues.
    pub committed: u64,
    /// Total lag.
    pub lag: u64,
}

impl Sample {
    /// The sample of a poll at `at_ms`; `None` when nothing was committed (lag unknown).
    pub fn of(lag: &GroupLag, at_ms: i64) -> Option<Sample> {
        Some(Sample {
            at_ms,
            committed: lag.topics.values().map(|topic| topic.committed_sum).sum(),
            lag: lag.total_messages()?,
        })
    }
}

/// How a group consumes, judged Burrow-style over a wall-clock window of samples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// No judgement: nothing committed yet, or the poll was incomplete.
    Unknown,
    /// Nothing waiting, or commits keep up.
    Ok,
    /// Lag has not gone down at any poll for a whole window and is higher than when that run
    /// began, while commits move: consumers are too slow.
    Warning {
        /// First sample of the run of polls whose lag never went down.
        since_ms: i64,
        /// Lag then.
        from: u64,
    },
    /// Lag > 0 at every poll for a whole window and no commit: consumers are stuck.
    Stalled {
        /// First sample of the run with lag > 0 and unmoved commits.
        since_ms: i64,
    },
    /// Lag > 0 and no consumer connected.
    Stopped,
}

impl Progress {
    /// Every judged status, as the `status` label of `quiver_consumer_group_status` names them.
    pub const LABELS: [&'static str; 4] = ["ok", "warning", "stalled", "stopped"];

    /// The `status` label; `None` when unknown.
    pub fn label(self) -> Option<&'static str> {
        match self {
            Progress::Unknown => None,
            Progress::Ok => Some("ok"),
            Progress::Warning { .. } => Some("warning"),
            Progress::Stalled { .. } => Some("stalled"),
            Progress::Stopped => Some("stopped"),
        }
    }
}

/// A group's window of samples, kept as the first sample of each run that decides the judgement:
/// "lag > 0 with commits unmoved at every sample of the window" holds exactly when that run began
/// at or before the window's start, and likewise "lag never went down". Equivalent to keeping
/// every sample, yet small and stable enough to live in status for the next leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LagWindow {
    /// Committed offsets summed at the last sample.
    pub committed: u64,
    /// Total lag at the last sample.
    pub lag: u64,
    /// When committed offsets were last seen to move.
    pub last_commit_ms: Option<i64>,
    /// First sample of the current run with lag > 0 and unmoved commits.
    pub stuck_since_ms: Option<i64>,
    /// First sample of the current run whose lag never went down.
    pub growing_since_ms: i64,
    /// Lag at `growing_since_ms`.
    pub growing_from: u64,
}

impl LagWindow {
    /// The window after `sample`; without a `previous` window every run starts at `sample`.
    pub fn observe(previous: Option<&LagWindow>, sample: Sample) -> LagWindow {
        let Sample {
            at_ms,
            committed,
            lag,
        } = sample;
        let Some(previous) = previous else {
            return LagWindow {
                committed,
                lag,
                last_commit_ms: None,
                stuck_since_ms: (lag > 0).then_some(at_ms),
                growing_since_ms: at_ms,
                growing_from: lag,
            };
        };
        let moved = committed != previous.committed;
        let stuck_since_ms = match previous.stuck_since_ms {
            _ if lag == 0 => None,
            Some(since) if !moved && previous.lag > 0 => Some(since),
            _ => Some(at_ms),
        };
        let (growing_since_ms, growing_from) = if lag >= previous.lag {
            (previous.growing_since_ms, previous.growing_from)
        } else {
            (at_ms, lag)
        };
        LagWindow {
            committed,
            lag,
            last_commit_ms: if moved {
                Some(at_ms)
            } else {
                previous.last_commit_ms
            },
            stuck_since_ms,
            growing_since_ms,
            growing_from,
        }
    }

    /// Since when lag has waited with no commit, once that covers the whole window ending at
    /// `now_ms`; connected members or not.
    pub fn stalled_since(&self, now_ms: i64, window_ms: i64) -> Option<i64> {
        let window_start = now_ms.saturating_sub(window_ms);
        self.stuck_since_ms.filter(|since| *since <= window_start)
    }

    /// The judgement at `now_ms` over the last `window_ms`, with `members` consumers connected.
    /// Stopped comes first: with nobody connected, that is the cause to fix.
    pub fn judge(&self, now_ms: i64, window_ms: i64, members: usize) -> Progress {
        if self.lag == 0 {
            return Progress::Ok;
        }
        if members == 0 {
            return Progress::Stopped;
        }
        let window_start = now_ms.saturating_sub(window_ms);
        if let Some(since_ms) = self.stalled_since(now_ms, window_ms) {
            return Progress::Stalled { since_ms };
        }
        if self.growing_since_ms <= window_start && self.lag > self.growing_from {
            return Progress::Warning {
                since_ms: self.growing_since_ms,
                from: self.growing_from,
            };
        }
        Progress::Ok
    }
}

/// One lagging queue's current run of polls with its committed offset unmoved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRun {
    /// The committed offset at the last poll.
    pub committed: QueueOffset,
    /// Lag at the last poll.
    pub lag: u64,
    /// First poll of the run: since then the queue had lag at every poll and no commit.
    pub since_ms: i64,
}

/// The group's window per queue: each lagging queue's current run without a commit. A queue
/// stalls once its run covers the whole window, the group's rule applied to one queue, so one
/// stuck queue shows even while the group's sums move.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueWindows {
    /// Runs of the queues that had lag at the last poll.
    pub runs: BTreeMap<QueueKey, QueueRun>,
}

/// The stalled queues of one judgement: `count` in all, the first listed (longest stalled
/// first, then most lag).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StalledQueues {
    /// At most the listing limit.
    pub listed: Vec<(QueueKey, QueueRun)>,
    /// Every stalled queue.
    pub count: usize,
}

impl QueueWindows {
    /// The windows after a poll at `at_ms`: a queue without lag (or without a commit) has no run;
    /// a run goes on while its committed offset stays where the previous poll saw it.
    pub fn observe(previous: &QueueWindows, lag: &GroupLag, at_ms: i64) -> QueueWindows {
        let runs = lag.queues.iter().filter_map(|sample| {
            let QueueLag::Known { messages, .. } = sample.lag else {
                return None;
            };
            let committed = sample.committed.filter(|_| messages > 0)?;
            let since_ms = match previous.runs.get(&sample.key) {
                Some(run) if run.committed == committed => run.since_ms,
                _ => at_ms,
            };
            let run = QueueRun {
                committed,
                lag: messages,
                since_ms,
            };
            Some((sample.key.clone(), run))
        });
        QueueWindows {
            runs: runs.collect(),
        }
    }

    /// The queues whose run covers the whole window ending at `now_ms`, `limit` of them listed.
    pub fn stalled(&self, now_ms: i64, window_ms: i64, limit: usize) -> StalledQueues {
        let window_start = now_ms.saturating_sub(window_ms);
        let mut stalled: Vec<(QueueKey, QueueRun)> = self
            .runs
            .iter()
            .filter(|(_, run)| run.since_ms <= window_start)
            .map(|(key, run)| (key.clone(), *run))
            .collect();
        stalled.sort_by(|(a_key, a), (b_key, b)| {
            (a.since_ms, std::cmp::Reverse(a.lag), a_key).cmp(&(
                b.since_ms,
                std::cmp::Reverse(b.lag),
                b_key,
            ))
        });
        let count = stalled.len();
        stalled.truncate(limit);
        StalledQueues {
            listed: stalled,
            count,
        }
    }
}

/// What remains to drain on brokers being removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// Unconsumed messages over queues with a commit.
    pub remaining_messages: u64,
    /// Groups with unconsumed messages there.
    pub pending_groups: Vec<String>,
}

impl DrainProgress {
    /// Adds one group's stats on a draining broker. Queues the group never committed on are
    /// not waited for: the group never consumed them, so there is no position to lose.
    pub fn add_group(&mut self, group: &str, queues: &[QueueConsumeStats]) {
        let remaining: u64 = queues
            .iter()
            .filter_map(|queue| {
                queue
                    .consumer_offset
                    .map(|committed| queue.broker_offset.0.saturating_sub(committed.0))
            })
            .sum();
        if remaining > 0 {
            self.remaining_messages += remaining;
            if !self.pending_groups.iter().any(|pending| pending == group) {
                self.pending_groups.push(group.to_string());
            }
        }
    }

    /// Every group consumed the draining brokers to the end.
    pub fn is_drained(&self) -> bool {
        self.remaining_messages == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(
        topic: &str,
        queue_id: i32,
        max: u64,
        committed: Option<u64>,
        oldest_ms: Option<i64>,
    ) -> QueueConsumeStats {
        QueueConsumeStats {
            topic: topic.to_string(),
            broker_name: "qb-0".to_string(),
            queue_id,
            broker_offset: QueueOffset(max),
            consumer_offset: committed.map(QueueOffset),
            oldest_unconsumed_store_ms: oldest_ms,
        }
    }

    #[test]
    fn lag_is_max_minus_committed() {
        let lag = queue_lag(&stats("t", 0, 100, Some(40), Some(1_000)), 6_000);
        assert_eq!(
            lag,
            QueueLag::Known {
                messages: 60,
                latency_ms: Some(5_000)
            }
        );
    }

    #[test]
    fn lag_never_goes_negative() {
        // A commit ahead of the max offset happens after a reset or a truncated tail.
        let lag = queue_lag(&stats("t", 0, 10, Some(25), None), 6_000);
        assert_eq!(
            lag,
            QueueLag::Known {
                messages: 0,
                latency_ms: Some(0)
            }
        );
    }

    #[test]
    fn nothing_committed_is_unknown_not_zero() {
        assert_eq!(
            queue_lag(&stats("t", 0, 100, None, Some(1)), 6_000),
            QueueLag::Unknown
        );
        let group = group_lag(&[stats("t", 0, 100, None, None)], &[], 0);
        assert_eq!(group.total_messages(), None);
        assert_eq!(group.topics["t"].uncommitted_queues, 1);
    }

    #[test]
    fn caught_up_latency_is_zero() {
        assert_eq!(
            queue_lag(&stats("t", 0, 7, Some(7), None), 6_000),
            QueueLag::Known {
                messages: 0,
                latency_ms: Some(0)
            }
        );
    }

    #[test]
    fn store_time_in_the_future_clamps_latency_to_zero() {
        let lag = queue_lag(&stats("t", 0, 8, Some(7), Some(9_000)), 6_000);
        assert_eq!(
            lag,
            QueueLag::Known {
                messages: 1,
                latency_ms: Some(0)
            }
        );
    }

    #[test]
    fn topic_totals_skip_unknown_queues_and_filter_topics() {
        let all = [
            stats("orders", 0, 100, Some(90), Some(1_000)),
            stats("orders", 1, 50, None, None),
            stats("orders", 2, 30, Some(10), Some(500)),
            stats("audit", 0, 5, Some(0), Some(100)),
        ];
        let group = group_lag(&all, &["orders".to_string()], 2_000);
        assert_eq!(group.topics.len(), 1);
        let orders = &group.topics["orders"];
        assert_eq!(orders.messages, Some(30));
        assert_eq!(orders.latency_ms, Some(1_500));
        assert_eq!(orders.committed_sum, 100);
        assert_eq!(orders.uncommitted_queues, 1);
        let top: Vec<(i32, u64)> = group
            .top_queues(10)
            .into_iter()
            .map(|(key, lag)| (key.queue_id, lag))
            .collect();
        assert_eq!(top, vec![(2, 20), (0, 10)]);
        assert_eq!(group_lag(&all, &[], 2_000).total_messages(), Some(35));
    }

    #[test]
    fn latency_unknown_when_a_lagging_queue_has_no_store_time() {
        let group = group_lag(
            &[
                stats("t", 0, 10, Some(5), None),
                stats("t", 1, 10, Some(5), Some(0)),
            ],
            &[],
            1_000,
        );
        assert_eq!(group.topics["t"].latency_ms, None);
        assert_eq!(group.topics["t"].messages, Some(10));
    }

    const WINDOW_MS: i64 = 600_000;

    /// Feeds `(second, committed, lag)` samples (30 s apart in the tables) and judges after each.
    fn judged(samples: &[(i64, u64, u64)], members: usize) -> Vec<Progress> {
        let mut window: Option<LagWindow> = None;
        samples
            .iter()
            .map(|&(second, committed, lag)| {
                let at_ms = second * 1_000;
                let next = LagWindow::observe(
                    window.as_ref(),
                    Sample {
                        at_ms,
                        committed,
                        lag,
                    },
                );
                window = Some(next);
                next.judge(at_ms, WINDOW_MS, members)
            })
            .collect()
    }

    /// `count` samples from `start_s`, 30 s apart, committed and lag given per step.
    fn every_30s(
        start_s: i64,
        count: i64,
        step: impl Fn(i64) -> (u64, u64),
    ) -> Vec<(i64, u64, u64)> {
        (0..count)
            .map(|i| {
                let (committed, lag) = step(i);
                (start_s + 30 * i, committed, lag)
            })
            .collect()
    }

    #[test]
    fn the_window_judges_ok_warning_stalled_and_stopped() {
        // (what, samples, members connected, judgement after the last sample)
        type Case = (&'static str, Vec<(i64, u64, u64)>, usize, Progress);
        let cases: Vec<Case> = vec![
            (
                "caught up",
                every_30s(0, 30, |i| (10 * i as u64, 0)),
                1,
                Progress::Ok,
            ),
            (
                "steady lag, commits move",
                every_30s(0, 30, |i| (10 * i as u64, 5)),
                1,
                Progress::Ok,
            ),
            (
                "lag rises for 14.5 min while commits move",
                every_30s(0, 30, |i| (10 * i as u64, 100 + i as u64)),
                1,
                Progress::Warning {
                    since_ms: 0,
                    from: 100,
                },
            ),
            (
                "lag rises, dipped 5 min ago",
                every_30s(0, 30, |i| {
                    (10 * i as u64, if i == 20 { 1 } else { 100 + i as u64 })
                }),
                1,
                Progress::Ok,
            ),
            (
                "no commit for 14.5 min, lag waiting",
                every_30s(0, 30, |_| (40, 7)),
                1,
                Progress::Stalled { since_ms: 0 },
            ),
            (
                "no commit for 9.5 min only",
                every_30s(0, 20, |_| (40, 7)),
                1,
                Progress::Ok,
            ),
            (
                "no commit, nothing waiting",
                every_30s(0, 30, |_| (40, 0)),
                1,
                Progress::Ok,
            ),
            (
                "commits stopped at minute 2",
                every_30s(0, 30, |i| (10 * i.min(4) as u64, 7)),
                1,
                Progress::Stalled { since_ms: 120_000 },
            ),
            (
                "lag waiting, nobody connected",
                every_30s(0, 2, |_| (40, 7)),
                0,
                Progress::Stopped,
            ),
            (
                "nothing waiting, nobody connected",
                every_30s(0, 2, |_| (40, 0)),
                0,
                Progress::Ok,
            ),
        ];
        for (name, samples, members, expected) in cases {
            assert_eq!(
                judged(&samples, members).last().copied(),
                Some(expected),
                "{name}"
            );
        }
    }

    #[test]
    fn stalled_follows_the_wall_clock_not_the_poll_count() {
        // Polls every 5 min: the third poll is 10 min after the first, a full window.
        let sparse = judged(&[(0, 40, 7), (300, 40, 7), (600, 40, 7)], 1);
        assert_eq!(
            sparse,
            vec![
                Progress::Ok,
                Progress::Ok,
                Progress::Stalled { since_ms: 0 }
            ]
        );
        // Polls every second: 599 polls later it is still not a full window.
        let dense = every_30s(0, 1, |_| (40, 7))
            .into_iter()
            .chain((1..600).map(|second| (second, 40, 7)))
            .collect::<Vec<_>>();
        assert_eq!(judged(&dense, 1).last(), Some(&Progress::Ok));
    }

    #[test]
    fn a_commit_or_catching_up_restarts_the_stall() {
        let mut samples = every_30s(0, 25, |_| (40, 7));
        samples.push((750, 41, 7)); // a commit
        samples.extend(every_30s(780, 10, |_| (41, 7)));
        let judged = judged(&samples, 1);
        assert_eq!(judged[24], Progress::Stalled { since_ms: 0 });
        assert_eq!(judged[25], Progress::Ok);
        assert_eq!(judged.last(), Some(&Progress::Ok), "5 min since the commit");
        let window = samples
            .iter()
            .fold(None, |window: Option<LagWindow>, &(s, c, l)| {
                Some(LagWindow::observe(
                    window.as_ref(),
                    Sample {
                        at_ms: s * 1_000,
                        committed: c,
                        lag: l,
                    },
                ))
            });
        assert_eq!(window.and_then(|w| w.last_commit_ms), Some(750_000));
        assert_eq!(window.and_then(|w| w.stuck_since_ms), Some(750_000));
    }

    #[test]
    fn a_window_rebuilt_from_its_runs_judges_as_the_original() {
        // What a new leader reads back from status is the same LagWindow: same judgement.
        let samples = every_30s(0, 30, |_| (40, 7));
        let mut window = None;
        for &(second, committed, lag) in &samples[..10] {
            window = Some(LagWindow::observe(
                window.as_ref(),
                Sample {
                    at_ms: second * 1_000,
                    committed,
                    lag,
                },
            ));
        }
        let persisted = window.expect("observed");
        let continued = LagWindow::observe(
            Some(&persisted),
            Sample {
                at_ms: 630_000,
                committed: 40,
                lag: 7,
            },
        );
        assert_eq!(
            continued.judge(630_000, WINDOW_MS, 1),
            Progress::Stalled { since_ms: 0 }
        );
        let forgotten = LagWindow::observe(
            None,
            Sample {
                at_ms: 630_000,
                committed: 40,
                lag: 7,
            },
        );
        assert_eq!(
            forgotten.judge(630_000, WINDOW_MS, 1),
            Progress::Ok,
            "starting from nothing would wait another window"
        );
    }

    #[test]
    fn samples_need_a_known_lag() {
        let none = group_lag(&[stats("t", 0, 100, None, None)], &[], 0);
        assert_eq!(Sample::of(&none, 5), None);
        let some = group_lag(
            &[
                stats("t", 0, 100, Some(10), None),
                stats("t", 1, 100, Some(30), None),
            ],
            &[],
            0,
        );
        assert_eq!(
            Sample::of(&some, 5),
            Some(Sample {
                at_ms: 5,
                committed: 40,
                lag: 160
            })
        );
    }

    /// Queues (orders, 0..) on qb-0 at `(stored, committed)` each.
    fn queues_at(queues: &[(u64, u64)], at_ms: i64) -> GroupLag {
        let stats: Vec<QueueConsumeStats> = (0..)
            .zip(queues)
            .map(|(id, &(max, committed))| stats("orders", id, max, Some(committed), Some(0)))
            .collect();
        group_lag(&stats, &[], at_ms)
    }

    #[test]
    fn one_stuck_queue_stalls_while_the_groups_sums_move() {
        // Queue 0 keeps 5 messages and never commits; queues 1 and 2 commit at every poll, so
        // the group's committed sum moves, and so does its lag.
        let mut windows = QueueWindows::default();
        let mut group: Option<LagWindow> = None;
        let mut stalled_at = Vec::new();
        for poll in 0..25 {
            let at_ms = poll * 30_000;
            let moving = 100 + 10 * poll as u64;
            let wobble = u64::try_from(poll % 2).expect("0 or 1");
            let lag = queues_at(
                &[
                    (45, 40),
                    (moving + 3 + wobble, moving),
                    (moving + 4, moving),
                ],
                at_ms,
            );
            windows = QueueWindows::observe(&windows, &lag, at_ms);
            let sample = Sample::of(&lag, at_ms).expect("known");
            let window = LagWindow::observe(group.as_ref(), sample);
            group = Some(window);
            assert_eq!(
                window.judge(at_ms, WINDOW_MS, 1),
                Progress::Ok,
                "poll {poll}"
            );
            let stalled = windows.stalled(at_ms, WINDOW_MS, 10);
            if stalled.count > 0 {
                stalled_at.push(poll);
                let (key, run) = &stalled.listed[0];
                assert_eq!((key.queue_id, run.lag, run.since_ms), (0, 5, 0));
                assert_eq!(stalled.count, 1);
            }
        }
        assert_eq!(
            stalled_at,
            (20..25).collect::<Vec<_>>(),
            "after a whole window"
        );
    }

    #[test]
    fn a_commit_or_no_lag_ends_a_queues_run() {
        let start = QueueWindows::observe(&QueueWindows::default(), &queues_at(&[(45, 40)], 0), 0);
        let committed = QueueWindows::observe(&start, &queues_at(&[(45, 41)], 30_000), 30_000);
        assert_eq!(
            committed.runs.values().next().map(|run| run.since_ms),
            Some(30_000)
        );
        let caught_up = QueueWindows::observe(&start, &queues_at(&[(45, 45)], 30_000), 30_000);
        assert!(caught_up.runs.is_empty());
        let unmoved = QueueWindows::observe(&start, &queues_at(&[(50, 40)], 30_000), 30_000);
        let run = unmoved.runs.values().next().expect("a run");
        assert_eq!(
            (run.since_ms, run.lag),
            (0, 10),
            "new messages, no commit: the run goes on"
        );
    }

    #[test]
    fn stalled_queues_are_listed_longest_first_and_counted() {
        let mut windows = QueueWindows::default();
        for queue_id in 0..12 {
            let key = QueueKey {
                topic: "orders".into(),
                broker: "qb-0".into(),
                queue_id,
            };
            let run = QueueRun {
                committed: QueueOffset(1),
                lag: 10 + u64::try_from(queue_id).expect("small"),
                since_ms: if queue_id < 3 { 1_000 } else { 0 },
            };
            windows.runs.insert(key, run);
        }
        let stalled = windows.stalled(WINDOW_MS + 1_000, WINDOW_MS, 4);
        assert_eq!(stalled.count, 12);
        let listed: Vec<i32> = stalled.listed.iter().map(|(key, _)| key.queue_id).collect();
        assert_eq!(
            listed,
            [11, 10, 9, 8],
            "longest stalled first, then most lag"
        );
        assert_eq!(windows.stalled(WINDOW_MS + 999, WINDOW_MS, 4).count, 9);
    }

    #[test]
    fn drain_waits_for_committed_queues_only() {
        let mut drain = DrainProgress::default();
        drain.add_group(
            "billing",
            &[
                stats("t", 0, 10, Some(10), None),
                stats("t", 1, 10, None, None),
            ],
        );
        assert!(drain.is_drained());
        drain.add_group("audit", &[stats("t", 0, 10, Some(4), None)]);
        assert_eq!(
            drain,
            DrainProgress {
                remaining_messages: 6,
                pending_groups: vec!["audit".to_string()]
            }
        );
        assert!(!drain.is_drained());
    }
}
