//! The two controllers (Broker, ConsumerGroup), their shared context, errors and backoff.

pub mod broker;
pub mod conditions;
pub mod drain;
pub mod expansion;
pub mod group;
pub mod membership;
pub mod replication;
pub mod rollout;
pub mod security;

use crate::admin::{AdminError, BrokerAdmin};
use crate::crd::{Broker, ConsumerGroup};
use crate::metrics::Metrics;
use conditions::Desired;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shortest delay after a failed reconcile.
pub const BACKOFF_BASE: Duration = Duration::from_secs(5);
/// Longest delay after repeated failures.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Time in-flight reconciles get to finish after a shutdown request.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Failures of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API call failed: {action}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A broker admin call failed.
    #[error("broker admin call failed while {action}")]
    Admin {
        /// What was being done.
        action: &'static str,
        /// The admin error.
        #[source]
        source: AdminError,
    },
    /// Adding or removing the finalizer failed.
    #[error("finalizer handling failed for {object}")]
    Finalizer {
        /// namespace/name of the object.
        object: String,
        /// The finalizer error.
        #[source]
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },
    /// The object lacks a field the API server always sets (namespace, uid).
    #[error("{kind} {name} has no {field}")]
    MissingField {
        /// Resource kind.
        kind: &'static str,
        /// Object name.
        name: String,
        /// The missing metadata field.
        field: &'static str,
    },
}

impl Error {
    /// Short label for the `error` label of `quiver_reconcile_errors_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Admin { .. } => "broker_admin",
            Error::Finalizer { .. } => "finalizer",
            Error::MissingField { .. } => "missing_field",
        }
    }

    pub(crate) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    pub(crate) fn admin(action: &'static str) -> impl FnOnce(AdminError) -> Error {
        move |source| Error::Admin { action, source }
    }
}

/// Milliseconds since the Unix epoch; injected so lag latency is testable.
pub type Clock = fn() -> i64;

/// The wall clock.
pub fn system_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// State shared by every reconcile.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Broker administration (lag, drain, groups, disk).
    pub admin: Arc<dyn BrokerAdmin>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Event recorder.
    pub recorder: Recorder,
    /// How often ConsumerGroups are polled for lag.
    pub lag_interval: Duration,
    /// Time source.
    pub clock: Clock,
    /// Each group's last lag poll and progress window, by [`object_key`].
    pub lag_polls: Mutex<HashMap<String, group::LastPoll>>,
    /// Labels of the operator's own pods: the Brokers' NetworkPolicies admit only these pods of
    /// its namespace (empty: every pod there).
    pub operator_pod_labels: BTreeMap<String, String>,
    /// Consecutive failures per object, for backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// The status this operator last wrote to each object, by [`object_key`], as the API server
    /// answered the write: a cached object showing another status lags behind that write.
    written_status: Mutex<HashMap<String, serde_json::Value>>,
    /// Brokers this operator saw an offset reset succeed on, by group uid and reset id, until
    /// the reset's record says so (a failed status write must not make it apply again).
    applied_resets: Mutex<HashMap<String, BTreeSet<String>>>,
}

