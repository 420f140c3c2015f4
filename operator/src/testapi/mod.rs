//! A test API server with real semantics, speaking HTTP in-process so a `kube::Client` talks to
//! it as to a cluster.
//!
//! What it does: generic JSON storage keyed by (apiVersion/plural, namespace, name) for the kinds
//! in [`resources`]; one global resourceVersion; list and watch (bookmarks, timeouts, 410 Gone
//! for resourceVersions older than the bounded history); generation, uid and creationTimestamp;
//! the status subresource; merge, JSON, strategic (as merge) patches and server-side apply with
//! managedFields and 409 conflicts; optimistic concurrency; finalizers and owner-reference
//! garbage collection; admission of the CRDs (OpenAPI schema and CEL rules) and of PVC resizes;
//! a simulated StatefulSet controller and kubelet ([`statefulset`]).
//!
//! Knowingly simplified: lists ignore `limit` (no `continue`); watches ignore
//! `sendInitialEvents` (kube's default ListWatch does not send it); server-side apply knows
//! the list types of the built-in fields the operator writes (`fields::list_type`), not every
//! schema, strategic merge is a JSON merge, and managedFields carry no `time`; deletion is
//! background only (Orphan honoured, Foreground treated as background, `gracePeriodSeconds`
//! ignored) and garbage collection runs at once; a pod the kubelet runs terminates (a
//! deletionTimestamp, not Ready) until the kubelet has stopped it or its grace period is over,
//! an unscheduled one goes at once; admission covers the CRDs (pruning, defaults, type/required/enum/bounds/
//! lengths, CEL; no `pattern`/`format`), StatefulSet and PVC spec immutability, PVC resize and
//! DefaultStorageClass, and nothing else (no RBAC, quota, namespace existence).
//!
//! Transport: [`TestApiServer::client`] is a `kube::Client` over an in-process tower service
//! that hands each `http::Request` to the server's handler ([`http::handle`]) in the same
//! runtime, behind kube-rs's own retry layer (429/503/504). There is no socket: a request and
//! its answer, and every watch event (an unbounded channel read by the response body), move
//! only through tokio wakers.
//!
//! Simulated time: run tests with `#[tokio::test(start_paused = true)]` (a current-thread
//! runtime) and keep server and client in that one runtime. tokio's paused clock auto-advances
//! only when no task can run; with no I/O anywhere, that is when the whole system is quiescent:
//! no request in flight, no watch event undelivered, no controller work ready, every task
//! waiting on a timer. The clock then jumps to the next timer. So a request costs no simulated
//! time and a scenario's verdict does not depend on the build profile or the machine's speed
//! (docs/ARCHITECTURE.md, "The operator's simulated clock").
//! [`sim_clock`] is a `Context::with_clock` clock that follows tokio's (paused) clock.
//!
//! Also served as a real server does: the scale subresource of a CRD that declares one
//! ([`scale`]; server-side apply to a Scale is refused), and the validation of every object's
//! name and labels ([`names`]), with CEL root rules seeing only `metadata.name` and
//! `metadata.generateName` of the metadata.

mod admission;
mod fields;
mod hooks;
mod http;
pub mod names;
mod ops;
pub mod resources;
mod scale;
mod selector;
pub mod statefulset;
mod store;
mod watch;

#[cfg(test)]
mod e2e;
#[cfg(test)]
mod tests;

pub use hooks::{FailureRule, RequestRecord};
pub use statefulset::PodBehaviour;

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The simulated clock's start, ms since the epoch (2023-11-14T22:13:20Z).
pub const SIM_EPOCH_MS: i64 = 1_700_000_000_000;

thread_local! {
    // The tokio instant at which this thread's server started: simulated time zero.
    static SIM_START: Cell<Option<tokio::time::Instant>> = const { Cell::new(None) };
}

