//! Safe scale-down: each leaving broker is made read-only and measured on its own, so one that
//! does not answer is reported without stopping the rest of the reconcile. Pure decisions here,
//! admin calls in [`inspect_leaving`] and [`restore_kept`].

use super::{error_chain, Context};
use crate::admin::{AdminError, BrokerAddr, BrokerPermission, QueueConsumeStats, TopicStats};
use crate::crd::{Broker, BrokerStatus, DrainStatus};
use crate::desired;
use std::collections::{BTreeMap, BTreeSet};

/// The topic where delayed messages wait for their delay level (queue = level - 1).
pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
/// The broker's delay levels (RocketMQ's default `messageDelayLevel`), in ms.
pub const DELAY_LEVELS_MS: [i64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];
/// Time the broker gets after a delayed message is due to move it to its topic.
pub const DELAY_DELIVERY_SLACK_MS: i64 = 10_000;

/// What is still to be read on one leaving broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Unconsumed messages of groups with a commit there.
    pub group_messages: u64,
    /// Groups with unconsumed messages there.
    pub pending_groups: BTreeSet<String>,
    /// Messages in queues no group has committed on.
    pub messages_without_group: u64,
    /// Topics holding those, plus SCHEDULE_TOPIC_XXXX while delayed messages are not yet due.
    pub pending_topics: BTreeSet<String>,
}

impl Backlog {
    /// Nothing left that would be lost with the broker.
    pub fn is_empty(&self) -> bool {
        self.group_messages == 0 && self.pending_topics.is_empty()
    }
}

/// One leaving broker as measured this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeavingBroker {
    /// Broker (pod) name.
    pub name: String,
    /// Its backlog, or why it could not be measured.
    pub backlog: Result<Backlog, String>,
}

/// The backlog of a broker from its groups' consume stats and its topics' stats at `now_ms`.
///
/// A group waits for its unconsumed messages where it has a commit. A queue no group has
/// committed on waits until it holds no message: nobody would ever read them after the broker
/// is gone. Delayed messages are waited for until the last one of each level is due.
pub fn backlog(
    groups: &[(String, Vec<QueueConsumeStats>)],
    topics: &[(String, TopicStats)],
    now_ms: i64,
) -> Backlog {
    let mut backlog = Backlog::default();
    let mut committed: BTreeSet<(&str, i32)> = BTreeSet::new();
    for (group, queues) in groups {
        for queue in queues {
            let Some(offset) = queue.consumer_offset else {
                continue;
            };
            committed.insert((queue.topic.as_str(), queue.queue_id));
            let unread = queue.broker_offset.0.saturating_sub(offset.0);
            if unread > 0 {
                backlog.group_messages += unread;
                backlog.pending_groups.insert(group.clone());
            }
        }
    }
    for (topic, stats) in topics {
        if topic == SCHEDULE_TOPIC {
            if delayed_messages_pending(stats, now_ms) {
                backlog.pending_topics.insert(topic.clone());
            }
            continue;
        }
        for queue in &stats.queues {
            let stored = queue.max_offset.0.saturating_sub(queue.min_offset.0);
            if stored > 0 && !committed.contains(&(topic.as_str(), queue.queue_id)) {
                backlog.messages_without_group += stored;
                backlog.pending_topics.insert(topic.clone());
            }
        }
    }
    backlog
}

/// Whether a delay level still holds a message not yet due (plus the delivery slack) at `now_ms`.
fn delayed_messages_pending(stats: &TopicStats, now_ms: i64) -> bool {
    stats.queues.iter().any(|queue| {
        let level_delay = usize::try_from(queue.queue_id)
            .ok()
            .and_then(|level| DELAY_LEVELS_MS.get(level))
            .copied()
            .unwrap_or(DELAY_LEVELS_MS[DELAY_LEVELS_MS.len() - 1]);
        let holds_messages = queue.max_offset > queue.min_offset;
        holds_messages
            && queue
                .last_update_ms
                .is_none_or(|stored| stored + level_delay + DELAY_DELIVERY_SLACK_MS > now_ms)
    })
}

/// The drain status of the leaving brokers.
pub fn drain_status(leaving: &[LeavingBroker]) -> DrainStatus {
    let mut groups = BTreeSet::new();
    let mut topics = BTreeSet::new();
    let mut status = DrainStatus {
        brokers: leaving.iter().map(|broker| broker.name.clone()).collect(),
        remaining_messages: 0,
        pending_groups: Vec::new(),
        messages_without_group: 0,
        pending_topics: Vec::new(),
        unreachable_brokers: Vec::new(),
    };
    for broker in leaving {
        match &broker.backlog {
            Ok(backlog) => {
                status.remaining_messages += backlog.group_messages;
                status.messages_without_group += backlog.messages_without_group;
                groups.extend(backlog.pending_groups.iter().cloned());
                topics.extend(backlog.pending_topics.iter().cloned());
            }
            Err(_) => status.unreachable_brokers.push(broker.name.clone()),
        }
    }
    status.pending_groups = groups.into_iter().collect();
    status.pending_topics = topics.into_iter().collect();
    status
}

