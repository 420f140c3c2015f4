//! Lag counts the unconsumed messages and the age of the first one.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{produce, TestBroker};
use quiver_client::{Admin, PullConsumer, QueueOffset};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_reports_messages_and_age_of_first_unconsumed() {
    let broker = TestBroker::start().await;
    let topic = "lagging";
    let group = "g-lag";
    broker.create_topic(topic, 1).await;
    let before_send = now_ms();
    produce(&broker.producer(), topic, "l", 7).await;

    let committer = PullConsumer::new(broker.client(), group);
    let queue = committer.queues(topic).await.expect("queues").remove(0);
    committer
        .commit(&queue, QueueOffset(2))
        .await
        .expect("commit");

    let admin = Admin::new(broker.client());
    let lags = admin.lag(group, Some(topic)).await.expect("lag");
    let after_lag = now_ms();
    assert_eq!(lags.len(), 1, "{lags:?}");
    let lag = &lags[0];
    assert_eq!(lag.broker_offset, QueueOffset(7));
    assert_eq!(lag.consumer_offset, Some(QueueOffset(2)));
    assert_eq!(lag.lag_messages, Some(5));
    // The first unconsumed message was stored between `before_send` and the lag call.
    let seconds = lag.lag_seconds.expect("time lag known");
    let upper = (after_lag - before_send) as f64 / 1000.0;
    assert!(
        (0.0..=upper).contains(&seconds),
        "time lag {seconds}s outside 0..={upper}s"
    );
    admin.shutdown().await;
    broker.stop().await;
}
