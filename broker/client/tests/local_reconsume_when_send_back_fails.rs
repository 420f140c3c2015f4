//! When the broker refuses a send-back (here: it is read-only), the failed message is
//! consumed again locally with reconsumeTimes + 1 instead of being lost or skipped.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, TestBroker};
use parking_lot::Mutex;
use quiver_client::admin::{PERM_READ_ONLY, PERM_READ_WRITE};
use quiver_client::{
    Admin, ConsumeFromWhere, ConsumeOutcome, Message, PushConsumer, ReceivedMessage,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_send_back_is_reconsumed_locally() {
    let broker = TestBroker::start().await;
    let topic = "refused";
    broker.create_topic(topic, 1).await;
    broker
        .producer()
        .send(Message::new(topic, "once-failing"))
        .await
        .expect("send");
    let admin = Admin::new(broker.client());
    // Reads still work on a read-only broker; the send-back (a write) is refused.
    admin
        .set_broker_permission(&broker.addr, PERM_READ_ONLY)
        .await
        .expect("read-only");

    let deliveries: Arc<Mutex<Vec<ReceivedMessage>>> = Arc::default();
    let seen = deliveries.clone();
    let listener = Arc::new(move |batch: &[ReceivedMessage]| {
        seen.lock().extend_from_slice(batch);
        if batch.iter().all(|m| m.reconsume_times == 0) {
            ConsumeOutcome::Retry
        } else {
            ConsumeOutcome::Success
        }
    });
    let config = broker
        .consumer_config("g-local", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    let consumer = PushConsumer::start(config, listener).await.expect("start");
    wait_until("the local redelivery", Duration::from_secs(10), || {
        deliveries.lock().len() >= 2
    })
    .await;
    let queue = consumer
        .assigned_queues()
        .into_iter()
        .find(|q| q.topic == topic)
        .expect("assigned");
    wait_until(
        "the offset to move past the message",
        Duration::from_secs(10),
        || consumer.local_offset(&queue).is_some_and(|o| o.0 == 1),
    )
    .await;
    admin
        .set_broker_permission(&broker.addr, PERM_READ_WRITE)
        .await
        .expect("read-write");
    consumer.shutdown().await.expect("shutdown");

    let deliveries = deliveries.lock().clone();
    assert_eq!(deliveries.len(), 2);
    assert_eq!(deliveries[1].reconsume_times, 1);
    assert_eq!(
        deliveries[1].queue_offset, deliveries[0].queue_offset,
        "redelivered from the same queue slot"
    );
    assert_eq!(
        deliveries[1].queue.topic, topic,
        "not through the retry topic"
    );
    admin.shutdown().await;
    broker.stop().await;
}
