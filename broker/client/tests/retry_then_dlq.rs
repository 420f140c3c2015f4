//! A message that keeps failing is redelivered through %RETRY%group, then dead-lettered.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, TestBroker};
use parking_lot::Mutex;
use quiver_client::{
    ConsumeFromWhere, ConsumeOutcome, Message, PullConsumer, PullStatus, PushConsumer, QueueOffset,
    ReceivedMessage, Subscription,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_message_is_retried_then_dead_lettered() {
    let broker = TestBroker::start().await;
    let topic = "fragile";
    let group = "g-retry";
    broker.create_topic(topic, 2).await;
    let deliveries: Arc<Mutex<Vec<ReceivedMessage>>> = Arc::default();
    let seen = deliveries.clone();
    let listener = Arc::new(move |batch: &[ReceivedMessage]| {
        seen.lock().extend_from_slice(batch);
        ConsumeOutcome::Retry
    });
    let mut config = broker
        .consumer_config(group, topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    config.max_reconsume_times = 1;
    config.retry_delay_level = Some(1);
    let consumer = PushConsumer::start(config, listener).await.expect("start");

    let producer = broker.producer();
    let sent = producer
        .send(
            Message::new(topic, "poison")
                .with_tags("T")
                .with_keys(["k-1"]),
        )
        .await
        .expect("send");
    wait_until("the redelivery", Duration::from_secs(20), || {
        deliveries.lock().len() >= 2
    })
    .await;

    let dlq_topic = format!("%DLQ%{group}");
    let reader = PullConsumer::new(broker.client(), "dlq-reader");
    let all = Subscription::new(dlq_topic.clone(), "*");
    let mut parked = None;
    let started = std::time::Instant::now();
    while parked.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing reached {dlq_topic}"
        );
        if let Ok(queues) = reader.queues(&dlq_topic).await {
            for queue in queues {
                let result = reader
                    .pull(
                        &queue,
                        QueueOffset(0),
                        8,
                        &all,
                        Some(Duration::from_millis(200)),
                    )
                    .await
                    .expect("pull dlq");
                if let PullStatus::Found(messages) = result.status {
                    parked = messages.into_iter().next();
                }
            }
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    consumer.shutdown().await.expect("shutdown");

    let deliveries = deliveries.lock().clone();
    assert_eq!(deliveries.len(), 2, "delivered once and redelivered once");
    assert_eq!(deliveries[0].reconsume_times, 0);
    assert_eq!(deliveries[1].reconsume_times, 1);
    // The redelivery comes from the retry topic but shows the producer's topic.
    assert!(deliveries[1].queue.topic.starts_with("%RETRY%"));
    assert_eq!(deliveries[1].topic, topic);
    let parked = parked.expect("parked");
    assert_eq!(&parked.body[..], b"poison");
    assert_eq!(parked.msg_id(), sent.msg_id);
    assert_eq!(parked.tags(), Some("T"));
    assert_eq!(parked.keys(), vec!["k-1"]);
    broker.stop().await;
}
