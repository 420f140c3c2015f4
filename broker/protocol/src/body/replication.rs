//! JSON bodies of Quiver's replicated broker groups.

use serde::{Deserialize, Serialize};

/// A group member's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaRole {
    Master,
    Replica,
    /// Not yet told its role by the group (starting, or the group has no master).
    Unknown,
}

/// One member of a group as the answering member sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    pub replica_id: u64,
    /// Its remoting address.
    pub address: String,
    pub role: ReplicaRole,
    pub in_sync: bool,
    /// Its CommitLog end, as last known (by the master for replicas; its own otherwise).
    pub log_end: u64,
    /// Bytes it is behind the master's CommitLog end.
    pub lag_bytes: u64,
    /// How long ago it last held every byte the master had, in milliseconds.
    pub lag_ms: u64,
}

/// QUIVER_REPLICATION_STATUS (30003): the group as one member sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationStatus {
    pub broker_name: String,
    /// The answering member.
    pub replica_id: u64,
    /// `sync` or `async`.
    pub mode: String,
    pub min_in_sync_replicas: u32,
    pub epoch: u64,
    pub master_id: Option<u64>,
    pub master_address: Option<String>,
    /// The in-sync set as the group last agreed it (master included).
    pub in_sync_replicas: Vec<u64>,
    /// CommitLog bytes below this are held by every in-sync replica.
    pub confirmed_offset: u64,
    /// Whether the master takes sends: false while the in-sync set is below the minimum.
    pub writable: bool,
    pub replicas: Vec<ReplicaStatus>,
}

/// QUIVER_REPLICATION_MEMBERS' answer: the group's membership after the change.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationMembers {
    /// Member id -> its remoting address.
    pub members: std::collections::BTreeMap<u64, String>,
}
