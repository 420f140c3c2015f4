//! Safe scale-down: each leaving broker is made read-only and measured on its own, so one that
//! does not answer is reported without stopping the rest of the reconcile. Pure decisions here,
//! admin calls in [`inspect_leaving`] and [`restore_kept`].

use super::{error_chain, replication, Context};
use crate::admin::{
    AdminError, BrokerAddr, BrokerPermission, QueueConsumeStats, ReplicationStatus, TopicStats,
};
use crate::crd::{Broker, BrokerStatus, DeadLetterTopic, DrainStatus, DrainWait};
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
/// Prefix of the dead-letter topics, `%DLQ%<group>`.
pub const DEAD_LETTER_PREFIX: &str = "%DLQ%";
/// Entries of `status.drain.waitingFor` and of `deadLetters`, each; the rest are counted.
pub const LISTED_ENTRIES: usize = 20;

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
    /// Unread messages waited for, by topic and group (`None`: no group committed on them).
    pub waits: BTreeMap<(String, Option<String>), u64>,
    /// Unread messages of dead-letter topics, reported and not waited for.
    pub dead_letters: BTreeMap<String, u64>,
}

impl Backlog {
    /// Nothing left that would be lost with the broker, dead letters aside.
    pub fn is_empty(&self) -> bool {
        self.group_messages == 0 && self.pending_topics.is_empty()
    }

    fn wait_for_group(&mut self, topic: &str, group: &str, unread: u64) {
        self.group_messages += unread;
        self.pending_groups.insert(group.to_string());
        *self
            .waits
            .entry((topic.to_string(), Some(group.to_string())))
            .or_default() += unread;
    }

    fn wait_for_topic(&mut self, topic: &str, stored: u64) {
        self.messages_without_group += stored;
        self.pending_topics.insert(topic.to_string());
        *self.waits.entry((topic.to_string(), None)).or_default() += stored;
    }
}

/// One leaving broker as measured this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeavingBroker {
    /// Broker (pod) name.
    pub name: String,
    /// Its backlog, or why it could not be measured. A member of a replicated group other than
    /// the one counted (see [`counted_member`]) is empty once fenced: its group counts once.
    pub backlog: Result<Backlog, String>,
}

/// Whether `topic` is a dead-letter topic.
pub fn is_dead_letter_topic(topic: &str) -> bool {
    topic.starts_with(DEAD_LETTER_PREFIX)
}

/// The backlog of a broker from its groups' consume stats and its topics' stats at `now_ms`.
///
/// A group waits for its unconsumed messages where it has a commit. A queue no group has
/// committed on waits until it holds no message: nobody would ever read them after the broker
/// is gone. Delayed messages are waited for until the last one of each level is due. Dead-letter
/// topics are only reported, unless `wait_for_dead_letters`: nobody may ever read them.
pub fn backlog(
    groups: &[(String, Vec<QueueConsumeStats>)],
    topics: &[(String, TopicStats)],
    now_ms: i64,
    wait_for_dead_letters: bool,
) -> Backlog {
    let reported_only = |topic: &str| !wait_for_dead_letters && is_dead_letter_topic(topic);
    let mut backlog = Backlog::default();
    let mut committed: BTreeSet<(&str, i32)> = BTreeSet::new();
    for (group, queues) in groups {
        for queue in queues {
            let Some(offset) = queue.consumer_offset else {
                continue;
            };
            committed.insert((queue.topic.as_str(), queue.queue_id));
            let unread = queue.broker_offset.0.saturating_sub(offset.0);
            if unread == 0 {
                continue;
            }
            if reported_only(&queue.topic) {
                *backlog.dead_letters.entry(queue.topic.clone()).or_default() += unread;
            } else {
                backlog.wait_for_group(&queue.topic, group, unread);
            }
        }
    }
    for (topic, stats) in topics {
        if topic == SCHEDULE_TOPIC {
            let not_due = delayed_messages_not_due(stats, now_ms);
            if not_due > 0 {
                backlog.pending_topics.insert(topic.clone());
                backlog.waits.insert((topic.clone(), None), not_due);
            }
            continue;
        }
        for queue in &stats.queues {
            let stored = queue.max_offset.0.saturating_sub(queue.min_offset.0);
            if stored == 0 || committed.contains(&(topic.as_str(), queue.queue_id)) {
                continue;
            }
            if reported_only(topic) {
                *backlog.dead_letters.entry(topic.clone()).or_default() += stored;
            } else {
                backlog.wait_for_topic(topic, stored);
            }
        }
    }
    backlog
}

