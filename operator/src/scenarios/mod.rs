//! Controller scenarios, one behaviour per file (the controller-rs fixtures pattern). They
//! run the real `controller::run` against the test API server ([`crate::testapi`]) and the
//! in-memory brokers ([`FakeAdmin`]) in simulated time: [`Scenario`] sets that up.
//!
//! They cover what a table cannot: the executor's calls, the watches, server-side apply,
//! generations and admission, and whole paths end to end. What a pass decides (the objects,
//! the steps, the status, the events) is asserted by the table tests of `plan` in
//! `controller::broker::tests` and `controller::group::tests`.

mod api_errors;
mod broker_create;
mod broker_deposed_master;
mod broker_drain_dead_letters;
mod broker_drain_partial_revert;
mod broker_drain_replicated;
mod broker_expansion_deadline;
mod broker_foreign_fields;
mod broker_groups_independent;
mod broker_lagging_watch;
mod broker_master_handover;
mod broker_member_scaling;
mod broker_name_limit;
mod broker_rbac;
mod broker_replicated_rollout;
mod broker_restart;
mod broker_scale_down;
mod broker_scale_no_restart;
mod broker_scale_subresource;
mod broker_security;
mod broker_statefulset_migration;
mod broker_status_write;
mod broker_storm;
mod broker_template_drift;
mod broker_two_operators;
mod group_finalizer;
mod group_lag_partial;
mod group_lag_status;
mod group_no_storm;
mod group_offset_reset;
mod group_offset_reset_once;
mod group_poll_failure;
mod group_storm;
mod group_stuck_queue;
mod group_support;

