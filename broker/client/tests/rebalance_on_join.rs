//! A second member joining splits the queues; each message goes to exactly one member.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, PushConsumer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_member_triggers_rebalance_and_messages_are_consumed_once() {
    let broker = TestBroker::start().await;
    let topic = "events";
    broker.create_topic(topic, 8).await;
    let config = broker
        .consumer_config("g-rebalance", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);

    let first = Received::default();
    let a = PushConsumer::start(config.clone(), first.listener())
        .await
        .expect("start a");
    let of_topic = |c: &PushConsumer| {
        c.assigned_queues()
            .into_iter()
            .filter(|q| q.topic == topic)
            .collect::<BTreeSet<_>>()
    };
    wait_until(
        "the only member to own all 8 queues",
        Duration::from_secs(10),
        || of_topic(&a).len() == 8,
    )
    .await;

    let second = Received::default();
    let b = PushConsumer::start(config, second.listener())
        .await
        .expect("start b");
    wait_until(
        "the queues to be split 4/4",
        Duration::from_secs(15),
        || of_topic(&a).len() == 4 && of_topic(&b).len() == 4,
    )
    .await;
    let (qa, qb) = (of_topic(&a), of_topic(&b));
    assert!(
        qa.is_disjoint(&qb),
        "a queue is owned twice: {qa:?} / {qb:?}"
    );
    assert_eq!(qa.union(&qb).count(), 8);

    let producer = broker.producer();
    let sent = produce(&producer, topic, "e", 200).await;
    wait_until(
        "all messages to be consumed",
        Duration::from_secs(20),
        || first.len() + second.len() >= sent.len(),
    )
    .await;
    // Both got work, and nothing was delivered twice.
    assert!(
        first.len() > 0 && second.len() > 0,
        "one member got nothing: {} / {}",
        first.len(),
        second.len()
    );
    let mut counts = first.counts();
    for (body, n) in second.counts() {
        *counts.entry(body).or_default() += n;
    }
    for body in &sent {
        assert_eq!(
            counts.get(body),
            Some(&1),
            "{body} delivered {:?} times",
            counts.get(body)
        );
    }
    a.shutdown().await.expect("a shutdown");
    b.shutdown().await.expect("b shutdown");
    broker.stop().await;
}
