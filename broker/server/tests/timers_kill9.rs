//! Timers survive kill -9: one set before the kill fires after the restart, once; one that
//! fired before the kill is not fired again; those due during the downtime fire at once on
//! start, in the order of their times.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{pulled_bodies, v2_send_fields, Client};
use quiver_protocol::code::{request, response};

struct Broker {
    child: Child,
    addr: std::net::SocketAddr,
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// Starts the binary on free ports over `data_dir` and waits until it is ready.
async fn start(data_dir: &Path, log: &Path) -> Broker {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = port.local_addr().unwrap();
    let http = http_port.local_addr().unwrap();
    drop((port, http_port));
    let child = Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .args(["--data-dir", data_dir.to_str().unwrap()])
        .args(["--listen", &addr.to_string()])
        .args(["--http-listen", &http.to_string()])
        .args(["--segment-size", "1048576", "--max-message-size", "65536"])
        .args(["--disk-high-water-ratio", "1", "--disk-clean-ratio", "1"])
        .args(["--disk-force-clean-ratio", "1"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut broker = Broker { child, addr };
    let deadline = Instant::now() + Duration::from_secs(30);
    while common::http_get(http, "/readyz")
        .await
        .is_none_or(|(status, _)| status != 200)
    {
        assert!(
            broker.child.try_wait().unwrap().is_none(),
            "broker exited early: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "broker not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker
}

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
    let mut first = start(data.path(), &logs.path().join("first.log")).await;
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

    let second = start(data.path(), &logs.path().join("second.log")).await;
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
