//! `quiver-broker-bench`: produce and consume 1 KiB messages over loopback against an
//! in-process broker (single and batch sends, 1 and 4 producers), reporting msgs/s, MB/s and
//! end-to-end p50/p99 latency, beside store-only figures of the same run; then a catch-up
//! read of stored messages, unfiltered and through a SQL92 filter matching 10%.
//!
//! `--mode timers` measures timed delivery instead (see `timers.rs`); `--mode grpc` the
//! RocketMQ 5.x gRPC path beside the remoting path (see `grpc.rs`).
//!
//! Run: `cargo run --release -p quiver-bench --bin quiver-broker-bench -- --messages 20000`;
//! `--tls` runs the broker with `--tls-mode enforcing` and connects with TLS, `--acl` with an
//! ACL file of one account whose keys sign every request, to compare with a plain run.

#![forbid(unsafe_code)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use clap::Parser;
use quiver_bench::percentile;
use quiver_broker::{BrokerConfig, FlushMode, TlsMode};
use quiver_protocol::acl::Credentials;
use quiver_protocol::code::{request, response};
use quiver_protocol::message::{encode_batch, sys_flag, BatchMessage};
use quiver_protocol::{ExtFields, RemotingCommand};
use quiver_remoting::tls::{self, AnyRead, TlsClient, TlsClientConfig};
use quiver_remoting::{Connection, Incoming, Options};
use quiver_store::{MessageStore, NewMessage, StoreConfig};
use tokio::net::{TcpListener, TcpStream};

mod grpc;
mod timers;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Produce, consume and catch-up read throughput and latency.
    Throughput,
    /// Timed delivery: RSS with many timers pending, and fire lateness.
    Timers,
    /// The gRPC (5.x) path beside the remoting path: produce, receive+ack, paced latency.
    Grpc,
}

#[derive(Parser, Debug)]
#[command(about = "Network and store benchmark of quiver-broker on loopback")]
struct Args {
    /// Messages per scenario.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages per SEND_BATCH_MESSAGE request.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Flush mode of the broker and the store.
    #[arg(long, default_value_t = FlushMode::Async)]
    flush_mode: FlushMode,
    /// Messages stored for the filtered catch-up read (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    catch_up_messages: u64,
    /// The broker enforces TLS (a certificate made with rcgen) and every connection is TLS.
    #[arg(long)]
    tls: bool,
    /// The broker has ACL on (one account) and every request is signed with it.
    #[arg(long)]
    acl: bool,
    #[arg(long, value_enum, default_value_t = Mode::Throughput)]
    mode: Mode,
    /// Timers mode: timers parked minutes ahead before RSS is read again.
    #[arg(long, default_value_t = 1_000_000)]
    timers: u64,
    /// Timers mode: timers sent (each due 3 s later) per second while lateness is measured.
    #[arg(long, default_value_t = 5_000)]
    fire_rate: u64,
    /// Timers mode: seconds of sending at --fire-rate.
    #[arg(long, default_value_t = 10)]
    fire_secs: u64,
    /// gRPC mode: messages per second of the paced latency scenario.
    #[arg(long, default_value_t = 5_000)]
    paced_rate: u64,
    /// gRPC mode: seconds of the paced latency scenario.
    #[arg(long, default_value_t = 5)]
    paced_secs: u64,
}

/// What `--tls` and `--acl` set up once: the files the broker reads and what clients use.
struct Security {
    dir: tempfile::TempDir,
    tls: Option<TlsClient>,
    credentials: Option<Arc<Credentials>>,
}

const BENCH_ACCESS_KEY: &str = "bench01";
const BENCH_SECRET_KEY: &str = "bench-secret";

impl Security {
    fn new(args: &Args) -> anyhow::Result<Security> {
        let dir = tempfile::tempdir()?;
        let mut tls = None;
        if args.tls {
            let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
            std::fs::write(dir.path().join("tls.crt"), certified.cert.pem())?;
            std::fs::write(
                dir.path().join("tls.key"),
                certified.key_pair.serialize_pem(),
            )?;
            let client = TlsClientConfig {
                ca_file: Some(dir.path().join("tls.crt")),
                server_name: Some("localhost".into()),
                ..TlsClientConfig::default()
            };
            tls = Some(client.connector().map_err(anyhow::Error::msg)?);
        }
        let mut credentials = None;
        if args.acl {
            let accounts = format!(
                "accounts:\n  - accessKey: {BENCH_ACCESS_KEY}\n    secretKey: {BENCH_SECRET_KEY}\n    admin: true\n"
            );
            std::fs::write(dir.path().join("plain_acl.yml"), accounts)?;
            credentials = Some(Arc::new(Credentials::new(
                BENCH_ACCESS_KEY,
                BENCH_SECRET_KEY,
            )));
        }
        Ok(Security {
            dir,
            tls,
            credentials,
        })
    }

    /// Neither TLS nor ACL (the timers mode's child broker).
    fn none() -> anyhow::Result<Security> {
        Ok(Security {
            dir: tempfile::tempdir()?,
            tls: None,
            credentials: None,
        })
    }

