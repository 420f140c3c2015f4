//! `quiver`: produce, consume, topics, lag, offset resets and cluster state for Quiver brokers.

#![forbid(unsafe_code)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod message;
mod replication;
mod table;

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use jiff::civil::DateTime;
use quiver_client::{
    Admin, BrokerState, ClientConfig, ClientError, ConsumeFromWhere, ConsumeMode, ConsumeOutcome,
    Message, MessageSelector, Producer, ProducerConfig, PushConsumer, PushConsumerConfig, QueueLag,
    QueueSelector, ReceivedMessage, ResetTarget, TlsConfig, TopicRoute, TopicSpec,
};
use quiver_protocol::body::SubscriptionGroupConfig;
use table::Table;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  any other error
  2  invalid command line
  3  broker unreachable or not answering in time
  4  topic, group or message not found
  5  the broker refused the request (busy, message too large, no permission, ...)";

#[derive(Parser, Debug)]
#[command(name = "quiver", version, about = "Command-line client for Quiver (RocketMQ-compatible) brokers", after_help = EXIT_CODES)]
struct Cli {
    /// Broker (name server) address, HOST:PORT; several separated by commas.
    #[arg(
        long,
        global = true,
        env = "QUIVER_SERVER",
        default_value = "127.0.0.1:10911"
    )]
    server: String,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Deadline of one request, in milliseconds.
    #[arg(long, global = true, default_value_t = 5000)]
    timeout_ms: u64,
    /// ACL access key: every request is signed with it and --secret-key (brokers with ACL
    /// on refuse unsigned requests).
    #[arg(
        long,
        global = true,
        env = "QUIVER_ACCESS_KEY",
        requires = "secret_key"
    )]
    access_key: Option<String>,
    /// ACL secret key of --access-key.
    #[arg(
        long,
        global = true,
        env = "QUIVER_SECRET_KEY",
        hide_env_values = true,
        requires = "access_key"
    )]
    secret_key: Option<String>,
    /// Connect with TLS (brokers with --tls-mode enforcing refuse plain connections); the
    /// --tls-* flags below imply it.
    #[arg(long, global = true, env = "QUIVER_TLS", action = clap::ArgAction::Set,
        num_args = 0..=1, default_value_t = false, default_missing_value = "true")]
    tls: bool,
    /// CA certificates (PEM) the broker's certificate must chain to; default: the Mozilla roots.
    #[arg(long, global = true, env = "QUIVER_TLS_CA_FILE")]
    tls_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for brokers that ask for one (--tls-client-auth); with
    /// --tls-key-file.
    #[arg(
        long,
        global = true,
        env = "QUIVER_TLS_CERT_FILE",
        requires = "tls_key_file"
    )]
    tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(
        long,
        global = true,
        env = "QUIVER_TLS_KEY_FILE",
        requires = "tls_cert_file"
    )]
    tls_key_file: Option<PathBuf>,
    /// Name the broker's certificate must carry; default: the host of --server.
    #[arg(long, global = true, env = "QUIVER_TLS_SERVER_NAME")]
    tls_server_name: Option<String>,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// The TLS settings, when --tls or any --tls-* flag is given.
    fn tls(&self) -> Option<TlsConfig> {
        let config = TlsConfig {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            server_name: self.tls_server_name.clone(),
            ..TlsConfig::default()
        };
        (self.tls || config != TlsConfig::default()).then_some(config)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Send messages: from arguments, from a file (one per line) or from stdin lines.
    Produce(ProduceArgs),
    /// Consume a topic as a member of a group and print or count the messages.
    Consume(ConsumeArgs),
    /// List or create topics.
    #[command(subcommand)]
    Topics(TopicsCommand),
    /// List or create subscription groups (consumer groups' settings on the brokers).
    #[command(subcommand)]
    Groups(GroupsCommand),
    /// Lag per group, topic and queue, in messages and seconds.
    Lag(LagArgs),
    /// Manage committed offsets.
    #[command(subcommand)]
    Offsets(OffsetsCommand),
    /// The brokers of the cluster and their state.
    Cluster,
    /// Find messages by key or by id and print them with their properties.
    Message(message::MessageArgs),
    /// The broker group of a broker (master, epoch, in-sync set, lag) and switchovers.
    #[command(subcommand)]
    Replication(replication::ReplicationCommand),
}

