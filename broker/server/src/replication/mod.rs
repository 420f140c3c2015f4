//! Replicated broker groups: one master takes writes, replicas mirror its CommitLog byte for
//! byte and dispatch their own ConsumeQueues.
//!
//! - The control plane (epoch, master, in-sync set, where each epoch starts) is agreed through
//!   `quiver-consensus` (openraft) among the group's members ([`controller`] elects).
//! - The data plane: replicas long-poll QUIVER_REPLICA_FETCH on the master's remoting port
//!   ([`replica`]); the master serves the bytes and counts the acknowledgements ([`master`]).
//! - Reads are fenced at the confirmed offset (held by every in-sync member), so a tail that
//!   a later epoch truncates is never read.

mod controller;
mod epoch_file;
#[cfg(test)]
mod fixture;
mod links;
mod master;
mod membership;
mod metadata;
mod rebuild;
mod replica;
mod roles;
mod stream;
mod switchover;
mod transport;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use quiver_consensus::{Consensus, GroupState};
use quiver_protocol::body::{ReplicaRole, ReplicaStatus, ReplicationStatus};
use quiver_store::CommitLogOffset;
use tokio::sync::{watch, Notify};

use crate::config::{BrokerConfig, ReplicationMode};
use crate::error::BrokerError;

pub use controller::{decide, Report};
pub use membership::{check_stored_members, flag_list, Members};
pub(crate) use membership::{Change as MembersChange, MembersError};
pub use metadata::{offset_table, ConsumerOffsetTable};
pub(crate) use switchover::DEFAULT_TIMEOUT as DEFAULT_SWITCHOVER_TIMEOUT;

/// What this member does now, as it acts on the group's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not part of a group: takes writes as before.
    Standalone,
    /// Starting, or the group has no master it can follow yet.
    Unknown,
    /// Takes writes for `epoch` (its start offset is agreed).
    Master { epoch: u64 },
    /// Mirrors `master`'s log of `epoch`.
    Replica { epoch: u64, master: u64 },
}

impl Role {
    /// The epoch this member acts in, if it has one.
    pub fn epoch(self) -> Option<u64> {
        match self {
            Role::Master { epoch } | Role::Replica { epoch, .. } => Some(epoch),
            Role::Standalone | Role::Unknown => None,
        }
    }
}

/// Why a write is refused on this member.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteRefusal {
    #[error("broker {name} is a replica (member {id}) of its group; the master is {master} (epoch {epoch}): send to the master")]
    Replica {
        name: String,
        id: u64,
        master: String,
        epoch: u64,
    },
    #[error("broker {name} (member {id}) has no master yet: the group is electing one")]
    NoMaster { name: String, id: u64 },
    #[error("broker {name}: {in_sync} member(s) in sync, fewer than min-in-sync-replicas {min}")]
    BelowMinInSync {
        name: String,
        in_sync: usize,
        min: u32,
    },
    #[error("broker {name}: mastership is being handed over; retry in a moment")]
    Switching { name: String },
    #[error("broker {name}: the master lost contact with its group; it takes no writes until it hears from it")]
    LeaseLost { name: String },
}

/// Why a sync send was stored but not confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfirmError {
    #[error("the in-sync replicas did not confirm the message within {0:?}; it is stored on the master and may or may not survive a failover")]
    Timeout(Duration),
    #[error("mastership moved while the message was being replicated; it may or may not survive")]
    Deposed,
    /// The in-sync set shrank while the send waited (Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND).
    #[error("only {holders} in-sync member(s) hold the message, fewer than min-in-sync-replicas {min}; it is stored on the master and may or may not survive a failover")]
    TooFewCopies { holders: usize, min: u32 },
}

/// What a member's replication reads and writes of its broker: the store, the committed
/// offsets, the topics and groups it copies from the master, the settled half messages it
/// reloads when it becomes the master, and the config.
pub trait Member: Send + Sync + 'static {
    fn store(&self) -> &Arc<quiver_store::MessageStore>;
    fn offsets(&self) -> &Arc<quiver_store::ConsumerOffsets>;
    fn topics(&self) -> &crate::topics::TopicManager;
    fn groups(&self) -> &crate::groups::GroupManager;
    fn config(&self) -> &crate::config::BrokerConfig;
    fn transactions(&self) -> &crate::transaction::Transactions;
    /// Applies the consumer-group state records this member holds (the state log) before it
    /// takes writes; how many it applied.
    fn apply_held_state(&self) -> Result<usize, quiver_store::StoreError>;
}

