//! The narrow slice of broker administration the operator needs (lag, drain, groups, topics,
//! disk).
//!
//! Two implementations exist: the remoting one in [`crate::remoting_admin`] and the in-memory
//! fake the controller tests use.

use futures::future::BoxFuture;
use quiver_client::TlsConfig;
use quiver_protocol::acl::Credentials;
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// A broker group's status as one member reports it (QUIVER_REPLICATION_STATUS).
pub use quiver_protocol::body::{ReplicaRole, ReplicaStatus, ReplicationStatus};

/// A change of a replicated group's membership, asked of its master
/// (QUIVER_REPLICATION_MEMBERS). Member ids are replica ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// Make the member `member` at `address` (started with an empty directory) a member.
    Add { member: u64, address: String },
    /// Take `member` out of the group; it must not be the master.
    Remove { member: u64 },
}

impl MembershipChange {
    /// The request header's `action`.
    pub fn action(&self) -> &'static str {
        match self {
            MembershipChange::Add { .. } => "add",
            MembershipChange::Remove { .. } => "remove",
        }
    }

    /// The member added or removed.
    pub fn member(&self) -> u64 {
        match self {
            MembershipChange::Add { member, .. } | MembershipChange::Remove { member } => *member,
        }
    }
}

/// A broker's remoting address, `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BrokerAddr(pub String);

impl fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A position in a consume queue (count of messages before it).
pub use quiver_protocol::offset::QueueOffset;

/// One queue of a group's consume stats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConsumeStats {
    /// Topic of the queue.
    pub topic: String,
    /// Name of the broker holding the queue.
    pub broker_name: String,
    /// Queue id within the topic on that broker.
    pub queue_id: i32,
    /// Next offset the broker will write (the queue's max offset).
    pub broker_offset: QueueOffset,
    /// Committed offset of the group; `None` when the group never committed on this queue.
    pub consumer_offset: Option<QueueOffset>,
    /// Store time (ms since epoch) of the first unconsumed message, when there is one.
    pub oldest_unconsumed_store_ms: Option<i64>,
}

/// A group's consume stats on one broker (RocketMQ GET_CONSUME_STATS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumeStats {
    /// Per-queue offsets.
    pub queues: Vec<QueueConsumeStats>,
}

/// One queue of a topic's stats (RocketMQ GET_TOPIC_STATS_INFO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueTopicStats {
    /// Name of the broker holding the queue.
    pub broker_name: String,
    /// Queue id.
    pub queue_id: i32,
    /// Smallest offset still stored.
    pub min_offset: QueueOffset,
    /// Next offset to be written.
    pub max_offset: QueueOffset,
    /// Store time of the last message, ms since epoch; `None` for an empty queue.
    pub last_update_ms: Option<i64>,
}

/// A topic's stats on one broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicStats {
    /// Per-queue offsets.
    pub queues: Vec<QueueTopicStats>,
}

/// Broker permission as RocketMQ encodes it in routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BrokerPermission {
    /// Reads only (4): producers route elsewhere, consumers drain it.
    ReadOnly,
    /// Reads and writes (6).
    ReadWrite,
}

impl BrokerPermission {
    /// The RocketMQ `brokerPermission` value.
    pub fn wire_value(self) -> i32 {
        match self {
            BrokerPermission::ReadOnly => quiver_protocol::body::perm::READ_ONLY,
            BrokerPermission::ReadWrite => quiver_protocol::body::perm::READ_WRITE,
        }
    }
}

/// Subscription group settings (RocketMQ SubscriptionGroupConfig, the fields we manage).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionGroup {
    /// Group name.
    pub group: String,
    /// Whether the broker serves pulls for the group.
    pub consume_enable: bool,
    /// A member without a committed offset starts at the queue's min offset (first offset).
    pub consume_from_min_enable: bool,
    /// Queues of the group's retry topic.
    pub retry_queue_nums: i32,
    /// Retries before dead-lettering.
    pub max_reconsume_times: i32,
}

/// A topic to create on a broker (RocketMQ UPDATE_AND_CREATE_TOPIC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicConfig {
    /// Topic name.
    pub name: String,
    /// Read and write queues.
    pub queues: i32,
}

/// Where an offset reset moves a group: Earliest, Latest or a store time (ms since epoch).
pub use quiver_client::ResetTarget;

