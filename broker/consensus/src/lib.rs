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
//!
//! A member whose directory is empty (new, or wiped) never takes part as the
//! Raft node it may have been before: it asks the other members whether the
//! group exists (message "probe"). It creates a brand-new group only with a
//! majority of the members known to be uninitialized; if the group exists, it
//! comes back under a Raft node id the group has never seen (its member id with
//! a new random incarnation, see [`node_id`]), first as a learner, and the
//! leader replaces its old node with the new one once it has caught up
//! (message "rejoin"). See the crate's README for why.

#![forbid(unsafe_code)]

mod network;
mod state;
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
// Named by `declare_raft_types!`'s default `SnapshotData`.
use std::io::Cursor;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use openraft::error::{
    CheckIsLeaderError, ClientWriteError, InitializeError, InstallSnapshotError, RaftError,
};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{BasicNode, ChangeMembers, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use state::{Command, CommandOutcome, EpochStart, GroupState};

use network::{KIND_APPEND, KIND_PROBE, KIND_PROPOSE, KIND_REJOIN, KIND_SNAPSHOT, KIND_VOTE};
use store::Identity;

openraft::declare_raft_types!(
    /// openraft's type configuration of a broker group.
    pub TypeConfig:
        D = Command,
        R = CommandOutcome,
        NodeId = u64,
        Node = BasicNode,
);

/// The Raft node id of incarnation `incarnation` of member `member` (a member id
/// below 2^32): `incarnation << 32 | member`. Incarnation 0, the one of every
/// member of a brand-new group, is the member id itself (as in directories made
/// before incarnations existed); a member that rejoins after losing its directory
/// takes a random nonzero one, a node id the group has never seen.
pub fn node_id(member: u64, incarnation: u32) -> u64 {
    (u64::from(incarnation) << 32) | member
}

/// The member a Raft node id belongs to (see [`node_id`]).
pub fn member_of(node: u64) -> u64 {
    node & u64::from(u32::MAX)
}

/// The incarnation part of a Raft node id (see [`node_id`]).
pub fn incarnation_of(node: u64) -> u32 {
    (node >> 32) as u32
}

/// A boxed, sendable future (what [`Transport::call`] returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A consensus message could not be delivered or answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transport: {0}")]
pub struct TransportError(pub String);

/// The embedding broker's way of reaching the other members of the group.
pub trait Transport: Send + Sync + 'static {
    /// Sends one consensus message to member `target` (a member id, as in
    /// [`ConsensusConfig::members`]) at `address` and returns its answer: the
    /// bytes the receiver's [`Consensus::handle`] returned for `kind` and
    /// `body`. `kind` is one of `"vote"`, `"append"`, `"snapshot"`,
    /// `"propose"`, `"probe"`, `"rejoin"` (carry any kind as it is). Any failure
    /// to deliver or to get the answer (including the receiver's `handle`
    /// returning an error) is a [`TransportError`].
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
    /// A Raft message reached a member that has not yet found out whether its
    /// group exists (its directory was empty): it takes none until it knows
    /// which Raft node it is.
    #[error("this member has not joined the group's consensus yet")]
    NotJoined,
    /// A Raft message for another Raft node of this member: one it was before it
    /// lost its directory. Refused, so the leader sees that node unreachable
    /// rather than its log reverted.
    #[error("consensus message for raft node {to}; this member is raft node {node}")]
    WrongNode { to: u64, node: u64 },
}

/// Configuration of one member's [`Consensus`].
#[derive(Debug, Clone)]
pub struct ConsensusConfig {
    /// This member's id (its broker id in the group), below 2^32.
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

/// Where a member is in joining its group's consensus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Its directory had no Raft state: it is asking the other members whether
    /// the group exists, and takes no Raft message meanwhile.
    Probing,
    /// The group exists and this member lost its state: it is a new Raft node
    /// (a learner once the leader adds it) until the leader makes it a voter.
    Rejoining,
    /// A Raft node of the group (a voter, or created a brand-new group).
    Member,
}