impl Context {
    /// A context with the system clock.
    pub fn new(
        client: Client,
        admin: Arc<dyn BrokerAdmin>,
        metrics: Arc<Metrics>,
        lag_interval: Duration,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "quiver-operator".into(),
                instance: None,
            },
        );
        Context {
            client,
            admin,
            metrics,
            recorder,
            lag_interval,
            clock: system_clock,
            lag_polls: Mutex::new(HashMap::new()),
            operator_pod_labels: BTreeMap::new(),
            failures: Mutex::new(HashMap::new()),
            written_status: Mutex::new(HashMap::new()),
            applied_resets: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the labels of the operator's own pods (`--operator-pod-labels`).
    pub fn with_operator_pod_labels(mut self, labels: BTreeMap<String, String>) -> Context {
        self.operator_pod_labels = labels;
        self
    }

    /// Replaces the time source.
    pub fn with_clock(mut self, clock: Clock) -> Context {
        self.clock = clock;
        self
    }

    fn reset_backoff(&self, key: &str) {
        self.failures
            .lock()
            .expect("failures lock poisoned")
            .remove(key);
    }

    /// Notes `stored`'s status as the one this operator last wrote (or read back).
    fn remember_status<K>(&self, stored: &K)
    where
        K: Resource<DynamicType = ()> + serde::Serialize,
    {
        self.written_status
            .lock()
            .expect("written status lock poisoned")
            .insert(object_key(stored), status_json(stored));
    }

    /// Whether `cached` shows a status other than the one this operator last wrote to it: its
    /// watch has not delivered that write yet (or someone else wrote since). False when this
    /// operator wrote nothing to it yet.
    fn lags_own_write<K>(&self, cached: &K) -> bool
    where
        K: Resource<DynamicType = ()> + serde::Serialize,
    {
        let written = self
            .written_status
            .lock()
            .expect("written status lock poisoned");
        written
            .get(&object_key(cached))
            .is_some_and(|status| *status != status_json(cached))
    }

    /// The brokers this operator saw the offset reset `key` succeed on.
    fn applied_resets(&self, key: &str) -> BTreeSet<String> {
        let applied = self.applied_resets.lock().expect("resets lock poisoned");
        applied.get(key).cloned().unwrap_or_default()
    }

    /// Notes that the offset reset `key` succeeded on `broker`.
    fn note_applied_reset(&self, key: &str, broker: &str) {
        let mut applied = self.applied_resets.lock().expect("resets lock poisoned");
        applied
            .entry(key.to_string())
            .or_default()
            .insert(broker.to_string());
    }

    /// Forgets the offset reset `key`: its record is written.
    fn forget_applied_resets(&self, key: &str) {
        let mut applied = self.applied_resets.lock().expect("resets lock poisoned");
        applied.remove(key);
    }

    /// Delay before retrying after one more failure of `key`: doubling from BACKOFF_BASE.
    fn next_backoff(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().expect("failures lock poisoned");
        let count = failures.entry(key.to_string()).or_insert(0);
        let delay = BACKOFF_BASE
            .saturating_mul(1u32 << (*count).min(10))
            .min(BACKOFF_MAX);
        *count = count.saturating_add(1);
        delay
    }
}

/// `object`'s status as JSON (null when it has none).
fn status_json<K: serde::Serialize>(object: &K) -> serde_json::Value {
    serde_json::to_value(object)
        .ok()
        .and_then(|mut value| value.get_mut("status").map(serde_json::Value::take))
        .unwrap_or_default()
}

/// The object a pass works from: `cached` (what the watch delivered), unless it lags behind a
/// status this operator wrote, then the stored object, read back (None: `cached` will do). On a
/// lagging cache a pass would judge against an older status than the stored one: skip a write
/// that is due (the stored status stays wrong until the watch catches up and a later pass runs)
/// or write the stored status again with its transition and progress times moved.
pub(crate) async fn read_own_write<K>(
    api: &Api<K>,
    cached: &K,
    ctx: &Context,
) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + serde::Serialize,
    K: std::fmt::Debug,
{
    if !ctx.lags_own_write(cached) {
        return Ok(None);
    }
    let name = cached.name_any();
    let stored = api
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading {} {name}", K::kind(&()))))?;
    if let Some(stored) = &stored {
        ctx.remember_status(stored);
    }
    Ok(stored)
}

/// A resource whose status the operator writes.
pub(crate) trait WithStatus:
    Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
    + Clone
    + serde::de::DeserializeOwned
    + serde::Serialize
    + std::fmt::Debug
{
    /// Its status.
    type Status: Clone + Default + PartialEq + serde::Serialize;
    /// The status, when it has one.
    fn status(&self) -> Option<&Self::Status>;
    /// The conditions of `status`.
    fn conditions_mut(status: &mut Self::Status) -> &mut Vec<Condition>;
}

