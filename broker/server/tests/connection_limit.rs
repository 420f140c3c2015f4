//! Connections beyond max-connections are closed at accept; the others keep working.

mod common;

use common::{test_config, Client, TestBroker};
use quiver_protocol::code::response;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        max_connections: 2,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut first = broker.client().await;
    let mut second = broker.client().await;
    assert_eq!(first.send("Lim", 0, "a", "A").await.code, response::SUCCESS);
    assert_eq!(
        second.send("Lim", 0, "b", "A").await.code,
        response::SUCCESS
    );
    let mut third = Client::connect(broker.addr).await;
    assert!(
        third.read().await.is_none(),
        "the third connection is closed"
    );
    drop(first);
    // The slot frees once the broker notices the close.
    common::wait_for("a free slot", std::time::Duration::from_secs(10), || {
        common::new_connection_answers(broker.addr, "Lim")
    })
    .await;
    assert_eq!(
        second.send("Lim", 0, "c", "A").await.code,
        response::SUCCESS
    );
    broker.stop().await;
}
