//! Shared broker state: the store, offsets, topics, groups, consumers and parked pulls.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use quiver_store::{CommitLogOffset, ConsumerOffsets, MessageStore, QueueOffset, StoreError};

use crate::acl::Acl;
use crate::config::BrokerConfig;
use crate::consumers::ConsumerManager;
use crate::error::BrokerError;
use crate::groups::GroupManager;
use crate::locks::QueueLocks;
use crate::long_poll::LongPollRegistry;
use crate::metrics::Metrics;
use crate::peers::PeerView;
use crate::persist;
use crate::producers::ProducerManager;
use crate::topics::TopicManager;
use crate::transaction::Transactions;
use quiver_protocol::body::perm;
use quiver_remoting::{ByteBudget, PerConnectionBudget};

/// The in-flight byte budgets of the remoting port (`max-inflight-bytes[-per-connection]`).
pub struct ReadBudgets {
    pub shared: ByteBudget,
    pub per_connection: PerConnectionBudget,
}

/// The broker once it has opened; empty while the store recovers.
pub type BrokerSlot = Arc<std::sync::OnceLock<Arc<Broker>>>;

/// One broker's state managers, composed once at open and reached through accessors by the
/// services, the deliveries and the two front doors.
pub struct Broker {
    config: BrokerConfig,
    /// host:port clients and peers reach this broker at.
    advertised: String,
    /// STOREHOST of records and the address inside message ids.
    store_host: SocketAddr,
    store: Arc<MessageStore>,
    offsets: Arc<ConsumerOffsets>,
    topics: TopicManager,
    groups: GroupManager,
    consumers: ConsumerManager,
    producers: ProducerManager,
    long_poll: Arc<LongPollRegistry>,
    /// Per-stage times of sampled sends and parked-pull wake-ups (`--stage-sample-every`).
    stages: Arc<crate::stages::StageRecorder>,
    locks: QueueLocks,
    peers: PeerView,
    /// The config file `peers` is re-read from; None when the peers came from a flag.
    peers_file: Option<crate::peers::reload::PeersFile>,
    metrics: Metrics,
    /// Client connections of both ports: `max-connections`, `max-connections-per-address`.
    connection_slots: crate::slots::ConnectionSlots,
    /// What connections' requests may hold in memory: all of them, and each one.
    read_budgets: ReadBudgets,
    /// Which half messages are settled (transactional messages).
    transactions: Transactions,
    /// POP consumption (5.x clients' receive / ack): state, waiting receives, revive counts.
    pop: crate::pop::PopService,
    /// The accounts every request is checked against; None: ACL off.
    acl: Option<Acl>,
    /// The gRPC port's state: its endpoint, Telemetry sessions, auto-renewed receives, counters.
    grpc: crate::grpc_state::GrpcState,
    permission: AtomicI32,
    /// Woken by the store's flusher after every flush: Sync-mode senders re-check durability.
    flushed: Arc<tokio::sync::Notify>,
    /// Serialises writers of config/brokerRuntime.json.
    runtime_lock: parking_lot::Mutex<()>,
    /// Per delay level (queue of the schedule topic), the offset delivered up to, as the
    /// schedule loop last knew it; a level missing here has delivered nothing.
    delay_delivered: parking_lot::Mutex<std::collections::BTreeMap<u32, u64>>,
    /// The timer service's progress and counts (timed delivery).
    timers: crate::timer::TimerState,
    ready: AtomicBool,
    /// When the broker opened (ms since the epoch): GET_BROKER_RUNTIME_INFO's bootTimestamp.
    started_ms: i64,
    /// This member's replication when it is one of a group (`--group-members`).
    replication: Option<Arc<crate::replication::Replication>>,
}

impl Broker {
    // What the broker is composed of, for the services and front doors that use it.

    /// The configuration the broker opened with.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// host:port clients and peers reach this broker at.
    pub fn advertised(&self) -> &str {
        &self.advertised
    }

    /// STOREHOST of records and the address inside message ids.
    pub fn store_host(&self) -> SocketAddr {
        self.store_host
    }

    /// The message store.
    pub fn store(&self) -> &Arc<MessageStore> {
        &self.store
    }