impl WithStatus for Broker {
    type Status = crate::crd::BrokerStatus;
    fn status(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_mut(status: &mut Self::Status) -> &mut Vec<Condition> {
        &mut status.conditions
    }
}

impl WithStatus for ConsumerGroup {
    type Status = crate::crd::ConsumerGroupStatus;
    fn status(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_mut(status: &mut Self::Status) -> &mut Vec<Condition> {
        &mut status.conditions
    }
}

/// Attempts of a status write that lost a race with another writer (409 on its resourceVersion).
const STATUS_WRITE_ATTEMPTS: usize = 3;

/// The one way the operator writes a status: `update` builds it, purely, from the stored one,
/// read fresh for the write (so a condition another writer set since the pass read the object
/// is kept, not reverted), and it is applied server-side under the operator's field manager with
/// that read's resourceVersion (a write in between is a 409: read again, build again). Nothing is
/// written when `update` changes nothing: of `known` (the status the pass worked from, when it
/// has one, which saves the read) or of the stored status. True if written.
pub(crate) async fn write_status<K: WithStatus>(
    ctx: &Context,
    object: &K,
    known: Option<&K::Status>,
    update: impl Fn(Option<&K::Status>) -> K::Status,
) -> Result<bool, Error> {
    if known.is_some_and(|status| update(Some(status)) == *status) {
        return Ok(false);
    }
    let name = object.name_any();
    let kind = K::kind(&());
    let namespace = object.namespace().ok_or_else(|| Error::MissingField {
        kind: "object",
        name: name.clone(),
        field: "namespace",
    })?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let stored = api.get(&name).await.map_err(Error::kube(format!(
            "reading {kind} {name} to write its status"
        )))?;
        let status = update(stored.status());
        if stored.status() == Some(&status) {
            ctx.remember_status(&stored);
            return Ok(false);
        }
        let patch = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": kind,
            "metadata": {"resourceVersion": stored.resource_version()},
            "status": status,
        });
        let params = kube::api::PatchParams::apply(crate::desired::FIELD_MANAGER).force();
        match api
            .patch_status(&name, &params, &kube::api::Patch::Apply(&patch))
            .await
        {
            Ok(written) => {
                ctx.remember_status(&written);
                return Ok(true);
            }
            Err(kube::Error::Api(answer))
                if answer.code == 409 && attempt < STATUS_WRITE_ATTEMPTS =>
            {
                tracing::debug!(object = %name, "status changed while written; reading it again");
            }
            Err(source) => {
                return Err(Error::Kube {
                    action: format!("writing status of {kind} {name}"),
                    source,
                })
            }
        }
    }
}

/// `error` and its sources, outermost first, joined with ": " (what a condition message shows).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        // Some errors repeat their source in their own message: say it once.
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

/// Makes a failure visible on `object`: a Warning event with `failure`'s reason and message, and
/// `failure` set among the stored object's conditions (the others kept) through
/// [`write_status`]. Best effort: a failure to report is logged, never returned. Status is
/// written only when the condition changes, so repeated identical failures do not churn the
/// object.
pub(crate) async fn report_failure<K: WithStatus>(
    ctx: &Context,
    object: &K,
    failure: &Desired,
    action: &str,
) {
    publish(
        ctx,
        object,
        EventType::Warning,
        failure.reason,
        action,
        &failure.message,
    )
    .await;
    let now = Timestamp::from_millisecond((ctx.clock)()).unwrap_or(Timestamp::UNIX_EPOCH);
    let generation = object.meta().generation;
    let with_failure = |stored: Option<&K::Status>| {
        let mut status = stored.cloned().unwrap_or_default();
        let list = K::conditions_mut(&mut status);
        *list = conditions::set(list, failure, generation, now);
        status
    };
    if let Err(error) = write_status(ctx, object, None, with_failure).await {
        tracing::warn!(%error, reason = failure.reason, "could not write the failure condition");
    }
}

