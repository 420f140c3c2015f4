//! Lag computation (pure): per queue, per topic, per group, plus stall detection across polls.

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

    fn committed_offsets(&self) -> BTreeMap<QueueKey, QueueOffset> {
        self.queues
            .iter()
            .filter_map(|sample| sample.committed.map(|offset| (sample.key.clone(), offset)))
            .collect()
    }
}

/// Whether a group is making progress, judged across polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// No lag, or commits moved recently.
    Moving,
    /// Lag > 0 and committed offsets unchanged for this many consecutive polls (>= threshold).
    Stalled {
        /// Consecutive polls without a commit.
        unmoved_polls: u32,
    },
}

/// Remembers a group's committed offsets between polls.
#[derive(Clone, Debug, Default)]
pub struct StallTracker {
    last_committed: Option<BTreeMap<QueueKey, QueueOffset>>,
    unmoved_polls: u32,
    last_commit_ms: Option<i64>,
}

impl StallTracker {
    /// Feeds one poll; Stalled once lag stayed > 0 with no commit for `threshold` polls.
    pub fn observe(&mut self, lag: &GroupLag, threshold: u32, now_ms: i64) -> Progress {
        let committed = lag.committed_offsets();
        match &self.last_committed {
            Some(previous) if *previous == committed => self.unmoved_polls += 1,
            Some(_) => {
                self.unmoved_polls = 0;
                self.last_commit_ms = Some(now_ms);
            }
            None => self.unmoved_polls = 0,
        }
        self.last_committed = Some(committed);
        let lagging = lag.total_messages().is_some_and(|total| total > 0);
        if lagging && self.unmoved_polls >= threshold.max(1) {
            Progress::Stalled {
                unmoved_polls: self.unmoved_polls,
            }
        } else {
            Progress::Moving
        }
    }

    /// When a committed offset last moved, as seen by this tracker.
    pub fn last_commit_ms(&self) -> Option<i64> {
        self.last_commit_ms
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

    #[test]
    fn stalled_after_threshold_polls_without_commits() {
        let mut tracker = StallTracker::default();
        let behind = group_lag(&[stats("t", 0, 100, Some(10), Some(0))], &[], 0);
        assert_eq!(tracker.observe(&behind, 2, 0), Progress::Moving);
        assert_eq!(tracker.observe(&behind, 2, 1), Progress::Moving);
        assert_eq!(
            tracker.observe(&behind, 2, 2),
            Progress::Stalled { unmoved_polls: 2 }
        );
        let moved = group_lag(&[stats("t", 0, 100, Some(11), Some(0))], &[], 0);
        assert_eq!(tracker.observe(&moved, 2, 3), Progress::Moving);
        assert_eq!(tracker.last_commit_ms(), Some(3));
    }

    #[test]
    fn an_idle_caught_up_group_is_not_stalled() {
        let mut tracker = StallTracker::default();
        let caught_up = group_lag(&[stats("t", 0, 10, Some(10), None)], &[], 0);
        for poll in 0..5 {
            assert_eq!(tracker.observe(&caught_up, 1, poll), Progress::Moving);
        }
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
