//! Broker configuration: one serde struct read from a file, the environment and flags.

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser};
use quiver_protocol::body::perm;
use serde::{Deserialize, Serialize};

pub use quiver_broker_config::{defaults, BrokerSettings, ClientAuth, ReplicationMode, TlsMode};
pub use quiver_store::FlushMode;

mod validate;

/// Every setting of the broker. Each field is a flag `--<name>`, an environment variable
/// `QUIVER_<NAME>` and a key `<name>` of the `--config` file (TOML or JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Parser)]
#[serde(rename_all = "kebab-case", default)]
#[command(
    name = "quiver-broker",
    version,
    about = "A RocketMQ 4.x compatible message broker"
)]
pub struct BrokerConfig {
    /// Directory of the CommitLog, ConsumeQueues and config/ files.
    #[arg(long, env = "QUIVER_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,

    /// Address of the remoting port; it also answers name-server requests.
    #[arg(long, env = "QUIVER_LISTEN", default_value = defaults::LISTEN)]
    pub listen: String,

    /// Address of the HTTP port (/metrics, /healthz, /readyz).
    #[arg(long, env = "QUIVER_HTTP_LISTEN", default_value = defaults::HTTP_LISTEN)]
    pub http_listen: String,

    /// Address of the gRPC port (`apache.rocketmq.v2.MessagingService`, what RocketMQ 5.x
    /// clients speak to a Proxy); "" or "off" turns it off.
    #[arg(long, env = "QUIVER_GRPC_LISTEN", default_value = defaults::GRPC_LISTEN)]
    pub grpc_listen: String,

    /// host:port 5.x clients reach the gRPC port at (QueryRoute answers). Default: the
    /// advertised host with the gRPC port's port.
    #[arg(long, env = "QUIVER_GRPC_ADVERTISE")]
    pub grpc_advertise: Option<String>,

    /// host:port clients reach this broker at (routes, message ids). Default: the listen address.
    #[arg(long, env = "QUIVER_ADVERTISE")]
    pub advertise: Option<String>,

    /// Name of this broker in routes. 1..=127 chars of [A-Za-z0-9_-.].
    #[arg(long, env = "QUIVER_BROKER_NAME", default_value = defaults::BROKER_NAME)]
    pub broker_name: String,

    /// Cluster name in routes and metric labels.
    #[arg(long, env = "QUIVER_CLUSTER", default_value = defaults::CLUSTER)]
    pub cluster: String,

    /// Other brokers' advertised host:port, comma separated; each is named by its own
    /// answer to GET_BROKER_CONFIG. Taken from the `--config` file, the list follows the file
    /// while the broker runs (re-read when it changes).
    #[arg(long, env = "QUIVER_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,

    /// async (acknowledge from page cache) or sync (acknowledge once durable).
    #[arg(long, env = "QUIVER_FLUSH_MODE", default_value_t = FlushMode::Async)]
    pub flush_mode: FlushMode,

    /// Sync mode: zero-fill and fsync each CommitLog segment before it takes writes, so
    /// group-commit fsyncs never allocate blocks (off by default: docs/ARCHITECTURE.md, measured).
    #[arg(long, env = "QUIVER_WARM_SEGMENTS", default_value_t = false, action = clap::ArgAction::Set)]
    pub warm_segments: bool,

    /// CommitLog segment file size in bytes. At least 64 KiB.
    #[arg(long, env = "QUIVER_SEGMENT_SIZE", default_value_t = defaults::SEGMENT_SIZE)]
    pub segment_size: u64,

    /// Create a topic on its first send or route lookup.
    #[arg(long, env = "QUIVER_AUTO_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_create_topics: bool,

    /// Queues of an auto-created topic, 1..=1024 (RocketMQ uses 4; the default 8 spreads 4
    /// consumers evenly with room to grow).
    #[arg(long, env = "QUIVER_DEFAULT_QUEUE_NUMS", default_value_t = defaults::DEFAULT_QUEUE_NUMS)]
    pub default_queue_nums: u32,

    /// Largest message body accepted, in bytes. 1..=15 MiB and at most half
    /// of segment-size.
    #[arg(long, env = "QUIVER_MAX_MESSAGE_SIZE", default_value_t = defaults::MAX_MESSAGE_SIZE)]
    pub max_message_size: u32,

    /// 6 read-write, 4 read-only (draining), 2 write-only. Changeable at run time.
    #[arg(long, env = "QUIVER_BROKER_PERMISSION", default_value_t = perm::READ_WRITE)]
    pub broker_permission: i32,

    /// Worker threads of the async runtime; 0: one per CPU core.
    #[arg(long, env = "QUIVER_WORKER_THREADS", default_value_t = defaults::WORKER_THREADS)]
    pub worker_threads: usize,

