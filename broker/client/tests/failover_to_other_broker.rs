//! With two brokers, sends keep succeeding when one of them goes away: the producer retries
//! on the other broker and refreshes its route.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::TestBroker;
use quiver_client::{Admin, ClientConfig, Message, Producer, ProducerConfig, TopicSpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_fail_over_to_the_remaining_broker() {
    let mut brokers = TestBroker::start_cluster(2).await;
    let servers = format!("{},{}", brokers[0].addr, brokers[1].addr);
    let topic = "spread";
    let admin = Admin::new(ClientConfig::new(&servers));
    // Brokers learn their peers in the background: wait until the cluster lists both.
    let started = Instant::now();
    while admin.broker_addrs().await.expect("cluster info").len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the brokers never saw each other"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let created_on = admin
        .create_topic(&TopicSpec::new(topic, 2))
        .await
        .expect("create on both");
    assert_eq!(created_on.len(), 2, "topic created on {created_on:?}");

    // Each broker learns the other's topics on its next peer poll.
    while admin.route(topic).await.expect("route").write_queues.len() < 4 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the route never listed both brokers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let producer = Producer::new(ProducerConfig::new(&servers));
    let mut used = BTreeSet::new();
    for i in 0..8 {
        let result = producer
            .send(Message::new(topic, format!("both-{i}")))
            .await
            .expect("send");
        used.insert(result.queue.broker_name);
    }
    assert_eq!(
        used.len(),
        2,
        "round-robin should reach both brokers: {used:?}"
    );

    let gone = brokers.remove(0);
    let gone_name = "broker-0";
    gone.stop().await;
    for i in 0..8 {
        let result = producer
            .send(Message::new(topic, format!("one-{i}")))
            .await
            .expect("send after failover");
        assert_ne!(result.queue.broker_name, gone_name);
    }
    admin.shutdown().await;
    for broker in brokers {
        broker.stop().await;
    }
}