/// Messages of the delay levels whose last message is not yet due (plus the delivery slack) at
/// `now_ms`.
fn delayed_messages_not_due(stats: &TopicStats, now_ms: i64) -> u64 {
    stats
        .queues
        .iter()
        .filter(|queue| {
            let level_delay = usize::try_from(queue.queue_id)
                .ok()
                .and_then(|level| DELAY_LEVELS_MS.get(level))
                .copied()
                .unwrap_or(DELAY_LEVELS_MS[DELAY_LEVELS_MS.len() - 1]);
            queue
                .last_update_ms
                .is_none_or(|stored| stored + level_delay + DELAY_DELIVERY_SLACK_MS > now_ms)
        })
        .map(|queue| queue.max_offset.0.saturating_sub(queue.min_offset.0))
        .sum()
}

/// The drain status of the leaving brokers.
pub fn drain_status(leaving: &[LeavingBroker]) -> DrainStatus {
    let mut groups = BTreeSet::new();
    let mut topics = BTreeSet::new();
    let mut waits: BTreeMap<(String, Option<String>), u64> = BTreeMap::new();
    let mut dead_letters: BTreeMap<String, u64> = BTreeMap::new();
    let mut status = DrainStatus {
        brokers: leaving.iter().map(|broker| broker.name.clone()).collect(),
        ..DrainStatus::default()
    };
    for broker in leaving {
        match &broker.backlog {
            Ok(backlog) => {
                status.remaining_messages += backlog.group_messages;
                status.messages_without_group += backlog.messages_without_group;
                groups.extend(backlog.pending_groups.iter().cloned());
                topics.extend(backlog.pending_topics.iter().cloned());
                for (key, unread) in &backlog.waits {
                    *waits.entry(key.clone()).or_default() += unread;
                }
                for (topic, messages) in &backlog.dead_letters {
                    status.dead_letter_messages += messages;
                    *dead_letters.entry(topic.clone()).or_default() += messages;
                }
            }
            Err(_) => status.unreachable_brokers.push(broker.name.clone()),
        }
    }
    status.pending_groups = groups.into_iter().collect();
    status.pending_topics = topics.into_iter().collect();
    let waits = waits.into_iter().map(|((topic, group), unread)| DrainWait {
        topic,
        group,
        unread,
    });
    (status.waiting_for, status.waiting_for_not_listed) = most_first(waits, |wait| wait.unread);
    let dead_letters = dead_letters
        .into_iter()
        .map(|(topic, messages)| DeadLetterTopic { topic, messages });
    (status.dead_letters, status.dead_letters_not_listed) =
        most_first(dead_letters, |topic| topic.messages);
    status
}

/// The first [`LISTED_ENTRIES`] of `entries` (in name order) by `count`, most first, and how
/// many were left out.
fn most_first<T>(entries: impl Iterator<Item = T>, count: impl Fn(&T) -> u64) -> (Vec<T>, u32) {
    let mut entries: Vec<T> = entries.collect();
    // Stable: equal counts stay in name order.
    entries.sort_by_key(|entry| std::cmp::Reverse(count(entry)));
    let left_out = entries.len().saturating_sub(LISTED_ENTRIES);
    entries.truncate(LISTED_ENTRIES);
    (entries, u32::try_from(left_out).unwrap_or(u32::MAX))
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
    let waited = if parts.is_empty() {
        "nothing left to read".to_string()
    } else {
        parts.join("; ")
    };
    match dead_letters_left(status) {
        Some(dead_letters) => format!("{waited}; {dead_letters}"),
        None => waited,
    }
}

