//! Connections from one source address beyond max-connections-per-address are closed at
//! accept and counted; that address's open connections and other addresses keep working, and
//! a closed connection gives its slot back.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::{test_config, Client, TestBroker};
use quiver_protocol::code::response;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_is_bounded_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        max_connections_per_address: 2,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut first = broker.client().await;
    let mut second = broker.client().await;
    assert_eq!(first.send("Src", 0, "a", "A").await.code, response::SUCCESS);
    assert_eq!(
        second.send("Src", 0, "b", "A").await.code,
        response::SUCCESS
    );
    let mut third = Client::connect(broker.addr).await;
    assert!(
        third.read().await.is_none(),
        "the third from 127.0.0.1 is closed"
    );

    let other_host = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut elsewhere = Client::connect_from(other_host, broker.addr).await;
    assert_eq!(
        elsewhere.send("Src", 0, "c", "A").await.code,
        response::SUCCESS
    );
    assert_eq!(
        second.send("Src", 0, "d", "A").await.code,
        response::SUCCESS
    );
    let metrics = broker.metrics().await;
    assert_eq!(
        common::connections_closed(&metrics, "max-connections-per-address"),
        1
    );
    assert_eq!(common::connections_closed(&metrics, "max-connections"), 0);

    drop(first);
    // The slot frees once the broker notices the close.
    common::wait_for("a free slot for 127.0.0.1", Duration::from_secs(10), || {
        common::new_connection_answers(broker.addr, "Src")
    })
    .await;
    broker.stop().await;
}

#[test]
fn the_limit_is_at_least_one() {
    let config = |max| quiver_broker::BrokerConfig {
        max_connections_per_address: max,
        ..quiver_broker::BrokerConfig::default()
    };
    assert!(config(1).validate().is_ok());
    let error = config(0).validate().unwrap_err().to_string();
    assert!(error.contains("max-connections-per-address"), "{error}");
}
