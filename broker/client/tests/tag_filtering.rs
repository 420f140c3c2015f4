//! A tag subscription delivers only the listed tags (broker hash filter + client check).

mod common;

use std::time::Duration;

use common::{wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, Message, PushConsumer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_subscribed_tags_are_delivered() {
    let broker = TestBroker::start().await;
    let topic = "tagged";
    broker.create_topic(topic, 2).await;
    let producer = broker.producer();
    for (i, tag) in ["A", "B", "C", "A", "B", "C"].iter().enumerate() {
        producer
            .send(Message::new(topic, format!("{tag}-{i}")).with_tags(*tag))
            .await
            .expect("send");
    }
    producer
        .send(Message::new(topic, "untagged"))
        .await
        .expect("send");
    // Sent last on each queue: once it arrives, everything before it was filtered or delivered.
    for queue_id in 0..2 {
        let marker = Message::new(topic, format!("end-{queue_id}")).with_tags("B");
        producer
            .send_with(marker, quiver_client::QueueSelector::QueueId(queue_id))
            .await
            .expect("send");
    }

    let received = Received::default();
    let mut config = broker
        .consumer_config("g-tags", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    config.subscriptions = vec![(topic.to_owned(), "A || B".into())];
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    wait_until("both end markers", Duration::from_secs(10), || {
        let bodies = received.bodies();
        bodies.contains(&"end-0".to_owned()) && bodies.contains(&"end-1".to_owned())
    })
    .await;
    consumer.shutdown().await.expect("shutdown");
    let mut bodies = received.bodies();
    bodies.sort();
    assert_eq!(bodies, vec!["A-0", "A-3", "B-1", "B-4", "end-0", "end-1"]);
    broker.stop().await;
}