    /// Consumer groups' committed offsets.
    pub fn offsets(&self) -> &Arc<ConsumerOffsets> {
        &self.offsets
    }

    /// Topic configs.
    pub fn topics(&self) -> &TopicManager {
        &self.topics
    }

    /// Subscription group configs.
    pub fn groups(&self) -> &GroupManager {
        &self.groups
    }

    /// Consumer connections by group.
    pub fn consumers(&self) -> &ConsumerManager {
        &self.consumers
    }

    /// Producer connections by group.
    pub fn producers(&self) -> &ProducerManager {
        &self.producers
    }

    /// Parked pulls.
    pub fn long_poll(&self) -> &Arc<LongPollRegistry> {
        &self.long_poll
    }

    /// Per-stage times of sampled requests.
    pub fn stages(&self) -> &Arc<crate::stages::StageRecorder> {
        &self.stages
    }

    /// Queue locks of orderly consumers.
    pub fn locks(&self) -> &QueueLocks {
        &self.locks
    }

    /// The other brokers of the cluster.
    pub fn peers(&self) -> &PeerView {
        &self.peers
    }

    /// The config file the peers follow, when they come from one.
    pub fn peers_file(&self) -> Option<&crate::peers::reload::PeersFile> {
        self.peers_file.as_ref()
    }

    /// Counters the metrics endpoint exports.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Client connections of both ports.
    pub fn connection_slots(&self) -> &crate::slots::ConnectionSlots {
        &self.connection_slots
    }

    /// What connections' requests may hold in memory.
    pub fn read_budgets(&self) -> &ReadBudgets {
        &self.read_budgets
    }

    /// Which half messages are settled.
    pub fn transactions(&self) -> &Transactions {
        &self.transactions
    }

    /// POP consumption.
    pub fn pop(&self) -> &crate::pop::PopService {
        &self.pop
    }

    /// The accounts every request is checked against; None: ACL off.
    pub fn acl(&self) -> &Option<Acl> {
        &self.acl
    }

    /// The gRPC port's shared state.
    pub fn grpc(&self) -> &crate::grpc_state::GrpcState {
        &self.grpc
    }

    /// Per delay level, the offset delivered up to.
    pub fn delay_delivered(&self) -> &parking_lot::Mutex<std::collections::BTreeMap<u32, u64>> {
        &self.delay_delivered
    }

    /// The timer service's progress and counts.
    pub fn timers(&self) -> &crate::timer::TimerState {
        &self.timers
    }

    /// When the broker opened (ms since the epoch).
    pub fn started_ms(&self) -> i64 {
        self.started_ms
    }

    /// This member's replication when it is one of a group.
    pub fn replication(&self) -> &Option<Arc<crate::replication::Replication>> {
        &self.replication
    }