/// A broker's store and disk state, from GET_BROKER_RUNTIME_INFO (Apache's `KVTable`). Every
/// field is optional: Apache brokers send only the `commitLogDisk*` keys, and a key a broker did
/// not send (or sent empty or unparsable) is `None`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeInfo {
    /// Used share of the store's file system, 0..=1 (`commitLogDiskRatio`).
    pub disk_used_ratio: Option<f64>,
    /// The broker's own size line, e.g. `Total : 48.0 MiB, Free : 3.1 MiB.`
    /// (`commitLogDirCapacity`).
    pub disk_capacity: Option<String>,
    /// The broker's `disk-high-water-ratio`, above which it refuses sends
    /// (`quiverDiskHighWaterRatio`).
    pub high_water_ratio: Option<f64>,
    /// Whether the store takes writes (`quiverWritable`).
    pub writable: Option<bool>,
    /// Why the store refuses writes (`quiverWriteRefusal`): `disk-high-water`, `no-space`,
    /// `fsync-failed`, `read-only-fs` or `data-dir-gone`; `None` while writable.
    pub write_refusal: Option<String>,
    /// The broker's sentence about the refusal (`quiverWriteRefusalMessage`).
    pub write_refusal_message: Option<String>,
}

/// `quiverWriteRefusal` of a broker refusing sends because its disk is above high water.
pub const REFUSAL_DISK_HIGH_WATER: &str = "disk-high-water";
/// `quiverWriteRefusal` of a broker whose file system ran out of space.
pub const REFUSAL_NO_SPACE: &str = "no-space";

impl RuntimeInfo {
    /// Reads the keys the operator uses from a GET_BROKER_RUNTIME_INFO table.
    pub fn from_table(table: &BTreeMap<String, String>) -> RuntimeInfo {
        let text = |key: &str| {
            table
                .get(key)
                .map(|value| value.trim())
                .filter(|value| !value.is_empty())
                .map(str::to_string)
        };
        let ratio = |key: &str| {
            text(key)
                .and_then(|value| value.parse::<f64>().ok())
                .filter(|ratio| ratio.is_finite() && *ratio >= 0.0)
        };
        RuntimeInfo {
            disk_used_ratio: ratio("commitLogDiskRatio"),
            disk_capacity: text("commitLogDirCapacity"),
            high_water_ratio: ratio("quiverDiskHighWaterRatio"),
            writable: text("quiverWritable").and_then(|value| match value.as_str() {
                "true" => Some(true),
                "false" => Some(false),
                _ => None,
            }),
            write_refusal: text("quiverWriteRefusal"),
            write_refusal_message: text("quiverWriteRefusalMessage"),
        }
    }
}

/// Failures talking to a broker.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The broker could not be reached or the connection broke.
    #[error("broker {addr} unreachable")]
    Unreachable {
        addr: BrokerAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The broker answered with an error code.
    #[error("broker {addr} rejected {request}: code {code}: {remark}")]
    Rejected {
        addr: BrokerAddr,
        request: &'static str,
        code: i32,
        remark: String,
    },
    /// The broker's answer could not be decoded.
    #[error("broker {addr} sent an undecodable {request} response")]
    Malformed {
        addr: BrokerAddr,
        request: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl AdminError {
    /// Whether the broker answered that it does not know the request (REQUEST_CODE_NOT_SUPPORTED,
    /// an older broker).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            AdminError::Rejected { code, .. }
                if *code == quiver_protocol::code::response::REQUEST_CODE_NOT_SUPPORTED
        )
    }
}

/// The part of a broker address its Broker resource's brokers share (`<headless service>.
/// <namespace>.svc:<port>`, the address without the pod name): the scope of an account.
pub fn account_scope(addr: &BrokerAddr) -> &str {
    addr.0
        .split_once('.')
        .map_or(addr.0.as_str(), |(_, scope)| scope)
}

/// How the operator reaches the brokers of one Broker resource; the default is unsigned and
/// plain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerAccess {
    /// The account calls are signed with (ACL on the brokers).
    pub account: Option<Credentials>,
    /// TLS settings (CA and maybe a client certificate, in memory) when the brokers serve TLS.
    pub tls: Option<TlsConfig>,
}