#[derive(Args, Debug)]
struct ProduceArgs {
    /// Topic to send to.
    #[arg(long, short)]
    topic: String,
    /// Message bodies; without any (and without --file) lines are read from stdin.
    messages: Vec<String>,
    /// Read one message per line from this file.
    #[arg(long, conflicts_with = "messages")]
    file: Option<PathBuf>,
    /// Tag of every message.
    #[arg(long)]
    tags: Option<String>,
    /// Keys of every message (comma-separated).
    #[arg(long, value_delimiter = ',')]
    keys: Vec<String>,
    /// Extra property KEY=VALUE (repeatable).
    #[arg(long = "property", short = 'p', value_parser = parse_property)]
    properties: Vec<(String, String)>,
    /// Deliver every message at this time, in ms since the epoch (TIMER_DELIVER_MS).
    #[arg(long, conflicts_with = "delay_ms")]
    deliver_at_ms: Option<i64>,
    /// Deliver every message this many ms after the broker receives it (TIMER_DELAY_MS).
    #[arg(long)]
    delay_ms: Option<u64>,
    /// Send each message this many times (load generation).
    #[arg(long, default_value_t = 1)]
    repeat: u64,
    /// Pick the queue by hashing this key (keeps per-key order) instead of round-robin.
    #[arg(long)]
    hash_key: Option<String>,
    /// Sends in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Producer group name.
    #[arg(long, default_value = "quiver-cli-producer")]
    group: String,
    /// Print only the summary, not one line per message.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ConsumePrint {
    /// One line per message.
    Print,
    /// Only the number of messages at the end.
    Count,
}

#[derive(Args, Debug)]
struct ConsumeArgs {
    #[arg(long, short)]
    topic: String,
    /// Consumer group (members of one group share the queues).
    #[arg(long, short, default_value = "quiver-cli")]
    group: String,
    /// Where a group with no committed offset starts: first, last, or a time (ms since the
    /// epoch, or UTC as YYYY-MM-DDTHH:MM:SSZ).
    #[arg(long, default_value = "last", value_parser = parse_from)]
    from: ConsumeFromWhere,
    /// Tag filter, e.g. "TagA || TagB".
    #[arg(long, default_value = "*", conflicts_with = "sql")]
    tags: String,
    /// SQL92 filter over the message properties instead of tags, evaluated by the broker,
    /// e.g. "a > 5 AND TAGS = 'TagA'" (a bad expression exits 2).
    #[arg(long, value_parser = parse_sql)]
    sql: Option<String>,
    #[arg(long, value_enum, default_value_t = ConsumePrint::Print)]
    mode: ConsumePrint,
    /// Stop after this many messages.
    #[arg(long)]
    max: Option<u64>,
    /// Stop when no message arrived for this many seconds.
    #[arg(long)]
    idle_timeout_secs: Option<u64>,
    /// Consume each queue in order (locks the queues on the broker).
    #[arg(long)]
    orderly: bool,
}

#[derive(Subcommand, Debug)]
enum TopicsCommand {
    /// List every topic.
    List,
    /// Create or update a topic on every broker.
    Create {
        name: String,
        /// Read and write queues per broker.
        #[arg(long, default_value_t = 8)]
        queues: u32,
        /// 6 read-write, 4 read-only, 2 write-only.
        #[arg(long, default_value_t = 6)]
        perm: i32,
    },
    /// Show the route (brokers and queues) of a topic.
    Route { name: String },
    /// The groups consuming a topic: online subscribers and groups with offsets on it.
    Consumers { name: String },
}

#[derive(Subcommand, Debug)]
enum GroupsCommand {
    /// List every subscription group with its settings.
    List,
    /// Create or update a subscription group on every broker.
    Create {
        name: String,
        /// In-order delivery (consumeMessageOrderly): 5.x clients receive a message group's
        /// messages in order, one batch in flight per queue.
        #[arg(long)]
        fifo: bool,
        /// Redeliveries before a message goes to %DLQ%<group>.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(i32).range(0..))]
        retry_max_times: i32,
    },
}

#[derive(Args, Debug)]
struct LagArgs {
    /// Only this group (default: every group the brokers know).
    #[arg(long, short)]
    group: Option<String>,
    /// Only this topic.
    #[arg(long, short)]
    topic: Option<String>,
    /// Refresh until interrupted.
    #[arg(long)]
    watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 2)]
    interval_secs: u64,
}

#[derive(Subcommand, Debug)]
enum OffsetsCommand {
    /// Move a group's committed offsets on a topic.
    Reset {
        #[arg(long, short)]
        group: String,
        #[arg(long, short)]
        topic: String,
        /// earliest, latest, or a time (ms since the epoch, or UTC as YYYY-MM-DDTHH:MM:SSZ).
        #[arg(long, value_parser = parse_reset)]
        to: ResetTarget,
    },
}

/// A `--sql` filter, checked before anything is sent.
fn parse_sql(text: &str) -> Result<String, String> {
    quiver_protocol::sql92::Selector::parse(text)
        .map(|_| text.to_owned())
        .map_err(|error| error.to_string())
}

fn parse_property(raw: &str) -> Result<(String, String), String> {
    raw.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {raw:?}"))
}

