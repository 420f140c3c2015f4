//! One member's configuration, and the openraft configuration made from it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use openraft::SnapshotPolicy;

use crate::ConsensusError;

/// Configuration of one member's [`Consensus`](crate::Consensus).
#[derive(Debug, Clone)]
pub struct ConsensusConfig {
    /// This member's id (its broker id in the group), below 2^32.
    pub id: u64,
    /// Every member of the group (this one included) and its address: the
    /// membership a brand-new group is created with, and whom a member with an
    /// empty directory probes. Once a member has Raft state, the group's agreed
    /// membership (which membership changes alter) is what counts, and
    /// [`Consensus::start`](crate::Consensus::start) refuses a `members` that
    /// differs from the one its directory stores.
    pub members: BTreeMap<u64, String>,
    /// Where this member's Raft state is kept (created if missing).
    pub dir: PathBuf,
    /// The leader's heartbeat interval.
    pub heartbeat_ms: u64,
    /// A follower starts an election after a random timeout in this range
    /// without hearing from a leader.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// The bound of [`Consensus::propose`](crate::Consensus::propose) and [`Consensus::ensure_current`](crate::Consensus::ensure_current),
    /// waits for a leader included; also of one probe of another member. A
    /// rejoining member's catch-up is bounded by six times it.
    pub request_timeout_ms: u64,
    /// A snapshot is taken after this many log entries since the last one; the
    /// log before it is then purged (keeping `logs_to_keep` entries for
    /// followers that lag slightly).
    pub snapshot_after_logs: u64,
    pub logs_to_keep: u64,
}

impl ConsensusConfig {
    /// A config with the default timings (heartbeat 100 ms, election timeout
    /// 500..1000 ms, requests 5 s) and log compaction (snapshot every 64
    /// entries, keeping 16).
    pub fn new(id: u64, members: BTreeMap<u64, String>, dir: impl Into<PathBuf>) -> Self {
        ConsensusConfig {
            id,
            members,
            dir: dir.into(),
            heartbeat_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1000,
            request_timeout_ms: 5000,
            snapshot_after_logs: 64,
            logs_to_keep: 16,
        }
    }
}

/// openraft's configuration of this member's node.
pub(crate) fn raft_config(config: &ConsensusConfig) -> Result<openraft::Config, ConsensusError> {
    openraft::Config {
        cluster_name: "quiver-broker-group".to_string(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_after_logs.max(1)),
        max_in_snapshot_log_to_keep: config.logs_to_keep,
        purge_batch_size: 1,
        ..Default::default()
    }
    .validate()
    .map_err(|e| ConsensusError::Config(e.to_string()))
}