/// Administration calls against one broker at a time.
pub trait BrokerAdmin: Send + Sync {
    /// Makes every later call to the brokers of `scope` (see [`account_scope`]) go through
    /// `access`: signed with its account, over TLS with its settings.
    fn use_access(&self, scope: &str, access: BrokerAccess);
    /// Per-queue offsets of `group` on `addr` (all topics the group has offsets or subscriptions for).
    fn consume_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<ConsumeStats, AdminError>>;
    /// Per-queue offsets of `topic` on `addr`.
    fn topic_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<TopicStats, AdminError>>;
    /// Client ids of the group's live members connected to `addr`; empty when none is online.
    fn members<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>>;
    /// Groups known to the broker (subscription group configs).
    fn groups<'a>(&'a self, addr: &'a BrokerAddr)
        -> BoxFuture<'a, Result<Vec<String>, AdminError>>;
    /// Topics the broker has (GET_ALL_TOPIC_CONFIG), system topics such as SCHEDULE_TOPIC_XXXX
    /// included.
    fn topics<'a>(&'a self, addr: &'a BrokerAddr)
        -> BoxFuture<'a, Result<Vec<String>, AdminError>>;
    /// Makes the broker read-only or read-write in the routes it serves.
    fn set_permission<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        permission: BrokerPermission,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Creates or updates a topic.
    fn create_topic<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a TopicConfig,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Creates or updates a subscription group.
    fn upsert_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a SubscriptionGroup,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Moves the committed offsets of `group` on `topic`.
    fn reset_offsets<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
        topic: &'a str,
        target: ResetTarget,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Deletes a group and its committed offsets.
    fn delete_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// The broker's disk usage and whether it takes writes (GET_BROKER_RUNTIME_INFO). A broker
    /// that predates the request answers [`AdminError::Rejected`] with
    /// [`AdminError::is_unsupported`].
    fn runtime_info<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<RuntimeInfo, AdminError>>;
    /// The broker group of `addr` as that member sees it (QUIVER_REPLICATION_STATUS). A broker
    /// without replicated groups answers [`AdminError::Rejected`] with
    /// [`AdminError::is_unsupported`].
    fn replication_status<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<ReplicationStatus, AdminError>>;
    /// Asks the master at `addr` to hand mastership to replica `target` (QUIVER_SWITCHOVER),
    /// pausing sends at most `timeout`; Ok once the target is master.
    fn switchover<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        target: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Asks the member at `addr` (the operator asks the master) to change the group's
    /// membership (QUIVER_REPLICATION_MEMBERS), taking at most `timeout`; the membership after
    /// the change, replica id -> address.
    fn change_membership<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        change: &'a MembershipChange,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<BTreeMap<u64, String>, AdminError>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn runtime_info_reads_the_quiver_keys() {
        let info = RuntimeInfo::from_table(&table(&[
            ("commitLogDiskRatio", "0.93"),
            ("commitLogDirCapacity", "Total : 48.0 MiB, Free : 3.1 MiB."),
            ("quiverDiskHighWaterRatio", "0.9"),
            ("quiverWritable", "false"),
            ("quiverWriteRefusal", "disk-high-water"),
            (
                "quiverWriteRefusalMessage",
                "disk 93% used, above the 90% high water",
            ),
            ("bootTimestamp", "1700000000000"),
        ]));
        assert_eq!(
            info,
            RuntimeInfo {
                disk_used_ratio: Some(0.93),
                disk_capacity: Some("Total : 48.0 MiB, Free : 3.1 MiB.".into()),
                high_water_ratio: Some(0.9),
                writable: Some(false),
                write_refusal: Some(REFUSAL_DISK_HIGH_WATER.into()),
                write_refusal_message: Some("disk 93% used, above the 90% high water".into()),
            }
        );
    }

    #[test]
    fn runtime_info_of_a_writable_broker_has_no_refusal() {
        let info = RuntimeInfo::from_table(&table(&[
            ("commitLogDiskRatio", "0.4"),
            ("quiverDiskHighWaterRatio", "0.9"),
            ("quiverWritable", "true"),
            ("quiverWriteRefusal", ""),
            ("quiverWriteRefusalMessage", ""),
        ]));
        assert_eq!(info.writable, Some(true));
        assert_eq!(info.write_refusal, None);
        assert_eq!(info.write_refusal_message, None);
    }

    #[test]
    fn runtime_info_of_an_apache_broker_or_garbage_is_partial() {
        let apache = RuntimeInfo::from_table(&table(&[("commitLogDiskRatio", "0.5123")]));
        assert_eq!(apache.disk_used_ratio, Some(0.5123));
        assert_eq!((apache.high_water_ratio, apache.writable), (None, None));
        let garbage = RuntimeInfo::from_table(&table(&[
            ("commitLogDiskRatio", "NaN"),
            ("quiverDiskHighWaterRatio", "-1"),
            ("quiverWritable", "yes"),
        ]));
        assert_eq!(garbage, RuntimeInfo::default());
    }

    #[test]
    fn only_request_code_not_supported_is_unsupported() {
        let rejected = |code| AdminError::Rejected {
            addr: BrokerAddr("b:1".into()),
            request: "GET_BROKER_RUNTIME_INFO",
            code,
            remark: String::new(),
        };
        assert!(rejected(3).is_unsupported());
        assert!(!rejected(1).is_unsupported());
        let unreachable = AdminError::Unreachable {
            addr: BrokerAddr("b:1".into()),
            source: "refused".into(),
        };
        assert!(!unreachable.is_unsupported());
    }
}