fn parse_from(raw: &str) -> Result<ConsumeFromWhere, String> {
    match raw {
        "first" => Ok(ConsumeFromWhere::FirstOffset),
        "last" => Ok(ConsumeFromWhere::LastOffset),
        other => parse_time_ms(other).map(ConsumeFromWhere::Timestamp).ok_or_else(|| {
            format!("expected first, last, ms since the epoch or YYYY-MM-DDTHH:MM:SSZ, got {other:?}")
        }),
    }
}

fn parse_reset(raw: &str) -> Result<ResetTarget, String> {
    match raw {
        "earliest" => Ok(ResetTarget::Earliest),
        "latest" => Ok(ResetTarget::Latest),
        other => parse_time_ms(other).map(ResetTarget::Timestamp).ok_or_else(|| {
            format!("expected earliest, latest, ms since the epoch or YYYY-MM-DDTHH:MM:SSZ, got {other:?}")
        }),
    }
}

/// Milliseconds since the epoch, or a UTC time `YYYY-MM-DDTHH:MM:SS[.fff]Z` (RFC 3339 lets
/// `t` or a space stand for the `T`, and `z` for the `Z`; digits past milliseconds are dropped).
fn parse_time_ms(raw: &str) -> Option<i64> {
    if let Ok(ms) = raw.parse::<i64>() {
        return Some(ms);
    }
    // UTC only: a time without `Z` is ambiguous, and other offsets are not documented.
    let utc = raw.strip_suffix(['Z', 'z'])?;
    let (date, time) = utc.split_once(['T', 't', ' '])?;
    if date.contains(char::is_whitespace) || time.contains(char::is_whitespace) {
        return None;
    }
    let civil = DateTime::strptime("%Y-%m-%dT%H:%M:%S%.f", format!("{date}T{time}")).ok()?;
    // Whole seconds, then the milliseconds as written: before 1970 a time is floored to the
    // millisecond, not moved towards 1970.
    let whole = civil.with().subsec_nanosecond(0).build().ok()?;
    let seconds = whole.duration_since(UNIX_EPOCH).as_secs();
    Some(seconds * 1000 + i64::from(civil.millisecond()))
}

const UNIX_EPOCH: DateTime = DateTime::constant(1970, 1, 1, 0, 0, 0, 0);

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(exit_code(&error))
        }
    }
}