/// What a reconcile acts on, hashed: generation (spec), labels, annotations (pause, force
/// scale-down), finalizers and deletion. Status is left out: the operator's own status writes
/// must not wake the next reconcile.
pub fn reconcile_trigger<K: Resource>(object: &K) -> Option<u64> {
    let meta = object.meta();
    let mut hasher = DefaultHasher::new();
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|time| time.0.as_millisecond())
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// The watch of a controller's own objects, passing only changes [`reconcile_trigger`] sees,
/// with the store the controller reads from.
fn trigger_stream<K>(api: Api<K>) -> (impl Stream<Item = Result<K, watcher::Error>>, Store<K>)
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(reconcile_trigger, Default::default());
    (stream, reader)
}

/// The metadata watch of Secrets (their data never passes through the operator's watch), and
/// the mapper waking the Brokers whose `spec.security` names a changed Secret.
#[allow(clippy::type_complexity)]
fn secret_triggers(
    api: Api<PartialObjectMeta<Secret>>,
    brokers: Store<Broker>,
) -> (
    impl Stream<Item = Result<PartialObjectMeta<Secret>, watcher::Error>>,
    impl Fn(PartialObjectMeta<Secret>) -> Vec<ObjectRef<Broker>> + Send + Sync + 'static,
) {
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .touched_objects();
    let mapper = move |secret: PartialObjectMeta<Secret>| {
        let namespace = secret.namespace().unwrap_or_default();
        let name = secret.name_any();
        brokers
            .state()
            .iter()
            .filter(|broker| security::references(broker, &namespace, &name))
            .map(|broker| ObjectRef::from_obj(broker.as_ref()))
            .collect::<Vec<_>>()
    };
    (stream, mapper)
}

/// Longest event note the API server accepts (events.k8s.io/v1: under 1 kB).
const MAX_EVENT_NOTE_BYTES: usize = 1000;

/// `note` cut to fit an event, on a character boundary, marked with an ellipsis when cut.
fn event_note(note: &str) -> String {
    if note.len() <= MAX_EVENT_NOTE_BYTES {
        return note.to_string();
    }
    let mut end = MAX_EVENT_NOTE_BYTES - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

/// Events are best effort: a failure is logged, never fails the reconcile.
pub(crate) async fn publish<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    object: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(event_note(note)),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(%error, reason, "could not publish event");
    }
}

/// `kind/namespace/name`, the key of per-object state.
pub fn object_key<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

/// Requeue with exponential backoff; logs and counts the error.
pub fn error_policy<K: Resource<DynamicType = ()>>(
    object: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let key = object_key(object.as_ref());
    let delay = ctx.next_backoff(&key);
    let controller = K::kind(&()).to_lowercase();
    ctx.metrics
        .reconcile_failed(&controller, error.metric_label());
    tracing::warn!(object = %key, error = %error, source = ?std::error::Error::source(error), retry_in_s = delay.as_secs(), "reconcile failed");
    Action::requeue(delay)
}

