//! The admin API finds messages by key across the brokers of a topic, by the producer's
//! message id and by the offset message id of a send result, and reads a queue's earliest
//! store time.

mod common;

use std::time::{Duration, Instant};

use common::TestBroker;
use quiver_client::{
    Admin, ClientConfig, KeyQuery, Message, MessageQueue, Producer, ProducerConfig, TopicSpec,
};

/// Creates `topic` on both brokers once they know each other, and waits until routes list
/// the queues of both.
async fn create_on_both(admin: &Admin, topic: &str) {
    let started = Instant::now();
    let within = |what: &str| {
        assert!(started.elapsed() < Duration::from_secs(20), "{what}");
    };
    while admin.broker_addrs().await.expect("cluster info").len() < 2 {
        within("the brokers never saw each other");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let created_on = admin.create_topic(&TopicSpec::new(topic, 2)).await.unwrap();
    assert_eq!(created_on.len(), 2, "topic created on {created_on:?}");
    while admin.route(topic).await.expect("route").write_queues.len() < 4 {
        within("the route never listed both brokers");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_found_by_key_unique_key_and_offset_id_on_every_broker() {
    let brokers = TestBroker::start_cluster(2).await;
    let servers = format!("{},{}", brokers[0].addr, brokers[1].addr);
    let admin = Admin::new(ClientConfig::new(&servers));
    let topic = "queried";
    create_on_both(&admin, topic).await;
    let producer = Producer::new(ProducerConfig::new(&servers));
    let mut sent = Vec::new();
    for i in 0..8 {
        let message = Message::new(topic, format!("q{i}"))
            .with_keys([format!("order-{}", i % 2), "everyone".to_owned()]);
        sent.push(producer.send(message).await.expect("send"));
    }
    let brokers_used: std::collections::BTreeSet<_> =
        sent.iter().map(|r| r.queue.broker_name.clone()).collect();
    assert_eq!(brokers_used.len(), 2, "round robin reaches both brokers");

    let odd = admin
        .query_by_key(&KeyQuery::new(topic, "order-1"))
        .await
        .expect("query by key");
    let mut bodies: Vec<String> = odd
        .iter()
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect();
    bodies.sort();
    assert_eq!(bodies, ["q1", "q3", "q5", "q7"]);
    assert!(odd.iter().all(|m| m.keys().contains(&"order-1")));
    let everyone = admin
        .query_by_key(&KeyQuery::new(topic, "everyone"))
        .await
        .unwrap();
    assert_eq!(everyone.len(), 8);
    let none = admin
        .query_by_key(&KeyQuery {
            end_ms: 0,
            ..KeyQuery::new(topic, "everyone")
        })
        .await
        .unwrap();
    assert!(none.is_empty(), "stored after the range");

    for result in &sent {
        let by_id = admin
            .query_by_unique_key(topic, &result.msg_id)
            .await
            .unwrap();
        assert_eq!(by_id.len(), 1, "{}", result.msg_id);
        assert_eq!(by_id[0].queue, result.queue);
        assert_eq!(by_id[0].queue_offset, result.queue_offset);

        let viewed = admin.view_message(&result.offset_msg_id).await.unwrap();
        assert_eq!(viewed.msg_id(), result.msg_id);
        assert_eq!(viewed.offset_msg_id(), result.offset_msg_id);
        assert_eq!(viewed.queue, result.queue);
    }
    assert!(admin
        .query_by_unique_key(topic, "0123456789ABCDEF0123456789ABCDEF")
        .await
        .unwrap()
        .is_empty());

    let queue = &sent[0].queue;
    let earliest = admin.earliest_store_time(queue).await.unwrap();
    assert!(earliest.is_some_and(|ms| ms > 0), "{earliest:?}");
    create_on_both(&admin, "never-written").await;
    let empty = MessageQueue {
        topic: "never-written".into(),
        ..queue.clone()
    };
    assert_eq!(admin.earliest_store_time(&empty).await.unwrap(), None);
    admin.shutdown().await;
    producer.shutdown().await;
    for broker in brokers {
        broker.stop().await;
    }
}