    /// Opens the store (running recovery) and loads the config files. Blocking.
    pub fn open(config: BrokerConfig, bound: SocketAddr) -> Result<Broker, BrokerError> {
        let advertised = config.advertised_addr(bound);
        let acl = config.acl_file.as_deref().map(Acl::load).transpose()?;
        // Before recovery: a change of the file while the store opens is still seen.
        let peers_file = config
            .peers_file
            .as_deref()
            .map(crate::peers::reload::PeersFile::open);
        let store_host = resolve(&advertised).unwrap_or(bound);
        let replication = crate::replication::Replication::new(&config)?;
        let store =
            MessageStore::open(config.store_config()).map_err(BrokerError::store("open"))?;
        let config_dir = config.data_dir.join("config");
        let offsets =
            ConsumerOffsets::load(&config_dir).map_err(BrokerError::store("load offsets"))?;
        let topics = TopicManager::load(&config.data_dir)?;
        let transactions = Transactions::load(&store, &offsets)?;
        let groups = GroupManager::load(&config.data_dir, config.max_reconsume_times)?;
        let long_poll = LongPollRegistry::new(
            config.max_parked_pulls,
            config.max_parked_pulls_per_connection,
        );
        let pop_wakers = Arc::new(crate::pop::Wakers::default());
        let pop = crate::pop::PopService::open(&config, pop_wakers.clone())
            .map_err(BrokerError::store("open pop state"))?;
        let timers = crate::timer::TimerState::default();
        hook_dispatch(&store, long_poll.clone(), pop_wakers, timers.wake.clone());
        let flushed = Arc::new(tokio::sync::Notify::new());
        let flushed_hook = flushed.clone();
        store.set_flushed_hook(Arc::new(move || flushed_hook.notify_waiters()));
        let peers = PeerView::new(&config.peers);
        let permission = saved_permission(&config)?;
        Ok(Broker {
            permission: AtomicI32::new(permission),
            flushed,
            runtime_lock: parking_lot::Mutex::new(()),
            delay_delivered: parking_lot::Mutex::default(),
            timers,
            advertised,
            store_host,
            store: Arc::new(store),
            offsets: Arc::new(offsets),
            topics,
            groups,
            consumers: ConsumerManager::default(),
            producers: ProducerManager::default(),
            long_poll,
            stages: crate::stages::StageRecorder::new(config.stage_sample_every),
            locks: QueueLocks::default(),
            peers,
            peers_file,
            metrics: Metrics::default(),
            connection_slots: crate::slots::ConnectionSlots::new(
                config.max_connections,
                config.max_connections_per_address,
            ),
            read_budgets: ReadBudgets {
                shared: ByteBudget::new(config.max_inflight_bytes),
                per_connection: PerConnectionBudget::new(config.max_inflight_bytes_per_connection),
            },
            transactions,
            pop,
            acl,
            grpc: crate::grpc_state::GrpcState::default(),
            ready: AtomicBool::new(false),
            started_ms: crate::now_ms(),
            replication,
            config,
        })
    }

    /// Waits, holding no thread, until CommitLog bytes below `end` are durable: at once in
    /// Async mode; in Sync mode when the group commit covering them has finished.
    pub async fn wait_durable(&self, end: CommitLogOffset) -> Result<(), StoreError> {
        if self.store.request_durable(end) {
            return Ok(());
        }
        loop {
            let flushed = self.flushed.notified();
            tokio::pin!(flushed);
            // Registered before the check, so a flush finishing in between still wakes us.
            flushed.as_mut().enable();
            if let Some(status) = self.store.durable_status(end) {
                return status;
            }
            flushed.await;
        }
    }