    /// The broker side of the same settings.
    fn apply(&self, config: &mut BrokerConfig) {
        if self.tls.is_some() {
            config.tls_mode = TlsMode::Enforcing;
            config.tls_cert_file = Some(self.dir.path().join("tls.crt"));
            config.tls_key_file = Some(self.dir.path().join("tls.key"));
        }
        if self.credentials.is_some() {
            config.acl_file = Some(self.dir.path().join("plain_acl.yml"));
        }
    }

    fn describe(&self) -> &'static str {
        match (self.tls.is_some(), self.credentials.is_some()) {
            (false, false) => "plain",
            (true, false) => "TLS enforcing",
            (false, true) => "ACL on",
            (true, true) => "TLS enforcing + ACL on",
        }
    }
}

const QUEUES: u32 = 8;
const TOPIC: &str = "Bench";

fn epoch() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

fn stamp_nanos() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A body whose first 8 bytes carry the send time, for end-to-end latency.
fn body(size: usize) -> Bytes {
    let mut body = vec![b'x'; size.max(8)];
    body[..8].copy_from_slice(&stamp_nanos().to_be_bytes());
    Bytes::from(body)
}

/// Bounds one request, long polls included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A client connection whose answers are read by the task waiting for them.
struct Conn {
    connection: Connection,
    incoming: Incoming<AnyRead>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.connection.close();
    }
}

impl Conn {
    /// A plain, unsigned connection.
    async fn connect_plain(addr: SocketAddr) -> anyhow::Result<Conn> {
        Conn::connect(addr, &Security::none()?).await
    }

    async fn connect(addr: SocketAddr, security: &Security) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let options = Options {
            credentials: security.credentials.clone(),
            ..Options::new(addr.to_string())
        };
        let (connection, incoming) =
            tls::start(stream, "localhost:0", security.tls.as_ref(), options).await?;
        Ok(Conn {
            connection,
            incoming,
        })
    }

    /// One request at a time, so the caller reads too: its answer arrives without a task
    /// switch, as the hand-written loop this replaced did (the figures are the broker's).
    async fn call(
        &mut self,
        code: i32,
        ext: ExtFields,
        body: Bytes,
    ) -> anyhow::Result<RemotingCommand> {
        let request = RemotingCommand::request(code, ext).with_body(body);
        let answer = self.connection.request(request, CALL_TIMEOUT);
        tokio::pin!(answer);
        loop {
            tokio::select! {
                biased;
                answered = &mut answer => return Ok(answered?),
                // Routes the answer; the broker pushes nothing to these connections.
                read = self.incoming.next() => if read?.is_none() {
                    bail!("broker closed the connection");
                },
            }
        }
    }
}