/// Maps the root cause to the documented exit code.
fn exit_code(error: &anyhow::Error) -> u8 {
    let Some(client_error) = error.chain().find_map(|e| e.downcast_ref::<ClientError>()) else {
        return 1;
    };
    match client_error {
        ClientError::Connect { .. }
        | ClientError::ConnectionClosed { .. }
        | ClientError::Io { .. }
        | ClientError::Tls { .. }
        | ClientError::Timeout { .. } => 3,
        ClientError::TopicNotFound { .. }
        | ClientError::NoRoute { .. }
        | ClientError::MessageNotFound { .. } => 4,
        ClientError::Broker { code, .. }
            if *code == quiver_protocol::code::response::SUBSCRIPTION_GROUP_NOT_EXIST =>
        {
            4
        }
        ClientError::BrokerBusy { .. }
        | ClientError::MessageTooLarge { .. }
        | ClientError::Broker { .. } => 5,
        _ => 1,
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut client =
        ClientConfig::new(&cli.server).with_request_timeout(Duration::from_millis(cli.timeout_ms));
    if let (Some(access_key), Some(secret_key)) = (&cli.access_key, &cli.secret_key) {
        client = client.with_credentials(access_key, secret_key);
    }
    if let Some(tls) = cli.tls() {
        client = client.with_tls(tls);
    }
    match cli.command {
        Command::Produce(args) => produce(client, cli.output, args).await,
        Command::Consume(args) => consume(client, cli.output, args).await,
        Command::Topics(command) => topics(client, cli.output, command).await,
        Command::Groups(command) => groups(client, cli.output, command).await,
        Command::Lag(args) => lag(client, cli.output, args).await,
        Command::Offsets(OffsetsCommand::Reset { group, topic, to }) => {
            reset(client, cli.output, &group, &topic, to).await
        }
        Command::Cluster => cluster(client, cli.output).await,
        Command::Message(args) => message::run(client, cli.output, args).await,
        Command::Replication(command) => replication::run(client, cli.output, command).await,
    }
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// The bodies to send: the arguments, the lines of --file, or the lines of stdin.
fn read_bodies(args: &ProduceArgs) -> anyhow::Result<Vec<String>> {
    let bodies: Vec<String> = if let Some(path) = &args.file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        text.lines().map(String::from).collect()
    } else if !args.messages.is_empty() {
        args.messages.clone()
    } else {
        let stdin = std::io::stdin();
        stdin
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("cannot read messages from stdin")?
    };
    if bodies.is_empty() {
        bail!("no messages to send: pass them as arguments, with --file, or on stdin");
    }
    Ok(bodies)
}

async fn produce(client: ClientConfig, output: Output, args: ProduceArgs) -> anyhow::Result<()> {
    let bodies = read_bodies(&args)?;
    let mut config = ProducerConfig::new("");
    config.client = client;
    config.group = args.group.clone();
    let producer = Producer::new(config);
    let total = bodies.len() as u64 * args.repeat;
    let template = |body: &str| {
        let mut message = Message::new(args.topic.clone(), body.to_owned()).with_keys(&args.keys);
        if let Some(tags) = &args.tags {
            message = message.with_tags(tags.clone());
        }
        for (k, v) in &args.properties {
            message = message.with_property(k.clone(), v.clone());
        }
        if let Some(at) = args.deliver_at_ms {
            message = message.with_deliver_at_ms(at);
        }
        if let Some(delay) = args.delay_ms {
            message = message.with_delay_ms(delay);
        }
        message
    };
    let started = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(total, sent.clone());
    let semaphore = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut results = Vec::new();
    let mut first_error = None;
    'sending: for _ in 0..args.repeat {
        for body in &bodies {
            let permit = semaphore
                .clone()
                .acquire_owned()
                .await
                .context("send limiter closed")?;
            let producer = producer.clone();
            let message = template(body);
            let hash_key = args.hash_key.clone();
            let sent = sent.clone();
            tasks.spawn(async move {
                let _permit = permit;
                let selector = hash_key
                    .as_deref()
                    .map_or(QueueSelector::RoundRobin, QueueSelector::KeyHash);
                let result = producer.send_with(message, selector).await;
                sent.fetch_add(1, Ordering::Relaxed);
                result
            });
            while let Some(done) = tasks.try_join_next() {
                collect(done, &mut results, &mut first_error, args.quiet);
            }
            if first_error.is_some() {
                break 'sending;
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        collect(done, &mut results, &mut first_error, args.quiet);
    }
    progress.finish();
    producer.shutdown().await;
    if let Some(error) = first_error {
        return Err(error).context(format!("sending to topic {}", args.topic));
    }
    print_produced(
        output,
        &results,
        args.quiet,
        started.elapsed().as_secs_f64(),
    )
}

/// What was sent: every result unless `quiet`, and the rate.
fn print_produced(
    output: Output,
    results: &[serde_json::Value],
    quiet: bool,
    elapsed: f64,
) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(&serde_json::json!({
            "sent": results.len(),
            "seconds": elapsed,
            "results": if quiet { &[][..] } else { results },
        }))?,
        Output::Table => {
            if !quiet {
                let mut table = Table::new(&["MSG_ID", "BROKER", "QUEUE", "OFFSET"]);
                for r in results {
                    table.row(vec![
                        r["msg_id"].as_str().unwrap_or_default().to_owned(),
                        r["broker"].as_str().unwrap_or_default().to_owned(),
                        r["queue_id"].to_string(),
                        r["queue_offset"].to_string(),
                    ]);
                }
                print!("{}", table.render());
            }
            eprintln!(
                "sent {} messages in {elapsed:.2} s ({:.0} msg/s)",
                results.len(),
                results.len() as f64 / elapsed.max(1e-9)
            );
        }
    }
    Ok(())
}

fn collect(
    done: Result<quiver_client::Result<quiver_client::SendResult>, tokio::task::JoinError>,
    results: &mut Vec<serde_json::Value>,
    first_error: &mut Option<anyhow::Error>,
    quiet: bool,
) {
    match done {
        Ok(Ok(result)) => {
            if quiet {
                results.push(serde_json::Value::Null);
            } else {
                results.push(serde_json::json!({
                    "msg_id": result.msg_id,
                    "offset_msg_id": result.offset_msg_id,
                    "broker": result.queue.broker_name,
                    "queue_id": result.queue.queue_id,
                    "queue_offset": result.queue_offset.0,
                }));
            }
        }
        Ok(Err(error)) => {
            first_error.get_or_insert(error.into());
        }
        Err(join_error) => {
            first_error.get_or_insert(anyhow::Error::new(join_error).context("send task failed"));
        }
    }
}

/// A one-line progress bar with rate on stderr, only when stderr is a terminal.
struct Progress {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(total: u64, done: Arc<AtomicU64>) -> Self {
        if !std::io::stderr().is_terminal() || total < 1000 {
            return Self { task: None };
        }
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let n = done.load(Ordering::Relaxed);
                let width = 30usize;
                let filled = (n as f64 / total as f64 * width as f64) as usize;
                let rate = n as f64 / started.elapsed().as_secs_f64().max(1e-9);
                eprint!(
                    "\r[{}{}] {n}/{total} {rate:.0} msg/s",
                    "#".repeat(filled),
                    "-".repeat(width - filled.min(width))
                );
                let _ = std::io::stderr().flush();
            }
        });
        Self { task: Some(task) }
    }

    fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
            eprintln!();
        }
    }
}

