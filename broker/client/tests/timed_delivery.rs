//! Timed messages through the Rust client: `with_deliver_at_ms` and `with_delay_ms` reach a
//! push consumer not before their time, in the queue the send named, with keys, properties
//! and the message id the producer logged.

mod common;

use std::time::Duration;

use common::{wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, Message, PushConsumer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_messages_reach_consumers_not_before_their_time() {
    let broker = TestBroker::start().await;
    let topic = "timed";
    broker.create_topic(topic, 2).await;
    let producer = broker.producer();
    let now = quiver_broker::now_ms();
    let at = producer
        .send(
            Message::new(topic, "at")
                .with_keys(["key-at"])
                .with_property("color", "red")
                .with_deliver_at_ms(now + 1_500),
        )
        .await
        .expect("timed send");
    let delayed = producer
        .send(
            Message::new(topic, "delayed")
                .with_keys(["key-delayed"])
                .with_delay_ms(1_000),
        )
        .await
        .expect("delayed send");

    let received = Received::default();
    let config = broker
        .consumer_config("timed-consumers", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("consumer starts");
    wait_until("both timed messages", Duration::from_secs(30), || {
        received.len() >= 2
    })
    .await;
    let messages = received.messages.lock().clone();
    for (sent, due, key) in [
        (&at, now + 1_500, "key-at"),
        (&delayed, now + 1_000, "key-delayed"),
    ] {
        let message = messages
            .iter()
            .find(|m| m.msg_id() == sent.msg_id)
            .unwrap_or_else(|| panic!("{} not received by its id", sent.msg_id));
        assert!(message.store_timestamp_ms >= due, "delivered early");
        assert_eq!(
            message.queue, sent.queue,
            "delivered to the queue the send named"
        );
        assert_eq!(message.keys(), [key]);
    }
    let at_message = messages.iter().find(|m| m.body.as_ref() == b"at").unwrap();
    assert_eq!(at_message.property("color"), Some("red"));
    assert_eq!(received.counts().values().max(), Some(&1));
    consumer.shutdown().await.expect("consumer stops");
    producer.shutdown().await;
    broker.stop().await;
}
