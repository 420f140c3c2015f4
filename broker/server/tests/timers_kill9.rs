//! Timers survive kill -9: one set before the kill fires after the restart, once; one that
//! fired before the kill is not fired again; those due during the downtime fire at once on
//! start, in the order of their times.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{pulled_bodies, v2_send_fields, Client};
use quiver_protocol::code::{request, response};

async fn delivered(addr: std::net::SocketAddr) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    pulled_bodies(&client.pull("G", "Timed", 0, 0, 0, None).await)
}

async fn send_at(client: &mut Client, body: &str, deliver_ms: i64) {
    let properties = format!("TIMER_DELIVER_MS\u{1}{deliver_ms}\u{2}");
    let reply = client
        .call(
            request::SEND_MESSAGE_V2,
            v2_send_fields("Timed", "0", "0", &properties, false),
            Bytes::from(body.to_owned()),
        )
        .await;
    assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_fire_once_across_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut first = common::start_binary(data.path(), &logs.path().join("first.log"), &[]).await;
    let mut client = Client::connect(first.addr).await;
    client.create_topic("Timed", 1).await;
    let now = quiver_broker::now_ms();
    send_at(&mut client, "fired-before", now + 300).await;
    // Due while the broker is down, set out of order.
    send_at(&mut client, "down-2", now + 2_600).await;
    send_at(&mut client, "down-1", now + 2_500).await;
    let after_restart = now + 8_000;
    send_at(&mut client, "after-restart", after_restart).await;
    let addr = first.addr;
    common::wait_for("the first timer", Duration::from_secs(20), || async move {
        !delivered(addr).await.is_empty()
    })
    .await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(first);
    assert!(
        quiver_broker::now_ms() < now + 2_500,
        "the kill came too late to test downtime"
    );
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(now + 3_000 - quiver_broker::now_ms()).unwrap_or(0),
    ))
    .await;

    let second = common::start_binary(data.path(), &logs.path().join("second.log"), &[]).await;
    let addr = second.addr;
    common::wait_for(
        "the timers after the restart",
        Duration::from_secs(30),
        || async move { delivered(addr).await.len() >= 4 },
    )
    .await;
    // A duplicate, if any, would follow at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        delivered(addr).await,
        ["fired-before", "down-1", "down-2", "after-restart"]
    );
    let mut client = Client::connect(addr).await;
    let records = common::pulled_records(&client.pull("G", "Timed", 0, 0, 0, None).await);
    assert!(
        records[3].store_timestamp_ms >= after_restart,
        "fired early"
    );
    drop(second);
}
