//! CONSUME_FROM_TIMESTAMP starts at the first message stored at or after the time.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, PushConsumer};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_group_from_timestamp_starts_at_that_time() {
    let broker = TestBroker::start().await;
    let topic = "history-ts";
    broker.create_topic(topic, 4).await;
    let producer = broker.producer();
    produce(&producer, topic, "before", 12).await;
    // Everything above was stored strictly before `cut`, everything below strictly after.
    let cut = now_ms() + 1;
    wait_until("the clock to pass the cut", Duration::from_secs(1), || {
        now_ms() > cut
    })
    .await;
    let after = produce(&producer, topic, "after", 12).await;

    let received = Received::default();
    let config = broker
        .consumer_config("g-ts", topic)
        .consume_from(ConsumeFromWhere::Timestamp(cut));
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    wait_until(
        "the messages after the cut",
        Duration::from_secs(10),
        || received.len() >= after.len(),
    )
    .await;
    consumer.shutdown().await.expect("shutdown");
    let mut bodies = received.bodies();
    bodies.sort();
    let mut expected = after.clone();
    expected.sort();
    assert_eq!(bodies, expected);
    broker.stop().await;
}