/// A group member's replication: its role, the master's view of its replicas, the read fence.
pub struct Replication {
    pub id: u64,
    /// The group's members and addresses: `--group-members` until the consensus knows the
    /// agreed membership, then that (it follows membership changes).
    pub members: Members,
    pub mode: ReplicationMode,
    pub min_in_sync: u32,
    broker_name: String,
    lag_max: Duration,
    master_timeout: Duration,
    timeout: Duration,
    consensus: std::sync::OnceLock<Consensus>,
    /// The group's agreed state (a default one until consensus starts).
    state: watch::Sender<GroupState>,
    role: watch::Sender<Role>,
    /// CommitLog bytes below this are held by every in-sync member.
    confirmed: watch::Sender<u64>,
    /// Woken after every append on the master: parked replica fetches look again.
    log_grew: Notify,
    /// Woken after every replica fetch the master recorded: a switchover waits on it.
    fetch_recorded: Notify,
    progress: Mutex<master::Progress>,
    /// On the master: each replica's stream of fetches in flight.
    streams: stream::Streams,
    reports: Mutex<controller::Reports>,
    epoch_file: epoch_file::EpochFile,
    /// Set while mastership is handed over: sends are refused, appends drained.
    switching: AtomicBool,
    /// This member is the agreed master but its log lost the epoch: it reports so.
    declined: AtomicBool,
    /// Recovered from an unclean stop and not caught up with a master since: its log may
    /// be shorter than what it acknowledged, so the group prefers others in elections.
    unclean: AtomicBool,
    /// On the master: members caught up that it is about to add to the in-sync set. They
    /// count for acknowledgements before the group can elect them (Kafka's maximal ISR).
    expanding: Mutex<BTreeSet<u64>>,
    /// Held shared by every append, exclusively by a switchover to drain them.
    appends: RwLock<()>,
    /// When the master last knew a quorum of its group still answered it (the lease runs
    /// two thirds of `master_timeout` from there: the group replaces a master only after a
    /// whole `master_timeout` of silence, so the two never take writes at once).
    lease: Mutex<Option<Instant>>,
    links: links::Links,
    /// The master's gRPC endpoint as a replica last learned it (GET_BROKER_CONFIG).
    master_grpc: Mutex<Option<(u64, String)>>,
    /// Rebuilds past the master's retention, and the cap of what it keeps for replicas.
    rebuilds: rebuild::Rebuilds,
}

impl Replication {
    /// The replication of `config`'s group; None for a standalone broker.
    pub fn new(config: &BrokerConfig) -> Result<Option<Arc<Replication>>, BrokerError> {
        if !config.is_replicated() {
            return Ok(None);
        }
        let members = config.members().map_err(BrokerError::Config)?;
        check_stored_members(&consensus_dir(config), &members).map_err(|reason| {
            BrokerError::Config(crate::config::ConfigError::Invalid {
                field: "group-members",
                reason,
            })
        })?;
        let epoch_file = epoch_file::EpochFile::open(&config.data_dir)?;
        Ok(Some(Arc::new(Replication {
            id: config.replica_id,
            members: Members::new(members),
            mode: config.replication,
            min_in_sync: config.min_in_sync_replicas,
            broker_name: config.broker_name.clone(),
            lag_max: Duration::from_millis(config.replica_lag_max_ms),
            master_timeout: Duration::from_millis(config.master_timeout_ms),
            timeout: Duration::from_millis(config.replication_timeout_ms),
            consensus: std::sync::OnceLock::new(),
            state: watch::channel(GroupState::default()).0,
            role: watch::channel(Role::Unknown).0,
            confirmed: watch::channel(0).0,
            log_grew: Notify::new(),
            fetch_recorded: Notify::new(),
            progress: Mutex::new(master::Progress::default()),
            streams: stream::Streams::default(),
            reports: Mutex::new(controller::Reports::default()),
            epoch_file,
            switching: AtomicBool::new(false),
            declined: AtomicBool::new(false),
            unclean: AtomicBool::new(false),
            expanding: Mutex::new(BTreeSet::new()),
            appends: RwLock::new(()),
            lease: Mutex::new(None),
            links: links::Links::new(config.peer_credentials(), config.peer_tls()),
            master_grpc: Mutex::new(None),
            rebuilds: rebuild::Rebuilds::new(config),
        })))
    }

    pub fn role(&self) -> Role {
        *self.role.borrow()
    }

    pub fn state(&self) -> GroupState {
        self.state.borrow().clone()
    }

    pub fn confirmed(&self) -> u64 {
        *self.confirmed.borrow()
    }

    /// The remoting address of member `id` (empty for one the group does not have).
    pub(crate) fn address_of(&self, id: u64) -> String {
        self.members.get(&id).cloned().unwrap_or_default()
    }

