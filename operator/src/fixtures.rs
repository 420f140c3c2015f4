//! Test fixtures: resource builders that read like sentences and an in-memory `BrokerAdmin`
//! (the API server is `crate::testapi`).

use crate::admin::{
    account_scope, AdminError, BrokerAccess, BrokerAddr, BrokerAdmin, BrokerPermission,
    ConsumeStats, QueueConsumeStats, QueueOffset, QueueTopicStats, ReplicaRole, ReplicaStatus,
    ReplicationStatus, ResetTarget, RuntimeInfo, SubscriptionGroup, TopicConfig, TopicStats,
};
use crate::crd::{
    Broker, BrokerSpec, ConsumeFromWhere, ConsumerGroup, ConsumerGroupSpec, FlushDiskType,
    PodOverrides, RetentionSpec, StorageSpec, TopicSpec, VolumeRetentionPolicy,
};
use futures::future::{BoxFuture, FutureExt};
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Mutex;
use std::time::Duration;

/// Builders for Broker test objects.
pub trait BrokerFixture: Sized {
    /// Broker `ns/qb`, one replica, 10Gi, default image.
    fn test() -> Self;
    /// Sets spec.replicas.
    fn replicas(self, replicas: i32) -> Self;
    /// Sets spec.image.
    fn image(self, image: &str) -> Self;
    /// Sets spec.storage.size.
    fn storage_size(self, size: &str) -> Self;
    /// Sets spec.replication: groups of `replicas` pods, sync, `min_in_sync` in sync.
    fn replicated(self, replicas: i32, min_in_sync: i32) -> Self;
    /// Fills every optional field.
    fn full_spec(self) -> Self;
}

impl BrokerFixture for Broker {
    fn test() -> Self {
        let mut broker = Broker::new(
            "qb",
            BrokerSpec {
                replicas: 1,
                image: String::new(),
                storage: StorageSpec {
                    size: "10Gi".to_string(),
                    storage_class_name: None,
                    retention_policy: VolumeRetentionPolicy::Retain,
                },
                resources: None,
                flush_disk_type: FlushDiskType::Async,
                topics: Vec::new(),
                retention: None,
                pod_template: None,
                progress_deadline_seconds: crate::crd::DEFAULT_PROGRESS_DEADLINE_SECONDS,
                network_policy: None,
                security: None,
                replication: None,
            },
        );
        broker.metadata = ObjectMeta {
            name: Some("qb".to_string()),
            namespace: Some("ns".to_string()),
            uid: Some("uid-qb".to_string()),
            generation: Some(1),
            ..ObjectMeta::default()
        };
        broker
    }

    fn replicas(mut self, replicas: i32) -> Self {
        self.spec.replicas = replicas;
        self
    }

    fn image(mut self, image: &str) -> Self {
        self.spec.image = image.to_string();
        self.metadata.generation = self.metadata.generation.map(|generation| generation + 1);
        self
    }

    fn storage_size(mut self, size: &str) -> Self {
        self.spec.storage.size = size.to_string();
        self
    }

    fn replicated(mut self, replicas: i32, min_in_sync: i32) -> Self {
        self.spec.replication = Some(crate::crd::ReplicationSpec {
            replicas,
            mode: crate::crd::ReplicationMode::Sync,
            min_in_sync_replicas: min_in_sync,
        });
        self
    }

    fn full_spec(mut self) -> Self {
        self.spec.storage.storage_class_name = Some("fast-ssd".to_string());
        self.spec.storage.retention_policy = VolumeRetentionPolicy::Delete;
        self.spec.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("2Gi".to_string()),
            )])),
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                Quantity("500m".to_string()),
            )])),
            ..ResourceRequirements::default()
        });
        self.spec.flush_disk_type = FlushDiskType::Sync;
        self.spec.topics = vec![TopicSpec {
            name: "orders".to_string(),
            queues: 4,
        }];
        self.spec.retention = Some(RetentionSpec {
            file_reserved_hours: 48,
            disk_high_water_percent: Some(70),
            disk_clean_percent: Some(55),
            disk_force_clean_percent: Some(65),
        });
        self.spec.pod_template = Some(PodOverrides {
            tolerations: vec![Toleration {
                key: Some("dedicated".to_string()),
                ..Toleration::default()
            }],
            node_selector: BTreeMap::from([("disk".to_string(), "ssd".to_string())]),
            termination_grace_period_seconds: Some(120),
            ..PodOverrides::default()
        });
        self
    }
}

