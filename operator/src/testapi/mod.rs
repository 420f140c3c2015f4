//! A test API server with real semantics, served over HTTP on 127.0.0.1 so a `kube::Client`
//! talks to it exactly as to a cluster.
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
//! `sendInitialEvents` (kube's default ListWatch does not send it); every list is atomic for
//! field ownership (no associative-list merge keys), strategic merge is a JSON merge, and
//! managedFields carry no `time`; deletion is background only (Orphan honoured, Foreground
//! treated as background) and garbage collection runs at once; pods are removed at once, with
//! no grace period; admission covers the CRDs (pruning, defaults, type/required/enum/bounds/
//! lengths, CEL; no `pattern`/`format`), StatefulSet and PVC spec immutability, PVC resize and
//! DefaultStorageClass, and nothing else (no RBAC, quota, namespace existence).
//!
//! Simulated time: run tests with `#[tokio::test(start_paused = true)]` (a current-thread
//! runtime) and keep server and client in that one runtime. The server spawns a "time pump" that
//! sleeps [`TIME_TICK`] in a loop: tokio's auto-advance then moves the clock by at most one tick
//! whenever every task is idle, so a request in flight on the loopback socket never lets a client
//! timeout (295 s) fire early, while ten simulated minutes take about a second of real time
//! ([`TestApiServer::set_time_tick`] trades precision for speed).
//! [`sim_clock`] is a `Context::with_clock` clock that follows tokio's (paused) clock.

mod admission;
mod fields;
mod hooks;
mod http;
mod ops;
pub mod resources;
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
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The simulated clock's start, ms since the epoch (2023-11-14T22:13:20Z).
pub const SIM_EPOCH_MS: i64 = 1_700_000_000_000;
/// Default largest jump of the paused clock while tasks wait on sockets: a request costs about
/// one or two ticks of simulated time; ten simulated minutes take about a second of real time.
pub const TIME_TICK: Duration = Duration::from_millis(50);

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
    /// The time pump's period, in ms.
    pub tick_ms: AtomicU64,
}

impl Shared {
    pub(crate) fn store(&self) -> std::sync::MutexGuard<'_, store::Store> {
        self.store.lock().expect("store lock poisoned")
    }
}

/// The running test API server; stops its tasks when dropped.
pub struct TestApiServer {
    pub(crate) shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl TestApiServer {
    /// Binds 127.0.0.1 on a free port and serves; the StatefulSet simulation only runs on
    /// [`TestApiServer::step`] until [`TestApiServer::run_controllers`] is called.
    pub async fn start() -> TestApiServer {
        SIM_START.with(|start| start.set(Some(tokio::time::Instant::now())));
        let shared = Arc::new(Shared {
            store: Mutex::new(store::Store::default()),
            hooks: Mutex::new(hooks::Hooks::default()),
            sim: Mutex::new(statefulset::SimState::default()),
            tick_ms: AtomicU64::new(TIME_TICK.as_millis() as u64),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("bound address");
        let server = tokio::spawn(http::serve(listener, shared.clone()));
        let pump = tokio::spawn(time_pump(shared.clone()));
        TestApiServer {
            shared,
            addr,
            tasks: Mutex::new(vec![server.abort_handle(), pump.abort_handle()]),
        }
    }

    /// Where the server listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for this server: plain HTTP, default namespace "default".
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr)
            .parse()
            .expect("server URL parses");
        kube::Client::try_from(kube::Config::new(url)).expect("client from config")
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

    /// Sets the largest jump of the paused clock while requests are in flight (default
    /// [`TIME_TICK`]); smaller is more precise, larger is faster.
    pub fn set_time_tick(&self, tick: Duration) {
        let millis = u64::try_from(tick.as_millis()).unwrap_or(u64::MAX).max(1);
        self.shared.tick_ms.store(millis, Ordering::Relaxed);
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

/// Keeps one timer due within a tick so a paused clock advances in small steps (see module docs).
async fn time_pump(shared: Arc<Shared>) {
    loop {
        let tick = shared.tick_ms.load(Ordering::Relaxed).max(1);
        tokio::time::sleep(Duration::from_millis(tick)).await;
    }
}
