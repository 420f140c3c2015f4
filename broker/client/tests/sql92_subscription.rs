//! SQL92 subscriptions through the Rust client: the push consumer gets exactly the messages
//! whose properties match, the pull consumer too, and a bad expression never starts.

mod common;

use std::time::Duration;

use common::{wait_until, Received, TestBroker};
use quiver_client::{
    ClientError, ConsumeFromWhere, Message, MessageSelector, PullConsumer, PullStatus,
    PushConsumer, QueueOffset, QueueSelector, Subscription,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_and_pull_consumers_filter_by_sql92() {
    let broker = TestBroker::start().await;
    let topic = "sql92";
    broker.create_topic(topic, 1).await;
    let producer = broker.producer();
    for i in 0..10 {
        let message = Message::new(topic, format!("m{i}"))
            .with_tags(if i % 2 == 0 { "even" } else { "odd" })
            .with_property("a", i.to_string());
        producer
            .send_with(message, QueueSelector::QueueId(0))
            .await
            .expect("send");
    }
    // Sent last: once it arrives, everything before it was filtered or delivered.
    let marker = Message::new(topic, "end").with_property("a", "100");
    producer
        .send_with(marker, QueueSelector::QueueId(0))
        .await
        .expect("send");

    let received = Received::default();
    let mut config = broker
        .consumer_config("g-sql", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    config.subscriptions = vec![(topic.to_owned(), MessageSelector::by_sql("a > 5"))];
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    wait_until("the end marker", Duration::from_secs(10), || {
        received.bodies().contains(&"end".to_owned())
    })
    .await;
    consumer.shutdown().await.expect("shutdown");
    let mut bodies = received.bodies();
    bodies.sort();
    assert_eq!(bodies, vec!["end", "m6", "m7", "m8", "m9"]);

    let reader = PullConsumer::new(broker.client(), "sql-reader");
    let queue = reader.queues(topic).await.expect("queues").remove(0);
    let odd_and_big = Subscription::sql92(topic, "a >= 3 AND TAGS = 'odd'").expect("parses");
    let pulled = reader
        .pull(&queue, QueueOffset(0), 32, &odd_and_big, None)
        .await
        .expect("pull");
    let PullStatus::Found(messages) = pulled.status else {
        panic!("expected messages, got {:?}", pulled.status);
    };
    let bodies: Vec<_> = messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    assert_eq!(bodies, vec!["m3", "m5", "m7", "m9"]);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_sql92_expression_is_refused_before_anything_is_sent() {
    let broker = TestBroker::start().await;
    broker.create_topic("sql92-bad", 1).await;
    let mut config = broker.consumer_config("g-bad", "sql92-bad");
    config.subscriptions = vec![("sql92-bad".to_owned(), MessageSelector::by_sql("a > 'x'"))];
    let error = match PushConsumer::start(config, Received::default().listener()).await {
        Ok(_) => panic!("a bad expression started a consumer"),
        Err(error) => error,
    };
    assert!(
        matches!(
            &error,
            ClientError::InvalidArgument {
                what: "subscription",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("cannot be compared"), "{error}");
    broker.stop().await;
}