/// Builders for ConsumerGroup test objects.
pub trait GroupFixture: Sized {
    /// Group `ns/billing` on Broker `qb`, topic `orders`.
    fn test() -> Self;
}

impl GroupFixture for ConsumerGroup {
    fn test() -> Self {
        let mut group = ConsumerGroup::new(
            "billing",
            ConsumerGroupSpec {
                broker_ref: "qb".to_string(),
                topics: vec!["orders".to_string()],
                consume_from_where: ConsumeFromWhere::ConsumeFromLastOffset,
                max_reconsume_times: 16,
                consume_enable: true,
                lag_thresholds: None,
                offset_reset: None,
                delete_offsets_on_delete: false,
            },
        );
        group.metadata = ObjectMeta {
            name: Some("billing".to_string()),
            namespace: Some("ns".to_string()),
            uid: Some("uid-billing".to_string()),
            generation: Some(1),
            ..ObjectMeta::default()
        };
        group
    }
}

/// In-memory brokers: the second `BrokerAdmin` implementation.
#[derive(Default)]
pub struct FakeAdmin {
    state: Mutex<FakeBrokers>,
}

#[derive(Default)]
struct FakeBrokers {
    permissions: BTreeMap<BrokerAddr, BrokerPermission>,
    groups: BTreeMap<BrokerAddr, BTreeMap<String, SubscriptionGroup>>,
    queues: BTreeMap<(BrokerAddr, String), Vec<QueueConsumeStats>>,
    topics: BTreeMap<BrokerAddr, BTreeMap<String, TopicConfig>>,
    topic_queues: BTreeMap<(BrokerAddr, String), BTreeMap<i32, QueueTopicStats>>,
    resets: Vec<(BrokerAddr, String, String, ResetTarget)>,
    deleted: Vec<(BrokerAddr, String)>,
    unreachable: HashSet<BrokerAddr>,
    members: BTreeMap<(BrokerAddr, String), Vec<String>>,
    runtime: BTreeMap<BrokerAddr, Option<RuntimeInfo>>,
    upserts: usize,
    topic_creates: usize,
    /// Per account scope: the access key calls are signed with.
    accounts: BTreeMap<String, String>,
    /// Per account scope: the TLS settings calls use.
    tls: BTreeMap<String, quiver_client::TlsConfig>,
    /// When set, the brokers have ACL on: a call not signed with this access key is refused.
    required_access_key: Option<String>,
    /// Per broker: the access key of the last call (None: unsigned).
    last_signer: BTreeMap<BrokerAddr, Option<String>>,
    /// Replicated broker groups, by broker name.
    replication: BTreeMap<String, FakeGroup>,
    /// Switchovers asked for, in order: (the address sent to, the target replica id).
    switchovers: Vec<(BrokerAddr, u64)>,
}

/// A replicated broker group as its members report it.
#[derive(Clone, Debug)]
struct FakeGroup {
    /// Member addresses by replica id.
    members: Vec<BrokerAddr>,
    min_in_sync: u32,
    epoch: u64,
    master: Option<u64>,
    in_sync: Vec<u64>,
}

impl FakeGroup {
    fn status(&self, name: &str, answering: u64) -> ReplicationStatus {
        let replicas = self
            .members
            .iter()
            .zip(0u64..)
            .map(|(addr, id)| {
                let in_sync = self.in_sync.contains(&id);
                ReplicaStatus {
                    replica_id: id,
                    address: addr.0.clone(),
                    role: match self.master {
                        Some(master) if master == id => ReplicaRole::Master,
                        Some(_) => ReplicaRole::Replica,
                        None => ReplicaRole::Unknown,
                    },
                    in_sync,
                    log_end: if in_sync { 4096 } else { 1024 },
                    lag_bytes: if in_sync { 0 } else { 3072 },
                    lag_ms: if in_sync { 0 } else { 2500 },
                }
            })
            .collect();
        ReplicationStatus {
            broker_name: name.to_string(),
            replica_id: answering,
            mode: "sync".to_string(),
            min_in_sync_replicas: self.min_in_sync,
            epoch: self.epoch,
            master_id: self.master,
            master_address: self
                .master
                .and_then(|master| self.members.get(usize::try_from(master).ok()?))
                .map(|addr| addr.0.clone()),
            in_sync_replicas: self.in_sync.clone(),
            confirmed_offset: 4096,
            writable: self.master.is_some() && self.in_sync.len() >= self.min_in_sync as usize,
            replicas,
        }
    }
}