/// Every leaving broker answered and holds nothing a reader would miss.
pub fn is_drained(leaving: &[LeavingBroker]) -> bool {
    leaving
        .iter()
        .all(|broker| broker.backlog.as_ref().is_ok_and(Backlog::is_empty))
}

/// What is still waited for, in a sentence (condition message, forced scale-down event).
pub fn describe(status: &DrainStatus) -> String {
    let mut parts = Vec::new();
    if !status.pending_groups.is_empty() {
        parts.push(format!(
            "{} messages unread by {}",
            status.remaining_messages,
            status.pending_groups.join(", ")
        ));
    }
    let stored_topics: Vec<&str> = status
        .pending_topics
        .iter()
        .map(String::as_str)
        .filter(|topic| *topic != SCHEDULE_TOPIC)
        .collect();
    if !stored_topics.is_empty() {
        parts.push(format!(
            "{} messages no group has committed on, in {}",
            status.messages_without_group,
            stored_topics.join(", ")
        ));
    }
    if status
        .pending_topics
        .iter()
        .any(|topic| topic == SCHEDULE_TOPIC)
    {
        parts.push(format!("delayed messages not yet due in {SCHEDULE_TOPIC}"));
    }
    if !status.unreachable_brokers.is_empty() {
        parts.push(format!(
            "{} did not answer, so what they hold is unknown",
            status.unreachable_brokers.join(", ")
        ));
    }
    if parts.is_empty() {
        return "nothing left to read".to_string();
    }
    parts.join("; ")
}

/// Ordinals a previous pass made read-only that stay now: a reverted scale-down.
pub fn kept_read_only(broker: &Broker, previous: &BrokerStatus, wanted: i32) -> Vec<i32> {
    let prefix = format!("{}-", broker.metadata.name.as_deref().unwrap_or_default());
    let draining = previous.drain.iter().flat_map(|drain| drain.brokers.iter());
    let ordinals: BTreeSet<i32> = draining
        .chain(previous.read_only_brokers.iter())
        .filter_map(|name| name.strip_prefix(&prefix)?.parse::<i32>().ok())
        .filter(|ordinal| *ordinal < wanted)
        .collect();
    ordinals.into_iter().collect()
}

/// Makes the broker at `ordinal` read-only and measures what it still holds; never fails (a
/// broker that does not answer is reported as such).
pub async fn inspect_leaving(
    broker: &Broker,
    ordinal: i32,
    ctx: &Context,
    now_ms: i64,
) -> LeavingBroker {
    let addr = BrokerAddr(desired::broker_address(broker, ordinal));
    let backlog = measure(&addr, ctx, now_ms)
        .await
        .map_err(|error| error_chain(&error));
    LeavingBroker {
        name: desired::pod_name(broker, ordinal),
        backlog,
    }
}

async fn measure(addr: &BrokerAddr, ctx: &Context, now_ms: i64) -> Result<Backlog, AdminError> {
    ctx.admin
        .set_permission(addr, BrokerPermission::ReadOnly)
        .await?;
    let mut groups = Vec::new();
    for group in ctx.admin.groups(addr).await? {
        let stats = ctx.admin.consume_stats(addr, &group).await?;
        groups.push((group, stats.queues));
    }
    let mut topics = Vec::new();
    for topic in ctx.admin.topics(addr).await? {
        let stats = ctx.admin.topic_stats(addr, &topic).await?;
        topics.push((topic, stats));
    }
    Ok(backlog(&groups, &topics, now_ms))
}

