//! Test fixtures: resource builders that read like sentences, an in-memory `BrokerAdmin`, and a
//! stateful fake API server behind a tower-test mock service.

use crate::admin::{
    AdminError, BrokerAddr, BrokerAdmin, BrokerPermission, ConsumeStats, QueueConsumeStats,
    QueueOffset, QueueTopicStats, ResetTarget, RuntimeInfo, SubscriptionGroup, TopicConfig,
    TopicStats,
};
use crate::crd::{
    Broker, BrokerSpec, BrokerStatus, ConsumeFromWhere, ConsumerGroup, ConsumerGroupSpec,
    FlushDiskType, PodOverrides, RetentionSpec, StorageSpec, TopicSpec, VolumeRetentionPolicy,
};
use futures::future::{BoxFuture, FutureExt};
use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

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
    /// Fills every optional field.
    fn full_spec(self) -> Self;
    /// Sets the status.
    fn with_status(self, status: BrokerStatus) -> Self;
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

    fn with_status(mut self, status: BrokerStatus) -> Self {
        self.status = Some(status);
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

    fn call<'a, T: Send + 'a>(
        &'a self,
        addr: &'a BrokerAddr,
        f: impl FnOnce(&mut FakeBrokers) -> T + Send + 'a,
    ) -> BoxFuture<'a, Result<T, AdminError>> {
        async move {
            self.with_state(|state| {
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

/// A stateful fake of the Kubernetes API server behind a tower-test mock service: GET, server-side
/// apply, merge and JSON patches, status subresources, events, injected failures.
pub struct FakeApiServer {
    state: Arc<Mutex<FakeApiState>>,
    _task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct FakeApiState {
    objects: BTreeMap<String, Value>,
    posted: Vec<Value>,
    requests: Vec<String>,
    failures: Vec<(String, String, u16)>,
}

/// The parts of an API path: group ("" for the core group), resource, namespace, name and
/// subresource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePath {
    /// API group, "" for the core group.
    pub group: String,
    /// Plural resource name.
    pub resource: String,
    /// Namespace, for namespaced paths.
    pub namespace: Option<String>,
    /// Object name; None for a collection.
    pub name: Option<String>,
    /// Subresource, e.g. status.
    pub subresource: Option<String>,
}

impl ResourcePath {
    /// Parses `/api/v1/...` and `/apis/<group>/<version>/...` paths.
    pub fn parse(path: &str) -> Option<ResourcePath> {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => (Some(*namespace), rest),
            rest => (None, rest),
        };
        let (resource, name, subresource) = match rest {
            [resource] => (*resource, None, None),
            [resource, name] => (*resource, Some(*name), None),
            [resource, name, subresource] => (*resource, Some(*name), Some(*subresource)),
            _ => return None,
        };
        Some(ResourcePath {
            group: group.to_string(),
            resource: resource.to_string(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            subresource: subresource.map(str::to_string),
        })
    }
}

/// Whether `object` has every `key=value` label of `selector` (equality selectors only).
fn matches_selector(object: &Value, selector: &str) -> bool {
    selector
        .split(',')
        .filter(|term| !term.is_empty())
        .all(|term| match term.split_once('=') {
            Some((key, value)) => object["metadata"]["labels"][key] == value,
            None => false,
        })
}

fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        (name == key).then(|| percent_decoded(value))
    })
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let escaped = (bytes[index] == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(if bytes[index] == b'+' {
                    b' '
                } else {
                    bytes[index]
                });
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The objects of the collection at `path`, like a list call answers.
fn list(objects: &BTreeMap<String, Value>, collection: &ResourcePath, query: &str) -> Value {
    let selector = query_value(query, "labelSelector").unwrap_or_default();
    let items: Vec<Value> = objects
        .iter()
        .filter(|(path, object)| {
            ResourcePath::parse(path).is_some_and(|stored| {
                stored.group == collection.group
                    && stored.resource == collection.resource
                    && stored.subresource.is_none()
                    && (collection.namespace.is_none() || stored.namespace == collection.namespace)
            }) && matches_selector(object, &selector)
        })
        .map(|(_, object)| object.clone())
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
}

impl FakeApiServer {
    /// A client talking to a new fake server.
    pub fn start() -> (Client, FakeApiServer) {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let state = Arc::new(Mutex::new(FakeApiState::default()));
        let task_state = state.clone();
        let task = tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let method = request.method().to_string();
                let path = request.uri().path().to_string();
                let query = request.uri().query().unwrap_or_default().to_string();
                let content_type = request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                if method == "GET" && query_value(&query, "watch").is_some() {
                    // No watch events: the watch stays open with nothing to say, as a quiet
                    // cluster's would (an error would make the controller back off instead).
                    record(&task_state, &method, &path);
                    tokio::spawn(async move {
                        tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                        send.send_response(Response::new(Body::empty()));
                    });
                    continue;
                }
                let body = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("request body");
                let (status, reply) =
                    handle_request(&task_state, (&method, &path, &query), &content_type, &body);
                let response = Response::builder()
                    .status(status)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(Body::from(serde_json::to_vec(&reply).expect("json")))
                    .expect("response");
                send.send_response(response);
            }
        });
        (
            Client::new(service, "default"),
            FakeApiServer { state, _task: task },
        )
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut FakeApiState) -> T) -> T {
        f(&mut self.state.lock().expect("fake api lock poisoned"))
    }

    /// Stores an object at its API path.
    pub fn insert(&self, path: &str, object: impl serde::Serialize) {
        let value = serde_json::to_value(object).expect("object serializes");
        self.with_state(|state| state.objects.insert(path.to_string(), value));
    }

    /// The object stored at `path`.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.with_state(|state| state.objects.get(path).cloned())
    }

    /// The object at `path`, deserialized; panics when absent.
    pub fn object<K: serde::de::DeserializeOwned>(&self, path: &str) -> K {
        serde_json::from_value(
            self.get(path)
                .unwrap_or_else(|| panic!("no object at {path}")),
        )
        .expect("object deserializes")
    }

    /// Every request so far, as "METHOD path".
    pub fn requests(&self) -> Vec<String> {
        self.with_state(|state| state.requests.clone())
    }

    /// Reasons of the Events created so far, in order.
    pub fn event_reasons(&self) -> Vec<String> {
        self.with_state(|state| {
            state
                .posted
                .iter()
                .filter(|object| object["kind"] == "Event")
                .filter_map(|event| event["reason"].as_str().map(str::to_string))
                .collect()
        })
    }

    /// Edits the object at `path` in place, as a user would.
    pub fn edit(&self, path: &str, edit: impl FnOnce(&mut Value)) {
        self.with_state(|state| {
            edit(
                state
                    .objects
                    .get_mut(path)
                    .unwrap_or_else(|| panic!("no object at {path}")),
            )
        });
    }

    /// The next `method` request to `path` fails with `status`.
    pub fn fail_next(&self, method: &str, path: &str, status: u16) {
        self.with_state(|state| {
            state
                .failures
                .push((method.to_string(), path.to_string(), status))
        });
    }
}

