//! Scale-down drains from the leaving brokers' measured backlog (were the scenarios
//! broker_drain_forced and broker_drain_delayed). The backlog is measured by
//! [`drain::backlog`] from the stats the brokers answer, as observe does.

use super::*;
use crate::admin::{QueueConsumeStats, QueueOffset, QueueTopicStats, TopicStats};
use crate::controller::drain::SCHEDULE_TOPIC;
use crate::crd::FORCE_SCALE_DOWN_ANNOTATION;

/// Group `group`'s queue 0 of `topic`: `max` written, `committed` read.
fn group_queue(
    group: &str,
    topic: &str,
    max: u64,
    committed: u64,
) -> (String, Vec<QueueConsumeStats>) {
    let queue = QueueConsumeStats {
        topic: topic.to_string(),
        broker_name: String::new(),
        queue_id: 0,
        broker_offset: QueueOffset(max),
        consumer_offset: Some(QueueOffset(committed)),
        oldest_unconsumed_store_ms: None,
    };
    (group.to_string(), vec![queue])
}

/// Topic `topic`'s queues: (queue id, min offset, max offset, last store time).
fn topic(topic: &str, queues: &[(i32, u64, u64, Option<i64>)]) -> (String, TopicStats) {
    let queues = queues
        .iter()
        .map(|&(queue_id, min, max, last_update_ms)| QueueTopicStats {
            broker_name: String::new(),
            queue_id,
            min_offset: QueueOffset(min),
            max_offset: QueueOffset(max),
            last_update_ms,
        })
        .collect();
    (topic.to_string(), TopicStats { queues })
}

fn measured(
    name: &str,
    groups: &[(String, Vec<QueueConsumeStats>)],
    topics: &[(String, TopicStats)],
) -> LeavingBroker {
    LeavingBroker {
        name: name.to_string(),
        backlog: Ok(drain::backlog(groups, topics, NOW_MS, false)),
    }
}

/// Three brokers to two; qb-2 holds 60 messages billing has not read and 20 in audit-log that
/// no group commits on. The drain holds the broker pass after pass, until
/// quiver.io/force-scale-down lets it go with a Warning naming what is dropped.
#[test]
fn a_blocked_drain_waits_until_the_annotation_forces_it() {
    let blocked = measured(
        "qb-2",
        &[group_queue("billing", "orders", 100, 40)],
        &[topic("audit-log", &[(0, 0, 20, None)])],
    );
    let broker = Broker::test().replicas(2).image("quiver:1");
    let cluster = Cluster {
        leaving: vec![blocked],
        ..running(&broker, 3, 3)
    };
    let mut world = world(broker, cluster);
    let rows: [(&str, bool, &[&str], i32); 3] = [
        ("the drain starts", false, &["Normal DrainStarted"], 3),
        ("the drain holds", false, &[], 3),
        // The broker goes; the two that stay do not roll (their peer lists are not hashed).
        ("forced", true, &["Warning ForcedScaleDown"], 2),
    ];
    for (name, forced, events, replicas) in rows {
        if forced {
            world
                .broker
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(FORCE_SCALE_DOWN_ANNOTATION.to_string(), "true".to_string());
        }
        let done = pass(&world);
        assert_eq!(done.events, events, "{name}");
        assert_eq!(sts_of(&done.plan).spec.replicas, Some(replicas), "{name}");
        assert_eq!(done.status.current_replicas, replicas, "{name}");
        assert_eq!(done.status.drain.is_some(), !forced, "{name}");
        next(&mut world, &done);
    }
    let forced = note_of(&decide(&world), "ForcedScaleDown");
    for part in [
        "qb-2",
        "60 messages unread by billing",
        "20 messages",
        "audit-log",
    ] {
        assert!(forced.contains(part), "{part:?} not in {forced}");
    }
    assert!(
        !actions(&decide(&world)).contains(&"event Drained".to_string()),
        "forced, not drained"
    );
}

/// Delayed messages not yet due sit in SCHEDULE_TOPIC_XXXX, which no group commits on: they
/// hold the leaving broker, while a level whose messages were delivered long since does not.
#[test]
fn delayed_messages_not_yet_due_hold_the_leaving_broker() {
    // Level 18 (two hours): stored a minute ago, due in about two hours.
    let not_due = (17, 0, 3, Some(NOW_MS - 60_000));
    // Level 1 (one second), stored an hour ago: delivered long since.
    let delivered = (0, 0, 9, Some(NOW_MS - 3_600_000));
    let rows = [
        ("a level not yet due", vec![not_due, delivered], 2),
        ("only delivered levels", vec![delivered], 1),
    ];
    let broker = Broker::test().replicas(1);
    for (name, levels, replicas) in rows {
        let leaving = measured("qb-1", &[], &[topic(SCHEDULE_TOPIC, &levels)]);
        let cluster = Cluster {
            leaving: vec![leaving],
            ..running(&broker, 2, 2)
        };
        let done = pass(&world(broker.clone(), cluster));
        assert_eq!(sts_of(&done.plan).spec.replicas, Some(replicas), "{name}");
        if let Some(drain) = &done.status.drain {
            assert_eq!(drain.pending_topics, [SCHEDULE_TOPIC], "{name}");
            assert_eq!(drain.messages_without_group, 0, "{name}");
        }
        assert_eq!(done.status.drain.is_some(), replicas == 2, "{name}");
    }
}