/// Makes the kept brokers of a reverted scale-down writable again, each on its own; returns the
/// ones still read-only, with why.
pub async fn restore_kept(
    broker: &Broker,
    ordinals: &[i32],
    ctx: &Context,
) -> BTreeMap<String, String> {
    let mut still_read_only = BTreeMap::new();
    for ordinal in ordinals {
        let addr = BrokerAddr(desired::broker_address(broker, *ordinal));
        if let Err(error) = ctx
            .admin
            .set_permission(&addr, BrokerPermission::ReadWrite)
            .await
        {
            still_read_only.insert(desired::pod_name(broker, *ordinal), error_chain(&error));
        }
    }
    still_read_only
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::{QueueOffset, QueueTopicStats};
    use crate::fixtures::BrokerFixture;

    fn consumed(topic: &str, queue_id: i32, max: u64, committed: Option<u64>) -> QueueConsumeStats {
        QueueConsumeStats {
            topic: topic.to_string(),
            broker_name: "qb-2".to_string(),
            queue_id,
            broker_offset: QueueOffset(max),
            consumer_offset: committed.map(QueueOffset),
            oldest_unconsumed_store_ms: None,
        }
    }

    fn stored(queues: &[(i32, u64, u64, Option<i64>)]) -> TopicStats {
        TopicStats {
            queues: queues
                .iter()
                .map(|(queue_id, min, max, last)| QueueTopicStats {
                    broker_name: "qb-2".to_string(),
                    queue_id: *queue_id,
                    min_offset: QueueOffset(*min),
                    max_offset: QueueOffset(*max),
                    last_update_ms: *last,
                })
                .collect(),
        }
    }

    #[test]
    fn groups_wait_where_they_committed_and_topics_where_nobody_did() {
        let groups = vec![(
            "billing".to_string(),
            vec![
                consumed("orders", 0, 100, Some(40)),
                consumed("orders", 1, 5, None),
            ],
        )];
        let topics = vec![
            (
                "orders".to_string(),
                stored(&[(0, 0, 100, None), (1, 0, 5, None)]),
            ),
            (
                "audit-log".to_string(),
                stored(&[(0, 10, 30, None), (1, 7, 7, None)]),
            ),
            ("TBW102".to_string(), stored(&[(0, 0, 0, None)])),
        ];
        let backlog = backlog(&groups, &topics, 0);
        assert_eq!(backlog.group_messages, 60);
        assert_eq!(
            backlog.pending_groups,
            BTreeSet::from(["billing".to_string()])
        );
        // orders queue 1 has no commit: its 5 messages count as nobody's, like audit-log's 20.
        assert_eq!(backlog.messages_without_group, 25);
        assert_eq!(
            backlog.pending_topics,
            BTreeSet::from(["audit-log".to_string(), "orders".to_string()])
        );
        assert!(!backlog.is_empty());
    }

    #[test]
    fn a_consumed_broker_with_empty_topics_is_drained() {
        let groups = vec![(
            "billing".to_string(),
            vec![consumed("orders", 0, 100, Some(100))],
        )];
        let topics = vec![("orders".to_string(), stored(&[(0, 0, 100, None)]))];
        assert!(backlog(&groups, &topics, 0).is_empty());
    }

    #[test]
    fn delayed_messages_are_waited_for_until_due() {
        // Level 3 (queue 2) delays 10 s; the last message was stored at t = 1 000 000.
        let topics = vec![(
            SCHEDULE_TOPIC.to_string(),
            stored(&[(0, 0, 0, None), (2, 0, 4, Some(1_000_000))]),
        )];
        let due = 1_000_000 + 10_000 + DELAY_DELIVERY_SLACK_MS;
        assert_eq!(
            backlog(&[], &topics, due - 1).pending_topics,
            BTreeSet::from([SCHEDULE_TOPIC.to_string()])
        );
        let after = backlog(&[], &topics, due);
        assert!(after.is_empty(), "{after:?}");
        assert_eq!(
            after.messages_without_group, 0,
            "delivered ones are counted in their topic"
        );
    }

    #[test]
    fn the_delay_levels_are_the_brokers() {
        assert_eq!(DELAY_LEVELS_MS, quiver_broker::schedule::DELAY_LEVELS_MS);
    }

    #[test]
    fn an_unreachable_broker_is_never_drained_and_is_named() {
        let leaving = vec![
            LeavingBroker {
                name: "qb-2".into(),
                backlog: Ok(Backlog::default()),
            },
            LeavingBroker {
                name: "qb-3".into(),
                backlog: Err("broker qb-3 unreachable: connection refused".into()),
            },
        ];
        assert!(!is_drained(&leaving));
        let status = drain_status(&leaving);
        assert_eq!(status.brokers, vec!["qb-2", "qb-3"]);
        assert_eq!(status.unreachable_brokers, vec!["qb-3"]);
        assert_eq!(
            describe(&status),
            "qb-3 did not answer, so what they hold is unknown"
        );
        assert!(is_drained(&leaving[..1]));
    }

    #[test]
    fn the_description_names_groups_topics_and_delays() {
        let status = DrainStatus {
            brokers: vec!["qb-2".into()],
            remaining_messages: 60,
            pending_groups: vec!["billing".into()],
            messages_without_group: 20,
            pending_topics: vec!["audit-log".into(), SCHEDULE_TOPIC.into()],
            unreachable_brokers: Vec::new(),
        };
        assert_eq!(
            describe(&status),
            "60 messages unread by billing; 20 messages no group has committed on, in \
             audit-log; delayed messages not yet due in SCHEDULE_TOPIC_XXXX"
        );
    }

    #[test]
    fn kept_brokers_of_a_partial_revert_are_the_ones_below_the_new_count() {
        let broker = Broker::test().replicas(3);
        let previous = BrokerStatus {
            drain: Some(DrainStatus {
                brokers: vec!["qb-2".into(), "qb-3".into(), "qb-4".into()],
                remaining_messages: 1,
                pending_groups: Vec::new(),
                messages_without_group: 0,
                pending_topics: Vec::new(),
                unreachable_brokers: Vec::new(),
            }),
            read_only_brokers: vec!["qb-1".into()],
            ..BrokerStatus::default()
        };
        assert_eq!(kept_read_only(&broker, &previous, 3), vec![1, 2]);
        assert_eq!(kept_read_only(&broker, &previous, 1), Vec::<i32>::new());
    }
}