impl FakeAdmin {
    fn with_state<T>(&self, f: impl FnOnce(&mut FakeBrokers) -> T) -> T {
        f(&mut self.state.lock().expect("fake admin lock poisoned"))
    }

    /// Sets the stats of one queue of `group` on `addr`.
    pub fn set_queue(
        &self,
        addr: &str,
        group: &str,
        (topic, queue_id): (&str, i32),
        max: u64,
        committed: Option<u64>,
        oldest_ms: Option<i64>,
    ) {
        let addr = BrokerAddr(addr.to_string());
        let broker_name = addr.0.split('.').next().unwrap_or_default().to_string();
        self.with_state(|state| {
            state
                .groups
                .entry(addr.clone())
                .or_default()
                .entry(group.to_string())
                .or_insert_with(|| SubscriptionGroup {
                    group: group.to_string(),
                    consume_enable: true,
                    consume_from_min_enable: false,
                    retry_queue_nums: 1,
                    max_reconsume_times: 16,
                });
            let queues = state.queues.entry((addr, group.to_string())).or_default();
            queues.retain(|queue| !(queue.topic == topic && queue.queue_id == queue_id));
            queues.push(QueueConsumeStats {
                topic: topic.to_string(),
                broker_name,
                queue_id,
                broker_offset: QueueOffset(max),
                consumer_offset: committed.map(QueueOffset),
                oldest_unconsumed_store_ms: oldest_ms,
            });
        });
    }

    /// Sets the stored messages of one queue of `topic` on `addr`: offsets `min..max`, the last
    /// stored at `last_update_ms`. The topic then shows in the broker's topic list.
    pub fn set_topic_queue(
        &self,
        addr: &str,
        (topic, queue_id): (&str, i32),
        (min, max): (u64, u64),
        last_update_ms: Option<i64>,
    ) {
        let addr = BrokerAddr(addr.to_string());
        let broker_name = addr.0.split('.').next().unwrap_or_default().to_string();
        self.with_state(|state| {
            state
                .topic_queues
                .entry((addr, topic.to_string()))
                .or_default()
                .insert(
                    queue_id,
                    QueueTopicStats {
                        broker_name,
                        queue_id,
                        min_offset: QueueOffset(min),
                        max_offset: QueueOffset(max),
                        last_update_ms,
                    },
                );
        });
    }

    /// Topic creations so far, over all brokers.
    pub fn topic_creates(&self) -> usize {
        self.with_state(|state| state.topic_creates)
    }

    /// Subscription group upserts so far, over all brokers.
    pub fn upserts(&self) -> usize {
        self.with_state(|state| state.upserts)
    }

    /// Forgets `group` on `addr`, as a broker whose store was replaced would.
    pub fn forget_group(&self, addr: &str, group: &str) {
        self.with_state(|state| {
            if let Some(groups) = state.groups.get_mut(&BrokerAddr(addr.to_string())) {
                groups.remove(group);
            }
        });
    }

    /// Sets the live members of `group` connected to `addr`.
    pub fn set_members(&self, addr: &str, group: &str, members: &[&str]) {
        self.with_state(|state| {
            let members = members.iter().map(|member| member.to_string()).collect();
            state
                .members
                .insert((BrokerAddr(addr.to_string()), group.to_string()), members);
        });
    }

    /// Simulates `group` consuming everything stored on `addr`.
    pub fn consume_all(&self, addr: &str, group: &str) {
        self.with_state(|state| {
            if let Some(queues) = state
                .queues
                .get_mut(&(BrokerAddr(addr.to_string()), group.to_string()))
            {
                for queue in queues {
                    queue.consumer_offset = Some(queue.broker_offset);
                    queue.oldest_unconsumed_store_ms = None;
                }
            }
        });
    }

    /// Permission last set on `addr`.
    pub fn permission(&self, addr: &str) -> Option<BrokerPermission> {
        self.with_state(|state| {
            state
                .permissions
                .get(&BrokerAddr(addr.to_string()))
                .copied()
        })
    }

    /// Subscription group config of `group` on `addr`.
    pub fn group(&self, addr: &str, group: &str) -> Option<SubscriptionGroup> {
        self.with_state(|state| {
            state
                .groups
                .get(&BrokerAddr(addr.to_string()))
                .and_then(|groups| groups.get(group))
                .cloned()
        })
    }

