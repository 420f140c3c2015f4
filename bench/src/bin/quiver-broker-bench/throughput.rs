//! The default mode: produce and consume over loopback (single, batch and transactional
//! sends, 1 and 4 producers) beside store-only figures, then a catch-up read unfiltered and
//! through a SQL92 filter.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_bench::percentile;
use quiver_protocol::code::{request, response};
use quiver_protocol::message::{encode_batch, sys_flag, BatchMessage};
use quiver_protocol::{ExtFields, RemotingCommand};
use quiver_store::{MessageStore, NewMessage, StoreConfig};

use crate::harness::{
    body, pull_ext, send_ext, stamp_nanos, start_broker, Conn, Security, QUEUES, TOPIC,
};
use crate::Args;

/// How a scenario's producers send: one message a request, batches, or transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sends {
    Single,
    Batch(usize),
    /// A half message, then END_TRANSACTION commit sent oneway (as the Java producer does).
    Transactional,
}

impl Sends {
    pub(crate) fn label(self) -> String {
        match self {
            Sends::Single => "single".into(),
            Sends::Batch(batch) => format!("batch {batch}"),
            Sends::Transactional => "transactional".into(),
        }
    }
}

/// A half message of `producer` on `queue_id`, then its commit; the half message's answer.
pub(crate) async fn send_committed(
    conn: &mut Conn,
    queue_id: u32,
    size: usize,
    unique_key: &str,
) -> anyhow::Result<RemotingCommand> {
    let mut ext = send_ext(queue_id, false);
    ext.insert("f", sys_flag::TRANSACTION_PREPARED.to_string());
    ext.insert(
        "i",
        format!("TAGS\u{1}bench\u{2}TRAN_MSG\u{1}true\u{2}PGROUP\u{1}BenchProducer\u{2}UNIQ_KEY\u{1}{unique_key}\u{2}"),
    );
    let half = conn.call(request::SEND_MESSAGE_V2, ext, body(size)).await?;
    if half.code != response::SUCCESS {
        return Ok(half);
    }
    let msg_id = half
        .ext("msgId")
        .context("the half message's answer has no msgId")?;
    let (_, commit_log_offset) = quiver_protocol::message::decode_offset_msg_id(msg_id)?;
    let end: ExtFields = [
        ("producerGroup", "BenchProducer".to_string()),
        (
            "tranStateTableOffset",
            half.ext("queueOffset").unwrap_or("0").to_string(),
        ),
        ("commitLogOffset", commit_log_offset.to_string()),
        ("commitOrRollback", sys_flag::TRANSACTION_COMMIT.to_string()),
        ("fromTransactionCheck", "false".to_string()),
        ("msgId", msg_id.to_string()),
        ("transactionId", unique_key.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let commit = RemotingCommand::request(request::END_TRANSACTION, end);
    conn.connection.send_oneway(commit).await?;
    Ok(half)
}

pub(crate) async fn produce(
    addr: SocketAddr,
    security: Arc<Security>,
    producer: u64,
    count: u64,
    size: usize,
    sends: Sends,
) -> anyhow::Result<()> {
    let mut conn = Conn::connect(addr, &security).await?;
    let mut sent = 0;
    let mut round = producer;
    while sent < count {
        let queue_id = u32::try_from(round % u64::from(QUEUES))?;
        round += 1;
        let batch = match sends {
            Sends::Batch(batch) => batch,
            Sends::Single | Sends::Transactional => 1,
        };
        let reply = if sends == Sends::Transactional {
            sent += 1;
            send_committed(&mut conn, queue_id, size, &format!("B{producer}-{sent}")).await?
        } else if batch <= 1 {
            sent += 1;
            conn.call(
                request::SEND_MESSAGE_V2,
                send_ext(queue_id, false),
                body(size),
            )
            .await?
        } else {
            let n = (count - sent).min(batch as u64);
            sent += n;
            let msgs: Vec<BatchMessage> = (0..n)
                .map(|_| BatchMessage {
                    flag: 0,
                    body: body(size),
                    properties: "TAGS\u{1}bench\u{2}".into(),
                })
                .collect();
            conn.call(
                request::SEND_BATCH_MESSAGE,
                send_ext(queue_id, true),
                encode_batch(&msgs),
            )
            .await?
        };
        if reply.code != response::SUCCESS {
            bail!("send failed: {} {:?}", reply.code, reply.remark);
        }
    }
    Ok(())
}

/// Pulls one queue (long polling) until `received` reaches `total`; returns latencies in µs.
pub(crate) async fn consume(
    addr: SocketAddr,
    security: Arc<Security>,
    queue_id: u32,
    total: u64,
    received: Arc<AtomicU64>,
) -> anyhow::Result<Vec<u64>> {
    let mut conn = Conn::connect(addr, &security).await?;
    let mut offset = 0u64;
    let mut latencies = Vec::new();
    while received.load(Ordering::Acquire) < total {
        let ext = pull_ext("BenchGroup", TOPIC, queue_id, offset, 256, 2, 200);
        let reply = conn.call(request::PULL_MESSAGE, ext, Bytes::new()).await?;
        let now = stamp_nanos();
        if let Some(next) = reply.ext("nextBeginOffset").and_then(|v| v.parse().ok()) {
            offset = next;
        }
        if reply.code == response::SUCCESS {
            let records = quiver_store::record::decode_all(&reply.body)?;
            for record in &records {
                let sent = u64::from_be_bytes(record.body[..8].try_into()?);
                latencies.push(now.saturating_sub(sent) / 1_000);
            }
            received.fetch_add(records.len() as u64, Ordering::AcqRel);
        }
    }
    Ok(latencies)
}

pub(crate) struct Figures {
    pub(crate) scenario: String,
    pub(crate) msgs_per_s: f64,
    pub(crate) mb_per_s: f64,
    p50_us: Option<u64>,
    p99_us: Option<u64>,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us =
            |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{:.2} ms", v as f64 / 1000.0));
        write!(
            f,
            "| {:<34} | {:>10.0} | {:>8.1} | {:>10} | {:>10} |",
            self.scenario,
            self.msgs_per_s,
            self.mb_per_s,
            us(self.p50_us),
            us(self.p99_us)
        )
    }
}

pub(crate) async fn network_scenario(
    args: &Args,
    security: &Arc<Security>,
    producers: u64,
    sends: Sends,
) -> anyhow::Result<Figures> {
    let dir = tempfile::tempdir()?;
    let broker = start_broker(args, security, dir.path()).await?;
    let addr = broker.addr;

    let total = args.messages;
    let received = Arc::new(AtomicU64::new(0));
    let consumers: Vec<_> = (0..QUEUES)
        .map(|q| tokio::spawn(consume(addr, security.clone(), q, total, received.clone())))
        .collect();
    let started = Instant::now();
    let per_producer = total / producers;
    let producer_tasks: Vec<_> = (0..producers)
        .map(|p| {
            let count = if p == producers - 1 {
                total - per_producer * (producers - 1)
            } else {
                per_producer
            };
            tokio::spawn(produce(addr, security.clone(), p, count, args.size, sends))
        })
        .collect();
    for task in producer_tasks {
        task.await??;
    }
    let mut latencies = Vec::new();
    for task in consumers {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    broker.stop().await?;
    Ok(network_figures(args, producers, sends, elapsed, latencies))
}

/// One network scenario's row: its rate over `elapsed` seconds and latency percentiles.
pub(crate) fn network_figures(
    args: &Args,
    producers: u64,
    sends: Sends,
    elapsed: f64,
    mut latencies: Vec<u64>,
) -> Figures {
    latencies.sort_unstable();
    let pick = |q: f64| (!latencies.is_empty()).then(|| percentile(&latencies, q));
    let total = args.messages;
    let sends = sends.label();
    let plural = if producers == 1 { "" } else { "s" };
    Figures {
        scenario: format!("network {sends} x{producers} producer{plural}"),
        msgs_per_s: total as f64 / elapsed,
        mb_per_s: (total as f64 * args.size as f64) / elapsed / 1e6,
        p50_us: pick(0.50),
        p99_us: pick(0.99),
    }
}

pub(crate) fn store_scenario(args: &Args, batch: usize) -> anyhow::Result<Figures> {
    let dir = tempfile::tempdir()?;
    let store = MessageStore::open(StoreConfig {
        data_dir: dir.path().to_path_buf(),
        segment_size_bytes: 256 * 1024 * 1024,
        flush_mode: args.flush_mode,
        ..StoreConfig::default()
    })?;
    let payload = vec![b'x'; args.size];
    let host: SocketAddr = "127.0.0.1:10911".parse()?;
    let message = |queue_id: u32| NewMessage {
        topic: TOPIC,
        queue_id,
        flag: 0,
        body: &payload,
        properties: "TAGS\u{1}bench\u{2}",
        sys_flag: 0,
        born_timestamp_ms: 0,
        born_host: host,
        store_host: host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    };
    let started = Instant::now();
    let mut stored = 0u64;
    while stored < args.messages {
        let queue_id = u32::try_from(stored % u64::from(QUEUES))?;
        if batch <= 1 {
            store.put(&message(queue_id), quiver_broker::now_ms())?;
            stored += 1;
        } else {
            let n = (args.messages - stored).min(batch as u64);
            let msgs: Vec<_> = (0..n).map(|_| message(queue_id)).collect();
            store.put_batch(&msgs, quiver_broker::now_ms())?;
            stored += n;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let dispatched: u64 = (0..QUEUES).map(|q| store.max_offset(TOPIC, q).0).sum();
    if dispatched != stored {
        bail!("store dispatched {dispatched} of {stored}");
    }
    store.shutdown()?;
    Ok(Figures {
        scenario: format!(
            "store-only {}",
            if batch <= 1 {
                "single".to_string()
            } else {
                format!("batch {batch}")
            }
        ),
        msgs_per_s: stored as f64 / elapsed,
        mb_per_s: (stored as f64 * args.size as f64) / elapsed / 1e6,
        p50_us: None,
        p99_us: None,
    })
}

/// Stores `count` messages in batches, property `a` = i % 10 (so `a = 0` selects 10%).
pub(crate) async fn store_for_filtering(
    conn: &mut Conn,
    count: u64,
    size: usize,
) -> anyhow::Result<()> {
    let mut stored = 0u64;
    while stored < count {
        let n = (count - stored).min(32);
        let msgs: Vec<BatchMessage> = (stored..stored + n)
            .map(|i| BatchMessage {
                flag: 0,
                body: body(size),
                properties: format!("TAGS\u{1}bench\u{2}a\u{1}{}\u{2}", i % 10),
            })
            .collect();
        let queue_id = u32::try_from((stored / 32) % u64::from(QUEUES))?;
        stored += n;
        let reply = conn
            .call(
                request::SEND_BATCH_MESSAGE,
                send_ext(queue_id, true),
                encode_batch(&msgs),
            )
            .await?;
        if reply.code != response::SUCCESS {
            bail!("send failed: {} {:?}", reply.code, reply.remark);
        }
    }
    Ok(())
}

/// Reads every queue from 0 to its end, 32 messages a pull, with `(type, expression)`;
/// returns the messages delivered.
pub(crate) async fn catch_up(conn: &mut Conn, kind: &str, expression: &str) -> anyhow::Result<u64> {
    let mut delivered = 0u64;
    for queue_id in 0..QUEUES {
        let mut offset = 0u64;
        loop {
            let mut ext = pull_ext("CatchUp", TOPIC, queue_id, offset, 32, 4, 0);
            ext.insert("subscription", expression);
            ext.insert("expressionType", kind);
            let reply = conn.call(request::PULL_MESSAGE, ext, Bytes::new()).await?;
            let number = |key: &str| reply.ext(key).and_then(|v| v.parse::<u64>().ok());
            match reply.code {
                response::SUCCESS => {
                    delivered += quiver_store::record::decode_all(&reply.body)?.len() as u64;
                }
                response::PULL_RETRY_IMMEDIATELY | response::PULL_NOT_FOUND => {}
                code => bail!("pull failed: {code} {:?}", reply.remark),
            }
            let (Some(next), Some(max)) = (number("nextBeginOffset"), number("maxOffset")) else {
                bail!("pull answer without offsets: {reply:?}");
            };
            offset = next;
            if offset >= max {
                break;
            }
        }
    }
    Ok(delivered)
}

/// Catch-up reads of the same stored messages, unfiltered and with a SQL92 filter matching
/// 10%: messages delivered per second each, and their ratio (issue 23's target: >= 0.5).
pub(crate) async fn filtered_catch_up(args: &Args, security: &Security) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut broker = start_broker(args, security, dir.path()).await?;
    let conn = &mut broker.conn;
    let count = args.catch_up_messages;
    store_for_filtering(conn, count, args.size).await?;
    let mut rates = Vec::new();
    for (label, kind, expression) in [
        ("unfiltered (TAG *)", "TAG", "*"),
        ("SQL92 `a = 0` (10%)", "SQL92", "a = 0"),
    ] {
        let started = Instant::now();
        let delivered = catch_up(conn, kind, expression).await?;
        let rate = delivered as f64 / started.elapsed().as_secs_f64();
        println!("| catch-up {label:<25} | {delivered:>10} | {rate:>12.0} |");
        rates.push(rate);
    }
    println!(
        "filtered / unfiltered delivered msgs/s: {:.2} (target >= 0.50)",
        rates[1] / rates[0]
    );
    broker.stop().await
}

/// The default mode's tables: store-only and network rows, the transactional ratios, then
/// the filtered catch-up.
pub(crate) fn run(
    args: &Args,
    security: &Arc<Security>,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<()> {
    println!(
        "quiver-broker-bench: {} messages of {} B per scenario, flush {:?}, {}",
        args.messages,
        args.size,
        args.flush_mode,
        security.describe()
    );
    println!(
        "| {:<34} | {:>10} | {:>8} | {:>10} | {:>10} |",
        "scenario", "msgs/s", "MB/s", "p50", "p99"
    );
    println!(
        "|{}|{}|{}|{}|{}|",
        "-".repeat(36),
        "-".repeat(12),
        "-".repeat(10),
        "-".repeat(12),
        "-".repeat(12)
    );
    for batch in [1, args.batch] {
        println!("{}", store_scenario(args, batch)?);
    }
    let mut single_rates = Vec::new();
    for sends in [Sends::Single, Sends::Batch(args.batch)] {
        for producers in [1, 4] {
            let figures = runtime.block_on(network_scenario(args, security, producers, sends))?;
            println!("{figures}");
            if sends == Sends::Single {
                single_rates.push((producers, figures.msgs_per_s));
            }
        }
    }
    let mut transactional = Vec::new();
    for (producers, single) in single_rates {
        let sends = Sends::Transactional;
        let figures = runtime.block_on(network_scenario(args, security, producers, sends))?;
        println!("{figures}");
        transactional.push((producers, figures.msgs_per_s / single));
    }
    for (producers, ratio) in transactional {
        println!(
            "transactional / single x{producers}: {ratio:.2} (target >= 0.40: half message + \
             commit against one sync-acknowledged send)"
        );
    }
    if args.catch_up_messages > 0 {
        println!(
            "\nfiltered catch-up: {} messages of {} B, 32 a pull, 8 queues read in turn",
            args.catch_up_messages, args.size
        );
        println!(
            "| {:<34} | {:>10} | {:>12} |",
            "read", "delivered", "delivered/s"
        );
        println!("|{}|{}|{}|", "-".repeat(36), "-".repeat(12), "-".repeat(14));
        runtime.block_on(filtered_catch_up(args, security))?;
    }
    Ok(())
}