    /// Open client connections at most; more are closed on accept. >= 1.
    #[arg(long, env = "QUIVER_MAX_CONNECTIONS", default_value_t = defaults::MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Open client connections from one source IP address at most; more are closed on
    /// accept. >= 1.
    #[arg(
        long,
        env = "QUIVER_MAX_CONNECTIONS_PER_ADDRESS",
        default_value_t = defaults::MAX_CONNECTIONS_PER_ADDRESS
    )]
    pub max_connections_per_address: usize,

    /// Pull requests parked for long polling at most; more get PULL_NOT_FOUND at once.
    /// >= 1.
    #[arg(long, env = "QUIVER_MAX_PARKED_PULLS", default_value_t = defaults::MAX_PARKED_PULLS)]
    pub max_parked_pulls: usize,

    /// Pull requests parked for long polling at most per connection; more are refused with
    /// SYSTEM_BUSY (clients back off). >= 1.
    #[arg(
        long,
        env = "QUIVER_MAX_PARKED_PULLS_PER_CONNECTION",
        default_value_t = defaults::MAX_PARKED_PULLS_PER_CONNECTION
    )]
    pub max_parked_pulls_per_connection: usize,

    /// Requests of one connection being processed at once; reading pauses beyond it, which
    /// bounds memory held by in-flight requests. >= 1.
    #[arg(
        long,
        env = "QUIVER_MAX_INFLIGHT_PER_CONNECTION",
        default_value_t = defaults::MAX_INFLIGHT_PER_CONNECTION
    )]
    pub max_inflight_per_connection: usize,

    /// Bytes of requests being processed at once across all connections; reading pauses
    /// beyond it. At least 16 MiB (one largest frame).
    #[arg(long, env = "QUIVER_MAX_INFLIGHT_BYTES", default_value_t = defaults::MAX_INFLIGHT_BYTES)]
    pub max_inflight_bytes: usize,

    /// Bytes of one connection's requests being read or processed at once; reading from that
    /// connection pauses beyond it (others go on); a larger frame is still read, alone.
    /// At least 65536.
    #[arg(
        long,
        env = "QUIVER_MAX_INFLIGHT_BYTES_PER_CONNECTION",
        default_value_t = defaults::MAX_INFLIGHT_BYTES_PER_CONNECTION
    )]
    pub max_inflight_bytes_per_connection: usize,

    /// A client without a heartbeat for this long is dropped. >= 1000.
    #[arg(long, env = "QUIVER_CLIENT_EXPIRY_MS", default_value_t = defaults::CLIENT_EXPIRY_MS)]
    pub client_expiry_ms: u64,

    /// A connection that sent no frame for this long, with no request of it in flight (a
    /// parked pull counts), is closed; 0: never. Clients heartbeat every 30 s. 0 or >= 1000.
    #[arg(
        long,
        env = "QUIVER_IDLE_CONNECTION_TIMEOUT_MS",
        default_value_t = defaults::IDLE_CONNECTION_TIMEOUT_MS
    )]
    pub idle_connection_timeout_ms: u64,

    /// A frame whose first bytes arrived must arrive whole within this, or the connection is
    /// closed (a stalled sender holds no read buffer for long); 0: no bound. 0 or >= 100.
    #[arg(
        long,
        env = "QUIVER_FRAME_READ_TIMEOUT_MS",
        default_value_t = defaults::FRAME_READ_TIMEOUT_MS
    )]
    pub frame_read_timeout_ms: u64,

    /// How often consumer offsets, topics and groups are persisted. >= 100.
    #[arg(long, env = "QUIVER_PERSIST_INTERVAL_MS", default_value_t = defaults::PERSIST_INTERVAL_MS)]
    pub persist_interval_ms: u64,

    /// Redeliveries before a message goes to %DLQ%<group>, for groups with no config.
    /// 0..=64.
    #[arg(long, env = "QUIVER_MAX_RECONSUME_TIMES", default_value_t = defaults::MAX_RECONSUME_TIMES)]
    pub max_reconsume_times: i32,

    /// Hours a CommitLog segment is kept. >= 1.
    #[arg(long, env = "QUIVER_FILE_RESERVED_HOURS", default_value_t = defaults::FILE_RESERVED_HOURS)]
    pub file_reserved_hours: u64,

    /// Share of the data disk in use above which sends are refused (SERVICE_NOT_AVAILABLE),
    /// while pulls, offset commits and admin reads go on; sends resume once usage drops.
    /// In (0, 1].
    #[arg(long, env = "QUIVER_DISK_HIGH_WATER_RATIO", default_value_t = defaults::DISK_HIGH_WATER_RATIO)]
    pub disk_high_water_ratio: f64,

    /// Share of the data disk in use above which retention deletes CommitLog segments before
    /// `file-reserved-hours`, oldest first, but only those every consumer group has read.
    /// In (0, 1].
    #[arg(long, env = "QUIVER_DISK_CLEAN_RATIO", default_value_t = defaults::DISK_CLEAN_RATIO)]
    pub disk_clean_ratio: f64,

    /// Share of the data disk in use above which retention deletes the oldest CommitLog
    /// segment even if a group has not read it (logged and counted). In (0, 1],
    /// at least `disk-clean-ratio`.
    #[arg(long, env = "QUIVER_DISK_FORCE_CLEAN_RATIO", default_value_t = defaults::DISK_FORCE_CLEAN_RATIO)]
    pub disk_force_clean_ratio: f64,

    /// How often the data disk's usage is read to refuse or resume sends, in ms.
    /// >= 10.
    #[arg(long, env = "QUIVER_DISK_CHECK_INTERVAL_MS", default_value_t = defaults::DISK_CHECK_INTERVAL_MS)]
    pub disk_check_interval_ms: u64,

    /// Bound on the graceful part of shutdown, in ms. >= 100.
    #[arg(long, env = "QUIVER_SHUTDOWN_TIMEOUT_MS", default_value_t = defaults::SHUTDOWN_TIMEOUT_MS)]
    pub shutdown_timeout_ms: u64,

    /// Times the stages of one send and one parked pull in this many (read, answered,
    /// written; dispatched, answering, answered, written), served at GET /debug/stages; 0: off.
    #[arg(long, env = "QUIVER_STAGE_SAMPLE_EVERY", default_value_t = 0)]
    pub stage_sample_every: u32,

    /// Age at which a half message without an outcome is checked back with its producer
    /// group (CHECK_TRANSACTION_STATE), and the wait between two checks of it, in ms.
    /// A message's longer CHECK_IMMUNITY_TIME_IN_SECONDS delays its first check. >= 100.
    #[arg(long, env = "QUIVER_TRANSACTION_TIMEOUT_MS", default_value_t = defaults::TRANSACTION_TIMEOUT_MS)]
    pub transaction_timeout_ms: u64,

    /// Checks of a half message before it is discarded to TRANS_CHECK_MAX_TIME_TOPIC. >= 1.
    #[arg(long, env = "QUIVER_TRANSACTION_CHECK_MAX", default_value_t = defaults::TRANSACTION_CHECK_MAX)]
    pub transaction_check_max: u32,

    /// How often the half queue is walked for messages to check back, in ms. >= 10.
    #[arg(long, env = "QUIVER_TRANSACTION_CHECK_INTERVAL_MS", default_value_t = defaults::TRANSACTION_CHECK_INTERVAL_MS)]
    pub transaction_check_interval_ms: u64,

    /// Longest wait a timed message (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS) may
    /// ask for, in ms; a send asking more is refused. 1000..=31536000000 (a year).
    #[arg(long, env = "QUIVER_TIMER_MAX_DELAY_MS", default_value_t = defaults::TIMER_MAX_DELAY_MS)]
    pub timer_max_delay_ms: u64,

    /// ACL on: every request must be signed by an account of this `plain_acl.yml` (Apache's
    /// format) and have the permissions its code needs; the file is re-read when it changes.
    /// Unset: ACL off.
    #[arg(long, env = "QUIVER_ACL_FILE")]
    pub acl_file: Option<PathBuf>,

    /// Access key this broker signs its polls of `--peers` with, for peers with ACL on (any
    /// account: the polls read the broker config and topics). With --peer-secret-key.
    #[arg(long, env = "QUIVER_PEER_ACCESS_KEY")]
    pub peer_access_key: Option<String>,

    /// Secret key of --peer-access-key.
    #[arg(long, env = "QUIVER_PEER_SECRET_KEY", hide_env_values = true)]
    pub peer_secret_key: Option<String>,

    /// TLS on the remoting port: disabled, permissive (TLS and plain on the same port, told
    /// apart by the first byte) or enforcing (plain connections are closed). Apache's modes.
    #[arg(long, env = "QUIVER_TLS_MODE", value_enum, default_value_t = TlsMode::Disabled)]
    pub tls_mode: TlsMode,

    /// Certificate chain (PEM, e.g. a Secret's tls.crt) served; re-read when it changes.
    #[arg(long, env = "QUIVER_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,

    /// Private key (PEM, e.g. tls.key) of --tls-cert-file; re-read when it changes.
    #[arg(long, env = "QUIVER_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,

    /// CA certificates (PEM, e.g. ca.crt) client certificates must chain to.
    #[arg(long, env = "QUIVER_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,

    /// Client certificates: none (not asked), optional (checked when sent) or require
    /// (Apache's tls.server.need.client.auth). Needs --tls-ca-file unless none.
    #[arg(long, env = "QUIVER_TLS_CLIENT_AUTH", value_enum, default_value_t = ClientAuth::None)]
    pub tls_client_auth: ClientAuth,

    /// The HTTP port (/metrics, /healthz, /readyz) serves TLS only, with the same certificate.
    #[arg(long, env = "QUIVER_HTTP_TLS", default_value_t = false, action = clap::ArgAction::Set,
        num_args = 0..=1, default_missing_value = "true")]
    pub http_tls: bool,

    /// The config file whose `peers` the running broker follows: the `--config` file, unless
    /// `--peers` or QUIVER_PEERS was given. Not a setting (no flag, no key).
    #[arg(skip)]
    #[serde(skip)]
    pub peers_file: Option<PathBuf>,

    /// Every member of this broker group (one `--broker-name`): `id=host:port` remoting
    /// addresses, this broker included. Empty: a standalone broker, no replication.
    #[arg(long, env = "QUIVER_GROUP_MEMBERS", value_delimiter = ',')]
    pub group_members: Vec<String>,

    /// This broker's id among `--group-members` (a StatefulSet pod's ordinal).
    #[arg(long, env = "QUIVER_REPLICA_ID", default_value_t = 0)]
    pub replica_id: u64,

    /// sync: a send is acknowledged once every in-sync replica holds it; async: at once,
    /// replicas follow.
    #[arg(long, env = "QUIVER_REPLICATION", value_enum, default_value_t = ReplicationMode::Async)]
    pub replication: ReplicationMode,

    /// Sends are refused while fewer members than this (the master included) are in sync.
    #[arg(long, env = "QUIVER_MIN_IN_SYNC_REPLICAS", default_value_t = defaults::MIN_IN_SYNC_REPLICAS)]
    pub min_in_sync_replicas: u32,

    /// A replica that has not caught up with the master for this long leaves the in-sync set.
    #[arg(long, env = "QUIVER_REPLICA_LAG_MAX_MS", default_value_t = defaults::REPLICA_LAG_MAX_MS)]
    pub replica_lag_max_ms: u64,

    /// A master not heard from for this long is replaced by an in-sync replica.
    #[arg(long, env = "QUIVER_MASTER_TIMEOUT_MS", default_value_t = defaults::MASTER_TIMEOUT_MS)]
    pub master_timeout_ms: u64,

    /// How long a sync send waits for the in-sync replicas before it is answered
    /// FLUSH_SLAVE_TIMEOUT (stored on the master, not yet confirmed).
    #[arg(long, env = "QUIVER_REPLICATION_TIMEOUT_MS", default_value_t = defaults::REPLICATION_TIMEOUT_MS)]
    pub replication_timeout_ms: u64,

    /// A master's retention keeps the CommitLog files its in-sync replicas have not copied
    /// yet (however old, and under disk-clean pressure), up to this many bytes of them: past
    /// it the oldest go (logged, `quiver_replication_retention_cap_hits_total`) and a replica
    /// that needed them rebuilds from the oldest file left. Above disk-force-clean-ratio
    /// retention deletes them anyway. 0: keep nothing for replicas.
    #[arg(long, env = "QUIVER_REPLICA_RETENTION_CAP_BYTES", default_value_t = defaults::REPLICA_RETENTION_CAP_BYTES)]
    pub replica_retention_cap_bytes: u64,

    /// On SIGTERM or SIGINT a master hands mastership to its most caught-up in-sync replica
    /// before it stops, within this many ms; past it (or on failure) it stops plainly and the
    /// group elects. 0: no handover. Otherwise >= 100.
    #[arg(long, env = "QUIVER_SHUTDOWN_SWITCHOVER_TIMEOUT_MS", default_value_t = defaults::SHUTDOWN_SWITCHOVER_TIMEOUT_MS)]
    pub shutdown_switchover_timeout_ms: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            data_dir: PathBuf::from(defaults::DATA_DIR),
            listen: defaults::LISTEN.into(),
            http_listen: defaults::HTTP_LISTEN.into(),
            grpc_listen: defaults::GRPC_LISTEN.into(),
            grpc_advertise: None,
            advertise: None,
            broker_name: defaults::BROKER_NAME.into(),
            cluster: defaults::CLUSTER.into(),
            peers: Vec::new(),
            flush_mode: FlushMode::Async,
            warm_segments: false,
            segment_size: defaults::SEGMENT_SIZE,
            auto_create_topics: true,
            default_queue_nums: defaults::DEFAULT_QUEUE_NUMS,
            max_message_size: defaults::MAX_MESSAGE_SIZE,
            broker_permission: perm::READ_WRITE,
            worker_threads: defaults::WORKER_THREADS,
            max_connections: defaults::MAX_CONNECTIONS,
            max_connections_per_address: defaults::MAX_CONNECTIONS_PER_ADDRESS,
            max_parked_pulls: defaults::MAX_PARKED_PULLS,
            max_parked_pulls_per_connection: defaults::MAX_PARKED_PULLS_PER_CONNECTION,
            max_inflight_per_connection: defaults::MAX_INFLIGHT_PER_CONNECTION,
            max_inflight_bytes: defaults::MAX_INFLIGHT_BYTES,
            max_inflight_bytes_per_connection: defaults::MAX_INFLIGHT_BYTES_PER_CONNECTION,
            client_expiry_ms: defaults::CLIENT_EXPIRY_MS,
            idle_connection_timeout_ms: defaults::IDLE_CONNECTION_TIMEOUT_MS,
            frame_read_timeout_ms: defaults::FRAME_READ_TIMEOUT_MS,
            persist_interval_ms: defaults::PERSIST_INTERVAL_MS,
            max_reconsume_times: defaults::MAX_RECONSUME_TIMES,
            file_reserved_hours: defaults::FILE_RESERVED_HOURS,
            disk_high_water_ratio: defaults::DISK_HIGH_WATER_RATIO,
            disk_clean_ratio: defaults::DISK_CLEAN_RATIO,
            disk_force_clean_ratio: defaults::DISK_FORCE_CLEAN_RATIO,
            disk_check_interval_ms: defaults::DISK_CHECK_INTERVAL_MS,
            shutdown_timeout_ms: defaults::SHUTDOWN_TIMEOUT_MS,
            stage_sample_every: 0,
            transaction_timeout_ms: defaults::TRANSACTION_TIMEOUT_MS,
            transaction_check_max: defaults::TRANSACTION_CHECK_MAX,
            transaction_check_interval_ms: defaults::TRANSACTION_CHECK_INTERVAL_MS,
            timer_max_delay_ms: defaults::TIMER_MAX_DELAY_MS,
            acl_file: None,
            peer_access_key: None,
            peer_secret_key: None,
            tls_mode: TlsMode::Disabled,
            group_members: Vec::new(),
            replica_id: 0,
            replication: ReplicationMode::Async,
            min_in_sync_replicas: defaults::MIN_IN_SYNC_REPLICAS,
            replica_lag_max_ms: defaults::REPLICA_LAG_MAX_MS,
            master_timeout_ms: defaults::MASTER_TIMEOUT_MS,
            replication_timeout_ms: defaults::REPLICATION_TIMEOUT_MS,
            replica_retention_cap_bytes: defaults::REPLICA_RETENTION_CAP_BYTES,
            shutdown_switchover_timeout_ms: defaults::SHUTDOWN_SWITCHOVER_TIMEOUT_MS,
            tls_cert_file: None,
            tls_key_file: None,
            tls_ca_file: None,
            tls_client_auth: ClientAuth::None,
            http_tls: false,
            peers_file: None,
        }
    }
}