use crate::admin::BrokerAddr;
use crate::controller::{self, Context};
use crate::crd::{Broker, BrokerStatus};
use crate::fixtures::{BrokerFixture, BrokerProcess, FakeAdmin};
use crate::testapi::{sim_clock, statefulset, TestApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The fixed "now" of every scenario, ms since the epoch (the simulated clock starts there too).
pub const NOW_MS: i64 = crate::testapi::SIM_EPOCH_MS;

/// Lag poll interval of the scenarios' context.
pub const LAG_INTERVAL: Duration = Duration::from_secs(15);

/// Period of the simulated StatefulSet controller and kubelet.
pub const SIM_PERIOD: Duration = Duration::from_secs(1);

/// A context of an operator on `server`, its own metrics, following the simulated clock.
pub fn sim_context(server: &TestApiServer, admin: Arc<FakeAdmin>) -> Arc<Context> {
    Arc::new(
        Context::new(server.client(), admin, Arc::default(), LAG_INTERVAL).with_clock(sim_clock),
    )
}

/// Remoting address of broker `ordinal` of Broker `qb` in `ns`.
pub fn addr(ordinal: i32) -> String {
    format!("qb-{ordinal}.qb-headless.ns.svc:10911")
}

/// The test API server (default StorageClass "standard", simulated StatefulSet controller and
/// kubelet running), the in-memory brokers, and the operator (`controller::run` on namespace
/// "ns") until [`Scenario::stop`].
pub struct Scenario {
    pub server: TestApiServer,
    pub admin: Arc<FakeAdmin>,
    pub ctx: Arc<Context>,
    stop: tokio::sync::oneshot::Sender<()>,
    operator: tokio::task::JoinHandle<()>,
}

impl Scenario {
    /// Everything running, no Broker yet; the StorageClass allows volume expansion or not.
    pub async fn start(allow_volume_expansion: bool) -> Scenario {
        Scenario::launch(allow_volume_expansion, false).await
    }

    /// [`Scenario::start`] with the operator run under leader election (Lease in "ns"), as the
    /// binary runs it.
    pub async fn start_elected() -> Scenario {
        Scenario::launch(true, true).await
    }

    async fn launch(allow_volume_expansion: bool, elected: bool) -> Scenario {
        let server = TestApiServer::start().await;
        server.add_storage_class("standard", allow_volume_expansion, true);
        server.run_controllers(SIM_PERIOD);
        let admin = Arc::new(FakeAdmin::default());
        let shared = server.shared.clone();
        admin.count_api_requests_with(move || {
            let hooks = shared.hooks.lock().expect("hooks lock poisoned");
            hooks.requests.len()
        });
        let shared = server.shared.clone();
        admin.follow_pods(move |addr| broker_process(&shared, addr));
        let ctx = sim_context(&server, admin.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            stopped.await.ok();
        };
        let run_ctx = ctx.clone();
        let operator = tokio::spawn(async move {
            if !elected {
                return controller::run(run_ctx, Some("ns".into()), stopped).await;
            }
            let candidate = crate::leader::Candidate {
                namespace: "ns".into(),
                identity: "operator-a".into(),
            };
            let client = run_ctx.client.clone();
            crate::leader::run_while_leading(client, candidate, stopped, |shutdown| {
                controller::run(run_ctx, Some("ns".into()), shutdown)
            })
            .await
            .expect("the election works");
        });
        Scenario {
            server,
            admin,
            ctx,
            stop,
            operator,
        }
    }

    /// A Broker `ns/qb` of `replicas` brokers on image quiver:1, created and Ready.
    pub async fn settled(replicas: i32) -> Scenario {
        let scenario = Scenario::start(true).await;
        scenario.create_broker(Broker::test().replicas(replicas).image("quiver:1"));
        eventually(Duration::from_secs(300), || scenario.broker_ready()).await;
        scenario
    }

    /// A Broker of `groups` broker groups of `size` pods each (sync, `min_in_sync`), on image
    /// quiver:1, with the fake brokers answering as groups whose replica 0 is master, Ready.
    pub async fn settled_replicated(groups: i32, size: i32, min_in_sync: i32) -> Scenario {
        let scenario = Scenario::start(true).await;
        for group in 0..groups {
            let members: Vec<String> = (group * size..(group + 1) * size).map(addr).collect();
            let min = u32::try_from(min_in_sync).expect("positive");
            scenario
                .admin
                .set_replication_group(&format!("qb-g{group}"), &members, min);
        }
        let broker = Broker::test()
            .replicas(groups)
            .replicated(size, min_in_sync)
            .image("quiver:1");
        scenario.create_broker(broker);
        eventually(Duration::from_secs(600), || scenario.broker_ready()).await;
        scenario
    }

    /// Creates `broker` as a user would (uid and generation are the server's).
    pub fn create_broker(&self, mut broker: Broker) {
        broker.metadata.uid = None;
        broker.metadata.generation = None;
        self.server.insert(&broker);
    }

    /// Stops the operator and waits for it to finish within its shutdown grace.
    pub async fn stop(self) {
        self.stop.send(()).ok();
        tokio::time::timeout(Duration::from_secs(30), self.operator)
            .await
            .expect("the operator stops")
            .expect("the operator task joins");
    }

    /// The Broker as stored now.
    pub fn broker(&self) -> Broker {
        self.server.object("ns", "qb").expect("Broker qb stored")
    }

    /// The Broker's status as stored now (default when none was written).
    pub fn status(&self) -> BrokerStatus {
        self.broker().status.unwrap_or_default()
    }

    /// Edits the Broker as a user would (a spec change bumps the generation).
    pub fn edit_broker(&self, edit: impl FnOnce(&mut Value)) {
        self.server.edit::<Broker>("ns", "qb", edit);
    }

    /// Sets spec.replicas.
    pub fn scale_to(&self, replicas: i32) {
        self.edit_broker(|broker| broker["spec"]["replicas"] = replicas.into());
    }

    /// Sets spec.image.
    pub fn set_image(&self, image: &str) {
        self.edit_broker(|broker| broker["spec"]["image"] = image.into());
    }

    /// Sets an annotation on the Broker.
    pub fn annotate(&self, key: &str, value: &str) {
        self.edit_broker(|broker| broker["metadata"]["annotations"][key] = value.into());
    }

    /// The status and reason of a condition of the Broker, if it has that condition.
    pub fn condition(&self, type_: &str) -> Option<(String, String)> {
        let conditions = self.status().conditions;
        let found = conditions
            .iter()
            .find(|condition| condition.type_ == type_)?;
        Some((found.status.clone(), found.reason.clone()))
    }

    /// True when the status says every broker is Ready at the current generation, with nothing
    /// left rolling or draining.
    pub fn broker_ready(&self) -> bool {
        let Some(broker) = self.server.object::<Broker>("ns", "qb") else {
            return false;
        };
        let Some(status) = broker.status else {
            return false;
        };
        status.observed_generation == broker.metadata.generation
            && condition_is(&status.conditions, "Ready", "True")
            && condition_is(&status.conditions, "Progressing", "False")
    }

    /// The StatefulSet as stored now.
    pub fn statefulset(&self) -> StatefulSet {
        self.server
            .object("ns", "qb")
            .expect("StatefulSet qb stored")
    }

    /// spec.replicas of the StatefulSet.
    pub fn sts_replicas(&self) -> i32 {
        self.statefulset().spec.replicas.unwrap_or_default()
    }

    /// Each pod: name, image, Ready.
    pub fn pods(&self) -> Vec<(String, String, bool)> {
        self.server
            .list::<Pod>("ns")
            .into_iter()
            .map(|pod| {
                let image = pod
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.containers.first())
                    .and_then(|container| container.image.clone())
                    .unwrap_or_default();
                let conditions = pod.status.and_then(|status| status.conditions);
                let ready = conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                (pod.metadata.name.unwrap_or_default(), image, ready)
            })
            .collect()
    }

    /// True when exactly `count` pods run, all on `image` and Ready.
    pub fn pods_ready_on(&self, count: usize, image: &str) -> bool {
        let pods = self.pods();
        pods.len() == count && pods.iter().all(|(_, on, ready)| on == image && *ready)
    }

    /// Events recorded about the Broker with this reason.
    pub fn events(&self, reason: &str) -> Vec<Value> {
        self.server
            .events()
            .into_iter()
            .filter(|event| event["reason"] == reason)
            .collect()
    }

    /// The only event with this reason, checked to be of `type_` (Normal, Warning).
    pub fn event(&self, reason: &str, type_: &str) -> Value {
        let events = self.events(reason);
        let event = events
            .first()
            .unwrap_or_else(|| panic!("no {reason} event in {:?}", self.server.event_reasons()));
        assert_eq!(event["type"], type_, "{event}");
        event.clone()
    }

    /// The index in the API request log of the first delete of pod `name`, if any.
    pub fn pod_delete_index(&self, name: &str) -> Option<usize> {
        self.server.requests().iter().position(|request| {
            request.verb == "delete" && request.resource == "pods" && request.name == name
        })
    }

    /// The uid of pod `name`, if it exists (a restarted pod has a new one).
    pub fn pod_uid(&self, name: &str) -> Option<String> {
        self.server
            .object::<Pod>("ns", name)
            .and_then(|pod| pod.metadata.uid)
    }

    /// Broker reconciles so far, from the operator's own counter.
    pub fn reconciles(&self) -> u64 {
        broker_reconciles(&self.ctx)
    }
}

