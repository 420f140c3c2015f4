//! `--mode timers`: timed delivery against a `quiver-broker` child process (so its RSS is
//! the broker's alone). (a) Parks `--timers` timers minutes ahead and prints the broker's
//! anonymous RSS before and after; (b) with those pending, sends timers a few seconds ahead
//! at `--fire-rate` for `--fire-secs` and prints how late they arrive (receive - deliver).
//! Figures only: nothing is asserted.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_bench::percentile;
use quiver_protocol::code::{request, response};
use quiver_protocol::ExtFields;

use crate::harness::{create_topic, pull_ext, send_ext, Conn, QUEUES};
use crate::Args;

const TOPIC: &str = "BenchTimed";
/// Parked timers are due this far ahead (and spread over as long again): never during (b).
const PARKED_AHEAD_MS: i64 = 600_000;
/// Timers of (b) are due this long after their send.
const FIRE_LEAD_MS: i64 = 3_000;
const SENDERS: u64 = 8;

/// The broker binary beside this one, killed when dropped.
struct ChildBroker {
    child: Child,
    addr: SocketAddr,
    http: SocketAddr,
}

impl Drop for ChildBroker {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

async fn start_child(dir: &std::path::Path) -> anyhow::Result<ChildBroker> {
    let binary = crate::process::broker_binary()?;
    let (addr, http) = (crate::process::free_addr()?, crate::process::free_addr()?);
    let child = Command::new(&binary)
        .args(["--data-dir", &dir.display().to_string()])
        .args([
            "--listen",
            &addr.to_string(),
            "--http-listen",
            &http.to_string(),
        ])
        .args([
            "--advertise",
            &addr.to_string(),
            "--segment-size",
            "268435456",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let broker = ChildBroker { child, addr, http };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Conn::connect_plain(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("broker did not accept connections in 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(broker)
}

/// RssAnon of a process, in KiB.
fn rss_anon_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no RssAnon in /proc/PID/status")
}

/// A metric's value from the broker's /metrics (first series of that name).
fn metric(http: SocketAddr, name: &str) -> anyhow::Result<f64> {
    let mut stream = std::net::TcpStream::connect(http)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    text.lines()
        .find(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .with_context(|| format!("{name} not in /metrics"))
}

/// A single send's fields (the throughput mode's) to this mode's topic, with a deliver time
/// and no tag.
fn timer_send_ext(queue_id: u32, deliver_ms: i64) -> ExtFields {
    let mut ext = send_ext(queue_id, false);
    ext.insert("a", "BenchTimers");
    ext.insert("b", TOPIC);
    ext.insert("i", format!("TIMER_DELIVER_MS\u{1}{deliver_ms}\u{2}"));
    ext
}

/// One timed send; the body carries the deliver time for the consumer.
async fn send_timer(
    conn: &mut Conn,
    index: u64,
    deliver_ms: i64,
    size: usize,
) -> anyhow::Result<()> {
    let mut body = vec![b't'; size.max(8)];
    body[..8].copy_from_slice(&deliver_ms.to_be_bytes());
    let queue_id = u32::try_from(index % u64::from(QUEUES))?;
    let reply = conn
        .call(
            request::SEND_MESSAGE_V2,
            timer_send_ext(queue_id, deliver_ms),
            Bytes::from(body),
        )
        .await?;
    if reply.code != response::SUCCESS {
        bail!("timed send failed: {} {:?}", reply.code, reply.remark);
    }
    Ok(())
}

/// (a): `count` timers spread over [PARKED_AHEAD_MS, 2 * PARKED_AHEAD_MS) from now.
async fn park_timers(broker: &ChildBroker, count: u64, size: usize) -> anyhow::Result<()> {
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..SENDERS {
        let addr = broker.addr;
        senders.spawn(async move {
            let mut conn = Conn::connect_plain(addr).await?;
            let mut index = sender;
            while index < count {
                let spread = (index.wrapping_mul(2_654_435_761) % PARKED_AHEAD_MS as u64) as i64;
                let deliver = quiver_broker::now_ms() + PARKED_AHEAD_MS + spread;
                send_timer(&mut conn, index, deliver, size).await?;
                index += SENDERS;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = senders.join_next().await {
        done??;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(broker.http, "quiver_timers_pending")? < count as f64 {
        if Instant::now() > deadline {
            bail!("the broker did not enqueue {count} timers in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// (b): timers due FIRE_LEAD_MS after their send, `rate` a second for `secs` seconds.
async fn paced_timers(addr: SocketAddr, rate: u64, secs: u64, size: usize) -> anyhow::Result<u64> {
    let mut conn = Conn::connect_plain(addr).await?;
    let total = rate * secs;
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < total {
        let due_by_now = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        if sent >= due_by_now.min(total) {
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        send_timer(
            &mut conn,
            sent,
            quiver_broker::now_ms() + FIRE_LEAD_MS,
            size,
        )
        .await?;
        sent += 1;
    }
    Ok(total)
}

/// Pulls one queue until `total` timers arrived across queues; lateness in ms of each.
async fn lateness(
    addr: SocketAddr,
    queue_id: u32,
    total: u64,
    received: Arc<AtomicU64>,
) -> anyhow::Result<Vec<i64>> {
    let mut conn = Conn::connect_plain(addr).await?;
    let (mut offset, mut late) = (0u64, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(Ordering::Acquire) < total && Instant::now() < deadline {
        let ext = pull_ext("BenchTimers", TOPIC, queue_id, offset, 256, 2, 200);
        let reply = conn.call(request::PULL_MESSAGE, ext, Bytes::new()).await?;
        let now = quiver_broker::now_ms();
        if let Some(next) = reply.ext("nextBeginOffset").and_then(|v| v.parse().ok()) {
            offset = next;
        }
        if reply.code == response::SUCCESS {
            let records = quiver_store::record::decode_all(&reply.body)?;
            for record in &records {
                late.push(now - i64::from_be_bytes(record.body[..8].try_into()?));
            }
            received.fetch_add(records.len() as u64, Ordering::AcqRel);
        }
    }
    Ok(late)
}

/// Runs (a) and (b) and prints their rows.
pub async fn run(args: &Args) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let broker = start_child(dir.path()).await?;
    let mut setup = Conn::connect_plain(broker.addr).await?;
    create_topic(&mut setup, TOPIC).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_anon_kib(broker.child.id())?;
    let started = Instant::now();
    park_timers(&broker, args.timers, args.size).await?;
    let after = rss_anon_kib(broker.child.id())?;
    println!("| {:<44} | {:>14} |", "timers: figure", "value");
    println!("|{}|{}|", "-".repeat(46), "-".repeat(16));
    println!(
        "| {:<44} | {:>14} |",
        format!(
            "(a) timers parked ({:.0} s to send and enqueue)",
            started.elapsed().as_secs_f64()
        ),
        args.timers
    );
    println!(
        "| {:<44} | {:>11} KiB |",
        "(a) broker RssAnon before", before
    );
    println!("| {:<44} | {:>11} KiB |", "(a) broker RssAnon after", after);
    println!(
        "| {:<44} | {:>10.1} MiB |",
        "(a) difference (target <= 64 MiB)",
        (after as f64 - before as f64) / 1024.0
    );

    let total = args.fire_rate * args.fire_secs;
    let received = Arc::new(AtomicU64::new(0));
    let mut consumers = tokio::task::JoinSet::new();
    for queue_id in 0..QUEUES {
        consumers.spawn(lateness(broker.addr, queue_id, total, received.clone()));
    }
    paced_timers(broker.addr, args.fire_rate, args.fire_secs, args.size).await?;
    let mut late = Vec::with_capacity(total as usize);
    while let Some(done) = consumers.join_next().await {
        late.extend(done??);
    }
    late.sort_unstable();
    let row = |label: &str, value: String| println!("| {label:<44} | {value:>14} |");
    row(
        &format!(
            "(b) fired at {}/s for {} s, received",
            args.fire_rate, args.fire_secs
        ),
        format!("{} / {total}", late.len()),
    );
    row("(b) lateness p50 (ms)", percentile(&late, 0.50).to_string());
    row(
        "(b) lateness p99 (ms, target <= 10)",
        percentile(&late, 0.99).to_string(),
    );
    row(
        "(b) lateness p999 (ms)",
        percentile(&late, 0.999).to_string(),
    );
    row(
        "(b) early (lateness < 0; must be 0)",
        late.iter().filter(|l| **l < 0).count().to_string(),
    );
    drop(setup);
    Ok(())
}
