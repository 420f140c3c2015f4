//! Where a newly assigned queue starts (RocketMQ's `computePullFromWhere`).

use quiver_protocol::offset::QueueOffset;

/// Where a group with no committed offset starts reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsumeFromWhere {
    /// Skip the history: start at the queue's max offset.
    #[default]
    LastOffset,
    /// Read everything still stored.
    FirstOffset,
    /// Start at the first message stored at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// The decision, before any broker look-up it may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartPosition {
    At(QueueOffset),
    /// The queue's current max offset (ask the broker).
    QueueMax,
    /// The offset found by searching this timestamp (ask the broker).
    SearchTimestamp(i64),
}

pub const RETRY_TOPIC_PREFIX: &str = "%RETRY%";

pub fn is_retry_topic(topic: &str) -> bool {
    topic.starts_with(RETRY_TOPIC_PREFIX)
}

/// A committed offset always wins; otherwise the policy decides, and retry topics are always
/// read from the start so no failed message is skipped.
pub fn compute_pull_from_where(
    committed: Option<QueueOffset>,
    from: ConsumeFromWhere,
    topic: &str,
) -> StartPosition {
    if let Some(offset) = committed {
        return StartPosition::At(offset);
    }
    match from {
        ConsumeFromWhere::LastOffset if is_retry_topic(topic) => StartPosition::At(QueueOffset(0)),
        ConsumeFromWhere::LastOffset => StartPosition::QueueMax,
        ConsumeFromWhere::FirstOffset => StartPosition::At(QueueOffset(0)),
        ConsumeFromWhere::Timestamp(_) if is_retry_topic(topic) => StartPosition::QueueMax,
        ConsumeFromWhere::Timestamp(ts) => StartPosition::SearchTimestamp(ts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FROMS: [ConsumeFromWhere; 3] = [
        ConsumeFromWhere::LastOffset,
        ConsumeFromWhere::FirstOffset,
        ConsumeFromWhere::Timestamp(1_700_000_000_000),
    ];

    #[test]
    fn committed_offset_always_wins() {
        for from in FROMS {
            for topic in ["orders", "%RETRY%g"] {
                assert_eq!(
                    compute_pull_from_where(Some(QueueOffset(42)), from, topic),
                    StartPosition::At(QueueOffset(42))
                );
            }
        }
        // Zero is a real committed offset, not "nothing committed".
        assert_eq!(
            compute_pull_from_where(Some(QueueOffset(0)), ConsumeFromWhere::LastOffset, "orders"),
            StartPosition::At(QueueOffset(0))
        );
    }

    #[test]
    fn last_offset_skips_history_except_on_retry_topics() {
        assert_eq!(
            compute_pull_from_where(None, ConsumeFromWhere::LastOffset, "orders"),
            StartPosition::QueueMax
        );
        assert_eq!(
            compute_pull_from_where(None, ConsumeFromWhere::LastOffset, "%RETRY%g"),
            StartPosition::At(QueueOffset(0))
        );
    }

    #[test]
    fn first_offset_starts_at_zero() {
        for topic in ["orders", "%RETRY%g"] {
            assert_eq!(
                compute_pull_from_where(None, ConsumeFromWhere::FirstOffset, topic),
                StartPosition::At(QueueOffset(0))
            );
        }
    }

    #[test]
    fn timestamp_searches_except_on_retry_topics() {
        let ts = 1_700_000_000_000;
        assert_eq!(
            compute_pull_from_where(None, ConsumeFromWhere::Timestamp(ts), "orders"),
            StartPosition::SearchTimestamp(ts)
        );
        assert_eq!(
            compute_pull_from_where(None, ConsumeFromWhere::Timestamp(ts), "%RETRY%g"),
            StartPosition::QueueMax
        );
    }
}