fn message_json(message: &ReceivedMessage) -> serde_json::Value {
    serde_json::json!({
        "topic": message.topic,
        "broker": message.queue.broker_name,
        "queue_id": message.queue.queue_id,
        "queue_offset": message.queue_offset.0,
        "msg_id": message.msg_id(),
        "tags": message.tags(),
        "keys": message.keys(),
        "properties": message.properties,
        "reconsume_times": message.reconsume_times,
        "store_timestamp_ms": message.store_timestamp_ms,
        "body": String::from_utf8_lossy(&message.body),
    })
}

async fn consume(client: ClientConfig, output: Output, args: ConsumeArgs) -> anyhow::Result<()> {
    let selector = match &args.sql {
        Some(expression) => MessageSelector::by_sql(expression.clone()),
        None => MessageSelector::by_tag(args.tags.clone()),
    };
    let mut config = PushConsumerConfig::new("", args.group.clone())
        .subscribe(args.topic.clone(), selector)
        .consume_from(args.from)
        .mode(if args.orderly {
            ConsumeMode::Orderly
        } else {
            ConsumeMode::Concurrent
        });
    config.client = client;
    config.long_poll = Duration::from_secs(5);
    if args.max.is_some() {
        // One listener call at a time keeps the count exact at --max.
        config.consume_concurrency = 1;
    }
    let count = Arc::new(AtomicU64::new(0));
    let last_message = Arc::new(parking_lot::Mutex::new(Instant::now()));
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let max = args.max;
    let print = args.mode == ConsumePrint::Print;
    let listener = {
        let count = count.clone();
        let last_message = last_message.clone();
        Arc::new(move |messages: &[ReceivedMessage]| {
            let mut stdout = std::io::stdout().lock();
            for message in messages {
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                if max.is_some_and(|max| n > max) {
                    // Past --max: leave it for the next consumer rather than drop it.
                    return ConsumeOutcome::Retry;
                }
                if print {
                    let _ = writeln!(stdout, "{}", consumed_line(message, output));
                }
                if max.is_some_and(|max| n >= max) {
                    let _ = done_tx.send(true);
                }
            }
            let _ = stdout.flush();
            *last_message.lock() = Instant::now();
            ConsumeOutcome::Success
        })
    };
    let consumer = PushConsumer::start(config, listener)
        .await
        .context(format!("starting to consume {}", args.topic))?;
    let idle = args.idle_timeout_secs.map(Duration::from_secs);
    wait_until_done(&mut done_rx, idle, &last_message).await;
    consumer
        .shutdown()
        .await
        .context("committing offsets on shutdown")?;
    let consumed = max.map_or(count.load(Ordering::SeqCst), |max| {
        count.load(Ordering::SeqCst).min(max)
    });
    if args.mode == ConsumePrint::Count {
        match output {
            Output::Json => print_json(&serde_json::json!({ "consumed": consumed }))?,
            Output::Table => println!("{consumed}"),
        }
    }
    Ok(())
}

/// One consumed message as `consume` prints it.
fn consumed_line(message: &ReceivedMessage, output: Output) -> String {
    match output {
        Output::Json => message_json(message).to_string(),
        Output::Table => format!(
            "{}\t{}:{}@{}\ttags={}\tkeys={}\t{}",
            message.topic,
            message.queue.broker_name,
            message.queue.queue_id,
            message.queue_offset,
            message.tags().unwrap_or("-"),
            message.keys().join(","),
            String::from_utf8_lossy(&message.body)
        ),
    }
}

/// Until Ctrl-C, --max reached, or no message for `idle`.
async fn wait_until_done(
    done: &mut tokio::sync::watch::Receiver<bool>,
    idle: Option<Duration>,
    last_message: &parking_lot::Mutex<Instant>,
) {
    let mut check = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = done.changed() => return,
            _ = check.tick() => {
                if idle.is_some_and(|idle| last_message.lock().elapsed() >= idle) {
                    return;
                }
            }
        }
    }
}

