//! quiver-broker-config: the broker's settings as types, without the broker.
//!
//! The broker's `BrokerConfig` (quiver-broker) takes its defaults and enums from here and maps a
//! [`BrokerSettings`] onto itself field by field; the operator renders each pod's config file
//! from a [`BrokerSettings`], so neither writes a config key as a string and the operator needs
//! neither the store nor the server.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Each default once: clap's `--help` and `BrokerConfig::default()` both read these.
pub mod defaults {
    pub const DATA_DIR: &str = "./data";
    pub const LISTEN: &str = "0.0.0.0:10911";
    pub const HTTP_LISTEN: &str = "0.0.0.0:8080";
    /// The RocketMQ 5.x Proxy's gRPC port.
    pub const GRPC_LISTEN: &str = "0.0.0.0:8081";
    pub const BROKER_NAME: &str = "broker-0";
    pub const CLUSTER: &str = "DefaultCluster";
    pub const SEGMENT_SIZE: u64 = 1 << 30;
    pub const DEFAULT_QUEUE_NUMS: u32 = 8;
    pub const MAX_MESSAGE_SIZE: u32 = 4 * 1024 * 1024;
    pub const WORKER_THREADS: usize = 0;
    pub const MAX_CONNECTIONS: usize = 16_384;
    pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 1024;
    pub const MAX_PARKED_PULLS_PER_CONNECTION: usize = 1024;
    pub const MAX_PARKED_PULLS: usize = 65536;
    pub const MAX_INFLIGHT_PER_CONNECTION: usize = 256;
    pub const MAX_INFLIGHT_BYTES: usize = 256 * 1024 * 1024;
    pub const MAX_INFLIGHT_BYTES_PER_CONNECTION: usize = 32 * 1024 * 1024;
    /// The least per-connection budget: a few requests' worth (larger frames are read alone).
    pub const MIN_INFLIGHT_BYTES_PER_CONNECTION: usize = 64 * 1024;
    pub const CLIENT_EXPIRY_MS: u64 = 120_000;
    /// Apache's `serverChannelMaxIdleTimeSeconds`.
    pub const IDLE_CONNECTION_TIMEOUT_MS: u64 = 120_000;
    pub const FRAME_READ_TIMEOUT_MS: u64 = 30_000;
    pub const PERSIST_INTERVAL_MS: u64 = 5_000;
    pub const MAX_RECONSUME_TIMES: i32 = 16;
    pub const FILE_RESERVED_HOURS: u64 = 72;
    pub const DISK_HIGH_WATER_RATIO: f64 = 0.90;
    pub const DISK_CLEAN_RATIO: f64 = 0.75;
    pub const DISK_FORCE_CLEAN_RATIO: f64 = 0.85;
    pub const DISK_CHECK_INTERVAL_MS: u64 = 1000;
    pub const SHUTDOWN_TIMEOUT_MS: u64 = 10_000;
    /// Apache's `transactionTimeOut` and `transactionCheckMax`.
    pub const TRANSACTION_TIMEOUT_MS: u64 = 6_000;
    pub const TRANSACTION_CHECK_MAX: u32 = 15;
    pub const TRANSACTION_CHECK_INTERVAL_MS: u64 = 1_000;
    /// Apache's `timerMaxDelaySec`: 3 days.
    pub const TIMER_MAX_DELAY_MS: u64 = 259_200_000;
    pub const MIN_IN_SYNC_REPLICAS: u32 = 1;
    pub const REPLICA_LAG_MAX_MS: u64 = 3_000;
    pub const MASTER_TIMEOUT_MS: u64 = 1_500;
    pub const REPLICATION_TIMEOUT_MS: u64 = 5_000;
    /// What a master's retention keeps at most for in-sync replicas behind it: 10 GiB.
    pub const REPLICA_RETENTION_CAP_BYTES: u64 = 10 << 30;
    /// A master's handover on SIGTERM: well inside Kubernetes' default 30 s grace period,
    /// with `SHUTDOWN_TIMEOUT_MS` after it.
    pub const SHUTDOWN_SWITCHOVER_TIMEOUT_MS: u64 = 5_000;
}

/// How sends wait for replicas (`--replication`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReplicationMode {
    Sync,
    #[default]
    Async,
}

impl ReplicationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicationMode::Sync => "sync",
            ReplicationMode::Async => "async",
        }
    }
}

/// TLS on the remoting port (`--tls-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    #[default]
    Disabled,
    /// TLS and plain connections on the same port.
    Permissive,
    /// TLS connections only.
    Enforcing,
}

/// Whether the remoting port asks clients for a certificate (`--tls-client-auth`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    None,
    Optional,
    Require,
}

/// The values of the `flush-mode` key. The store has its own `FlushMode` (this crate does not
/// depend on the store); the broker maps this one onto it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// Acknowledge from the page cache.
    #[default]
    Async,
    /// Acknowledge once durable.
    Sync,
}

/// The settings a deployment writes into a broker's config file: each field is the broker
/// setting of the same name (`BrokerConfig`'s field, kebab-case in the file), and an absent
/// optional one leaves the broker's default. The broker maps every field onto its own config
/// (`BrokerConfig::with_settings`), so a field added here that the broker does not take does
/// not compile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BrokerSettings {
    pub broker_name: String,
    pub cluster: String,
    pub data_dir: PathBuf,
    pub listen: String,
    pub http_listen: String,
    pub grpc_listen: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_advertise: Option<String>,
    /// Other groups' brokers, always written (an empty list is a lone broker group).
    #[serde(default)]
    pub peers: Vec<String>,
    pub flush_mode: FlushMode,
    /// `id=host:port` of every member of a replicated group; empty (not written) otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub group_members: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_in_sync_replicas: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_reserved_hours: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_high_water_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_clean_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_force_clean_ratio: Option<f64>,
    /// What a master's retention keeps at most for in-sync replicas behind it, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_retention_cap_bytes: Option<u64>,
    /// 6 read-write, 4 read-only, 2 write-only (RocketMQ's permission bits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_permission: Option<i32>,
    /// How long a master's handover on SIGTERM may take, in ms (0: none, a plain stop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_switchover_timeout_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_settings_are_not_written_and_names_are_kebab_case() {
        let settings = BrokerSettings {
            broker_name: "b-0".into(),
            cluster: "b".into(),
            data_dir: "/data".into(),
            listen: "0.0.0.0:10911".into(),
            http_listen: "0.0.0.0:8080".into(),
            grpc_listen: "0.0.0.0:8081".into(),
            flush_mode: FlushMode::Sync,
            ..BrokerSettings::default()
        };
        let value = serde_json::to_value(&settings).expect("serializes");
        let keys: Vec<&str> = value
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "broker-name",
                "cluster",
                "data-dir",
                "flush-mode",
                "grpc-listen",
                "http-listen",
                "listen",
                "peers"
            ]
        );
        assert_eq!(value["flush-mode"], "sync");
        let back: BrokerSettings = serde_json::from_value(value).expect("deserializes");
        assert_eq!(back, settings);
    }
}