/// The dead letters a drain reports without waiting for them, in a phrase; `None` when there
/// are none.
pub fn dead_letters_left(status: &DrainStatus) -> Option<String> {
    if status.dead_letters.is_empty() {
        return None;
    }
    let mut topics: Vec<&str> = status
        .dead_letters
        .iter()
        .map(|topic| topic.topic.as_str())
        .collect();
    let more = format!("{} more", status.dead_letters_not_listed);
    if status.dead_letters_not_listed > 0 {
        topics.push(&more);
    }
    Some(format!(
        "not waited for (spec.drain.waitForDeadLetters is false): {} dead-lettered messages \
         in {}, dropped with the brokers",
        status.dead_letter_messages,
        topics.join(", ")
    ))
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

/// Makes the leaving brokers of `ordinals` read-only and measures what they still hold; never
/// fails (a broker that does not answer is reported as such). A replicated group's brokers are
/// each fenced, and its backlog is measured on one member only ([`counted_member`]).
pub async fn inspect_leaving(
    broker: &Broker,
    ordinals: std::ops::Range<i32>,
    ctx: &Context,
    now_ms: i64,
) -> Vec<LeavingBroker> {
    if !broker.is_replicated() {
        let inspections = ordinals.map(|ordinal| inspect_broker(broker, ordinal, ctx, now_ms));
        return futures::future::join_all(inspections).await;
    }
    let first = desired::group_of(broker, ordinals.start).0;
    let groups = first..desired::groups_of_pods(broker, ordinals.end);
    let inspections = groups.map(|group| inspect_group(broker, group, ctx, now_ms));
    let inspected = futures::future::join_all(inspections).await;
    inspected.into_iter().flatten().collect()
}

/// Fences one broker and measures it.
async fn inspect_broker(
    broker: &Broker,
    ordinal: i32,
    ctx: &Context,
    now_ms: i64,
) -> LeavingBroker {
    let addr = BrokerAddr(desired::broker_address(broker, ordinal));
    let backlog = async {
        fence(&addr, ctx).await?;
        measure(&addr, ctx, now_ms, broker.waits_for_dead_letters()).await
    };
    LeavingBroker {
        name: desired::pod_name(broker, ordinal),
        backlog: backlog.await.map_err(|error| error_chain(&error)),
    }
}

/// Fences every member of a leaving replicated group and measures the one that counts.
async fn inspect_group(
    broker: &Broker,
    group: i32,
    ctx: &Context,
    now_ms: i64,
) -> Vec<LeavingBroker> {
    let members = desired::group_ordinals(broker, group);
    let address = |ordinal| BrokerAddr(desired::broker_address(broker, ordinal));
    let fenced = members.clone().map(|ordinal| {
        let addr = address(ordinal);
        async move { fence(&addr, ctx).await.map_err(|error| error_chain(&error)) }
    });
    let fenced = futures::future::join_all(fenced).await;
    let answers = members.clone().map(|ordinal| {
        let addr = address(ordinal);
        async move { ctx.admin.replication_status(&addr).await.ok() }
    });
    let answers: Vec<ReplicationStatus> = futures::future::join_all(answers)
        .await
        .into_iter()
        .flatten()
        .filter(|status| status.broker_name == desired::group_name(broker, group))
        .collect();
    let counted = counted_member(members.start, answers);
    let mut leaving = Vec::with_capacity(fenced.len());
    for (ordinal, fenced) in members.zip(fenced) {
        let backlog = match fenced {
            Ok(()) if ordinal == counted => measure(
                &address(ordinal),
                ctx,
                now_ms,
                broker.waits_for_dead_letters(),
            )
            .await
            .map_err(|error| error_chain(&error)),
            Ok(()) => Ok(Backlog::default()),
            Err(error) => Err(error),
        };
        let name = desired::pod_name(broker, ordinal);
        leaving.push(LeavingBroker { name, backlog });
    }
    leaving
}

/// The ordinal of the member of a replicated group (first ordinal `first`) whose figures count
/// for the whole group: the master, as its own answer (else the newest epoch's) names it, else
/// replica 0, as the lag poll does. Every member holds the same messages, so summing them would
/// multiply the backlog by the group size; consumers commit on the master, and a replica's
/// offsets trail the master's or are absent.
pub fn counted_member(first: i32, answers: Vec<ReplicationStatus>) -> i32 {
    let master = replication::best_view(answers).and_then(|view| view.master_id);
    master
        .and_then(|id| i32::try_from(id).ok())
        .map_or(first, |id| first + id)
}

/// Makes the broker read-only: measuring a broker that still takes writes tells nothing.
async fn fence(addr: &BrokerAddr, ctx: &Context) -> Result<(), AdminError> {
    ctx.admin
        .set_permission(addr, BrokerPermission::ReadOnly)
        .await
}

async fn measure(
    addr: &BrokerAddr,
    ctx: &Context,
    now_ms: i64,
    wait_for_dead_letters: bool,
) -> Result<Backlog, AdminError> {
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
    Ok(backlog(&groups, &topics, now_ms, wait_for_dead_letters))
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
        let backlog = backlog(&groups, &topics, 0, false);
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
    fn dead_letters_are_reported_not_waited_for_unless_asked() {
        // billing read orders to the end; its DLQ holds 3 messages nobody committed on, and a
        // DLQ reader of audit left 2 unread.
        let groups = vec![
            (
                "billing".to_string(),
                vec![consumed("orders", 0, 100, Some(100))],
            ),
            (
                "dlq-reader".to_string(),
                vec![consumed("%DLQ%audit", 0, 5, Some(3))],
            ),
        ];
        let topics = vec![
            ("orders".to_string(), stored(&[(0, 0, 100, None)])),
            ("%DLQ%billing".to_string(), stored(&[(0, 0, 3, None)])),
            ("%DLQ%audit".to_string(), stored(&[(0, 0, 5, None)])),
        ];
        let reported = backlog(&groups, &topics, 0, false);
        assert!(reported.is_empty(), "{reported:?}");
        assert_eq!(
            reported.dead_letters,
            BTreeMap::from([
                ("%DLQ%audit".to_string(), 2),
                ("%DLQ%billing".to_string(), 3)
            ])
        );
        let waited = backlog(&groups, &topics, 0, true);
        assert!(!waited.is_empty());
        assert!(waited.dead_letters.is_empty());
        assert_eq!(
            waited.waits,
            BTreeMap::from([
                (
                    ("%DLQ%audit".to_string(), Some("dlq-reader".to_string())),
                    2
                ),
                (("%DLQ%billing".to_string(), None), 3),
            ])
        );
    }

    fn leaving_with(name: &str, backlog: Backlog) -> LeavingBroker {
        LeavingBroker {
            name: name.into(),
            backlog: Ok(backlog),
        }
    }

    #[test]
    fn the_status_lists_waits_per_topic_and_group_most_first_and_bounded() {
        let mut qb2 = Backlog::default();
        qb2.wait_for_group("orders", "billing", 60);
        qb2.wait_for_topic("audit-log", 20);
        qb2.dead_letters.insert("%DLQ%billing".into(), 3);
        let mut qb3 = Backlog::default();
        qb3.wait_for_group("orders", "billing", 15);
        qb3.wait_for_group("orders", "shipping", 80);
        qb3.dead_letters.insert("%DLQ%billing".into(), 4);
        let status = drain_status(&[leaving_with("qb-2", qb2), leaving_with("qb-3", qb3)]);
        let wait = |topic: &str, group: Option<&str>, unread| DrainWait {
            topic: topic.into(),
            group: group.map(str::to_string),
            unread,
        };
        assert_eq!(
            status.waiting_for,
            [
                wait("orders", Some("shipping"), 80),
                wait("orders", Some("billing"), 75),
                wait("audit-log", None, 20),
            ]
        );
        assert_eq!(status.waiting_for_not_listed, 0);
        assert_eq!(
            status.dead_letters,
            [DeadLetterTopic {
                topic: "%DLQ%billing".into(),
                messages: 7
            }]
        );
        assert_eq!(status.dead_letter_messages, 7);
        assert_eq!(
            describe(&status),
            "155 messages unread by billing, shipping; 20 messages no group has committed on, \
             in audit-log; not waited for (spec.drain.waitForDeadLetters is false): 7 \
             dead-lettered messages in %DLQ%billing, dropped with the brokers"
        );

        let mut many = Backlog::default();
        for group in 0..25 {
            many.wait_for_group("orders", &format!("g{group:02}"), 100 + group);
        }
        let status = drain_status(&[leaving_with("qb-2", many)]);
        assert_eq!(status.waiting_for.len(), LISTED_ENTRIES);
        assert_eq!(status.waiting_for_not_listed, 5);
        assert_eq!(status.waiting_for[0], wait("orders", Some("g24"), 124));
        assert_eq!(status.remaining_messages, (100..125).sum::<u64>());
    }

    #[test]
    fn a_replicated_group_counts_its_masters_figures() {
        let answer = |replica_id: u64, epoch: u64, master_id: Option<u64>| ReplicationStatus {
            broker_name: "qb-g1".into(),
            replica_id,
            mode: "sync".into(),
            min_in_sync_replicas: 1,
            epoch,
            master_id,
            master_address: None,
            in_sync_replicas: Vec::new(),
            confirmed_offset: 0,
            writable: true,
            replicas: Vec::new(),
        };
        // Replica 1 (ordinal 4) is master at epoch 3; replica 2 still believes epoch 2's.
        let answers = vec![answer(2, 2, Some(0)), answer(1, 3, Some(1))];
        assert_eq!(counted_member(3, answers), 4);
        assert_eq!(
            counted_member(3, vec![answer(0, 2, Some(2)), answer(1, 3, Some(1))]),
            4,
            "the newest epoch's view when the master did not answer"
        );
        assert_eq!(counted_member(3, vec![answer(0, 2, None)]), 3, "no master");
        assert_eq!(counted_member(3, Vec::new()), 3, "no member answered");
    }

    #[test]
    fn a_consumed_broker_with_empty_topics_is_drained() {
        let groups = vec![(
            "billing".to_string(),
            vec![consumed("orders", 0, 100, Some(100))],
        )];
        let topics = vec![("orders".to_string(), stored(&[(0, 0, 100, None)]))];
        assert!(backlog(&groups, &topics, 0, false).is_empty());
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
            backlog(&[], &topics, due - 1, false).pending_topics,
            BTreeSet::from([SCHEDULE_TOPIC.to_string()])
        );
        let after = backlog(&[], &topics, due, false);
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
            ..DrainStatus::default()
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
                ..DrainStatus::default()
            }),
            read_only_brokers: vec!["qb-1".into()],
            ..BrokerStatus::default()
        };
        assert_eq!(kept_read_only(&broker, &previous, 3), vec![1, 2]);
        assert_eq!(kept_read_only(&broker, &previous, 1), Vec::<i32>::new());
    }
}
