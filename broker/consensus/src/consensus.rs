//! [`Consensus`]: one member's public handle: start, propose, read, handle the
//! other members' messages, stop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, InstallSnapshotError, RaftError};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::ServerState;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::bootstrap::bootstrap;
use crate::config::{self, ConsensusConfig};
use crate::inner::{lock, Inner};
use crate::messages::{ElectRequest, ProbeRequest, ProposeReply, RejoinRequest};
use crate::network::{
    KIND_APPEND, KIND_ELECT, KIND_PROBE, KIND_PROPOSE, KIND_REJOIN, KIND_SNAPSHOT, KIND_VOTE,
};
use crate::rejoin::rejoin;
use crate::store::{self, Identity};
use crate::{
    member_of, node_id, Command, CommandOutcome, ConsensusError, GroupState, Transport, TypeConfig,
};

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

/// How often a request waiting for a leader looks again.
const LEADER_POLL: Duration = Duration::from_millis(25);

/// One member's consensus: an embedded openraft node with durable storage.
pub struct Consensus {
    pub(crate) inner: Arc<Inner>,
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
    ///
    /// A directory whose Raft state holds a membership other than `config.members`
    /// is refused ([`ConsensusError::MembersMismatch`]).
    pub async fn start(
        config: ConsensusConfig,
        transport: Arc<dyn Transport>,
    ) -> Result<Consensus, ConsensusError> {
        check_members(&config)?;
        let raft_config = config::raft_config(&config)?;
        let opened = Opened::read(config.dir.clone()).await?;
        if let Some(stored) = opened.stored_members.clone() {
            if stored != config.members {
                return Err(ConsensusError::MembersMismatch {
                    configured: config.members.clone(),
                    stored,
                    dir: config.dir.display().to_string(),
                });
            }
        }
        let identity = trusted_identity(&config, opened.identity, opened.has_state).await?;
        let inner = Arc::new(Inner {
            member: config.id,
            configured: config.members.clone(),
            members: watch::channel(config.members.clone()).0,
            admitted: Mutex::new(BTreeMap::new()),
            dir: config.dir.clone(),
            raft_config: Arc::new(raft_config),
            transport,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            catch_up_timeout: Duration::from_millis(config.request_timeout_ms) * 6,
            state: opened.state,
            nonce: rand::random::<u64>() | 1,
            stores: Mutex::new(Some((opened.log_store, opened.state_machine))),
            identity: Mutex::new(identity.clone()),
            node: OnceLock::new(),
            phase: Mutex::new((Phase::Probing, None)),
            rejoining: Mutex::new(None),
            leading_since: Arc::default(),
            tasks: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let consensus = Consensus { inner };
        consensus.run(&config, identity).await?;
        Ok(consensus)
    }

    /// Starts the node `identity` names, or, with none, finds out in the
    /// background which node this member is.
    async fn run(
        &self,
        config: &ConsensusConfig,
        identity: Option<Identity>,
    ) -> Result<(), ConsensusError> {
        let inner = &self.inner;
        let Some(identity) = identity else {
            tracing::info!(
                id = config.id,
                members = ?config.members.keys().collect::<Vec<_>>(),
                "consensus: started with an empty directory; asking the other members whether the group exists"
            );
            let task = tokio::spawn(bootstrap(inner.clone()));
            inner.track(task);
            return Ok(());
        };
        let node = node_id(config.id, identity.incarnation);
        inner.create_node(node).await?;
        if identity.incarnation == 0 {
            // Raft state but no membership yet (the vote and log are
            // empty): initialize as every member of a brand-new group does.
            if let Err(e) = inner.initialize().await {
                self.shutdown().await;
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
        Ok(())
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
                    let address = inner.address(member).unwrap_or_default();
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
            KIND_ELECT => {
                let req: ElectRequest = decode(kind, body)?;
                inner.campaign(req.node).await?;
                serde_json::to_vec(&())
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

/// `config.id` is a member, and every member id is below 2^32.
fn check_members(config: &ConsensusConfig) -> Result<(), ConsensusError> {
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
    Ok(())
}

/// What a member's directory holds.
struct Opened {
    log_store: store::LogStore,
    state_machine: store::StateMachine,
    state: watch::Receiver<GroupState>,
    identity: Option<Identity>,
    has_state: bool,
    /// The membership its Raft state holds, if any.
    stored_members: Option<BTreeMap<u64, String>>,
}

impl Opened {
    /// Opens (creating it if missing) the directory `dir`.
    async fn read(dir: PathBuf) -> Result<Opened, ConsensusError> {
        let opened = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            let identity = Identity::read(&dir)?;
            let has_state = store::has_raft_state(&dir);
            let stored_members = store::stored_members(&dir)?;
            let log_store = store::LogStore::open(&dir)?;
            let (state_machine, state) = store::StateMachine::open(&dir)?;
            Ok::<_, std::io::Error>(Opened {
                log_store,
                state_machine,
                state,
                identity,
                has_state,
                stored_members,
            })
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(opened)
    }
}

/// The identity the directory holds, if this member may resume as it: it must be
/// this member's, and come with Raft state (a directory from before identities
/// has one written for it).
async fn trusted_identity(
    config: &ConsensusConfig,
    identity: Option<Identity>,
    has_state: bool,
) -> Result<Option<Identity>, ConsensusError> {
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
    match identity {
        Some(identity) if !has_state => {
            tracing::warn!(
                id = config.id,
                incarnation = identity.incarnation,
                "consensus: member.json without Raft state; starting as a member with an empty directory"
            );
            Ok(None)
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
            Ok(Some(legacy))
        }
        other => Ok(other),
    }
}