/// The process of the broker at `addr` (`<pod>.<service>.<namespace>.svc:<port>`): its pod's,
/// while the simulated kubelet runs it.
fn broker_process(shared: &crate::testapi::Shared, addr: &BrokerAddr) -> Option<BrokerProcess> {
    let (pod, rest) = addr.0.split_once('.')?;
    let namespace = rest.split('.').nth(1)?;
    let (pod_uid, ready) = statefulset::running_process(shared, namespace, pod)?;
    Some(BrokerProcess { pod_uid, ready })
}

/// Broker reconciles `ctx`'s operator has run, from `quiver_reconcile_total`.
pub fn broker_reconciles(ctx: &Context) -> u64 {
    let prefix = r#"quiver_reconcile_total{controller="broker"} "#;
    ctx.metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .map_or(0, |count| count.parse().expect("a count"))
}

/// Checks `condition` every simulated second until it holds; panics after `limit` of simulated
/// time. Returns the time it took.
pub async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < limit,
            "condition not met within {limit:?} of simulated time"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    started.elapsed()
}

/// Checks `invariant` every simulated second for `period`, panicking with `what` if it breaks.
pub async fn holds_for(period: Duration, what: &str, mut invariant: impl FnMut() -> bool) {
    let started = Instant::now();
    while started.elapsed() < period {
        assert!(invariant(), "{what} broke after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn condition_is(conditions: &[Condition], type_: &str, status: &str) -> bool {
    conditions
        .iter()
        .any(|condition| condition.type_ == type_ && condition.status == status)
}

/// A condition's message.
pub fn condition_message(conditions: &[Condition], type_: &str) -> String {
    conditions
        .iter()
        .find(|condition| condition.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"))
        .message
        .clone()
}

/// A condition's status ("True"/"False"/"Unknown") and reason.
pub fn condition(conditions: &[Condition], type_: &str) -> (String, String) {
    let found = conditions
        .iter()
        .find(|condition| condition.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"));
    (found.status.clone(), found.reason.clone())
}
