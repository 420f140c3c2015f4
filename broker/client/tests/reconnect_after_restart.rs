//! A client whose broker restarts reconnects on its next request; stored messages survive.

mod common;

use common::{produce, TestBroker};
use quiver_client::{Message, PullConsumer, PullStatus, QueueOffset, QueueSelector, Subscription};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_reader_reconnect_after_broker_restart() {
    let broker = TestBroker::start().await;
    let topic = "durable";
    broker.create_topic(topic, 1).await;
    let producer = broker.producer();
    produce(&producer, topic, "before", 3).await;

    let broker = broker.restart().await;
    // Same client objects: their old connections are dead and must be replaced.
    let after = producer
        .send_with(Message::new(topic, "after"), QueueSelector::QueueId(0))
        .await
        .expect("send after restart");
    assert_eq!(after.queue_offset, QueueOffset(3));

    let reader = PullConsumer::new(broker.client(), "reader");
    let queue = reader.queues(topic).await.expect("queues").remove(0);
    let result = reader
        .pull(
            &queue,
            QueueOffset(0),
            16,
            &Subscription::new(topic, "*"),
            None,
        )
        .await
        .expect("pull");
    let PullStatus::Found(messages) = result.status else {
        panic!("nothing stored: {:?}", result.status)
    };
    let bodies: Vec<String> = messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(bodies, vec!["before-0", "before-1", "before-2", "after"]);
    broker.stop().await;
}