/// A configuration that cannot be used, naming the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config field `{field}` is invalid: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse config file {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error(transparent)]
    Args(#[from] clap::Error),
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

pub(crate) fn is_host_port(value: &str) -> bool {
    match value.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}

impl BrokerConfig {
    /// Whether the remoting port or the HTTP port serves TLS (certificates are loaded).
    pub fn serves_tls(&self) -> bool {
        self.tls_mode != TlsMode::Disabled || self.http_tls
    }

    /// How long a started frame may take to arrive whole; None: no bound.
    pub fn frame_read_timeout(&self) -> Option<std::time::Duration> {
        (self.frame_read_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(self.frame_read_timeout_ms))
    }

    /// How long a connection may stay idle before it is closed; None: forever.
    pub fn idle_connection_timeout(&self) -> Option<std::time::Duration> {
        (self.idle_connection_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(self.idle_connection_timeout_ms))
    }

    /// The group members (`--group-members`) by id; empty for a standalone broker.
    pub fn members(&self) -> Result<std::collections::BTreeMap<u64, String>, ConfigError> {
        let mut members = std::collections::BTreeMap::new();
        for entry in &self.group_members {
            let parsed = entry
                .split_once('=')
                .and_then(|(id, address)| Some((id.trim().parse::<u64>().ok()?, address.trim())));
            let Some((id, address)) = parsed.filter(|(_, address)| is_host_port(address)) else {
                return Err(invalid(
                    "group-members",
                    format!("`{entry}` is not id=host:port"),
                ));
            };
            if members.insert(id, address.to_owned()).is_some() {
                return Err(invalid("group-members", format!("id {id} is listed twice")));
            }
        }
        Ok(members)
    }

    /// Whether this broker is one member of a replicated group.
    pub fn is_replicated(&self) -> bool {
        !self.group_members.is_empty()
    }

    /// The account peer polls are signed with, if one is given.
    pub fn peer_credentials(&self) -> Option<quiver_protocol::acl::Credentials> {
        match (&self.peer_access_key, &self.peer_secret_key) {
            (Some(access_key), Some(secret_key)) => Some(quiver_protocol::acl::Credentials::new(
                access_key, secret_key,
            )),
            _ => None,
        }
    }

    /// How this broker polls its `--peers`: with TLS when its own port enforces it (peers of
    /// one cluster share its settings), trusting `--tls-ca-file` (else the Mozilla roots) and
    /// presenting its own certificate to peers that ask for one.
    pub fn peer_tls(&self) -> Option<quiver_remoting::tls::TlsClientConfig> {
        (self.tls_mode == TlsMode::Enforcing).then(|| quiver_remoting::tls::TlsClientConfig {
            ca_file: self.tls_ca_file.clone(),
            cert_file: self.tls_cert_file.clone(),
            key_file: self.tls_key_file.clone(),
            ..Default::default()
        })
    }

    /// The gRPC port's address; None when it is off ("" or "off").
    pub fn grpc_listen(&self) -> Option<&String> {
        let listen = &self.grpc_listen;
        (!listen.trim().is_empty() && !listen.trim().eq_ignore_ascii_case("off")).then_some(listen)
    }

    /// The address 5.x clients use for this broker's gRPC port bound at `bound`: the
    /// `grpc-advertise` setting, else the remoting port's advertised host with `bound`'s port.
    pub fn grpc_advertised_addr(&self, bound: std::net::SocketAddr, advertised: &str) -> String {
        if let Some(addr) = &self.grpc_advertise {
            return addr.clone();
        }
        match advertised.rsplit_once(':') {
            Some((host, _)) => format!("{host}:{}", bound.port()),
            None => format!("127.0.0.1:{}", bound.port()),
        }
    }

    /// The address peers and clients use for this broker.
    pub fn advertised_addr(&self, bound: std::net::SocketAddr) -> String {
        match &self.advertise {
            Some(addr) => addr.clone(),
            None if bound.ip().is_unspecified() => format!("127.0.0.1:{}", bound.port()),
            None => bound.to_string(),
        }
    }

    /// The store settings this broker config implies.
    pub fn store_config(&self) -> quiver_store::StoreConfig {
        quiver_store::StoreConfig {
            data_dir: self.data_dir.clone(),
            segment_size_bytes: self.segment_size,
            flush_mode: self.flush_mode,
            warm_segments: self.warm_segments,
            file_reserved_hours: self.file_reserved_hours,
            max_message_size_bytes: self.max_message_size,
            disk_high_water_ratio: self.disk_high_water_ratio,
            disk_clean_ratio: self.disk_clean_ratio,
            disk_force_clean_ratio: self.disk_force_clean_ratio,
            disk_check_interval_ms: self.disk_check_interval_ms,
            // A group member's readers see only what every in-sync member holds.
            publish_on_confirm: self.is_replicated(),
            ..quiver_store::StoreConfig::default()
        }
    }

    /// This config with a deployment's settings (what the operator writes in each pod's config
    /// file) in place of its own: every field of [`BrokerSettings`] is taken, an absent optional
    /// one keeps this config's value.
    pub fn with_settings(self, settings: BrokerSettings) -> BrokerConfig {
        let BrokerSettings {
            broker_name,
            cluster,
            data_dir,
            listen,
            http_listen,
            grpc_listen,
            advertise,
            grpc_advertise,
            peers,
            flush_mode,
            group_members,
            replica_id,
            replication,
            min_in_sync_replicas,
            file_reserved_hours,
            disk_high_water_ratio,
            disk_clean_ratio,
            disk_force_clean_ratio,
            replica_retention_cap_bytes,
            broker_permission,
            shutdown_switchover_timeout_ms,
        } = settings;
        BrokerConfig {
            broker_name,
            cluster,
            data_dir,
            listen,
            http_listen,
            grpc_listen,
            advertise: advertise.or(self.advertise),
            grpc_advertise: grpc_advertise.or(self.grpc_advertise),
            peers,
            flush_mode: match flush_mode {
                quiver_broker_config::FlushMode::Async => FlushMode::Async,
                quiver_broker_config::FlushMode::Sync => FlushMode::Sync,
            },
            group_members,
            replica_id: replica_id.unwrap_or(self.replica_id),
            replication: replication.unwrap_or(self.replication),
            min_in_sync_replicas: min_in_sync_replicas.unwrap_or(self.min_in_sync_replicas),
            file_reserved_hours: file_reserved_hours.unwrap_or(self.file_reserved_hours),
            disk_high_water_ratio: disk_high_water_ratio.unwrap_or(self.disk_high_water_ratio),
            disk_clean_ratio: disk_clean_ratio.unwrap_or(self.disk_clean_ratio),
            disk_force_clean_ratio: disk_force_clean_ratio.unwrap_or(self.disk_force_clean_ratio),
            replica_retention_cap_bytes: replica_retention_cap_bytes
                .unwrap_or(self.replica_retention_cap_bytes),
            broker_permission: broker_permission.unwrap_or(self.broker_permission),
            shutdown_switchover_timeout_ms: shutdown_switchover_timeout_ms
                .unwrap_or(self.shutdown_switchover_timeout_ms),
            ..self
        }
    }

    /// Reads a config file: TOML, or JSON when the name ends in .json.
    pub fn from_file(path: &Path) -> Result<BrokerConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let parsed = if path.extension().is_some_and(|ext| ext == "json") {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        } else {
            toml::from_str(&text).map_err(|e| e.to_string())
        };
        parsed.map_err(|reason| ConfigError::Parse {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Builds the config from command-line arguments (flags and `QUIVER_*` environment
    /// variables beat the `--config` file, which beats the defaults), then validates it.
    pub fn from_args<I, T>(args: I) -> Result<BrokerConfig, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Cli::command().try_get_matches_from(args)?;
        let cli = Cli::from_arg_matches(&matches)?;
        let mut config = match &cli.config {
            Some(path) => overlay(Self::from_file(path)?, &cli.broker, &matches)?,
            None => cli.broker,
        };
        if !is_explicit(&matches, "peers") {
            config.peers_file = cli.config;
        }
        config.validate()?;
        Ok(config)
    }
}

/// Whether the setting `id` was given as a flag or an environment variable.
fn is_explicit(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// Fields given explicitly (flag or environment) replace those of the file.
fn overlay(
    file: BrokerConfig,
    explicit: &BrokerConfig,
    matches: &ArgMatches,
) -> Result<BrokerConfig, ConfigError> {
    let to_value = |c: &BrokerConfig| serde_json::to_value(c).expect("config serializes");
    let mut merged = to_value(&file);
    let explicit_value = to_value(explicit);
    for id in matches.ids() {
        let id = id.as_str();
        let given = is_explicit(matches, id);
        let key = id.replace('_', "-");
        if given {
            if let (Some(obj), Some(value)) = (merged.as_object_mut(), explicit_value.get(&key)) {
                obj.insert(key, value.clone());
            }
        }
    }
    serde_json::from_value(merged).map_err(|e| ConfigError::Parse {
        path: PathBuf::from("<flags>"),
        reason: e.to_string(),
    })
}

/// The command line: `--config FILE` plus every broker setting.
#[derive(Debug, Parser)]
#[command(
    name = "quiver-broker",
    version,
    about = "A RocketMQ 4.x compatible message broker"
)]
struct Cli {
    /// TOML (or .json) file with any of the settings below, kebab-case keys.
    #[arg(long, env = "QUIVER_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    broker: BrokerConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_between_clap_and_serde() {
        let cli = Cli::try_parse_from(["quiver-broker"]).expect("parses");
        // Environment variables could leak in; only compare when none is set.
        if std::env::vars().all(|(k, _)| !k.starts_with("QUIVER_")) {
            assert_eq!(cli.broker, BrokerConfig::default());
        }
        BrokerConfig::default()
            .validate()
            .expect("defaults are valid");
    }

    #[test]
    fn validate_names_the_bad_field() {
        let config = BrokerConfig {
            segment_size: 10,
            ..BrokerConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("segment-size"), "{err}");
        let config = BrokerConfig {
            broker_permission: 5,
            ..BrokerConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("broker-permission"), "{err}");
        for ratio in [0.0, 1.5, f64::NAN] {
            let config = BrokerConfig {
                disk_high_water_ratio: ratio,
                ..BrokerConfig::default()
            };
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("disk-high-water-ratio"), "{ratio}: {err}");
        }
    }

    #[test]
    fn shutdown_switchover_timeout_is_off_at_zero_and_refused_below_100_ms() {
        let cli = Cli::try_parse_from(["quiver-broker", "--shutdown-switchover-timeout-ms", "0"])
            .expect("parses");
        assert_eq!(cli.broker.shutdown_switchover_timeout_ms, 0);
        cli.broker.validate().expect("0 turns the handover off");
        let config = BrokerConfig {
            shutdown_switchover_timeout_ms: 50,
            ..BrokerConfig::default()
        };
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("shutdown-switchover-timeout-ms"), "{err}");
    }

    #[test]
    fn disk_high_water_ratio_from_file_env_and_flag_reaches_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.toml");
        std::fs::write(&path, "disk-high-water-ratio = 0.6\n").unwrap();
        let from_file =
            BrokerConfig::from_args(["quiver-broker", "--config", path.to_str().unwrap()]).unwrap();
        assert_eq!(from_file.disk_high_water_ratio, 0.6);
        assert_eq!(from_file.store_config().disk_high_water_ratio, 0.6);
        let from_flag = BrokerConfig::from_args([
            "quiver-broker",
            "--config",
            path.to_str().unwrap(),
            "--disk-high-water-ratio",
            "1",
        ])
        .unwrap();
        assert_eq!(from_flag.store_config().disk_high_water_ratio, 1.0);
        assert!(
            BrokerConfig::from_args(["quiver-broker", "--disk-high-water-ratio", "0"]).is_err()
        );
        assert_eq!(
            BrokerConfig::default().store_config().disk_high_water_ratio,
            0.90
        );
        let both = BrokerConfig::from_args([
            "quiver-broker",
            "--disk-clean-ratio",
            "0.6",
            "--disk-force-clean-ratio",
            "0.7",
            "--disk-check-interval-ms",
            "200",
        ])
        .unwrap()
        .store_config();
        assert_eq!(
            (both.disk_clean_ratio, both.disk_force_clean_ratio),
            (0.6, 0.7)
        );
        assert_eq!(both.disk_check_interval_ms, 200);
        let err = BrokerConfig::from_args([
            "quiver-broker",
            "--disk-clean-ratio",
            "0.9",
            "--disk-force-clean-ratio",
            "0.8",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("disk-force-clean-ratio"), "{err}");
    }

    #[test]
    fn the_peers_follow_the_config_file_unless_a_flag_gives_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.json");
        std::fs::write(&path, r#"{"peers": ["a:1"]}"#).unwrap();
        let file = path.to_str().unwrap();
        let from_file = BrokerConfig::from_args(["quiver-broker", "--config", file]).unwrap();
        assert_eq!(from_file.peers_file.as_deref(), Some(path.as_path()));
        let flagged =
            BrokerConfig::from_args(["quiver-broker", "--config", file, "--peers", "b:2"]).unwrap();
        assert_eq!(
            (flagged.peers, flagged.peers_file),
            (vec!["b:2".into()], None)
        );
        let no_file = BrokerConfig::from_args(["quiver-broker"]).unwrap();
        assert_eq!(no_file.peers_file, None);
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.toml");
        std::fs::write(
            &path,
            "broker-name = \"from-file\"\ncluster = \"C1\"\nflush-mode = \"sync\"\npeers = [\"a:1\", \"b:2\"]\n",
        )
        .unwrap();
        let config = BrokerConfig::from_args([
            "quiver-broker",
            "--config",
            path.to_str().unwrap(),
            "--cluster",
            "C2",
            "--auto-create-topics",
            "false",
        ])
        .unwrap();
        assert_eq!(config.broker_name, "from-file");
        assert_eq!(config.cluster, "C2");
        assert_eq!(config.flush_mode, FlushMode::Sync);
        assert_eq!(config.peers, vec!["a:1".to_string(), "b:2".to_string()]);
        assert!(!config.auto_create_topics);
    }

    #[test]
    fn acl_file_from_file_env_or_flag_and_off_by_default() {
        assert_eq!(BrokerConfig::default().acl_file, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.toml");
        std::fs::write(&path, "acl-file = \"/etc/quiver/plain_acl.yml\"\n").unwrap();
        let from_file = BrokerConfig::from_file(&path).unwrap();
        assert_eq!(
            from_file.acl_file,
            Some(PathBuf::from("/etc/quiver/plain_acl.yml"))
        );
        let from_flag = BrokerConfig::from_args(["quiver-broker", "--acl-file", "/tmp/acl.yml"]);
        assert_eq!(
            from_flag.unwrap().acl_file,
            Some(PathBuf::from("/tmp/acl.yml"))
        );
        let empty = BrokerConfig::from_args(["quiver-broker", "--acl-file", ""]);
        assert!(empty.unwrap_err().to_string().contains("acl-file"));
        let half = BrokerConfig::from_args(["quiver-broker", "--peer-access-key", "broker01"]);
        assert!(half.unwrap_err().to_string().contains("peer-access-key"));
        let both = BrokerConfig::from_args([
            "quiver-broker",
            "--peer-access-key",
            "broker01",
            "--peer-secret-key",
            "broker-secret",
        ]);
        let credentials = both.unwrap().peer_credentials().expect("both given");
        assert_eq!(credentials.access_key, "broker01");
    }

    #[test]
    fn tls_flags_env_and_file_and_their_validation() {
        assert_eq!(BrokerConfig::default().tls_mode, TlsMode::Disabled);
        let no_cert = BrokerConfig::from_args(["quiver-broker", "--tls-mode", "enforcing"]);
        assert!(no_cert.unwrap_err().to_string().contains("tls-cert-file"));
        let no_key = BrokerConfig::from_args([
            "quiver-broker",
            "--tls-mode",
            "permissive",
            "--tls-cert-file",
            "/tls/tls.crt",
        ]);
        assert!(no_key.unwrap_err().to_string().contains("tls-key-file"));
        let http_only = BrokerConfig::from_args(["quiver-broker", "--http-tls"]);
        assert!(http_only.unwrap_err().to_string().contains("http-tls"));
        let with_files = [
            "quiver-broker",
            "--tls-cert-file",
            "/tls/tls.crt",
            "--tls-key-file",
            "/tls/tls.key",
        ];
        let no_ca = BrokerConfig::from_args(with_files.iter().chain(&[
            "--tls-mode",
            "enforcing",
            "--tls-client-auth",
            "require",
        ]));
        assert!(no_ca.unwrap_err().to_string().contains("tls-ca-file"));
        let auth_without_tls = BrokerConfig::from_args(with_files.iter().chain(&[
            "--tls-client-auth",
            "optional",
            "--tls-ca-file",
            "/tls/ca.crt",
        ]));
        assert!(auth_without_tls
            .unwrap_err()
            .to_string()
            .contains("tls-client-auth"));
        let full = BrokerConfig::from_args(with_files.iter().chain(&[
            "--tls-mode",
            "permissive",
            "--tls-client-auth",
            "optional",
            "--tls-ca-file",
            "/tls/ca.crt",
            "--http-tls",
        ]))
        .unwrap();
        assert_eq!(
            (full.tls_mode, full.tls_client_auth, full.http_tls),
            (TlsMode::Permissive, ClientAuth::Optional, true)
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.toml");
        std::fs::write(
            &path,
            "tls-mode = \"enforcing\"\ntls-cert-file = \"/a.crt\"\ntls-key-file = \"/a.key\"\nhttp-tls = true\n",
        )
        .unwrap();
        let from_file = BrokerConfig::from_file(&path).unwrap();
        assert_eq!(from_file.tls_mode, TlsMode::Enforcing);
        assert!(from_file.http_tls);
        from_file.validate().expect("cert and key given");
    }

    #[test]
    fn settings_written_to_a_file_parse_as_with_settings_says() {
        let settings = BrokerSettings {
            broker_name: "qb-g1".into(),
            cluster: "qb".into(),
            data_dir: "/data".into(),
            listen: "0.0.0.0:10911".into(),
            http_listen: "0.0.0.0:8080".into(),
            grpc_listen: "0.0.0.0:8081".into(),
            advertise: Some("qb-4.qb-headless.ns.svc:10911".into()),
            grpc_advertise: Some("qb-4.qb-headless.ns.svc:8081".into()),
            peers: vec!["qb-0.qb-headless.ns.svc:10911".into()],
            flush_mode: quiver_broker_config::FlushMode::Sync,
            group_members: vec![
                "0=qb-3.qb-headless.ns.svc:10911".into(),
                "1=qb-4.qb-headless.ns.svc:10911".into(),
            ],
            replica_id: Some(1),
            replication: Some(ReplicationMode::Sync),
            min_in_sync_replicas: Some(2),
            file_reserved_hours: Some(48),
            disk_high_water_ratio: Some(0.7),
            disk_clean_ratio: Some(0.55),
            disk_force_clean_ratio: Some(0.65),
            replica_retention_cap_bytes: Some(1 << 30),
            broker_permission: Some(perm::READ_ONLY),
            shutdown_switchover_timeout_ms: Some(12_000),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("broker.json");
        let text = serde_json::to_string_pretty(&settings).expect("serializes");
        std::fs::write(&path, text).expect("write");
        let parsed = BrokerConfig::from_file(&path).expect("parses");
        parsed.validate().expect("valid");
        assert_eq!(parsed, BrokerConfig::default().with_settings(settings));
        assert_eq!(parsed.flush_mode, FlushMode::Sync);
        assert_eq!(parsed.broker_permission, perm::READ_ONLY);
    }

    #[test]
    fn json_file_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.json");
        std::fs::write(&path, r#"{"data-dir": "/tmp/x", "default-queue-nums": 2}"#).unwrap();
        let config = BrokerConfig::from_file(&path).unwrap();
        assert_eq!(config.default_queue_nums, 2);
        assert_eq!(config.data_dir, PathBuf::from("/tmp/x"));
    }
}
