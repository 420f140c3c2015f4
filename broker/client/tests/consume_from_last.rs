//! CONSUME_FROM_LAST_OFFSET on a new group skips the history.

mod common;

use std::time::Duration;

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, PushConsumer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_from_last_skips_history() {
    let broker = TestBroker::start().await;
    let topic = "history-last";
    broker.create_topic(topic, 4).await;
    let producer = broker.producer();
    produce(&producer, topic, "old", 20).await;

    let received = Received::default();
    let config = broker
        .consumer_config("g-last", topic)
        .consume_from(ConsumeFromWhere::LastOffset);
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    wait_until("all queues assigned", Duration::from_secs(10), || {
        consumer
            .assigned_queues()
            .iter()
            .filter(|q| q.topic == topic)
            .count()
            == 4
    })
    .await;
    let fresh = produce(&producer, topic, "new", 10).await;
    wait_until("the new messages", Duration::from_secs(10), || {
        received.len() >= fresh.len()
    })
    .await;
    consumer.shutdown().await.expect("shutdown");
    let mut bodies = received.bodies();
    bodies.sort();
    let mut expected = fresh.clone();
    expected.sort();
    assert_eq!(bodies, expected, "history was consumed");
    broker.stop().await;
}
