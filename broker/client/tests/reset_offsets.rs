//! An admin offset reset rewinds an online group (RESET_CONSUMER_CLIENT_OFFSET push) and
//! lag reports unknown, then exact numbers.

mod common;

use std::time::Duration;

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{Admin, ConsumeFromWhere, PushConsumer, ResetTarget};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_to_earliest_redelivers_and_lag_follows() {
    let broker = TestBroker::start().await;
    let topic = "replay";
    let group = "g-reset";
    broker.create_topic(topic, 2).await;
    let producer = broker.producer();
    let sent = produce(&producer, topic, "r", 20).await;
    let admin = Admin::new(broker.client());

    let received = Received::default();
    let config = broker
        .consumer_config(group, topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    wait_until("the first pass", Duration::from_secs(10), || {
        received.len() >= sent.len()
    })
    .await;

    // Once committed, lag is exactly zero messages and zero seconds.
    let mut lags = Vec::new();
    let started = std::time::Instant::now();
    while !(lags.len() == 2
        && lags
            .iter()
            .all(|l: &quiver_client::QueueLag| l.lag_messages == Some(0)))
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "lag never reached zero: {lags:?}"
        );
        lags = admin.lag(group, Some(topic)).await.expect("lag");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(lags.iter().all(|l| l.lag_seconds == Some(0.0)));

    let moved = admin
        .reset_offsets(group, topic, ResetTarget::Earliest)
        .await
        .expect("reset");
    assert_eq!(moved.len(), 2);
    assert!(moved.iter().all(|(_, offset)| offset.0 == 0));
    wait_until("the replay", Duration::from_secs(10), || {
        received.len() >= 2 * sent.len()
    })
    .await;
    consumer.shutdown().await.expect("shutdown");
    let counts = received.counts();
    for body in &sent {
        assert!(
            counts.get(body).copied().unwrap_or(0) >= 2,
            "{body} was not replayed"
        );
    }

    // A group that never committed has unknown lag, not zero.
    let unknown = admin
        .lag("g-never", Some(topic))
        .await
        .expect("lag of an idle group");
    assert!(
        unknown.iter().all(|l| l.lag_messages.is_none()),
        "{unknown:?}"
    );
    admin.shutdown().await;
    broker.stop().await;
}