async fn topics(
    client: ClientConfig,
    output: Output,
    command: TopicsCommand,
) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    match command {
        TopicsCommand::List => {
            let topics = admin.topics().await?;
            match output {
                Output::Json => print_json(&topics)?,
                Output::Table => {
                    let mut table = Table::new(&["TOPIC", "READ_QUEUES", "WRITE_QUEUES", "PERM"]);
                    for t in topics {
                        table.row(vec![
                            t.name,
                            t.read_queue_nums.to_string(),
                            t.write_queue_nums.to_string(),
                            t.perm.to_string(),
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        TopicsCommand::Create { name, queues, perm } => {
            let spec = TopicSpec {
                perm,
                ..TopicSpec::new(name, queues)
            };
            let brokers = admin.create_topic(&spec).await?;
            match output {
                Output::Json => {
                    print_json(&serde_json::json!({ "topic": spec, "brokers": brokers }))?
                }
                Output::Table => println!(
                    "topic {} created on {} broker(s): {}",
                    spec.name,
                    brokers.len(),
                    brokers.join(", ")
                ),
            }
        }
        TopicsCommand::Route { name } => print_route(&*admin.route(&name).await?, output)?,
        TopicsCommand::Consumers { name } => {
            let mut groups = std::collections::BTreeSet::new();
            for addr in admin.broker_addrs().await? {
                groups.extend(admin.consumed_by_at(&addr, &name).await?);
            }
            match output {
                Output::Json => print_json(&groups)?,
                Output::Table => {
                    let mut table = Table::new(&["GROUP"]);
                    for group in groups {
                        table.row(vec![group]);
                    }
                    print!("{}", table.render());
                }
            }
        }
    }
    admin.shutdown().await;
    Ok(())
}

async fn groups(
    client: ClientConfig,
    output: Output,
    command: GroupsCommand,
) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    match command {
        GroupsCommand::List => {
            let groups = admin.group_configs().await?;
            match output {
                Output::Json => print_json(&groups)?,
                Output::Table => {
                    let mut table = Table::new(&["GROUP", "FIFO", "RETRY_MAX_TIMES", "CONSUME"]);
                    for group in groups {
                        table.row(vec![
                            group.group_name,
                            group.consume_message_orderly.to_string(),
                            group.retry_max_times.to_string(),
                            group.consume_enable.to_string(),
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        GroupsCommand::Create {
            name,
            fifo,
            retry_max_times,
        } => {
            let config = SubscriptionGroupConfig {
                group_name: name,
                consume_message_orderly: fifo,
                retry_max_times,
                ..SubscriptionGroupConfig::default()
            };
            let brokers = admin.upsert_group(&config).await?;
            match output {
                Output::Json => {
                    print_json(&serde_json::json!({ "group": config, "brokers": brokers }))?
                }
                Output::Table => println!(
                    "group {} created on {} broker(s): {}",
                    config.group_name,
                    brokers.len(),
                    brokers.join(", ")
                ),
            }
        }
    }
    admin.shutdown().await;
    Ok(())
}

/// A topic's route: brokers and their queue counts.
fn print_route(route: &TopicRoute, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(&serde_json::json!({
            "topic": route.topic,
            "brokers": route.brokers,
            "read_queues": route.read_queues.iter().map(|q| (q.broker_name.clone(), q.queue_id)).collect::<Vec<_>>(),
            "write_queues": route.write_queues.iter().map(|q| (q.broker_name.clone(), q.queue_id)).collect::<Vec<_>>(),
        }))?,
        Output::Table => {
            let mut table = Table::new(&["BROKER", "ADDRESS", "READ_QUEUES", "WRITE_QUEUES"]);
            for (broker, addr) in &route.brokers {
                let reads = route
                    .read_queues
                    .iter()
                    .filter(|q| &q.broker_name == broker)
                    .count();
                let writes = route
                    .write_queues
                    .iter()
                    .filter(|q| &q.broker_name == broker)
                    .count();
                table.row(vec![
                    broker.clone(),
                    addr.clone(),
                    reads.to_string(),
                    writes.to_string(),
                ]);
            }
            print!("{}", table.render());
        }
    }
    Ok(())
}

fn optional<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

/// Per-queue lag, and per group and topic the total (table) or one JSON row per queue.
fn print_lag(lags: &[QueueLag], output: Output, watch: bool) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            let rows: Vec<serde_json::Value> = lags
                .iter()
                .map(|lag| {
                    serde_json::json!({
                        "group": lag.group,
                        "topic": lag.queue.topic,
                        "broker": lag.queue.broker_name,
                        "queue_id": lag.queue.queue_id,
                        "broker_offset": lag.broker_offset.0,
                        "consumer_offset": lag.consumer_offset.map(|o| o.0),
                        "lag_messages": lag.lag_messages,
                        "lag_seconds": lag.lag_seconds,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string(&rows)?);
        }
        Output::Table => {
            let mut table = Table::new(&[
                "GROUP",
                "TOPIC",
                "BROKER",
                "QUEUE",
                "BROKER_OFFSET",
                "CONSUMER_OFFSET",
                "LAG",
                "LAG_SECONDS",
            ]);
            let mut totals: BTreeMap<(String, String), (u64, bool)> = BTreeMap::new();
            for lag in lags {
                table.row(vec![
                    lag.group.clone(),
                    lag.queue.topic.clone(),
                    lag.queue.broker_name.clone(),
                    lag.queue.queue_id.to_string(),
                    lag.broker_offset.to_string(),
                    optional(lag.consumer_offset),
                    optional(lag.lag_messages),
                    optional(lag.lag_seconds.map(|s| format!("{s:.1}"))),
                ]);
                let total = totals
                    .entry((lag.group.clone(), lag.queue.topic.clone()))
                    .or_default();
                total.0 += lag.lag_messages.unwrap_or(0);
                total.1 |= lag.lag_messages.is_none();
            }
            if watch && std::io::stdout().is_terminal() {
                // Clear the screen so the table refreshes in place.
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", table.render());
            for ((group, topic), (total, has_unknown)) in totals {
                let note = if has_unknown {
                    " (some queues never committed)"
                } else {
                    ""
                };
                println!("total {group}/{topic}: {total}{note}");
            }
        }
    }
    Ok(())
}

async fn lag(client: ClientConfig, output: Output, args: LagArgs) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    loop {
        let groups = match &args.group {
            Some(group) => vec![group.clone()],
            None => admin.groups().await?,
        };
        let mut lags = Vec::new();
        for group in &groups {
            lags.extend(
                admin
                    .lag(group, args.topic.as_deref())
                    .await
                    .with_context(|| format!("lag of group {group}"))?,
            );
        }
        print_lag(&lags, output, args.watch)?;
        if !args.watch {
            break;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_secs(args.interval_secs.max(1))) => {}
        }
    }
    admin.shutdown().await;
    Ok(())
}

async fn reset(
    client: ClientConfig,
    output: Output,
    group: &str,
    topic: &str,
    to: ResetTarget,
) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    let moved = admin
        .reset_offsets(group, topic, to)
        .await
        .with_context(|| format!("resetting {group} on {topic}"))?;
    match output {
        Output::Json => print_json(
            &moved
                .iter()
                .map(|(q, o)| serde_json::json!({ "broker": q.broker_name, "queue_id": q.queue_id, "offset": o.0 }))
                .collect::<Vec<_>>(),
        )?,
        Output::Table => {
            let mut table = Table::new(&["BROKER", "QUEUE", "NEW_OFFSET"]);
            for (queue, offset) in &moved {
                table.row(vec![queue.broker_name.clone(), queue.queue_id.to_string(), offset.to_string()]);
            }
            print!("{}", table.render());
        }
    }
    admin.shutdown().await;
    Ok(())
}

async fn cluster(client: ClientConfig, output: Output) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    let brokers = admin.brokers().await?;
    match output {
        Output::Json => print_json(&brokers)?,
        Output::Table => {
            let mut table =
                Table::new(&["CLUSTER", "BROKER", "ADDRESS", "STATE", "PERM", "RTT_MS"]);
            for broker in brokers {
                let (state, perm, rtt) = match &broker.state {
                    BrokerState::Up {
                        round_trip_ms,
                        permission,
                    } => (
                        "up".to_owned(),
                        optional(*permission),
                        format!("{round_trip_ms:.1}"),
                    ),
                    BrokerState::Unreachable { error } => {
                        (format!("unreachable: {error}"), "-".into(), "-".into())
                    }
                };
                table.row(vec![
                    broker.cluster,
                    broker.broker_name,
                    broker.addr,
                    state,
                    perm,
                    rtt,
                ]);
            }
            print!("{}", table.render());
        }
    }
    admin.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_accepts_names_and_timestamps() {
        assert_eq!(parse_from("first"), Ok(ConsumeFromWhere::FirstOffset));
        assert_eq!(parse_from("last"), Ok(ConsumeFromWhere::LastOffset));
        assert_eq!(
            parse_from("1700000000000"),
            Ok(ConsumeFromWhere::Timestamp(1_700_000_000_000))
        );
        assert!(parse_from("yesterday")
            .unwrap_err()
            .contains("expected first, last"));
        assert_eq!(
            parse_from("2023-11-14T22:13:20Z"),
            Ok(ConsumeFromWhere::Timestamp(1_700_000_000_000))
        );
    }

    #[test]
    fn reset_targets_parse() {
        assert_eq!(parse_reset("earliest"), Ok(ResetTarget::Earliest));
        assert_eq!(parse_reset("latest"), Ok(ResetTarget::Latest));
        assert_eq!(parse_reset("42"), Ok(ResetTarget::Timestamp(42)));
        assert!(parse_reset("soon").is_err());
    }

    #[test]
    fn utc_times_convert_to_epoch_milliseconds() {
        assert_eq!(parse_time_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_time_ms("2000-02-29T12:30:15.25Z"),
            Some(951_827_415_250)
        );
        assert_eq!(parse_time_ms("1969-12-31T23:59:59Z"), Some(-1000));
        assert_eq!(parse_time_ms("2024-13-01T00:00:00Z"), None);
        assert_eq!(
            parse_time_ms("2024-01-01T00:00:00"),
            None,
            "a time without Z is ambiguous"
        );
    }

    #[test]
    fn utc_times_take_rfc3339_spellings_and_refuse_impossible_ones() {
        let at = 1_700_000_000_000;
        assert_eq!(parse_time_ms("2023-11-14t22:13:20z"), Some(at));
        assert_eq!(parse_time_ms("2023-11-14 22:13:20Z"), Some(at));
        assert_eq!(parse_time_ms("2023-11-14T22:13:20.1Z"), Some(at + 100));
        assert_eq!(
            parse_time_ms("2023-11-14T22:13:20.123456789Z"),
            Some(at + 123),
            "digits past milliseconds are dropped"
        );
        assert_eq!(parse_time_ms("1969-12-31T23:59:59.5Z"), Some(-500));
        assert_eq!(parse_time_ms("1969-12-31T23:59:59.9995Z"), Some(-1));
        assert_eq!(
            parse_time_ms("2024-02-29T00:00:00Z"),
            Some(1_709_164_800_000)
        );
        assert_eq!(
            parse_time_ms("9999-12-31T23:59:59.999Z"),
            Some(253_402_300_799_999)
        );
        for refused in [
            "2023-02-29T00:00:00Z",
            "2024-04-31T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:60:00Z",
            "2024-01-01T00:00:00+01:00",
            "2024-01-01T00:00:00+01:00Z",
            "2024-01-01Z",
            " 2024-01-01T00:00:00Z",
            "2024-01-01T 00:00:00Z",
            "2024-01-01T00:00:00.Z",
            "yesterday",
            "",
        ] {
            assert_eq!(parse_time_ms(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn a_time_that_does_not_parse_names_the_accepted_forms() {
        assert_eq!(
            parse_from("2024-01-01T00:00:00"),
            Err(
                "expected first, last, ms since the epoch or YYYY-MM-DDTHH:MM:SSZ, \
                 got \"2024-01-01T00:00:00\""
                    .to_owned()
            )
        );
        assert_eq!(
            parse_reset("2024-02-30T00:00:00Z"),
            Err(
                "expected earliest, latest, ms since the epoch or YYYY-MM-DDTHH:MM:SSZ, \
                 got \"2024-02-30T00:00:00Z\""
                    .to_owned()
            )
        );
        let Err(error) =
            Cli::try_parse_from(["quiver", "message", "--key", "k", "--begin", "soon"])
        else {
            panic!("--begin soon parsed");
        };
        assert!(
            error
                .to_string()
                .contains("expected ms since the epoch or YYYY-MM-DDTHH:MM:SSZ, got \"soon\""),
            "{error}"
        );
    }

    #[test]
    fn consume_takes_a_valid_sql_filter_or_tags_not_both() {
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["quiver", "consume", "-t", "T"].iter().chain(args))
        };
        let Command::Consume(args) = parse(&["--sql", "a > 5"]).unwrap().command else {
            panic!("not consume");
        };
        assert_eq!(args.sql.as_deref(), Some("a > 5"));
        let error = parse(&["--sql", "a >"]).unwrap_err();
        assert!(error.to_string().contains("column 4"), "{error}");
        assert!(parse(&["--sql", "a > 5", "--tags", "A"]).is_err());
    }

    #[test]
    fn properties_need_an_equals_sign() {
        assert_eq!(
            parse_property("a=b=c"),
            Ok(("a".to_owned(), "b=c".to_owned()))
        );
        assert!(parse_property("novalue").is_err());
    }

    #[test]
    fn exit_codes_follow_the_documented_table() {
        let code =
            |error: ClientError| exit_code(&anyhow::Error::new(error).context("doing something"));
        assert_eq!(
            code(ClientError::Timeout {
                addr: "a".into(),
                code: 10,
                timeout_ms: 1
            }),
            3
        );
        assert_eq!(code(ClientError::TopicNotFound { topic: "t".into() }), 4);
        assert_eq!(code(ClientError::MessageNotFound { what: "m".into() }), 4);
        assert_eq!(
            code(ClientError::MessageTooLarge {
                size_bytes: 2,
                max_bytes: 1
            }),
            5
        );
        assert_eq!(code(ClientError::Shutdown), 1);
        assert_eq!(exit_code(&anyhow::anyhow!("plain")), 1);
    }

    #[test]
    fn every_command_parses_its_help() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn tables_align_columns() {
        let mut table = Table::new(&["A", "LONG"]);
        table.row(vec!["wide-cell".into(), "x".into()]);
        assert_eq!(table.render(), "A          LONG\nwide-cell  x\n");
    }
}