    /// Topics created on `addr`.
    pub fn topics(&self, addr: &str) -> Vec<TopicConfig> {
        self.with_state(|state| {
            state
                .topics
                .get(&BrokerAddr(addr.to_string()))
                .map(|topics| topics.values().cloned().collect())
                .unwrap_or_default()
        })
    }

    /// Offset resets applied, in order.
    pub fn resets(&self) -> Vec<(BrokerAddr, String, String, ResetTarget)> {
        self.with_state(|state| state.resets.clone())
    }

    /// Groups deleted, in order.
    pub fn deleted(&self) -> Vec<(BrokerAddr, String)> {
        self.with_state(|state| state.deleted.clone())
    }

    /// What `addr` answers to GET_BROKER_RUNTIME_INFO from now on; `None`: REQUEST_CODE_NOT_SUPPORTED,
    /// as a broker older than the request. Until set, a broker reports [`disk_report`]`(0.25, None)`.
    pub fn set_runtime_info(&self, addr: &str, info: Option<RuntimeInfo>) {
        self.with_state(|state| state.runtime.insert(BrokerAddr(addr.to_string()), info));
    }

    /// Makes every call to `addr` fail as unreachable.
    pub fn make_unreachable(&self, addr: &str) {
        self.with_state(|state| state.unreachable.insert(BrokerAddr(addr.to_string())));
    }

    /// Makes `addr` answer again.
    pub fn make_reachable(&self, addr: &str) {
        self.with_state(|state| state.unreachable.remove(&BrokerAddr(addr.to_string())));
    }

    /// Turns ACL on: calls not signed with `access_key` are refused with NO_PERMISSION.
    pub fn require_access_key(&self, access_key: &str) {
        self.with_state(|state| state.required_access_key = Some(access_key.to_string()));
    }

    /// The TLS settings calls to `addr` use; None: plain.
    pub fn tls_of(&self, addr: &str) -> Option<quiver_client::TlsConfig> {
        let addr = BrokerAddr(addr.to_string());
        self.with_state(|state| state.tls.get(account_scope(&addr)).cloned())
    }

    /// The access key the last call to `addr` was signed with; None if unsigned or no call.
    pub fn last_signer(&self, addr: &str) -> Option<String> {
        self.with_state(|state| {
            state
                .last_signer
                .get(&BrokerAddr(addr.to_string()))
                .cloned()
                .flatten()
        })
    }

    /// Makes `members` (addresses by replica id) a replicated group `name` with replica 0 its
    /// master and every member in sync, at epoch 1.
    pub fn set_replication_group(&self, name: &str, members: &[String], min_in_sync: u32) {
        let members: Vec<BrokerAddr> = members.iter().cloned().map(BrokerAddr).collect();
        let in_sync = (0u64..).take(members.len()).collect();
        self.with_state(|state| {
            state.replication.insert(
                name.to_string(),
                FakeGroup {
                    members,
                    min_in_sync,
                    epoch: 1,
                    master: Some(0),
                    in_sync,
                },
            )
        });
    }

    /// Sets the in-sync set of group `name`, as its master would after a replica fell behind
    /// or caught up.
    pub fn set_in_sync(&self, name: &str, in_sync: &[u64]) {
        self.with_state(|state| {
            if let Some(group) = state.replication.get_mut(name) {
                group.in_sync = in_sync.to_vec();
            }
        });
    }

    /// Sets the master of group `name` (None: no master), bumping the epoch.
    pub fn set_master(&self, name: &str, master: Option<u64>) {
        self.with_state(|state| {
            if let Some(group) = state.replication.get_mut(name) {
                group.master = master;
                group.epoch += 1;
            }
        });
    }

    /// The master of group `name`.
    pub fn master(&self, name: &str) -> Option<u64> {
        self.with_state(|state| state.replication.get(name).and_then(|group| group.master))
    }

    /// Switchovers asked for so far: (the address sent to, the target replica id).
    pub fn switchovers(&self) -> Vec<(BrokerAddr, u64)> {
        self.with_state(|state| state.switchovers.clone())
    }

