//! A drain reports dead-letter topics and does not wait for them: once the groups have read the
//! leaving broker, it goes, with its `%DLQ%` messages named in the status while it drained and
//! in the Drained event. `spec.drain.waitForDeadLetters: true` waits for them like any topic.

use super::{addr, condition_message, eventually, holds_for, Scenario, NOW_MS};
use crate::crd::{DeadLetterTopic, DrainWait};
use std::time::Duration;

/// On qb-2: billing has 60 unread messages of orders; `%DLQ%billing` holds 3 messages nobody
/// has ever committed on.
fn seed_leaving_broker(scenario: &Scenario) {
    let admin = &scenario.admin;
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    admin.set_topic_queue(&addr(2), ("orders", 0), (0, 100), Some(NOW_MS - 5_000));
    admin.set_topic_queue(&addr(2), ("%DLQ%billing", 0), (0, 3), Some(NOW_MS - 5_000));
}

fn dead_letters() -> Vec<DeadLetterTopic> {
    vec![DeadLetterTopic {
        topic: "%DLQ%billing".into(),
        messages: 3,
    }]
}

#[tokio::test(start_paused = true)]
async fn a_dead_lettered_message_does_not_hold_the_drain_and_is_reported() {
    let scenario = Scenario::settled(3).await;
    seed_leaving_broker(&scenario);
    scenario.scale_to(2);

    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    let status = scenario.status();
    let drain = status.drain.clone().expect("draining");
    let billing_on_orders = DrainWait {
        topic: "orders".into(),
        group: Some("billing".into()),
        unread: 60,
    };
    assert_eq!(
        drain.waiting_for,
        [billing_on_orders],
        "what the drain waits for"
    );
    assert_eq!(
        drain.pending_topics,
        Vec::<String>::new(),
        "the DLQ is not waited for"
    );
    assert_eq!(
        (drain.dead_letters, drain.dead_letter_messages),
        (dead_letters(), 3)
    );
    let progressing = condition_message(&status.conditions, "Progressing");
    assert!(
        progressing.contains("60 messages unread by billing")
            && progressing.contains("3 dead-lettered messages in %DLQ%billing"),
        "{progressing}"
    );

    // billing catches up: nothing is waited for any more, the broker goes with its DLQ.
    scenario.admin.consume_all(&addr(2), "billing");
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 2 && scenario.broker_ready()
    })
    .await;
    let drained = scenario.event("Drained", "Normal");
    let note = drained["note"].as_str().expect("a note");
    assert!(
        note.contains("3 dead-lettered messages in %DLQ%billing, dropped with the brokers"),
        "{note}"
    );
    assert_eq!(scenario.status().drain, None);
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn wait_for_dead_letters_holds_the_drain_until_they_are_read() {
    let scenario = Scenario::settled(3).await;
    scenario.edit_broker(|broker| {
        broker["spec"]["drain"] = serde_json::json!({"waitForDeadLetters": true});
    });
    eventually(Duration::from_secs(60), || scenario.broker_ready()).await;
    seed_leaving_broker(&scenario);
    scenario.admin.consume_all(&addr(2), "billing");
    scenario.scale_to(2);

    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    let drain = scenario.status().drain.expect("draining");
    let dead_letters_unread = DrainWait {
        topic: "%DLQ%billing".into(),
        group: None,
        unread: 3,
    };
    assert_eq!(drain.waiting_for, [dead_letters_unread]);
    assert_eq!(drain.pending_topics, ["%DLQ%billing"]);
    assert_eq!(
        drain.dead_letters,
        Vec::new(),
        "waited for, so not only reported"
    );
    holds_for(
        Duration::from_secs(120),
        "three brokers while the DLQ is unread",
        || scenario.sts_replicas() == 3,
    )
    .await;

    // A DLQ reader commits to the end: the broker goes.
    let reader = ("%DLQ%billing", 0);
    scenario
        .admin
        .set_queue(&addr(2), "dlq-reader", reader, 3, Some(3), None);
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 2 && scenario.broker_ready()
    })
    .await;
    scenario.stop().await;
}
