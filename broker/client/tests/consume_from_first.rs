//! CONSUME_FROM_FIRST_OFFSET on a new group reads the whole history.

mod common;

use std::time::Duration;

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, PushConsumer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_from_first_reads_everything() {
    let broker = TestBroker::start().await;
    let topic = "history-first";
    broker.create_topic(topic, 4).await;
    let producer = broker.producer();
    let mut expected = produce(&producer, topic, "old", 30).await;

    let received = Received::default();
    let config = broker
        .consumer_config("g-first", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    expected.extend(produce(&producer, topic, "new", 5).await);
    wait_until("history and new messages", Duration::from_secs(10), || {
        received.len() >= expected.len()
    })
    .await;
    consumer.shutdown().await.expect("shutdown");
    let mut bodies = received.bodies();
    bodies.sort();
    expected.sort();
    assert_eq!(bodies, expected);
    broker.stop().await;
}
