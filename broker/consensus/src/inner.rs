//! The state a member's [`Consensus`](crate::Consensus) shares with its
//! background tasks, and the operations on its Raft node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Raft, RaftMetrics};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::messages::ProposeReply;
use crate::store::{self, Identity};
use crate::{
    member_of, network, node_id, Command, ConsensusError, GroupState, Phase, Transport, TypeConfig,
};

/// The bounds of the wait between two probe rounds (doubling) and between two
/// rejoin requests.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(100);
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(2);

/// This member's Raft node, once it knows which one it is.
pub(crate) struct Node {
    pub(crate) id: u64,
    pub(crate) raft: Raft<TypeConfig>,
    pub(crate) metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
}

impl Node {
    /// Whether this node is a voter of the group's uniform membership.
    pub(crate) fn is_voter(&self) -> bool {
        let m = self.metrics.borrow();
        let configs = m.membership_config.membership().get_joint_config();
        configs.len() == 1 && configs[0].contains(&self.id)
    }
}

pub(crate) struct Inner {
    pub(crate) member: u64,
    /// The members this member was started with (`ConsensusConfig::members`): whom it
    /// probes, and the membership of a brand-new group.
    pub(crate) configured: BTreeMap<u64, String>,
    /// The members and addresses of the group's membership as this member's node knows
    /// it (`configured` until it knows one).
    pub(crate) members: watch::Sender<BTreeMap<u64, String>>,
    /// On the leader: members an `add_member` waits for, and their addresses; their
    /// rejoin requests are taken as those of members.
    pub(crate) admitted: Mutex<BTreeMap<u64, String>>,
    pub(crate) dir: PathBuf,
    pub(crate) raft_config: Arc<openraft::Config>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) request_timeout: Duration,
    pub(crate) catch_up_timeout: Duration,
    pub(crate) state: watch::Receiver<GroupState>,
    /// Tells this start apart in probe answers (random).
    pub(crate) nonce: u64,
    /// The log store and state machine, until the node takes them.
    pub(crate) stores: Mutex<Option<(store::LogStore, store::StateMachine)>>,
    /// Set once this member has decided who it is (before its node exists).
    pub(crate) identity: Mutex<Option<Identity>>,
    pub(crate) node: OnceLock<Node>,
    pub(crate) phase: Mutex<(Phase, Option<String>)>,
    /// On the leader: the (member, node) being rejoined.
    pub(crate) rejoining: Mutex<Option<(u64, u64)>>,
    /// Since when this member's node leads, and in which term (as first seen in its
    /// metrics: no earlier than openraft's own record of its vote).
    pub(crate) leading_since: Arc<Mutex<Option<(u64, Instant)>>>,
    pub(crate) tasks: Mutex<Vec<JoinHandle<()>>>,
    pub(crate) stopped: AtomicBool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn random_nonzero_u32() -> u32 {
    loop {
        let v: u32 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

impl Inner {
    pub(crate) fn set_phase(&self, phase: Phase, waiting_for: Option<String>) {
        *lock(&self.phase) = (phase, waiting_for);
    }

    /// Keeps `task` to stop it at shutdown (or stops it now if stopped).
    pub(crate) fn track(&self, task: JoinHandle<()>) {
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.is_finished());
        if self.stopped.load(Ordering::SeqCst) {
            task.abort();
        }
        tasks.push(task);
    }

    /// Starts this member's Raft node as node `id`.
    pub(crate) async fn create_node(&self, id: u64) -> Result<&Node, ConsensusError> {
        let stores = lock(&self.stores).take();
        let (log_store, state_machine) =
            stores.ok_or_else(|| ConsensusError::Raft("the Raft node exists already".into()))?;
        let raft = Raft::new(
            id,
            self.raft_config.clone(),
            network::NetworkFactory {
                transport: self.transport.clone(),
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
        let metrics = node.metrics.clone();
        if self.node.set(node).is_err() {
            return Err(ConsensusError::Raft("the Raft node exists already".into()));
        }
        let task = tokio::spawn(follow_membership(metrics.clone(), self.members.clone()));
        self.track(task);
        let task = tokio::spawn(follow_leadership(id, metrics, self.leading_since.clone()));
        self.track(task);
        Ok(self.node.get().expect("just set"))
    }

    /// The address of `member`: the group's membership's, else the configured one, else
    /// the one an `add_member` admitted it with.
    pub(crate) fn address(&self, member: u64) -> Option<String> {
        let agreed = self.members.borrow().get(&member).cloned();
        agreed
            .or_else(|| self.configured.get(&member).cloned())
            .or_else(|| lock(&self.admitted).get(&member).cloned())
    }

    /// The other members: of the group's membership as known, and configured.
    pub(crate) fn others(&self) -> Vec<u64> {
        let known: std::collections::BTreeSet<u64> = self
            .members
            .borrow()
            .keys()
            .chain(self.configured.keys())
            .copied()
            .filter(|m| *m != self.member)
            .collect();
        known.into_iter().collect()
    }

    /// Initializes a brand-new group (every member at incarnation 0) on this
    /// member's node if it is not initialized; the same membership on every
    /// member that does it.
    pub(crate) async fn initialize(&self) -> Result<(), ConsensusError> {
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
            .configured
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
    pub(crate) fn raft_message<T: serde::de::DeserializeOwned>(
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
    pub(crate) async fn write_local(&self, command: Command) -> ProposeReply {
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
}

/// The members (and addresses) of a Raft membership: every node, voter or learner, of
/// every configuration in it, by the member it belongs to.
pub(crate) fn members_of(
    membership: &openraft::Membership<u64, BasicNode>,
) -> BTreeMap<u64, String> {
    membership
        .nodes()
        .map(|(node, n)| (member_of(*node), n.addr.clone()))
        .collect()
}

/// Publishes the node's membership as members and addresses whenever it changes (a node
/// that knows none yet, e.g. rejoining, keeps what was there).
async fn follow_membership(
    mut metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    members: watch::Sender<BTreeMap<u64, String>>,
) {
    loop {
        let known = members_of(metrics.borrow_and_update().membership_config.membership());
        if !known.is_empty() {
            members.send_if_modified(|current| {
                let changed = *current != known;
                if changed {
                    *current = known;
                }
                changed
            });
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Records since when node `id` leads (the term and the instant it is first seen leading),
/// None while it does not: a leadership transfer waits until the leader's own lease on its
/// vote has passed.
async fn follow_leadership(
    id: u64,
    mut metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    leading_since: Arc<Mutex<Option<(u64, Instant)>>>,
) {
    loop {
        let term = {
            let m = metrics.borrow_and_update();
            let leads = m.state == openraft::ServerState::Leader && m.current_leader == Some(id);
            leads.then_some(m.current_term)
        };
        {
            let mut since = lock(&leading_since);
            match term {
                Some(term) if since.is_some_and(|(t, _)| t == term) => {}
                Some(term) => *since = Some((term, Instant::now())),
                None => *since = None,
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