    /// Whether a write may be appended here now; the guard keeps a switchover from starting
    /// until the append is done.
    pub fn admit_write(&self) -> Result<parking_lot::RwLockReadGuard<'_, ()>, WriteRefusal> {
        let guard = self.appends.read();
        self.check_writable()?;
        Ok(guard)
    }

    fn check_writable(&self) -> Result<(), WriteRefusal> {
        let name = self.broker_name.clone();
        match self.role() {
            Role::Standalone => return Ok(()),
            Role::Unknown => return Err(WriteRefusal::NoMaster { name, id: self.id }),
            Role::Replica { epoch, master } => {
                return Err(WriteRefusal::Replica {
                    name,
                    id: self.id,
                    master: self.address_of(master),
                    epoch,
                })
            }
            Role::Master { .. } => {}
        }
        if self.switching.load(Ordering::Acquire) {
            return Err(WriteRefusal::Switching { name });
        }
        if !self.lease_fresh() {
            return Err(WriteRefusal::LeaseLost { name });
        }
        let in_sync = self.state.borrow().in_sync.len();
        if in_sync < self.min_in_sync as usize {
            return Err(WriteRefusal::BelowMinInSync {
                name,
                in_sync,
                min: self.min_in_sync,
            });
        }
        Ok(())
    }

    /// Whether a quorum confirmed this master's epoch within its lease (two thirds of
    /// `master_timeout`: the group replaces a master only after a whole one of silence).
    fn lease_fresh(&self) -> bool {
        self.lease
            .lock()
            .is_some_and(|at| at.elapsed() < self.master_timeout * 2 / 3)
    }

    /// After an append on the master: parked fetches look again and, with nobody else to
    /// wait for, the fence moves.
    pub fn appended(&self, store: &quiver_store::MessageStore) {
        self.log_grew.notify_waiters();
        self.advance_confirmed(store);
    }

    /// Waits until the in-sync members hold CommitLog bytes below `end` (sync mode; at once
    /// in async mode).
    pub async fn wait_confirmed(&self, end: CommitLogOffset) -> Result<(), ConfirmError> {
        if self.mode == ReplicationMode::Async {
            // Acknowledged at once, but only by a master still sure of its epoch: a send
            // appended before a long pause is not answered SEND_OK after it.
            return match self.role() {
                Role::Master { .. } if self.lease_fresh() => Ok(()),
                _ => Err(ConfirmError::Deposed),
            };
        }
        let Role::Master { epoch } = self.role() else {
            return Err(ConfirmError::Deposed);
        };
        let mut confirmed = self.confirmed.subscribe();
        let mut role = self.role.subscribe();
        let waited = tokio::time::timeout(self.timeout, async {
            loop {
                if *confirmed.borrow_and_update() >= end.0 {
                    return self.check_copies(end.0);
                }
                if *role.borrow_and_update() != (Role::Master { epoch }) {
                    return Err(ConfirmError::Deposed);
                }
                tokio::select! {
                    changed = confirmed.changed() => if changed.is_err() { return Err(ConfirmError::Deposed) },
                    changed = role.changed() => if changed.is_err() { return Err(ConfirmError::Deposed) },
                }
            }
        })
        .await;
        waited.unwrap_or(Err(ConfirmError::Timeout(self.timeout)))
    }

    /// A confirmed send is acknowledged only if at least `min_in_sync` agreed in-sync
    /// members hold it: the set may have shrunk while it waited.
    fn check_copies(&self, end: u64) -> Result<(), ConfirmError> {
        let in_sync = self.state.borrow().in_sync.clone();
        let holders = self.progress.lock().holders(self.id, end, &in_sync);
        if holders < self.min_in_sync as usize {
            return Err(ConfirmError::TooFewCopies {
                holders,
                min: self.min_in_sync,
            });
        }
        Ok(())
    }

    /// Whether this member leads its group's consensus now.
    pub fn leads_consensus(&self) -> bool {
        self.consensus().is_some_and(Consensus::is_leader)
    }

    /// Routes' broker addresses: the master as id 0, the replicas after it (by member id).
    pub fn route_addresses(&self) -> BTreeMap<i64, String> {
        let master = self.state.borrow().master;
        let mut addresses = BTreeMap::new();
        if let Some(master) = master {
            addresses.insert(0, self.address_of(master));
        }
        let replicas = self.members.iter().filter(|(id, _)| Some(**id) != master);
        for (next, (_, address)) in (1..).zip(replicas) {
            addresses.insert(next, address.clone());
        }
        addresses
    }

    /// Where 5.x clients reach this group for writes: this member's own gRPC endpoint on
    /// the master, the master's on a replica once learned; None while there is no master
    /// (or its endpoint is not known yet).
    pub fn grpc_route_endpoint(&self, own: &str) -> Option<String> {
        match self.role() {
            Role::Standalone | Role::Master { .. } => Some(own.to_owned()),
            Role::Replica { master, .. } => self
                .master_grpc
                .lock()
                .as_ref()
                .filter(|(id, _)| *id == master)
                .map(|(_, endpoint)| endpoint.clone()),
            Role::Unknown => None,
        }
    }

    /// The group as this member sees it (QUIVER_REPLICATION_STATUS).
    pub fn status(&self, store: &quiver_store::MessageStore) -> ReplicationStatus {
        let state = self.state();
        let role = self.role();
        let log_end = store.log_end().0;
        let replicas = match role {
            Role::Master { .. } => self.progress.lock().statuses(self, &state, log_end),
            _ => self.peer_statuses(&state, log_end, role),
        };
        ReplicationStatus {
            broker_name: self.broker_name.clone(),
            replica_id: self.id,
            mode: self.mode.as_str().to_owned(),
            min_in_sync_replicas: self.min_in_sync,
            epoch: state.epoch,
            master_id: state.master,
            master_address: state.master.map(|id| self.address_of(id)),
            in_sync_replicas: state.in_sync.iter().copied().collect(),
            confirmed_offset: self.confirmed(),
            writable: self.check_writable().is_ok(),
            replicas,
        }
    }

    /// Off the master, each member with the role the state gives it; only this member's log
    /// end is known.
    fn peer_statuses(&self, state: &GroupState, log_end: u64, role: Role) -> Vec<ReplicaStatus> {
        self.members
            .iter()
            .map(|(id, address)| {
                let member_role = if state.master == Some(*id) {
                    ReplicaRole::Master
                } else if *id == self.id && role == Role::Unknown {
                    ReplicaRole::Unknown
                } else {
                    ReplicaRole::Replica
                };
                let mine = *id == self.id;
                ReplicaStatus {
                    replica_id: *id,
                    address: address.clone(),
                    role: member_role,
                    in_sync: state.in_sync.contains(id),
                    log_end: if mine { log_end } else { 0 },
                    lag_bytes: 0,
                    lag_ms: 0,
                }
            })
            .collect()
    }

    /// The members' ids.
    pub(crate) fn member_ids(&self) -> BTreeSet<u64> {
        self.members.keys().copied().collect()
    }

    fn consensus(&self) -> Option<&Consensus> {
        self.consensus.get()
    }
}

