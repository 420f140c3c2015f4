//! Apache's Rust 5.x client (crates.io `rocketmq` 5.0.0) against a running quiver-broker:
//! its Producer and SimpleConsumer over gRPC. `run.sh` starts the broker, creates the topics
//! and groups and runs this with the gRPC endpoint; a failed check exits non-zero.
//!
//! Usage: `quiver-e2e-rust5 GRPC_ENDPOINT`

use anyhow::{ensure, Context, Result};
use rocketmq::conf::{ClientOption, ProducerOption, SimpleConsumerOption};
use rocketmq::model::common::{FilterExpression, FilterType};
use rocketmq::model::message::{MessageBuilder, MessageView};
use rocketmq::{Producer, SimpleConsumer};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Topics and groups `run.sh` creates before running this.
const TOPIC: &str = "Rust5Topic";
const GROUP: &str = "rust5-readers";
const REDELIVER_TOPIC: &str = "Rust5Redeliver";
const REDELIVER_GROUP: &str = "rust5-redeliver";
const MESSAGES: usize = 8;

fn client_option(endpoint: &str) -> ClientOption {
    let mut option = ClientOption::default();
    option.set_access_url(endpoint);
    option.set_enable_tls(false);
    // The broker's long poll of one receive; the client's deadline is this plus its timeout.
    option.set_long_polling_timeout(Duration::from_secs(2));
    option
}

async fn producer(endpoint: &str, topic: &str) -> Result<Producer> {
    let mut option = ProducerOption::default();
    option.set_topics(vec![topic]);
    let mut producer = Producer::new(option, client_option(endpoint))?;
    producer.start().await.context("producer start")?;
    Ok(producer)
}

async fn consumer(endpoint: &str, group: &str, topic: &str) -> Result<SimpleConsumer> {
    let mut option = SimpleConsumerOption::default();
    option.set_consumer_group(group);
    option.set_topics(vec![topic]);
    let mut consumer = SimpleConsumer::new(option, client_option(endpoint))?;
    consumer.start().await.context("simple consumer start")?;
    Ok(consumer)
}

/// Receives (each queue in turn, as the client picks them) until `count` messages came or
/// `timeout` passed.
async fn receive(
    consumer: &SimpleConsumer,
    topic: &str,
    filter: &FilterExpression,
    count: usize,
    invisible: Duration,
    timeout: Duration,
) -> Result<Vec<MessageView>> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::new();
    while got.len() < count && Instant::now() < deadline {
        got.extend(consumer.receive_with(topic, filter, 16, invisible).await?);
    }
    Ok(got)
}

/// Sends MESSAGES tagged TagA with keys and a property, and one TagB; the consumer subscribed
/// to TagA receives each TagA message once with what was sent, acks it, and nothing follows.
async fn produce_receive_ack(endpoint: &str) -> Result<()> {
    let producer = producer(endpoint, TOPIC).await?;
    let mut sent = HashMap::new();
    for i in 0..MESSAGES {
        let body = format!("rust5-{i}");
        let message = MessageBuilder::builder()
            .set_topic(TOPIC)
            .set_tag("TagA")
            .set_keys(vec![body.clone(), "order-7".to_string()])
            .set_properties(HashMap::from([("color", "blue")]))
            .set_body(body.clone().into_bytes())
            .build()?;
        let receipt = producer.send(message).await.context("send")?;
        sent.insert(body, receipt.message_id().to_string());
    }
    let other = MessageBuilder::builder()
        .set_topic(TOPIC)
        .set_tag("TagB")
        .set_body(b"not-for-TagA".to_vec())
        .build()?;
    producer.send(other).await.context("send TagB")?;
    producer.shutdown().await?;

    let consumer = consumer(endpoint, GROUP, TOPIC).await?;
    let tag_a = FilterExpression::new(FilterType::Tag, "TagA");
    let invisible = Duration::from_secs(30);
    let got = receive(
        &consumer,
        TOPIC,
        &tag_a,
        MESSAGES,
        invisible,
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        got.len() == MESSAGES,
        "received {} of {MESSAGES}",
        got.len()
    );
    for message in &got {
        let body = String::from_utf8(message.body().to_vec())?;
        ensure!(
            sent.get(&body).map(String::as_str) == Some(message.message_id()),
            "{body}: id"
        );
        ensure!(
            message.tag() == Some("TagA"),
            "{body}: tag {:?}",
            message.tag()
        );
        let keys: HashSet<&str> = message.keys().iter().map(String::as_str).collect();
        ensure!(
            keys == HashSet::from([body.as_str(), "order-7"]),
            "{body}: keys {keys:?}"
        );
        let color = message.properties().get("color").map(String::as_str);
        ensure!(color == Some("blue"), "{body}: property color {color:?}");
        ensure!(
            message.delivery_attempt() == 1,
            "{body}: attempt {}",
            message.delivery_attempt()
        );
        consumer.ack(message).await.context("ack")?;
    }
    let bodies: HashSet<String> = got
        .iter()
        .map(|m| String::from_utf8_lossy(m.body()).into())
        .collect();
    ensure!(bodies.len() == MESSAGES, "a message came twice: {bodies:?}");
    let after = receive(
        &consumer,
        TOPIC,
        &tag_a,
        1,
        invisible,
        Duration::from_secs(3),
    )
    .await?;
    ensure!(
        after.is_empty(),
        "received again after its ack: {}",
        after.len()
    );
    consumer.shutdown().await?;
    println!("ok: produce, receive and ack ({MESSAGES} messages, tag, keys, property, ids)");
    Ok(())
}

/// A message received and not acked comes back after its invisible time, attempt raised.
async fn unacked_comes_back(endpoint: &str) -> Result<()> {
    let producer = producer(endpoint, REDELIVER_TOPIC).await?;
    let message = MessageBuilder::builder()
        .set_topic(REDELIVER_TOPIC)
        .set_body(b"again".to_vec())
        .build()?;
    let id = producer.send(message).await?.message_id().to_string();
    producer.shutdown().await?;

    let consumer = consumer(endpoint, REDELIVER_GROUP, REDELIVER_TOPIC).await?;
    let all = FilterExpression::new(FilterType::Tag, "*");
    let first = receive(
        &consumer,
        REDELIVER_TOPIC,
        &all,
        1,
        Duration::from_secs(2),
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        first.len() == 1 && first[0].message_id() == id,
        "first delivery: {}",
        first.len()
    );
    let again = receive(
        &consumer,
        REDELIVER_TOPIC,
        &all,
        1,
        Duration::from_secs(30),
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        again.len() == 1 && again[0].message_id() == id,
        "redelivery: {}",
        again.len()
    );
    ensure!(
        again[0].delivery_attempt() == 2,
        "attempt {}",
        again[0].delivery_attempt()
    );
    consumer.ack(&again[0]).await?;
    consumer.shutdown().await?;
    println!("ok: an unacked message is received again with delivery attempt 2");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .context("usage: quiver-e2e-rust5 GRPC_ENDPOINT")?;
    let checks = [
        ("produce_receive_ack", produce_receive_ack(&endpoint).await),
        ("unacked_comes_back", unacked_comes_back(&endpoint).await),
    ];
    let failed: Vec<_> = checks
        .iter()
        .filter(|(_, result)| result.is_err())
        .collect();
    for (name, result) in &failed {
        eprintln!("FAILED {name}: {:#}", result.as_ref().unwrap_err());
    }
    println!(
        "{} passed, {} failed",
        checks.len() - failed.len(),
        failed.len()
    );
    ensure!(failed.is_empty(), "{} check(s) failed", failed.len());
    Ok(())
}