    fn call<'a, T: Send + 'a>(
        &'a self,
        addr: &'a BrokerAddr,
        f: impl FnOnce(&mut FakeBrokers) -> T + Send + 'a,
    ) -> BoxFuture<'a, Result<T, AdminError>> {
        async move {
            self.with_state(|state| {
                let signer = state.accounts.get(account_scope(addr)).cloned();
                state.last_signer.insert(addr.clone(), signer.clone());
                if state.required_access_key.is_some() && state.required_access_key != signer {
                    return Err(AdminError::Rejected {
                        addr: addr.clone(),
                        request: "an admin call",
                        code: 16,
                        remark: format!("ACL: access key {signer:?} refused"),
                    });
                }
                if state.unreachable.contains(addr) {
                    let refused = std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "connection refused",
                    );
                    return Err(AdminError::Unreachable {
                        addr: addr.clone(),
                        source: Box::new(refused),
                    });
                }
                Ok(f(state))
            })
        }
        .boxed()
    }
}

impl BrokerAdmin for FakeAdmin {
    fn use_access(&self, scope: &str, access: BrokerAccess) {
        self.with_state(|state| match access.tls {
            Some(tls) => {
                state.tls.insert(scope.to_string(), tls);
            }
            None => {
                state.tls.remove(scope);
            }
        });
        self.with_state(|state| match access.account {
            Some(account) => {
                state.accounts.insert(scope.to_string(), account.access_key);
            }
            None => {
                state.accounts.remove(scope);
            }
        });
    }

    fn consume_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<ConsumeStats, AdminError>> {
        self.call(addr, move |state| ConsumeStats {
            queues: state
                .queues
                .get(&(addr.clone(), group.to_string()))
                .cloned()
                .unwrap_or_default(),
        })
    }

    fn topic_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<TopicStats, AdminError>> {
        let broker_name = addr.0.split('.').next().unwrap_or_default().to_string();
        async move {
            let (created, stored) = self
                .call(addr, move |state| {
                    let created = state
                        .topics
                        .get(addr)
                        .and_then(|topics| topics.get(topic))
                        .cloned();
                    let stored = state
                        .topic_queues
                        .get(&(addr.clone(), topic.to_string()))
                        .map(|queues| queues.values().cloned().collect::<Vec<_>>());
                    (created, stored)
                })
                .await?;
            if let Some(queues) = stored {
                return Ok(TopicStats { queues });
            }
            // Like the broker: a topic it does not have is refused (TOPIC_NOT_EXIST).
            let created = created.ok_or_else(|| AdminError::Rejected {
                addr: addr.clone(),
                request: "GET_TOPIC_STATS_INFO",
                code: 17,
                remark: format!("topic {topic} does not exist"),
            })?;
            let queues = (0..created.queues)
                .map(|queue_id| QueueTopicStats {
                    broker_name: broker_name.clone(),
                    queue_id,
                    min_offset: QueueOffset(0),
                    max_offset: QueueOffset(0),
                    last_update_ms: None,
                })
                .collect();
            Ok(TopicStats { queues })
        }
        .boxed()
    }