/// What a member knows of its place in the group ([`Consensus::status`]).
#[derive(Debug, Clone)]
pub struct Status {
    pub phase: Phase,
    /// While probing or rejoining: what it is waiting for (the last round's
    /// answers, or the leader's).
    pub waiting_for: Option<String>,
    /// Its Raft node id, once it knows it (see [`node_id`]).
    pub node: Option<u64>,
    /// The group's voters and learners (Raft node ids) as this member knows
    /// them; a joint membership (a change under way) lists both configs' voters.
    pub voters: BTreeSet<u64>,
    pub learners: BTreeSet<u64>,
    /// The current leader's Raft node id as this member knows it.
    pub leader_node: Option<u64>,
    /// Why its Raft node stopped, if it did (a panic or a fatal storage error).
    pub fatal: Option<String>,
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

/// A member with an empty directory asks (kind "probe").
#[derive(Serialize, Deserialize)]
struct ProbeRequest {
    from: u64,
    nonce: u64,
}

/// The answer to a probe.
#[derive(Serialize, Deserialize, Debug, Clone)]
enum ProbeReply {
    /// This member has no Raft state either and has not decided anything; `nonce`
    /// tells this start of it apart from any other.
    Fresh { nonce: u64 },
    /// This member is (or is becoming) a Raft node of the group: the group exists.
    Member {
        node: u64,
        voters: BTreeSet<u64>,
        learners: BTreeSet<u64>,
        /// The leader's member id.
        leader: Option<u64>,
        /// If the group was created brand-new: the members it counted as
        /// uninitialized, with the nonces they answered.
        founders: BTreeMap<u64, u64>,
    },
}

/// A rejoining member asks the leader to make its new node a voter (kind "rejoin").
#[derive(Serialize, Deserialize)]
struct RejoinRequest {
    member: u64,
    node: u64,
}

#[derive(Serialize, Deserialize, Debug)]
enum RejoinReply {
    /// The node is a voter of the group's (uniform) membership.
    Done,
    /// The leader has added it as a learner and is waiting for it to catch up.
    InProgress,
    /// The leader is rejoining another member first (one change at a time).
    Busy {
        member: u64,
    },
    NotLeader {
        leader: Option<u64>,
    },
    Refused(String),
}

/// How often a request waiting for a leader looks again.
const LEADER_POLL: Duration = Duration::from_millis(25);
/// The bounds of the wait between two probe rounds (doubling) and between two
/// rejoin requests.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// How many more probe rounds (RETRY_MIN apart) a member that may create the group
/// gives the members that did not answer.
const CREATE_GRACE_ROUNDS: u32 = 2;

/// This member's Raft node, once it knows which one it is.
struct Node {
    id: u64,
    raft: Raft<TypeConfig>,
    metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
}

impl Node {
    /// Whether this node is a voter of the group's uniform membership.
    fn is_voter(&self) -> bool {
        let m = self.metrics.borrow();
        let configs = m.membership_config.membership().get_joint_config();
        configs.len() == 1 && configs[0].contains(&self.id)
    }
}

struct Inner {
    member: u64,
    members: Arc<BTreeMap<u64, String>>,
    dir: PathBuf,
    raft_config: Arc<openraft::Config>,
    transport: Arc<dyn Transport>,
    request_timeout: Duration,
    catch_up_timeout: Duration,
    state: watch::Receiver<GroupState>,
    /// Tells this start apart in probe answers (random).
    nonce: u64,
    /// The log store and state machine, until the node takes them.
    stores: Mutex<Option<(store::LogStore, store::StateMachine)>>,
    /// Set once this member has decided who it is (before its node exists).
    identity: Mutex<Option<Identity>>,
    node: OnceLock<Node>,
    phase: Mutex<(Phase, Option<String>)>,
    /// On the leader: the (member, node) being rejoined.
    rejoining: Mutex<Option<(u64, u64)>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stopped: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn random_nonzero_u32() -> u32 {
    loop {
        let v: u32 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

/// One member's consensus: an embedded openraft node with durable storage.
pub struct Consensus {
    inner: Arc<Inner>,
}

impl Consensus {
    /// Opens this member's state under `config.dir` and starts it.
    ///
    /// A member with Raft state in `dir` resumes as the Raft node it was. A
    /// member whose `dir` has none (new, or wiped) returns at once and, in the
    /// background, asks the other members whether the group exists: it creates
    /// a brand-new group (all members as voters) only when a majority of the
    /// members is known to have no state either; it rejoins an existing group as
    /// a new learner that the leader promotes; with too few answers it retries
    /// (see [`Consensus::status`]). Until then it takes no Raft message.
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
        if let Some(id) = config.members.keys().find(|id| **id > u64::from(u32::MAX)) {
            return Err(ConsensusError::Config(format!(
                "member id {id} is not below 2^32"
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
        let (log_store, state_machine, state, identity, has_state) =
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(&dir)?;
                let identity = Identity::read(&dir)?;
                let has_state = store::has_raft_state(&dir);
                let log = store::LogStore::open(&dir)?;
                let (sm, state) = store::StateMachine::open(&dir)?;
                Ok::<_, std::io::Error>((log, sm, state, identity, has_state))
            })
            .await
            .map_err(std::io::Error::other)??;
        if let Some(identity) = &identity {
            if identity.member != config.id {
                return Err(ConsensusError::Config(format!(
                    "{} belongs to member {}, not {}",
                    config.dir.display(),
                    identity.member,
                    config.id
                )));
            }
        }
        // An identity without Raft state: the node never took part (it stopped before
        // its first vote or entry), or its state was lost. Not trusted: the member
        // decides again as one with an empty directory does.
        let identity = match identity {
            Some(identity) if !has_state => {
                tracing::warn!(
                    id = config.id,
                    incarnation = identity.incarnation,
                    "consensus: member.json without Raft state; starting as a member with an empty directory"
                );
                None
            }
            // A directory from before identities: its Raft node id is the member id.
            None if has_state => {
                let legacy = Identity {
                    member: config.id,
                    incarnation: 0,
                    founders: BTreeMap::new(),
                };
                let (write, dir) = (legacy.clone(), config.dir.clone());
                tokio::task::spawn_blocking(move || write.write(&dir))
                    .await
                    .map_err(std::io::Error::other)??;
                Some(legacy)
            }
            other => other,
        };

        let inner = Arc::new(Inner {
            member: config.id,
            members: Arc::new(config.members.clone()),
            dir: config.dir.clone(),
            raft_config: Arc::new(raft_config),
            transport,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            catch_up_timeout: Duration::from_millis(config.request_timeout_ms) * 6,
            state,
            nonce: rand::random::<u64>() | 1,
            stores: Mutex::new(Some((log_store, state_machine))),
            identity: Mutex::new(identity.clone()),
            node: OnceLock::new(),
            phase: Mutex::new((Phase::Probing, None)),
            rejoining: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let consensus = Consensus {
            inner: inner.clone(),
        };
        match identity {
            Some(identity) => {
                let node = node_id(config.id, identity.incarnation);
                inner.create_node(node).await?;
                if identity.incarnation == 0 {
                    // Raft state but no membership yet (the vote and log are
                    // empty): initialize as every member of a brand-new group does.
                    if let Err(e) = inner.initialize().await {
                        consensus.shutdown().await;
                        return Err(e);
                    }
                    inner.set_phase(Phase::Member, None);
                } else {
                    // A rejoined member: done, or resumes asking to be a voter.
                    inner.set_phase(Phase::Rejoining, None);
                    let task = tokio::spawn(rejoin(inner.clone(), None));
                    inner.track(task);
                }
                tracing::info!(
                    id = config.id,
                    node,
                    members = ?config.members.keys().collect::<Vec<_>>(),
                    "consensus: started from its directory"
                );
            }
            None => {
                tracing::info!(
                    id = config.id,
                    members = ?config.members.keys().collect::<Vec<_>>(),
                    "consensus: started with an empty directory; asking the other members whether the group exists"
                );
                let task = tokio::spawn(bootstrap(inner.clone()));
                inner.track(task);
            }
        }
        Ok(consensus)
    }

    /// This member's id.
    pub fn id(&self) -> u64 {
        self.inner.member
    }

    /// A watch of the applied [`GroupState`] (what this member has applied
    /// from the committed log; it may lag the leader's).
    pub fn state(&self) -> watch::Receiver<GroupState> {
        self.inner.state.clone()
    }

    /// The current Raft leader's member id as this member knows it.
    pub fn leader(&self) -> Option<u64> {
        let node = self.inner.node.get()?;
        let leader = node.metrics.borrow().current_leader;
        leader.map(member_of)
    }

    /// Whether this member is the Raft leader (as far as it knows; see
    /// [`Consensus::ensure_current`] for a checked read).
    pub fn is_leader(&self) -> bool {
        self.inner.node.get().is_some_and(|node| {
            let m = node.metrics.borrow();
            m.state == ServerState::Leader && m.current_leader == Some(node.id)
        })
    }

    /// Where this member is in joining the group, and the group's Raft
    /// membership as it knows it.
    pub fn status(&self) -> Status {
        let (phase, waiting_for) = lock(&self.inner.phase).clone();
        let mut status = Status {
            phase,
            waiting_for,
            node: None,
            voters: BTreeSet::new(),
            learners: BTreeSet::new(),
            leader_node: None,
            fatal: None,
        };
        if let Some(node) = self.inner.node.get() {
            let m = node.metrics.borrow();
            let membership = m.membership_config.membership();
            status.node = Some(node.id);
            status.voters = membership.voter_ids().collect();
            status.learners = membership.learner_ids().collect();
            status.leader_node = m.current_leader;
            status.fatal = m.running_state.as_ref().err().map(|e| e.to_string());
        }
        status
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
        let inner = &self.inner;
        let deadline = Instant::now() + inner.request_timeout;
        let timeout = ConsensusError::Timeout(inner.request_timeout);
        loop {
            let leader = inner
                .node
                .get()
                .and_then(|node| node.metrics.borrow().current_leader.map(|l| (node, l)));
            let attempt = match leader {
                Some((node, l)) if l == node.id => {
                    match tokio::time::timeout_at(deadline, inner.write_local(command.clone()))
                        .await
                    {
                        Err(_) => return Err(timeout),
                        Ok(r) => r,
                    }
                }
                Some((_, l)) => {
                    let member = member_of(l);
                    let address = inner.members.get(&member).cloned().unwrap_or_default();
                    let body = serde_json::to_vec(&command).map_err(|e| ConsensusError::Codec {
                        kind: KIND_PROPOSE.into(),
                        error: e.to_string(),
                    })?;
                    let call = inner.transport.call(member, &address, KIND_PROPOSE, body);
                    match tokio::time::timeout_at(deadline, call).await {
                        Err(_) => return Err(timeout),
                        Ok(Err(e)) => {
                            tracing::debug!(leader = member, error = %e, "consensus: forwarding a proposal failed");
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

    /// A linearizable read, on the leader only: confirms with a quorum that
    /// this member still leads, waits until everything committed before is
    /// applied, and returns the applied state. On a follower,
    /// [`ConsensusError::NotLeader`].
    pub async fn ensure_current(&self) -> Result<GroupState, ConsensusError> {
        let Some(node) = self.inner.node.get() else {
            return Err(ConsensusError::NotLeader { leader: None });
        };
        let read =
            tokio::time::timeout(self.inner.request_timeout, node.raft.ensure_linearizable())
                .await
                .map_err(|_| ConsensusError::Timeout(self.inner.request_timeout))?;
        match read {
            Ok(_) => Ok(self.inner.state.borrow().clone()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(ConsensusError::NotLeader {
                    leader: f.leader_id.map(member_of),
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
        let inner = &self.inner;
        let answer = match kind {
            KIND_VOTE => {
                let (node, req) = inner.raft_message::<VoteRequest<u64>>(kind, body)?;
                serde_json::to_vec(&node.raft.vote(req).await)
            }
            KIND_APPEND => {
                let (node, req) =
                    inner.raft_message::<AppendEntriesRequest<TypeConfig>>(kind, body)?;
                serde_json::to_vec(&node.raft.append_entries(req).await)
            }
            KIND_SNAPSHOT => {
                let (node, req) =
                    inner.raft_message::<InstallSnapshotRequest<TypeConfig>>(kind, body)?;
                let res: Result<_, RaftError<u64, InstallSnapshotError>> =
                    node.raft.install_snapshot(req).await;
                serde_json::to_vec(&res)
            }
            KIND_PROPOSE => {
                let command: Command = decode(kind, body)?;
                // A member that does not lead answers NotLeader (openraft's
                // ForwardToLeader) at once.
                let reply = tokio::time::timeout(inner.request_timeout, inner.write_local(command))
                    .await
                    .unwrap_or(ProposeReply::TimedOut);
                serde_json::to_vec(&reply)
            }
            KIND_PROBE => {
                let req: ProbeRequest = decode(kind, body)?;
                let reply = inner.probe_reply();
                tracing::debug!(from = req.from, ?reply, "consensus: probed");
                serde_json::to_vec(&reply)
            }
            KIND_REJOIN => {
                let req: RejoinRequest = decode(kind, body)?;
                serde_json::to_vec(&inner.handle_rejoin(req))
            }
            other => return Err(ConsensusError::UnknownKind(other.to_string())),
        };
        answer.map_err(|e| ConsensusError::Codec {
            kind: kind.into(),
            error: e.to_string(),
        })
    }

    /// Stops this member's Raft node (and its probing or rejoining). Its state
    /// stays under `dir`; a later [`Consensus::start`] on the same `dir`
    /// resumes it.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.stopped.store(true, Ordering::SeqCst);
        let tasks = std::mem::take(&mut *lock(&inner.tasks));
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        if let Some(node) = inner.node.get() {
            if let Err(e) = node.raft.shutdown().await {
                tracing::warn!(id = inner.member, error = %e, "consensus: shutdown");
            }
        }
    }
}

impl Drop for Consensus {
    fn drop(&mut self) {
        for task in lock(&self.inner.tasks).iter() {
            task.abort();
        }
    }
}

impl Inner {
    fn set_phase(&self, phase: Phase, waiting_for: Option<String>) {
        *lock(&self.phase) = (phase, waiting_for);
    }

    /// Keeps `task` to stop it at shutdown (or stops it now if stopped).
    fn track(&self, task: JoinHandle<()>) {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        if self.stopped.load(Ordering::SeqCst) {
            task.abort();
        }
        tasks.push(task);
    }

    /// Starts this member's Raft node as node `id`.
    async fn create_node(&self, id: u64) -> Result<&Node, ConsensusError> {
        let stores = lock(&self.stores).take();
        let (log_store, state_machine) =
            stores.ok_or_else(|| ConsensusError::Raft("the Raft node exists already".into()))?;
        let raft = Raft::new(
            id,
            self.raft_config.clone(),
            network::NetworkFactory {
                transport: self.transport.clone(),
                members: self.members.clone(),
            },
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| ConsensusError::Raft(e.to_string()))?;
        let node = Node {
            id,
            metrics: raft.metrics(),
            raft,
        };
        if self.node.set(node).is_err() {
            return Err(ConsensusError::Raft("the Raft node exists already".into()));
        }
        Ok(self.node.get().expect("just set"))
    }

    /// Initializes a brand-new group (every member at incarnation 0) on this
    /// member's node if it is not initialized; the same membership on every
    /// member that does it.
    async fn initialize(&self) -> Result<(), ConsensusError> {
        let node = self.node.get().expect("the node exists");
        let initialized = node
            .raft
            .is_initialized()
            .await
            .map_err(|e| ConsensusError::Raft(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        let nodes: BTreeMap<u64, BasicNode> = self
            .members
            .iter()
            .map(|(id, addr)| (node_id(*id, 0), BasicNode::new(addr)))
            .collect();
        match node.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            // Another member's message got here first.
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(ConsensusError::Raft(e.to_string())),
        }
    }

    /// Decodes a Raft RPC meant for this member's node; refuses one for any
    /// other node id, or before the node exists.
    fn raft_message<T: serde::de::DeserializeOwned>(
        &self,
        kind: &str,
        body: &[u8],
    ) -> Result<(&Node, T), ConsensusError> {
        let node = self.node.get().ok_or(ConsensusError::NotJoined)?;
        let (to, req) = network::unwrap::<T>(body).map_err(|e| ConsensusError::Codec {
            kind: kind.into(),
            error: e.to_string(),
        })?;
        // A sender that does not say means this member's incarnation 0.
        let to = to.unwrap_or(self.member);
        if to != node.id {
            tracing::debug!(
                to,
                node = node.id,
                kind,
                "consensus: refused a message for another node"
            );
            return Err(ConsensusError::WrongNode { to, node: node.id });
        }
        Ok((node, req))
    }

    /// client_write on this member, which believes it leads.
    async fn write_local(&self, command: Command) -> ProposeReply {
        let Some(node) = self.node.get() else {
            return ProposeReply::NotLeader { leader: None };
        };
        match node.raft.client_write(command).await {
            Ok(resp) => ProposeReply::Done(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                ProposeReply::NotLeader {
                    leader: f.leader_id.map(member_of),
                }
            }
            Err(e) => ProposeReply::Failed(e.to_string()),
        }
    }

    fn probe_reply(&self) -> ProbeReply {
        let identity = lock(&self.identity).clone();
        let Some(identity) = identity else {
            return ProbeReply::Fresh { nonce: self.nonce };
        };
        let (mut voters, mut learners, mut leader) = (BTreeSet::new(), BTreeSet::new(), None);
        if let Some(node) = self.node.get() {
            let m = node.metrics.borrow();
            voters = m.membership_config.membership().voter_ids().collect();
            learners = m.membership_config.membership().learner_ids().collect();
            leader = m.current_leader.map(member_of);
        }
        ProbeReply::Member {
            node: node_id(identity.member, identity.incarnation),
            voters,
            learners,
            leader,
            founders: identity.founders,
        }
    }

    /// On the leader: a rejoining member's request to make `req.node` a voter in
    /// place of its old node. Answers at once; the change runs in the background,
    /// one member at a time.
    fn handle_rejoin(self: &Arc<Self>, req: RejoinRequest) -> RejoinReply {
        let Some(node) = self.node.get() else {
            return RejoinReply::NotLeader { leader: None };
        };
        let (leads, leader, uniform_voter) = {
            let m = node.metrics.borrow();
            let configs = m.membership_config.membership().get_joint_config();
            (
                m.state == ServerState::Leader && m.current_leader == Some(node.id),
                m.current_leader.map(member_of),
                configs.len() == 1 && configs[0].contains(&req.node),
            )
        };
        if !leads {
            return RejoinReply::NotLeader { leader };
        }
        if !self.members.contains_key(&req.member)
            || member_of(req.node) != req.member
            || incarnation_of(req.node) == 0
            || req.member == self.member
        {
            return RejoinReply::Refused(format!(
                "member {} cannot rejoin as raft node {}",
                req.member, req.node
            ));
        }
        if uniform_voter {
            return RejoinReply::Done;
        }
        let mut rejoining = lock(&self.rejoining);
        match *rejoining {
            Some(current) if current == (req.member, req.node) => RejoinReply::InProgress,
            Some((member, _)) => RejoinReply::Busy { member },
            None => {
                *rejoining = Some((req.member, req.node));
                drop(rejoining);
                tracing::info!(
                    member = req.member,
                    node = req.node,
                    "consensus: a member that lost its state rejoins: adding its new node as a learner"
                );
                let task = tokio::spawn(promote(self.clone(), req.member, req.node));
                self.track(task);
                RejoinReply::InProgress
            }
        }
    }

    /// One round of probes of every other member; what to do next.
    async fn probe_round(&self) -> Decision {
        let body = serde_json::to_vec(&ProbeRequest {
            from: self.member,
            nonce: self.nonce,
        })
        .expect("a probe serializes");
        let mut calls = tokio::task::JoinSet::new();
        for (member, address) in self.members.iter().filter(|(m, _)| **m != self.member) {
            let call = self
                .transport
                .call(*member, address, KIND_PROBE, body.clone());
            let (member, limit) = (*member, self.request_timeout);
            calls.spawn(async move {
                let answer = match tokio::time::timeout(limit, call).await {
                    Err(_) => Err(format!("no answer in {limit:?}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(bytes)) => serde_json::from_slice::<ProbeReply>(&bytes)
                        .map_err(|e| format!("unreadable answer: {e}")),
                };
                (member, answer)
            });
        }
        let mut fresh = BTreeMap::from([(self.member, self.nonce)]);
        let mut existing = Vec::new();
        let mut silent = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let Ok((member, answer)) = joined else {
                continue;
            };
            match answer {
                Ok(ProbeReply::Fresh { nonce }) => {
                    fresh.insert(member, nonce);
                }
                Ok(ProbeReply::Member {
                    node,
                    leader,
                    founders,
                    ..
                }) => existing.push((member, node, leader, founders)),
                Err(e) => silent.push(format!("{member}: {e}")),
            }
        }
        // A group created counting this very start as uninitialized: this member
        // has taken no Raft message since, so its incarnation 0 never had state.
        if let Some((_, _, _, founders)) = existing
            .iter()
            .find(|(_, _, _, f)| f.get(&self.member) == Some(&self.nonce))
        {
            return Decision::Found(founders.clone());
        }
        if let Some((member, node, leader, _)) = existing.first() {
            let leader = existing.iter().find_map(|(_, _, l, _)| *l).or(*leader);
            return Decision::Rejoin {
                why: format!("member {member} is raft node {node} of the group"),
                leader,
            };
        }
        let needed = self.members.len() / 2 + 1;
        if fresh.len() >= needed {
            return Decision::Create {
                founders: fresh,
                silent,
            };
        }
        Decision::Wait(format!(
            "{} of {} members known to have no consensus state ({:?}), {} needed to create the group, \
             and none answered that it exists; no answer from [{}]",
            fresh.len(),
            self.members.len(),
            fresh.keys().collect::<Vec<_>>(),
            needed,
            silent.join("; ")
        ))
    }

    /// Records who this member is (durably, before its node runs).
    async fn decide(&self, identity: Identity) -> Result<(), ConsensusError> {
        *lock(&self.identity) = Some(identity.clone());
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || identity.write(&dir))
            .await
            .map_err(std::io::Error::other)??;
        Ok(())
    }

    /// On the leader: adds `node` as a learner, waits until it has caught up,
    /// then makes it a voter in place of `member`'s other nodes.
    async fn add_and_promote(&self, member: u64, node: u64) -> Result<(), String> {
        let raft = &self.node.get().expect("the leader's node").raft;
        let address = self.members.get(&member).cloned().unwrap_or_default();
        let added = raft
            .add_learner(node, BasicNode::new(address), false)
            .await
            .map_err(|e| format!("adding the learner: {e}"))?;
        let target = added.log_id.index;
        let mut metrics = raft.metrics();
        let caught_up = metrics
            .wait_for(|m| {
                m.state != ServerState::Leader
                    || m.replication
                        .as_ref()
                        .and_then(|r| r.get(&node).copied().flatten())
                        .is_some_and(|matched| matched.index >= target)
            })
            .await
            .map(|m| m.state == ServerState::Leader)
            .unwrap_or(false);
        if !caught_up {
            return Err("no longer the leader".into());
        }
        let voters: BTreeSet<u64> = {
            let m = raft.metrics().borrow().clone();
            let configs = m.membership_config.membership().get_joint_config().clone();
            configs
                .last()
                .into_iter()
                .flatten()
                .copied()
                .filter(|v| member_of(*v) != member)
                .chain([node])
                .collect()
        };
        tracing::info!(
            member,
            node,
            ?voters,
            "consensus: the rejoining member caught up; making it a voter"
        );
        raft.change_membership(voters, false)
            .await
            .map_err(|e| format!("changing the membership: {e}"))?;
        Ok(())
    }
}

enum Decision {
    /// Another member created a brand-new group counting this start: initialize it too.
    Found(BTreeMap<u64, u64>),
    /// A majority is known to be uninitialized: create the group (`silent`: the
    /// members that did not answer).
    Create {
        founders: BTreeMap<u64, u64>,
        silent: Vec<String>,
    },
    /// The group exists: rejoin it under a new node id.
    Rejoin { why: String, leader: Option<u64> },
    /// Not enough answers to know.
    Wait(String),
}

/// A member with an empty directory: finds out whether its group exists, then
/// creates it, joins it as a founder, or rejoins it.
async fn bootstrap(inner: Arc<Inner>) {
    let mut backoff = RETRY_MIN;
    let mut round: u64 = 0;
    let mut grace = 0;
    loop {
        round += 1;
        let (identity, leader) = match inner.probe_round().await {
            Decision::Wait(why) => {
                // Said the first rounds, whenever the reason changes, then now and then.
                let said = lock(&inner.phase).1.clone();
                if round <= 3 || said.as_ref() != Some(&why) || round % 30 == 0 {
                    tracing::warn!(
                        id = inner.member,
                        round,
                        retry_in = ?backoff,
                        "consensus: not creating the group: {why}"
                    );
                }
                inner.set_phase(Phase::Probing, Some(why));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
                continue;
            }
            Decision::Create { silent, .. }
                if !silent.is_empty() && grace < CREATE_GRACE_ROUNDS =>
            {
                // Members starting at about the same time are counted too (then they
                // are voters from the start instead of rejoining).
                grace += 1;
                tracing::info!(
                    id = inner.member,
                    round,
                    "consensus: a majority of the members has no consensus state; \
                    waiting briefly for the others to answer: [{}]",
                    silent.join("; ")
                );
                tokio::time::sleep(RETRY_MIN).await;
                continue;
            }
            Decision::Create { founders, .. } => {
                tracing::info!(id = inner.member, founders = ?founders.keys().collect::<Vec<_>>(),
                    "consensus: a majority of the members has no consensus state: creating the group");
                let identity = Identity {
                    member: inner.member,
                    incarnation: 0,
                    founders,
                };
                (identity, None)
            }
            Decision::Found(founders) => {
                tracing::info!(id = inner.member, founders = ?founders.keys().collect::<Vec<_>>(),
                    "consensus: the group was created counting this member: joining it");
                let identity = Identity {
                    member: inner.member,
                    incarnation: 0,
                    founders,
                };
                (identity, None)
            }
            Decision::Rejoin { why, leader } => {
                let identity = Identity {
                    member: inner.member,
                    incarnation: random_nonzero_u32(),
                    founders: BTreeMap::new(),
                };
                tracing::warn!(
                    id = inner.member,
                    node = node_id(inner.member, identity.incarnation),
                    "consensus: this member has no consensus state but the group exists ({why}): \
                     rejoining under a new raft node id, as a learner until the leader promotes it"
                );
                (identity, Some(leader))
            }
        };
        let node = node_id(inner.member, identity.incarnation);
        let incarnation = identity.incarnation;
        if let Err(e) = inner.decide(identity).await {
            // Nothing ran as that node yet: try again (and decide again).
            tracing::error!(id = inner.member, error = %e, "consensus: cannot record this member's identity");
            *lock(&inner.identity) = None;
            inner.set_phase(
                Phase::Probing,
                Some(format!("cannot record the identity: {e}")),
            );
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
            continue;
        }
        if let Err(e) = inner.create_node(node).await {
            tracing::error!(id = inner.member, node, error = %e, "consensus: cannot start the raft node");
            inner.set_phase(
                Phase::Probing,
                Some(format!("cannot start the raft node: {e}")),
            );
            return;
        }
        match leader {
            None => {
                debug_assert_eq!(incarnation, 0);
                if let Err(e) = inner.initialize().await {
                    tracing::error!(id = inner.member, error = %e, "consensus: cannot initialize the group");
                    inner.set_phase(Phase::Member, Some(format!("cannot initialize: {e}")));
                    return;
                }
                inner.set_phase(Phase::Member, None);
            }
            Some(leader) => {
                inner.set_phase(Phase::Rejoining, None);
                rejoin(inner, leader).await;
            }
        }
        return;
    }
}

/// A rejoining member: asks the leader until its node is a voter.
async fn rejoin(inner: Arc<Inner>, mut hint: Option<u64>) {
    let node = inner.node.get().expect("the rejoining node");
    let others: Vec<u64> = inner
        .members
        .keys()
        .copied()
        .filter(|m| *m != inner.member)
        .collect();
    let mut next_other = 0usize;
    let mut backoff = RETRY_MIN;
    loop {
        if node.is_voter() {
            tracing::info!(
                id = inner.member,
                node = node.id,
                "consensus: rejoined the group as a voter"
            );
            inner.set_phase(Phase::Member, None);
            return;
        }
        let known = node.metrics.borrow().current_leader.map(member_of);
        let target = match known.or(hint.take()).filter(|m| *m != inner.member) {
            Some(m) => m,
            None if others.is_empty() => {
                inner.set_phase(Phase::Rejoining, Some("no other member".into()));
                return;
            }
            None => {
                next_other = (next_other + 1) % others.len();
                others[next_other]
            }
        };
        let address = inner.members.get(&target).cloned().unwrap_or_default();
        let body = serde_json::to_vec(&RejoinRequest {
            member: inner.member,
            node: node.id,
        })
        .expect("a rejoin request serializes");
        let call = inner.transport.call(target, &address, KIND_REJOIN, body);
        let answer = match tokio::time::timeout(inner.request_timeout, call).await {
            Err(_) => Err(format!("no answer in {:?}", inner.request_timeout)),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(bytes)) => serde_json::from_slice::<RejoinReply>(&bytes)
                .map_err(|e| format!("unreadable answer: {e}")),
        };
        let why = match answer {
            Ok(RejoinReply::Done) => {
                backoff = RETRY_MIN;
                format!("member {target} (leader) made it a voter; waiting to learn it")
            }
            Ok(RejoinReply::InProgress) => {
                backoff = RETRY_MIN;
                format!("member {target} (leader) is catching it up as a learner")
            }
            Ok(RejoinReply::Busy { member }) => {
                format!("member {target} (leader) is rejoining member {member} first")
            }
            Ok(RejoinReply::NotLeader { leader }) => {
                hint = leader;
                format!("member {target} does not lead (leader: {leader:?})")
            }
            Ok(RejoinReply::Refused(why)) => {
                tracing::warn!(
                    id = inner.member,
                    target,
                    "consensus: rejoin refused: {why}"
                );
                format!("member {target} refused: {why}")
            }
            Err(e) => format!("member {target}: {e}"),
        };
        tracing::debug!(
            id = inner.member,
            node = node.id,
            "consensus: rejoining: {why}"
        );
        inner.set_phase(Phase::Rejoining, Some(why));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// On the leader: rejoins `member` as `node` (bounded); on failure removes the
/// learner it added, so the member asks again.
async fn promote(inner: Arc<Inner>, member: u64, node: u64) {
    let result = tokio::time::timeout(inner.catch_up_timeout, inner.add_and_promote(member, node))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "not caught up and promoted within {:?}",
                inner.catch_up_timeout
            ))
        });
    match result {
        Ok(()) => {
            tracing::info!(member, node, "consensus: the rejoining member is a voter")
        }
        Err(why) => {
            tracing::warn!(member, node, "consensus: rejoining failed: {why}");
            if let Some(own) = inner.node.get() {
                let only_learner = {
                    let m = own.metrics.borrow();
                    let learner = m
                        .membership_config
                        .membership()
                        .learner_ids()
                        .any(|l| l == node);
                    learner
                };
                if only_learner {
                    let removal = own.raft.change_membership(
                        ChangeMembers::RemoveNodes(BTreeSet::from([node])),
                        false,
                    );
                    match tokio::time::timeout(inner.request_timeout, removal).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => {
                            tracing::warn!(member, node, error = %e, "consensus: removing the learner")
                        }
                        Err(_) => tracing::warn!(
                            member,
                            node,
                            "consensus: removing the learner timed out"
                        ),
                    }
                }
            }
        }
    }
    *lock(&inner.rejoining) = None;
}