/// Runs both controllers until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let client = ctx.client.clone();
    fn api<K>(client: &Client, namespace: &Option<String>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let broker_stop = stop_tx.subscribe();
    let group_stop = stop_tx.subscribe();
    let stop_on = |mut receiver: tokio::sync::broadcast::Receiver<()>| async move {
        receiver.recv().await.ok();
    };
    let labels = watcher::Config::default().labels("app.kubernetes.io/managed-by=quiver-operator");
    let (broker_changes, broker_store) = trigger_stream(api::<Broker>(&client, &namespace));
    let secret_changes = secret_triggers(
        api::<PartialObjectMeta<Secret>>(&client, &namespace),
        broker_store.clone(),
    );
    // Owned objects keep the unfiltered metadata watch: a StatefulSet status change (a pod
    // Ready or updated) is what moves a rollout on.
    let brokers = Controller::for_stream(broker_changes, broker_store)
        .owns(api::<StatefulSet>(&client, &namespace), labels.clone())
        .owns(api::<Service>(&client, &namespace), labels.clone())
        .owns(api::<ConfigMap>(&client, &namespace), labels.clone())
        .owns(
            api::<PodDisruptionBudget>(&client, &namespace),
            labels.clone(),
        )
        .owns(api::<NetworkPolicy>(&client, &namespace), labels)
        .watches_stream(secret_changes.0, secret_changes.1)
        .graceful_shutdown_on(stop_on(broker_stop))
        .run(broker::reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "broker controller event");
            }
        });
    let (group_changes, group_store) = trigger_stream(api::<ConsumerGroup>(&client, &namespace));
    let groups = Controller::for_stream(group_changes, group_store)
        .graceful_shutdown_on(stop_on(group_stop))
        .run(group::reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "consumergroup controller event");
            }
        });
    let mut grace_stop = stop_tx.subscribe();
    let trigger = async move {
        shutdown.await;
        stop_tx.send(()).ok();
    };
    let controllers = async {
        tokio::join!(brokers, groups);
    };
    // kube-runtime holds its runner until the first list succeeds, so with the API server
    // unreachable the controllers never finish on their own: bound the graceful part.
    let deadline = async move {
        grace_stop.recv().await.ok();
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let bounded = async {
        tokio::select! {
            () = controllers => tracing::info!("controllers stopped"),
            () = deadline => tracing::warn!(grace_s = SHUTDOWN_GRACE.as_secs(), "controllers still busy after the shutdown grace; stopping anyway"),
        }
    };
    tokio::join!(bounded, trigger);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{BrokerFixture, FakeAdmin};
    use crate::testapi::TestApiServer;

    #[test]
    fn the_error_chain_names_every_cause_once() {
        let error = Error::Admin {
            action: "draining",
            source: crate::admin::AdminError::Unreachable {
                addr: crate::admin::BrokerAddr("qb-2:10911".into()),
                source: "connection refused".into(),
            },
        };
        assert_eq!(
            error_chain(&error),
            "broker admin call failed while draining: broker qb-2:10911 unreachable: \
             connection refused"
        );
    }

    #[test]
    fn long_event_notes_are_cut_to_fit() {
        assert_eq!(event_note("short"), "short");
        let exact = "x".repeat(MAX_EVENT_NOTE_BYTES);
        assert_eq!(event_note(&exact), exact);
        // Multi-byte characters are never split.
        let long = "é".repeat(MAX_EVENT_NOTE_BYTES);
        let cut = event_note(&long);
        assert!(cut.len() <= MAX_EVENT_NOTE_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…') && cut.starts_with("éé"));
    }

    #[tokio::test]
    async fn backoff_doubles_and_is_capped_then_resets() {
        let server = TestApiServer::start().await;
        let ctx = Arc::new(Context::new(
            server.client(),
            Arc::new(FakeAdmin::default()),
            Arc::default(),
            Duration::from_secs(1),
        ));
        let broker = Arc::new(Broker::test());
        let error = Error::MissingField {
            kind: "Broker",
            name: "qb".into(),
            field: "namespace",
        };
        let delays: Vec<Action> = (0..8)
            .map(|_| error_policy(broker.clone(), &error, ctx.clone()))
            .collect();
        assert_eq!(delays[0], Action::requeue(Duration::from_secs(5)));
        assert_eq!(delays[1], Action::requeue(Duration::from_secs(10)));
        assert_eq!(delays[2], Action::requeue(Duration::from_secs(20)));
        assert_eq!(delays[7], Action::requeue(BACKOFF_MAX));
        ctx.reset_backoff(&object_key(broker.as_ref()));
        assert_eq!(
            error_policy(broker, &error, ctx.clone()),
            Action::requeue(Duration::from_secs(5))
        );
        assert!(ctx.metrics.encode().contains(
            r#"quiver_reconcile_errors_total{controller="broker",error="missing_field"} 9"#
        ));
    }
}