    fn members<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        self.call(addr, move |state| {
            state
                .members
                .get(&(addr.clone(), group.to_string()))
                .cloned()
                .unwrap_or_default()
        })
    }

    fn groups<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        self.call(addr, move |state| {
            let names: BTreeSet<String> = state
                .groups
                .get(addr)
                .map(|groups| groups.keys().cloned().collect())
                .unwrap_or_default();
            names.into_iter().collect()
        })
    }

    fn topics<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        self.call(addr, move |state| {
            let created = state
                .topics
                .get(addr)
                .into_iter()
                .flat_map(|topics| topics.keys().cloned());
            let stored = state
                .topic_queues
                .keys()
                .filter(|(holder, _)| holder == addr)
                .map(|(_, topic)| topic.clone());
            let names: BTreeSet<String> = created.chain(stored).collect();
            names.into_iter().collect()
        })
    }

    fn set_permission<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        permission: BrokerPermission,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        self.call(addr, move |state| {
            state.permissions.insert(addr.clone(), permission);
        })
    }

    fn create_topic<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a TopicConfig,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        self.call(addr, move |state| {
            state.topic_creates += 1;
            state
                .topics
                .entry(addr.clone())
                .or_default()
                .insert(topic.name.clone(), topic.clone());
        })
    }

    fn upsert_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a SubscriptionGroup,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        self.call(addr, move |state| {
            state.upserts += 1;
            state
                .groups
                .entry(addr.clone())
                .or_default()
                .insert(group.group.clone(), group.clone());
        })
    }

    fn reset_offsets<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
        topic: &'a str,
        target: ResetTarget,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        self.call(addr, move |state| {
            if let Some(queues) = state.queues.get_mut(&(addr.clone(), group.to_string())) {
                for queue in queues.iter_mut().filter(|queue| queue.topic == topic) {
                    match target {
                        ResetTarget::Earliest => queue.consumer_offset = Some(QueueOffset(0)),
                        ResetTarget::Latest => queue.consumer_offset = Some(queue.broker_offset),
                        ResetTarget::Timestamp(_) => {}
                    }
                }
            }
            state
                .resets
                .push((addr.clone(), group.to_string(), topic.to_string(), target));
        })
    }

    fn delete_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        self.call(addr, move |state| {
            if let Some(groups) = state.groups.get_mut(addr) {
                groups.remove(group);
            }
            state.queues.remove(&(addr.clone(), group.to_string()));
            state.deleted.push((addr.clone(), group.to_string()));
        })
    }

    fn runtime_info<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<RuntimeInfo, AdminError>> {
        async move {
            let reply = self
                .call(addr, move |state| match state.runtime.get(addr) {
                    Some(reply) => reply.clone(),
                    None => Some(disk_report(0.25, None)),
                })
                .await?;
            reply.ok_or_else(|| AdminError::Rejected {
                addr: addr.clone(),
                request: "GET_BROKER_RUNTIME_INFO",
                code: quiver_protocol::code::response::REQUEST_CODE_NOT_SUPPORTED,
                remark: "request type 28 not supported".to_string(),
            })
        }
        .boxed()
    }

    fn replication_status<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<ReplicationStatus, AdminError>> {
        async move {
            self.call(addr, move |state| {
                let Some((name, id)) = FakeAdmin::group_of(state, addr) else {
                    return Err(FakeAdmin::rejected(
                        addr,
                        "QUIVER_REPLICATION_STATUS",
                        quiver_protocol::code::response::REQUEST_CODE_NOT_SUPPORTED,
                        "request type 30003 not supported".to_string(),
                    ));
                };
                Ok(state.replication[&name].status(&name, id))
            })
            .await?
        }
        .boxed()
    }

    /// As a master does: only the master takes it, and only for an in-sync member.
    fn switchover<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        target: u64,
        _timeout: Duration,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            self.call(addr, move |state| {
                state.switchovers.push((addr.clone(), target));
                let refused = |remark: String| {
                    Err(FakeAdmin::rejected(
                        addr,
                        "QUIVER_SWITCHOVER",
                        quiver_protocol::code::response::SYSTEM_ERROR,
                        remark,
                    ))
                };
                let Some((name, id)) = FakeAdmin::group_of(state, addr) else {
                    return refused("not a member of a replicated group".to_string());
                };
                let group = state.replication.get_mut(&name).expect("found above");
                if group.master != Some(id) {
                    return refused(format!("replica {id} is not the master"));
                }
                if !group.in_sync.contains(&target) {
                    return refused(format!("replica {target} is not in sync"));
                }
                group.master = Some(target);
                group.epoch += 1;
                Ok(())
            })
            .await?
        }
        .boxed()
    }
}

impl FakeAdmin {
    fn group_of(state: &FakeBrokers, addr: &BrokerAddr) -> Option<(String, u64)> {
        state.replication.iter().find_map(|(name, group)| {
            let id = group.members.iter().position(|member| member == addr)?;
            Some((name.clone(), u64::try_from(id).ok()?))
        })
    }

    fn rejected(addr: &BrokerAddr, request: &'static str, code: i32, remark: String) -> AdminError {
        AdminError::Rejected {
            addr: addr.clone(),
            request,
            code,
            remark,
        }
    }
}

/// What a broker with `used` of its disk in use and the default 90% high water reports; with a
/// `refusal` reason it refuses writes.
pub fn disk_report(used: f64, refusal: Option<&str>) -> RuntimeInfo {
    RuntimeInfo {
        disk_used_ratio: Some(used),
        disk_capacity: Some(format!(
            "Total : 10.0 GiB, Free : {:.1} GiB.",
            10.0 * (1.0 - used)
        )),
        high_water_ratio: Some(0.9),
        writable: Some(refusal.is_none()),
        write_refusal: refusal.map(str::to_string),
        write_refusal_message: refusal.map(|reason| format!("sends refused: {reason}")),
    }
}