fn send_ext(queue_id: u32, batch: bool) -> ExtFields {
    [
        ("a", "BenchProducer".to_string()),
        ("b", TOPIC.to_string()),
        ("c", "TBW102".to_string()),
        ("d", "8".to_string()),
        ("e", queue_id.to_string()),
        ("f", "0".to_string()),
        ("g", quiver_broker::now_ms().to_string()),
        ("h", "0".to_string()),
        ("i", "TAGS\u{1}bench\u{2}".to_string()),
        ("j", "0".to_string()),
        ("k", "false".to_string()),
        ("m", batch.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// How a scenario's producers send: one message a request, batches, or transactions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sends {
    Single,
    Batch(usize),
    /// A half message, then END_TRANSACTION commit sent oneway (as the Java producer does).
    Transactional,
}

impl Sends {
    fn label(self) -> String {
        match self {
            Sends::Single => "single".into(),
            Sends::Batch(batch) => format!("batch {batch}"),
            Sends::Transactional => "transactional".into(),
        }
    }
}

/// A half message of `producer` on `queue_id`, then its commit; the half message's answer.
async fn send_committed(
    conn: &mut Conn,
    queue_id: u32,
    size: usize,
    unique_key: &str,
) -> anyhow::Result<RemotingCommand> {
    let mut ext = send_ext(queue_id, false);
    ext.insert("f".into(), sys_flag::TRANSACTION_PREPARED.to_string());
    ext.insert(
        "i".into(),
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

async fn produce(
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
async fn consume(
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
        let ext: ExtFields = [
            ("consumerGroup", "BenchGroup".to_string()),
            ("topic", TOPIC.to_string()),
            ("queueId", queue_id.to_string()),
            ("queueOffset", offset.to_string()),
            ("maxMsgNums", "256".to_string()),
            ("sysFlag", "2".to_string()),
            ("commitOffset", "-1".to_string()),
            ("suspendTimeoutMillis", "200".to_string()),
            ("subVersion", "0".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
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

struct Figures {
    scenario: String,
    msgs_per_s: f64,
    mb_per_s: f64,
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

async fn network_scenario(
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
fn network_figures(
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

fn store_scenario(args: &Args, batch: usize) -> anyhow::Result<Figures> {
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

/// An in-process broker with the bench topic, and a connection to it.
struct RunningBroker {
    addr: SocketAddr,
    /// The gRPC (5.x) port.
    grpc_addr: SocketAddr,
    conn: Conn,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), quiver_broker::BrokerError>>,
}

impl RunningBroker {
    async fn stop(self) -> anyhow::Result<()> {
        drop(self.conn);
        self.stop.send(()).ok();
        self.task.await?.context("broker run")?;
        Ok(())
    }
}

/// Starts a broker on a free loopback port over `dir` and creates the bench topic.
async fn start_broker(
    args: &Args,
    security: &Security,
    dir: &std::path::Path,
) -> anyhow::Result<RunningBroker> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let grpc_listener = TcpListener::bind("127.0.0.1:0").await?;
    let grpc_addr = grpc_listener.local_addr()?;
    let mut config = BrokerConfig {
        data_dir: dir.to_path_buf(),
        listen: addr.to_string(),
        http_listen: "127.0.0.1:0".into(),
        advertise: Some(addr.to_string()),
        flush_mode: args.flush_mode,
        segment_size: 256 * 1024 * 1024,
        ..BrokerConfig::default()
    };
    security.apply(&mut config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let broker = tokio::spawn(quiver_broker::run_with_grpc(
        config,
        listener,
        None,
        Some(grpc_listener),
        async move {
            let _ = stopped.await;
        },
    ));
    let mut setup = loop {
        match Conn::connect(addr, security).await {
            Ok(conn) => break conn,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    create_topic(&mut setup, TOPIC).await?;
    Ok(RunningBroker {
        addr,
        grpc_addr,
        conn: setup,
        stop,
        task: broker,
    })
}

/// UPDATE_AND_CREATE_TOPIC with QUEUES read and write queues.
async fn create_topic(conn: &mut Conn, topic: &str) -> anyhow::Result<()> {
    let queues = QUEUES.to_string();
    let ext = [
        ("topic", topic),
        ("readQueueNums", &queues),
        ("writeQueueNums", &queues),
        ("perm", "6"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let reply = conn
        .call(request::UPDATE_AND_CREATE_TOPIC, ext, Bytes::new())
        .await?;
    if reply.code != response::SUCCESS {
        bail!("creating {topic} failed: {} {:?}", reply.code, reply.remark);
    }
    Ok(())
}

/// Stores `count` messages in batches, property `a` = i % 10 (so `a = 0` selects 10%).
async fn store_for_filtering(conn: &mut Conn, count: u64, size: usize) -> anyhow::Result<()> {
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
async fn catch_up(conn: &mut Conn, kind: &str, expression: &str) -> anyhow::Result<u64> {
    let mut delivered = 0u64;
    for queue_id in 0..QUEUES {
        let mut offset = 0u64;
        loop {
            let ext: ExtFields = [
                ("consumerGroup", "CatchUp"),
                ("topic", TOPIC),
                ("queueId", &queue_id.to_string()),
                ("queueOffset", &offset.to_string()),
                ("maxMsgNums", "32"),
                ("sysFlag", "4"),
                ("commitOffset", "-1"),
                ("suspendTimeoutMillis", "0"),
                ("subscription", expression),
                ("subVersion", "0"),
                ("expressionType", kind),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
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
async fn filtered_catch_up(args: &Args, security: &Security) -> anyhow::Result<()> {
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    epoch();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.mode == Mode::Timers {
        println!(
            "quiver-broker-bench timers: {} parked, then {}/s for {} s, bodies of {} B",
            args.timers, args.fire_rate, args.fire_secs, args.size
        );
        return runtime.block_on(timers::run(&args));
    }
    let security = Arc::new(Security::new(&args)?);
    if args.mode == Mode::Grpc {
        if args.tls || args.acl {
            bail!("--mode grpc measures the plain paths: drop --tls and --acl");
        }
        println!(
            "quiver-broker-bench grpc: {} messages of {} B per produce scenario, {} for \
             catch-up, paced {}/s for {} s, flush {:?}",
            args.messages,
            args.size,
            args.catch_up_messages,
            args.paced_rate,
            args.paced_secs,
            args.flush_mode
        );
        return runtime.block_on(grpc::run(&args, &security));
    }
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
        println!("{}", store_scenario(&args, batch)?);
    }
    let mut single_rates = Vec::new();
    for sends in [Sends::Single, Sends::Batch(args.batch)] {
        for producers in [1, 4] {
            let figures = runtime.block_on(network_scenario(&args, &security, producers, sends))?;
            println!("{figures}");
            if sends == Sends::Single {
                single_rates.push((producers, figures.msgs_per_s));
            }
        }
    }
    let mut transactional = Vec::new();
    for (producers, single) in single_rates {
        let sends = Sends::Transactional;
        let figures = runtime.block_on(network_scenario(&args, &security, producers, sends))?;
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
        runtime.block_on(filtered_catch_up(&args, &security))?;
    }
    Ok(())
}