/// Starts the group's consensus and the loops of this member: role changes, elections,
/// reports, and (by role) serving or following the log. Returns when `stop` flips.
pub async fn run(
    broker: Arc<dyn Member>,
    replication: Arc<Replication>,
    stop: watch::Receiver<bool>,
) {
    // A store that recovered a previous run's files without its clean-shutdown mark (a new,
    // or wiped, directory has nothing to recover and a new incarnation instead).
    let report = broker.store().recovery_report();
    let unclean = report.checkpoint_found && !report.clean_shutdown;
    replication.unclean.store(unclean, Ordering::Release);
    // The read fence starts where the store's checkpoint left it.
    replication
        .confirmed
        .send_replace(broker.store().confirmed().0);
    let dir = consensus_dir(broker.config());
    let started = transport::start_consensus(&replication, dir).await;
    let consensus = match started {
        Ok(consensus) => consensus,
        Err(error) => {
            tracing::error!(error = %crate::error::chain(&error), "cannot start the group's consensus: this member stays without a role");
            return;
        }
    };
    let mut applied = consensus.state();
    let agreed_members = consensus.members();
    let _ = replication.consensus.set(consensus);
    let forward = {
        let replication = replication.clone();
        let mut stop = stop.clone();
        async move {
            loop {
                let state = applied.borrow_and_update().clone();
                replication.state.send_replace(state);
                tokio::select! {
                    _ = stop.changed() => return,
                    changed = applied.changed() => if changed.is_err() { return },
                }
            }
        }
    };
    tokio::join!(
        forward,
        follow_members(&replication, agreed_members, stop.clone()),
        roles::run(broker.clone(), replication.clone(), stop.clone()),
        controller::run(broker.clone(), replication.clone(), stop.clone()),
        metadata::run(broker.clone(), replication.clone(), stop.clone()),
    );
    if let Some(consensus) = replication.consensus() {
        consensus.shutdown().await;
    }
}

/// Where a member keeps its consensus state.
fn consensus_dir(config: &BrokerConfig) -> std::path::PathBuf {
    config.data_dir.join("consensus")
}

/// Keeps the member map on the membership the consensus agrees: routes, statuses, links,
/// elections and the in-sync set follow it.
async fn follow_members(
    replication: &Replication,
    mut agreed: watch::Receiver<BTreeMap<u64, String>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let members = agreed.borrow_and_update().clone();
        if replication.members.replace(&members) {
            tracing::info!(members = %flag_list(&members), "the group's membership changed");
        }
        tokio::select! {
            _ = stop.changed() => return,
            changed = agreed.changed() => if changed.is_err() { return },
        }
    }
}
