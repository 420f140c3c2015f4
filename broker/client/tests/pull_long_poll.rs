//! A long-polling pull at the queue's end returns the message sent while it is in flight.

mod common;

use std::time::Duration;

use common::TestBroker;
use quiver_client::{Message, PullConsumer, PullStatus, QueueSelector, Subscription};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_returns_message_sent_meanwhile() {
    let broker = TestBroker::start().await;
    let topic = "poll";
    broker.create_topic(topic, 1).await;
    let reader = PullConsumer::new(broker.client(), "poller");
    let queue = reader.queues(topic).await.expect("queues").remove(0);
    let start = reader.max_offset(&queue).await.expect("max offset");
    let all = Subscription::new(topic, "*");

    let producer = broker.producer();
    let pull = reader.pull(&queue, start, 8, &all, Some(Duration::from_secs(20)));
    let send = async {
        // Whether the send lands before or after the pull is parked, the pull must return
        // the message rather than PULL_NOT_FOUND.
        producer
            .send_with(Message::new(topic, "wake-up"), QueueSelector::QueueId(0))
            .await
            .expect("send")
    };
    let (pulled, sent) = tokio::join!(pull, send);
    let pulled = pulled.expect("pull");
    match pulled.status {
        PullStatus::Found(messages) => {
            assert_eq!(messages.len(), 1);
            assert_eq!(&messages[0].body[..], b"wake-up");
            assert_eq!(messages[0].queue_offset, sent.queue_offset);
        }
        other => panic!("expected the message, got {other:?}"),
    }
    broker.stop().await;
}