/// Milliseconds since the epoch in simulated time: [`SIM_EPOCH_MS`] plus the tokio time elapsed
/// since the server on this thread started. A `controller::Clock`.
pub fn sim_clock() -> i64 {
    let start = SIM_START.with(|start| match start.get() {
        Some(instant) => instant,
        None => {
            let now = tokio::time::Instant::now();
            start.set(Some(now));
            now
        }
    });
    let elapsed = tokio::time::Instant::now().saturating_duration_since(start);
    SIM_EPOCH_MS + i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
}

/// RFC 3339 timestamp `seconds` after the simulated now, in whole seconds rounded down (a
/// graceful deletion's deadline: never later than the grace period allows).
pub(crate) fn sim_timestamp_after(seconds: i64) -> String {
    let at_ms = (sim_clock() + seconds.saturating_mul(1000)).div_euclid(1000) * 1000;
    k8s_openapi::jiff::Timestamp::from_millisecond(at_ms)
        .map(|timestamp| timestamp.to_string())
        .unwrap_or_default()
}

/// RFC 3339 timestamp of the simulated now, as the API server writes them.
pub(crate) fn sim_timestamp() -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(sim_clock())
        .map(|timestamp| {
            timestamp
                .round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(timestamp)
                .to_string()
        })
        .unwrap_or_default()
}

/// Everything the HTTP handlers, the simulated controllers and the hooks share.
pub(crate) struct Shared {
    pub store: Mutex<store::Store>,
    pub hooks: Mutex<hooks::Hooks>,
    pub sim: Mutex<statefulset::SimState>,
    /// Resources (by id) whose watches hold their events back (a lagging watch), until released.
    pub held_watches: tokio::sync::watch::Sender<std::collections::BTreeSet<String>>,
}

impl Shared {
    pub(crate) fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.store.lock().expect("store lock poisoned")
    }
}

/// The running test API server; stops its tasks when dropped.
pub struct TestApiServer {
    pub(crate) shared: Arc<Shared>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl TestApiServer {
    /// A server with an empty store; simulated time starts now. The StatefulSet simulation only
    /// runs on [`TestApiServer::step`] until [`TestApiServer::run_controllers`] is called.
    pub async fn start() -> TestApiServer {
        SIM_START.with(|start| start.set(Some(tokio::time::Instant::now())));
        let shared = Arc::new(Shared {
            store: Mutex::new(store::Store::default()),
            hooks: Mutex::new(hooks::Hooks::default()),
            sim: Mutex::new(statefulset::SimState::default()),
            held_watches: tokio::sync::watch::Sender::new(Default::default()),
        });
        TestApiServer {
            shared,
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// A client for this server (default namespace "default"): kube-rs's retry layer over the
    /// in-process transport (module docs). Each client, like kube-rs's, runs its buffer worker
    /// on the current runtime.
    pub fn client(&self) -> kube::Client {
        let shared = self.shared.clone();
        let transport = tower::service_fn(move |request: ::http::Request<kube::client::Body>| {
            let shared = shared.clone();
            async move { Ok::<_, tower::BoxError>(http::handle(shared, request).await) }
        });
        let retry = tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry());
        kube::client::ClientBuilder::new(transport, "default")
            .with_layer(&retry)
            .build()
    }

    /// Runs the simulated StatefulSet controller and kubelet every `period` until dropped.
    pub fn run_controllers(&self, period: Duration) {
        let shared = self.shared.clone();
        let task = tokio::spawn(async move {
            loop {
                statefulset::step(&shared);
                tokio::time::sleep(period).await;
            }
        });
        self.tasks
            .lock()
            .expect("tasks lock poisoned")
            .push(task.abort_handle());
    }

    /// One pass of the simulated StatefulSet controller, then one of the kubelet.
    pub fn step(&self) {
        statefulset::step(&self.shared);
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        for task in self.tasks.lock().expect("tasks lock poisoned").drain(..) {
            task.abort();
        }
    }
}