fn status_error(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn record(state: &Mutex<FakeApiState>, method: &str, path: &str) {
    let mut state = state.lock().expect("fake api lock poisoned");
    state.requests.push(format!("{method} {path}"));
}

fn handle_request(
    state: &Mutex<FakeApiState>,
    (method, path, query): (&str, &str, &str),
    content_type: &str,
    body: &[u8],
) -> (StatusCode, Value) {
    record(state, method, path);
    let mut state = state.lock().expect("fake api lock poisoned");
    if let Some(index) = state
        .failures
        .iter()
        .position(|(m, p, _)| m == method && p == path)
    {
        let (_, _, code) = state.failures.remove(index);
        let status = StatusCode::from_u16(code).expect("valid status code");
        return (
            status,
            status_error(code, "InternalError", "injected failure"),
        );
    }
    let (object_path, subresource) = match path.strip_suffix("/status") {
        Some(object_path) => (object_path.to_string(), Some("status")),
        None => (path.to_string(), None),
    };
    let not_found = || {
        (
            StatusCode::NOT_FOUND,
            status_error(404, "NotFound", "not found"),
        )
    };
    let collection = ResourcePath::parse(path).filter(|parsed| parsed.name.is_none());
    match method {
        "GET" if collection.is_some() => (
            StatusCode::OK,
            list(&state.objects, collection.as_ref().expect("checked"), query),
        ),
        "GET" => match state.objects.get(&object_path) {
            Some(object) => (StatusCode::OK, object.clone()),
            None => not_found(),
        },
        "POST" => {
            let object: Value = serde_json::from_slice(body).expect("json body");
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or("generated")
                .to_string();
            state
                .objects
                .insert(format!("{path}/{name}"), object.clone());
            state.posted.push(object.clone());
            (StatusCode::CREATED, object)
        }
        "PATCH" => {
            let patch: Value = serde_json::from_slice(body).expect("json body");
            let existing = state.objects.get(&object_path).cloned();
            let updated = if content_type.starts_with("application/apply-patch") {
                match (subresource, existing) {
                    (Some(_), None) => return not_found(),
                    (Some(_), Some(mut object)) => {
                        object["status"] = patch["status"].clone();
                        object
                    }
                    (None, existing) => server_side_apply(existing, patch),
                }
            } else if content_type.starts_with("application/merge-patch")
                // Strategic merge acts like a merge patch on the objects tests use.
                || content_type.starts_with("application/strategic-merge-patch")
            {
                let Some(mut object) = existing else {
                    return not_found();
                };
                json_patch::merge(&mut object, &patch);
                object
            } else {
                let Some(mut object) = existing else {
                    return not_found();
                };
                // Like the API server, a `test` for null passes when the path is absent.
                let operations: Vec<Value> = patch
                    .as_array()
                    .expect("json patch is an array")
                    .iter()
                    .filter(|op| {
                        let absent = op["path"]
                            .as_str()
                            .is_some_and(|path| object.pointer(path).is_none());
                        !(op["op"] == "test" && op["value"].is_null() && absent)
                    })
                    .cloned()
                    .collect();
                let operations: json_patch::Patch =
                    serde_json::from_value(Value::Array(operations)).expect("json patch");
                if let Err(error) = json_patch::patch(&mut object, &operations) {
                    return (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        status_error(422, "Invalid", &error.to_string()),
                    );
                }
                object
            };
            let finalizers_empty = updated["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|finalizers| finalizers.is_empty());
            if updated["metadata"]["deletionTimestamp"].is_string() && finalizers_empty {
                state.objects.remove(&object_path);
            } else {
                state.objects.insert(object_path, updated.clone());
            }
            (StatusCode::OK, updated)
        }
        "DELETE" => match state.objects.remove(&object_path) {
            Some(object) => (StatusCode::OK, object),
            None => not_found(),
        },
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            status_error(405, "MethodNotAllowed", method),
        ),
    }
}

/// Server-side apply as far as tests need: the applied fields win, status and server-set
/// metadata stay, and a spec change bumps the generation.
fn server_side_apply(existing: Option<Value>, applied: Value) -> Value {
    let Some(existing) = existing else {
        let mut created = applied;
        created["metadata"]["generation"] = json!(1);
        created["metadata"]["uid"] = json!(format!(
            "uid-{}",
            created["metadata"]["name"].as_str().unwrap_or_default()
        ));
        return created;
    };
    let mut merged = applied.clone();
    let mut metadata = existing["metadata"].clone();
    if applied["metadata"].is_object() {
        json_patch::merge(&mut metadata, &applied["metadata"]);
    }
    let generation = existing["metadata"]["generation"].as_i64().unwrap_or(1);
    metadata["generation"] = json!(if existing["spec"] != applied["spec"] {
        generation + 1
    } else {
        generation
    });
    merged["metadata"] = metadata;
    if !existing["status"].is_null() {
        merged["status"] = existing["status"].clone();
    }
    merged
}

/// API paths of the objects the controllers touch in namespace `ns`.
pub mod paths {
    /// Broker `name`.
    pub fn broker(name: &str) -> String {
        format!("/apis/quiver.io/v1alpha1/namespaces/ns/brokers/{name}")
    }
    /// ConsumerGroup `name`.
    pub fn group(name: &str) -> String {
        format!("/apis/quiver.io/v1alpha1/namespaces/ns/consumergroups/{name}")
    }
}

thread_local! {
    /// Now of [`simulated_clock`], per test thread (tokio tests run on one).
    static SIMULATED_NOW_MS: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

/// A `Clock` that reads the test's simulated time: set it with [`set_simulated_now`] and move
/// it with [`advance_simulated_clock`].
pub fn simulated_clock() -> i64 {
    SIMULATED_NOW_MS.with(std::cell::Cell::get)
}

/// Sets the simulated time, ms since the epoch.
pub fn set_simulated_now(ms: i64) {
    SIMULATED_NOW_MS.with(|now| now.set(ms));
}

/// Moves the simulated time forward.
pub fn advance_simulated_clock(by: std::time::Duration) {
    let by = i64::try_from(by.as_millis()).expect("a test step fits in i64 ms");
    SIMULATED_NOW_MS.with(|now| now.set(now.get() + by));
}
