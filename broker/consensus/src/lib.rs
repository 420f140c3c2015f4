//! quiver-consensus: the control plane of a replicated broker group.
//!
//! A broker group is N replicas of one broker name: one master, the others
//! replicate its CommitLog. Who is master, the epoch, the in-sync replica set
//! and the history of epoch start offsets ([`GroupState`]) are decided through
//! Raft ([openraft]), embedded in every member of the group. Each member runs a
//! [`Consensus`]; the embedding broker carries its messages over its own
//! connections by implementing [`Transport`] on the sending side and calling
//! [`Consensus::handle`] on the receiving side.
//!
//! Changes are [`Command`]s, conditional on the epoch (compare-and-set), so a
//! stale or repeated proposal comes back [`CommandOutcome::Rejected`] with the
//! current state instead of being applied twice.
//!
//! All of Raft's durable state (vote, log, committed id, state machine and
//! snapshot) lives under [`ConsensusConfig::dir`] and is fsynced before the
//! call that changed it returns; a restarted member recovers from it and
//! rejoins.

mod network;
mod state;
mod store;

use std::collections::BTreeMap;
use std::future::Future;
// Named by `declare_raft_types!`'s default `SnapshotData`.
use std::io::Cursor;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, InitializeError, InstallSnapshotError, RaftError,
};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{BasicNode, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

pub use state::{Command, CommandOutcome, EpochStart, GroupState};

use network::{KIND_APPEND, KIND_PROPOSE, KIND_SNAPSHOT, KIND_VOTE};

openraft::declare_raft_types!(
    /// openraft's type configuration of a broker group.
    pub TypeConfig:
        D = Command,
        R = CommandOutcome,
        NodeId = u64,
        Node = BasicNode,
);

/// A boxed, sendable future (what [`Transport::call`] returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A consensus message could not be delivered or answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transport: {0}")]
pub struct TransportError(pub String);

/// The embedding broker's way of reaching the other members of the group.
pub trait Transport: Send + Sync + 'static {
    /// Sends one consensus message to member `target` at `address` and returns
    /// its answer: the bytes the receiver's [`Consensus::handle`] returned for
    /// `kind` and `body`. `kind` is one of `"vote"`, `"append"`, `"snapshot"`,
    /// `"propose"`. Any failure to deliver or to get the answer (including the
    /// receiver's `handle` returning an error) is a [`TransportError`].
    fn call(
        &self,
        target: u64,
        address: &str,
        kind: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>>;
}

/// Errors of [`Consensus`].
#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    #[error("invalid consensus config: {0}")]
    Config(String),
    #[error("consensus storage: {0}")]
    Storage(#[from] std::io::Error),
    /// The request needs the leader and this member is not (it may know who is).
    #[error("not the consensus leader (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    /// No answer in time: no leader, or no quorum. A timed-out proposal may
    /// still be applied later (its outcome is unknown); read the state.
    #[error("consensus request timed out after {0:?}")]
    Timeout(Duration),
    /// openraft stopped (shut down or a fatal storage error).
    #[error("consensus: {0}")]
    Raft(String),
    #[error("consensus message of kind {kind}: {error}")]
    Codec { kind: String, error: String },
    #[error("unknown consensus message kind {0:?}")]
    UnknownKind(String),
}

/// Configuration of one member's [`Consensus`].
#[derive(Debug, Clone)]
pub struct ConsensusConfig {
    /// This member's id (its broker id in the group).
    pub id: u64,
    /// Every member of the group (this one included) and its address, as
    /// passed to [`Transport::call`]. The same on every member.
    pub members: BTreeMap<u64, String>,
    /// Where this member's Raft state is kept (created if missing).
    pub dir: PathBuf,
    /// The leader's heartbeat interval.
    pub heartbeat_ms: u64,
    /// A follower starts an election after a random timeout in this range
    /// without hearing from a leader.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// The bound of [`Consensus::propose`] and [`Consensus::ensure_current`],
    /// waits for a leader included.
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

/// The answer to a forwarded proposal (kind "propose").
#[derive(Serialize, Deserialize)]
enum ProposeReply {
    Done(CommandOutcome),
    NotLeader {
        leader: Option<u64>,
    },
    /// The leader could not commit it in time (no quorum); it may still be.
    TimedOut,
    Failed(String),
}

/// How often a request waiting for a leader looks again.
const LEADER_POLL: Duration = Duration::from_millis(25);

/// One member's consensus: an embedded openraft node with durable storage.
pub struct Consensus {
    id: u64,
    members: BTreeMap<u64, String>,
    raft: Raft<TypeConfig>,
    metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    state: watch::Receiver<GroupState>,
    transport: Arc<dyn Transport>,
    request_timeout: Duration,
}

impl Consensus {
    /// Opens this member's state under `config.dir` and starts its Raft node.
    /// On a member whose log is empty, initializes the group with all
    /// `config.members` as voters; this is safe on every member with the same
    /// membership (a member already initialized, by itself or by a message from
    /// another member, skips it).
    pub async fn start(
        config: ConsensusConfig,
        transport: Arc<dyn Transport>,
    ) -> Result<Consensus, ConsensusError> {
        if !config.members.contains_key(&config.id) {
            return Err(ConsensusError::Config(format!(
                "member {} is not in members {:?}",
                config.id,
                config.members.keys().collect::<Vec<_>>()
            )));
        }
        let raft_config = openraft::Config {
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
        .map_err(|e| ConsensusError::Config(e.to_string()))?;

        let dir = config.dir.clone();
        let (log_store, state_machine, state) = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            let log = store::LogStore::open(&dir)?;
            let (sm, state) = store::StateMachine::open(&dir)?;
            Ok::<_, std::io::Error>((log, sm, state))
        })
        .await
        .map_err(std::io::Error::other)??;

        let raft = Raft::new(
            config.id,
            Arc::new(raft_config),
            network::NetworkFactory {
                transport: transport.clone(),
            },
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| ConsensusError::Raft(e.to_string()))?;

        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| ConsensusError::Raft(e.to_string()))?;
        if !initialized {
            let nodes: BTreeMap<u64, BasicNode> = config
                .members
                .iter()
                .map(|(id, addr)| (*id, BasicNode::new(addr)))
                .collect();
            match raft.initialize(nodes).await {
                Ok(()) => {}
                // Another member's message got here first.
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(e) => {
                    let _ = raft.shutdown().await;
                    return Err(ConsensusError::Raft(e.to_string()));
                }
            }
        }
        tracing::info!(
            id = config.id,
            members = ?config.members.keys().collect::<Vec<_>>(),
            initialized,
            "consensus: started"
        );
        Ok(Consensus {
            id: config.id,
            members: config.members,
            metrics: raft.metrics(),
            raft,
            state,
            transport,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
        })
    }

    /// This member's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A watch of the applied [`GroupState`] (what this member has applied
    /// from the committed log; it may lag the leader's).
    pub fn state(&self) -> watch::Receiver<GroupState> {
        self.state.clone()
    }

    /// The current Raft leader as this member knows it.
    pub fn leader(&self) -> Option<u64> {
        self.metrics.borrow().current_leader
    }

    /// Whether this member is the Raft leader (as far as it knows; see
    /// [`Consensus::ensure_current`] for a checked read).
    pub fn is_leader(&self) -> bool {
        let m = self.metrics.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Proposes `command` and returns its outcome once it is committed and
    /// applied. On a follower, forwards it to the leader (Transport kind
    /// "propose"); while there is no leader, or it changes, retries until
    /// `request_timeout_ms`, then fails with [`ConsensusError::Timeout`].
    ///
    /// A proposal retried after a lost answer may have been applied the first
    /// time; being conditional on the epoch, it then comes back `Rejected`
    /// with a state that already reflects it.
    pub async fn propose(&self, command: Command) -> Result<CommandOutcome, ConsensusError> {
        let deadline = Instant::now() + self.request_timeout;
        let timeout = ConsensusError::Timeout(self.request_timeout);
        loop {
            let metrics = self.metrics.borrow().clone();
            let leader = metrics.current_leader;
            let attempt = match leader {
                Some(l) if l == self.id => {
                    match tokio::time::timeout_at(deadline, self.write_local(command.clone())).await
                    {
                        Err(_) => return Err(timeout),
                        Ok(r) => r,
                    }
                }
                Some(l) => {
                    let address = metrics
                        .membership_config
                        .nodes()
                        .find(|(id, _)| **id == l)
                        .map(|(_, n)| n.addr.clone())
                        .or_else(|| self.members.get(&l).cloned())
                        .unwrap_or_default();
                    let body = serde_json::to_vec(&command).map_err(|e| ConsensusError::Codec {
                        kind: KIND_PROPOSE.into(),
                        error: e.to_string(),
                    })?;
                    let call = self.transport.call(l, &address, KIND_PROPOSE, body);
                    match tokio::time::timeout_at(deadline, call).await {
                        Err(_) => return Err(timeout),
                        Ok(Err(e)) => {
                            tracing::debug!(leader = l, error = %e, "consensus: forwarding a proposal failed");
                            ProposeReply::NotLeader { leader: None }
                        }
                        Ok(Ok(answer)) => {
                            serde_json::from_slice(&answer).map_err(|e| ConsensusError::Codec {
                                kind: KIND_PROPOSE.into(),
                                error: e.to_string(),
                            })?
                        }
                    }
                }
                None => ProposeReply::NotLeader { leader: None },
            };
            match attempt {
                ProposeReply::Done(outcome) => return Ok(outcome),
                ProposeReply::Failed(e) => return Err(ConsensusError::Raft(e)),
                ProposeReply::TimedOut => return Err(timeout),
                ProposeReply::NotLeader { .. } => {}
            }
            if Instant::now() + LEADER_POLL >= deadline {
                return Err(timeout);
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// client_write on this member, which believes it leads.
    async fn write_local(&self, command: Command) -> ProposeReply {
        match self.raft.client_write(command).await {
            Ok(resp) => ProposeReply::Done(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                ProposeReply::NotLeader {
                    leader: f.leader_id,
                }
            }
            Err(e) => ProposeReply::Failed(e.to_string()),
        }
    }

    /// A linearizable read, on the leader only: confirms with a quorum that
    /// this member still leads, waits until everything committed before is
    /// applied, and returns the applied state. On a follower,
    /// [`ConsensusError::NotLeader`].
    pub async fn ensure_current(&self) -> Result<GroupState, ConsensusError> {
        let read = tokio::time::timeout(self.request_timeout, self.raft.ensure_linearizable())
            .await
            .map_err(|_| ConsensusError::Timeout(self.request_timeout))?;
        match read {
            Ok(_) => Ok(self.state.borrow().clone()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ConsensusError::NotLeader {
                    leader: f.leader_id,
                })
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                tracing::debug!(error = %e, "consensus: no quorum for a read");
                Err(ConsensusError::NotLeader { leader: None })
            }
            Err(e) => Err(ConsensusError::Raft(e.to_string())),
        }
    }

    /// The receiving side of [`Transport`]: handles one message of `kind` from
    /// another member and returns the answer to send back.
    pub async fn handle(&self, kind: &str, body: &[u8]) -> Result<Vec<u8>, ConsensusError> {
        fn decode<'a, T: Deserialize<'a>>(kind: &str, body: &'a [u8]) -> Result<T, ConsensusError> {
            serde_json::from_slice(body).map_err(|e| ConsensusError::Codec {
                kind: kind.into(),
                error: e.to_string(),
            })
        }
        let answer = match kind {
            KIND_VOTE => {
                let req: VoteRequest<u64> = decode(kind, body)?;
                serde_json::to_vec(&self.raft.vote(req).await)
            }
            KIND_APPEND => {
                let req: AppendEntriesRequest<TypeConfig> = decode(kind, body)?;
                serde_json::to_vec(&self.raft.append_entries(req).await)
            }
            KIND_SNAPSHOT => {
                let req: InstallSnapshotRequest<TypeConfig> = decode(kind, body)?;
                let res: Result<_, RaftError<u64, InstallSnapshotError>> =
                    self.raft.install_snapshot(req).await;
                serde_json::to_vec(&res)
            }
            KIND_PROPOSE => {
                let command: Command = decode(kind, body)?;
                // A member that does not lead answers NotLeader (openraft's
                // ForwardToLeader) at once.
                let reply = tokio::time::timeout(self.request_timeout, self.write_local(command))
                    .await
                    .unwrap_or(ProposeReply::TimedOut);
                serde_json::to_vec(&reply)
            }
            other => return Err(ConsensusError::UnknownKind(other.to_string())),
        };
        answer.map_err(|e| ConsensusError::Codec {
            kind: kind.into(),
            error: e.to_string(),
        })
    }

    /// Stops this member's Raft node. Its state stays under `dir`; a later
    /// [`Consensus::start`] on the same `dir` resumes it.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!(id = self.id, error = %e, "consensus: shutdown");
        }
    }
}
