//! `quiver`: produce, consume, topics, lag, offset resets and cluster state for Quiver brokers.

#![forbid(unsafe_code)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cluster;
mod consume;
mod groups;
mod lag;
mod message;
mod offsets;
mod produce;
mod replication;
mod table;
mod topics;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use jiff::civil::DateTime;
use quiver_client::{ClientConfig, ClientError, ConsumeFromWhere, ResetTarget, TlsConfig};

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
        Command::Produce(args) => produce::run(client, cli.output, args).await,
        Command::Consume(args) => consume::run(client, cli.output, args).await,
        Command::Topics(command) => topics::run(client, cli.output, command).await,
        Command::Groups(command) => groups::run(client, cli.output, command).await,
        Command::Lag(args) => lag::run(client, cli.output, args).await,
        Command::Offsets(OffsetsCommand::Reset { group, topic, to }) => {
            offsets::reset(client, cli.output, &group, &topic, to).await
        }
        Command::Cluster => cluster::run(client, cli.output).await,
        Command::Message(args) => message::run(client, cli.output, args).await,
        Command::Replication(command) => replication::run(client, cli.output, command).await,
    }
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

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
