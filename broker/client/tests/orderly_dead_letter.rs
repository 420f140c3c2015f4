//! Orderly mode: a message that keeps failing is retried in place, then parked in the DLQ,
//! and the queue moves on to the messages behind it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, TestBroker};
use parking_lot::Mutex;
use quiver_client::{
    ConsumeFromWhere, ConsumeMode, ConsumeOutcome, Message, PullConsumer, PullStatus, PushConsumer,
    QueueOffset, QueueSelector, ReceivedMessage, Subscription,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_orderly_message_goes_to_dlq_and_queue_continues() {
    let broker = TestBroker::start().await;
    let topic = "ordered-poison";
    let group = "g-orderly-dlq";
    broker.create_topic(topic, 1).await;
    let producer = broker.producer();
    for body in ["first", "poison", "after"] {
        producer
            .send_with(Message::new(topic, body), QueueSelector::QueueId(0))
            .await
            .expect("send");
    }

    let attempts: Arc<Mutex<Vec<(String, i32)>>> = Arc::default();
    let log = attempts.clone();
    let listener = Arc::new(move |batch: &[ReceivedMessage]| {
        let mut outcome = ConsumeOutcome::Success;
        for message in batch {
            let body = String::from_utf8_lossy(&message.body).into_owned();
            if body == "poison" {
                outcome = ConsumeOutcome::Retry;
            }
            log.lock().push((body, message.reconsume_times));
        }
        outcome
    });
    let mut config = broker
        .consumer_config(group, topic)
        .consume_from(ConsumeFromWhere::FirstOffset)
        .mode(ConsumeMode::Orderly);
    config.max_reconsume_times = 3;
    let consumer = PushConsumer::start(config, listener).await.expect("start");
    wait_until(
        "the message behind the poison",
        Duration::from_secs(15),
        || attempts.lock().iter().any(|(body, _)| body == "after"),
    )
    .await;
    consumer.shutdown().await.expect("shutdown");

    let attempts = attempts.lock().clone();
    let expected: Vec<(String, i32)> = vec![
        ("first".into(), 0),
        ("poison".into(), 0),
        ("poison".into(), 1),
        ("poison".into(), 2),
        ("after".into(), 0),
    ];
    assert_eq!(attempts, expected);

    let dlq = format!("%DLQ%{group}");
    let reader = PullConsumer::new(broker.client(), "dlq-reader");
    let queue = reader.queues(&dlq).await.expect("dlq route").remove(0);
    let result = reader
        .pull(
            &queue,
            QueueOffset(0),
            8,
            &Subscription::new(dlq.clone(), "*"),
            None,
        )
        .await
        .expect("pull");
    let PullStatus::Found(parked) = result.status else {
        panic!("nothing in {dlq}: {:?}", result.status)
    };
    assert_eq!(parked.len(), 1);
    assert_eq!(&parked[0].body[..], b"poison");
    broker.stop().await;
}
