//! Sends that cannot succeed fail with errors that say why.

mod common;

use common::TestBroker;
use quiver_client::{ClientError, Message, Producer, ProducerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_topic_too_large_and_unreachable_are_named() {
    let broker = TestBroker::start_with(|config| config.auto_create_topics = false).await;
    let producer = broker.producer();
    match producer.send(Message::new("no-such-topic", "x")).await {
        Err(ClientError::TopicNotFound { topic }) => assert_eq!(topic, "no-such-topic"),
        other => panic!("expected TopicNotFound, got {other:?}"),
    }

    broker.create_topic("small", 1).await;
    let mut config = ProducerConfig::new(&broker.addr);
    config.max_message_size_bytes = 1024;
    let limited = Producer::new(config);
    match limited.send(Message::new("small", vec![0u8; 2048])).await {
        Err(ClientError::MessageTooLarge {
            size_bytes,
            max_bytes,
        }) => {
            assert!(size_bytes >= 2048);
            assert_eq!(max_bytes, 1024);
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    broker.stop().await;

    // Nothing listens on the stopped broker's port any more.
    let gone = broker_addr_after_stop().await;
    match Producer::new(ProducerConfig::new(&gone))
        .send(Message::new("small", "x"))
        .await
    {
        Err(ClientError::Connect { addr, .. }) => assert_eq!(addr, gone),
        other => panic!("expected Connect, got {other:?}"),
    }
}

/// A loopback address with no listener: bind a free port, then release it.
async fn broker_addr_after_stop() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    addr
}
