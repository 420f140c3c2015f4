//! The `quiver-broker` binary holds 10,000 idle connections (it raises its open-file limit
//! itself) while a client on another connection produces and consumes. The broker's memory
//! per connection is printed, not asserted: `quiver-bench connections` measures it.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{http_get, pulled_bodies, start_binary, wait_for, Client};
use quiver_protocol::code::response;

const IDLE: usize = 10_000;
/// The test's own descriptors beside the idle connections.
const SPARE_FILES: u64 = 256;

fn anonymous_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn connections_gauge(http: SocketAddr) -> Option<u64> {
    let (_, metrics) = http_get(http, "/metrics").await?;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("quiver_connections{cluster=\"DefaultCluster\"} "))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_are_held_and_others_served() {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap();
    assert!(
        limit >= IDLE as u64 + SPARE_FILES,
        "this test needs {} open files; the hard limit is {limit} (raise ulimit -Hn)",
        IDLE as u64 + SPARE_FILES
    );
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("broker.log");
    // Room for every idle connection from one address.
    let room = (IDLE + 100).to_string();
    let mut broker = start_binary(
        &dir.path().join("data"),
        &log,
        &["--max-connections-per-address", &room],
    )
    .await;
    let (addr, http) = (broker.addr, broker.http);
    let before_kib = anonymous_rss_kib(broker.child.id());

    let opened = Instant::now();
    let idle: Vec<TcpStream> = tokio::task::spawn_blocking(move || {
        (0..IDLE)
            .map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(10)).expect("connect"))
            .collect()
    })
    .await
    .unwrap();
    wait_for(
        "every idle connection held",
        Duration::from_secs(60),
        || async { connections_gauge(http).await.unwrap_or(0) >= IDLE as u64 },
    )
    .await;
    let per_connection =
        anonymous_rss_kib(broker.child.id()).saturating_sub(before_kib) as f64 / IDLE as f64;
    eprintln!(
        "{IDLE} idle connections held after {:?}: {per_connection:.1} KiB of anonymous memory each",
        opened.elapsed()
    );

    let mut client = Client::connect(addr).await;
    let sent = client.send("Busy", 0, "served-beside-10k", "A").await;
    assert_eq!(sent.code, response::SUCCESS, "{:?}", sent.remark);
    let pulled = client.pull("G", "Busy", 0, 0, 0, None).await;
    assert_eq!(pulled_bodies(&pulled), ["served-beside-10k"]);
    assert!(
        broker.child.try_wait().unwrap().is_none(),
        "the broker is still running: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    drop(idle);
}