    /// Whether this broker takes writes now: a standalone broker always, a group member
    /// while it is the master. Background deliveries (delays, timers, transaction checks,
    /// POP revives) run only then.
    pub fn takes_writes(&self) -> bool {
        self.replication.as_ref().is_none_or(|replication| {
            matches!(replication.role(), crate::replication::Role::Master { .. })
        })
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn permission(&self) -> i32 {
        self.permission.load(Ordering::Acquire)
    }

    pub fn set_permission(&self, permission: i32) {
        self.permission.store(permission, Ordering::Release);
    }

    pub fn is_writable(&self) -> bool {
        perm::is_writeable(self.permission())
    }

    pub fn is_readable(&self) -> bool {
        perm::is_readable(self.permission())
    }

    /// Persists the settings changed at run time (UPDATE_BROKER_CONFIG). Blocking.
    pub fn persist_runtime(&self) -> Result<(), BrokerError> {
        let _writer = self.runtime_lock.lock();
        let settings = RuntimeSettings {
            broker_permission: self.permission(),
        };
        persist::write_json(&runtime_settings_path(&self.config), &settings)
    }

    /// The lowest CommitLog offset still to be read: by a consumer group with committed
    /// offsets, by the delay levels' delivery (a delayed message not yet moved to its
    /// topic) or by the timer service (a timer not enqueued or not fired yet). Retention under disk pressure deletes nothing from there on. Blocking.
    pub fn lowest_unread(&self) -> Option<CommitLogOffset> {
        let mut positions = Vec::new();
        for group in self.offsets.groups() {
            for topic in self.offsets.topics_of(&group) {
                for (queue_id, committed) in self.offsets.table(&group, &topic) {
                    positions.push((topic.clone(), queue_id, committed));
                }
            }
        }
        let delivered = self.delay_delivered.lock().clone();
        for level in 0..crate::schedule::DELAY_LEVELS_MS.len() as u32 {
            let next = QueueOffset(delivered.get(&level).copied().unwrap_or(0));
            positions.push((crate::topics::SCHEDULE_TOPIC.to_owned(), level, next));
        }
        // The state log's records past the offset snapshot are replayed at start.
        positions.push((
            crate::topics::STATE_TOPIC.to_owned(),
            crate::topics::STATE_QUEUE,
            QueueOffset(self.offsets.persisted_position()),
        ));
        let enqueued = self.timers.enqueued_offset.load(Ordering::Acquire);
        positions.push((
            crate::timer::TIMER_TOPIC.to_owned(),
            crate::timer::TIMER_QUEUE,
            QueueOffset(enqueued),
        ));
        positions
            .into_iter()
            .filter_map(|(topic, queue_id, next)| {
                let first = next.max(self.store.min_offset(&topic, queue_id));
                self.store.physical_offset_at(&topic, queue_id, first)
            })
            .chain(self.timers.lowest_pending())
            .min()
    }

    /// Persists offsets, topics and groups (atomic writes). Blocking. Nothing is written once
    /// the data directory is gone: a write would create a new, empty one.
    pub fn persist_all(&self) -> Result<(), BrokerError> {
        let gone = self.store.disk_status().refusal.map(|r| r.reason)
            == Some(quiver_store::RefusalReason::DataDirGone);
        if gone {
            return Ok(());
        }
        self.offsets
            .persist()
            .map_err(|source| BrokerError::Persist {
                path: self
                    .config
                    .data_dir
                    .join("config")
                    .join("consumerOffset.json"),
                source,
            })?;
        self.topics.persist()?;
        self.pop.flush().map_err(|source| BrokerError::Store {
            op: "flush pop state",
            source,
        })?;
        self.groups.persist()
    }
}

/// Wakes, at every dispatch, the pulls parked on the queue, the POP receives waiting on the
/// topic, and the timer service when the dispatch is to the timer topic.
fn hook_dispatch(
    store: &MessageStore,
    parked: Arc<LongPollRegistry>,
    pop_wakers: Arc<crate::pop::Wakers>,
    timer_wake: Arc<crate::timer::TimerWake>,
) {
    store.set_dispatch_hook(Arc::new(move |event: &quiver_store::DispatchEvent<'_>| {
        parked.notify(event.topic, event.queue_id);
        pop_wakers.wake(event.topic);
        if event.topic == crate::timer::TIMER_TOPIC {
            timer_wake.wake();
        }
    }));
}

/// The broker permission: the last UPDATE_BROKER_CONFIG's when one was persisted, else the
/// configured one.
fn saved_permission(config: &BrokerConfig) -> Result<i32, BrokerError> {
    let runtime_path = runtime_settings_path(config);
    Ok(
        match persist::read_json::<RuntimeSettings>(&runtime_path)? {
            Some(saved) => {
                tracing::info!(
                    permission = saved.broker_permission,
                    path = %runtime_path.display(),
                    "brokerPermission restored from the last UPDATE_BROKER_CONFIG"
                );
                saved.broker_permission
            }
            None => config.broker_permission,
        },
    )
}

/// Runs blocking store work off the async workers.
pub async fn blocking<T, F>(broker: &Arc<Broker>, work: F) -> Result<T, BrokerError>
where
    T: Send + 'static,
    F: FnOnce(&Broker) -> T + Send + 'static,
{
    let broker = broker.clone();
    tokio::task::spawn_blocking(move || work(&broker))
        .await
        .map_err(BrokerError::Blocking)
}

/// Settings changed by UPDATE_BROKER_CONFIG; they override the config file on restart.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuntimeSettings {
    broker_permission: i32,
}

fn runtime_settings_path(config: &BrokerConfig) -> std::path::PathBuf {
    config.data_dir.join("config").join("brokerRuntime.json")
}

fn resolve(addr: &str) -> Option<SocketAddr> {
    let resolved = addr.to_socket_addrs().ok()?.find(SocketAddr::is_ipv4);
    resolved.map(|found| {
        if found.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], found.port()))
        } else {
            found
        }
    })
}
