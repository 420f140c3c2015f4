//! End-to-end: the real controller and leader election against the test API server, in
//! simulated time.

use super::{sim_clock, TestApiServer};
use crate::controller::{self, Context};
use crate::crd::{Broker, ConsumerGroup};
use crate::fixtures::FakeAdmin;
use crate::leader::{run_while_leading, Candidate, Leadership};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Simulated period of the StatefulSet controller and kubelet.
const SIM_PERIOD: Duration = Duration::from_secs(1);

fn broker_manifest(replicas: i32) -> serde_json::Value {
    json!({
        "apiVersion": "quiver.io/v1alpha1", "kind": "Broker",
        "metadata": {"name": "qb", "namespace": "ns"},
        "spec": {"replicas": replicas, "image": "quiver:1", "storage": {"size": "10Gi"}},
    })
}

/// True when the Broker's status says Ready for its current generation.
fn broker_ready(server: &TestApiServer) -> bool {
    let Some(broker) = server.object::<Broker>("ns", "qb") else {
        return false;
    };
    let Some(status) = broker.status else {
        return false;
    };
    let ready = status
        .conditions
        .iter()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True");
    ready && status.observed_generation == broker.metadata.generation
}

/// Polls `condition` every simulated second until it holds or `limit` of simulated time passes.
async fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> Duration {
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

#[tokio::test(start_paused = true)]
async fn the_controller_brings_a_two_replica_broker_to_ready() {
    let server = TestApiServer::start().await;
    server.add_storage_class("standard", true, true);
    server.run_controllers(SIM_PERIOD);
    let client = server.client();
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            Arc::new(FakeAdmin::default()),
            Arc::default(),
            Duration::from_secs(15),
        )
        .with_clock(sim_clock),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(controller::run(ctx, Some("ns".into()), async move {
        stop_rx.await.ok();
    }));

    let brokers: Api<Broker> = Api::namespaced(client, "ns");
    brokers
        .patch(
            "qb",
            &PatchParams::apply("kubectl"),
            &Patch::Apply(broker_manifest(2)),
        )
        .await
        .expect("the Broker is applied");
    let took = eventually(Duration::from_secs(600), || broker_ready(&server)).await;

    let broker: Broker = server.object("ns", "qb").expect("broker stored");
    let status = broker.status.expect("status written");
    assert_eq!((status.ready_replicas, status.current_replicas), (2, 2));
    assert_eq!(status.observed_generation, Some(1));
    let sts: StatefulSet = server.object("ns", "qb").expect("statefulset applied");
    let sts_status = sts.status.expect("statefulset status");
    assert_eq!(sts_status.ready_replicas, Some(2));
    assert_eq!(sts_status.current_revision, sts_status.update_revision);
    assert_eq!(server.list::<Pod>("ns").len(), 2);
    let claims = server.list::<PersistentVolumeClaim>("ns");
    assert_eq!(claims.len(), 2, "one claim per broker");
    assert!(
        sim_clock() - super::SIM_EPOCH_MS >= i64::try_from(took.as_millis()).unwrap(),
        "the context clock follows simulated time"
    );
    let status_writes = server.request_count("patch", "brokers", "qb", "status");
    assert!(
        status_writes <= 10,
        "{status_writes} status writes to get Ready"
    );

    stop_tx.send(()).expect("controllers running");
    tokio::time::timeout(Duration::from_secs(30), controllers)
        .await
        .expect("controllers stop within the grace")
        .expect("controllers join");
}

#[tokio::test(start_paused = true)]
async fn only_one_of_two_candidates_leads() {
    let server = TestApiServer::start().await;
    let leading = Arc::new(AtomicUsize::new(0));
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(AtomicUsize::new(0));
    let mut elections = Vec::new();
    let mut stops = Vec::new();
    for identity in ["operator-a", "operator-b"] {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        stops.push(stop_tx);
        let (leading, most_at_once, terms) = (leading.clone(), most_at_once.clone(), terms.clone());
        let candidate = Candidate {
            namespace: "ops".into(),
            identity: identity.into(),
        };
        elections.push(tokio::spawn(run_while_leading(
            server.client(),
            candidate,
            async move {
                stop_rx.await.ok();
            },
            move |shutdown| async move {
                terms.fetch_add(1, Ordering::SeqCst);
                let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                most_at_once.fetch_max(now, Ordering::SeqCst);
                shutdown.await;
                leading.fetch_sub(1, Ordering::SeqCst);
            },
        )));
    }
    // A minute of simulated time: several renewals of the 15 s lease.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(most_at_once.load(Ordering::SeqCst), 1, "never two leaders");
    assert_eq!(terms.load(Ordering::SeqCst), 1, "one leader, kept");
    let lease = server
        .raw::<k8s_openapi::api::coordination::v1::Lease>("ops", crate::leader::LEASE_NAME)
        .expect("lease created");
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(holder.starts_with("operator-"), "{lease}");
    for stop in stops {
        stop.send(()).ok();
    }
    for election in elections {
        let outcome = tokio::time::timeout(Duration::from_secs(30), election)
            .await
            .expect("election ends")
            .expect("task joins")
            .expect("election works");
        assert_eq!(outcome, Leadership::Stopped);
    }
}

/// The operator running against `server` in namespace "ns"; send on the sender to stop it.
fn start_operator(
    server: &TestApiServer,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let ctx = Arc::new(
        Context::new(
            server.client(),
            Arc::new(FakeAdmin::default()),
            Arc::default(),
            Duration::from_secs(15),
        )
        .with_clock(sim_clock),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller::run(ctx, Some("ns".into()), async move {
        stop_rx.await.ok();
    }));
    (stop_tx, task)
}

/// The opening most tests share: the simulated cluster and the operator running, a three-pod
/// Broker applied as kubectl would and Ready.
async fn operator_with_ready_broker(
    server: &TestApiServer,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    Api<Broker>,
) {
    server.add_storage_class("standard", true, true);
    server.run_controllers(SIM_PERIOD);
    let (stop, task) = start_operator(server);
    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    brokers
        .patch(
            "qb",
            &PatchParams::apply("kubectl"),
            &apply_broker("quiver:1"),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(600), || broker_ready(server)).await;
    (stop, task, brokers)
}

fn apply_broker(image: &str) -> Patch<serde_json::Value> {
    let mut manifest = broker_manifest(3);
    manifest["spec"]["image"] = image.into();
    Patch::Apply(manifest)
}

#[tokio::test(start_paused = true)]
async fn a_settled_broker_writes_nothing_for_ten_idle_minutes() {
    let server = TestApiServer::start().await;
    let (stop, task, _brokers) = operator_with_ready_broker(&server).await;
    // Let the last status write and the pods settle.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (requests_before, rv_before) = (server.requests().len(), server.resource_version());

    tokio::time::sleep(Duration::from_secs(600)).await;
    let idle = &server.requests()[requests_before..];
    assert_eq!(
        server.resource_version(),
        rv_before,
        "no stored change: every apply was a no-op"
    );
    let watches = idle
        .iter()
        .filter(|r| r.verb == "watch" && r.resource == "brokers")
        .count();
    assert_eq!(
        watches, 2,
        "watches end at timeoutSeconds (290 s) and are re-opened"
    );
    let statefulset_applies = idle
        .iter()
        .filter(|r| r.verb == "patch" && r.resource == "statefulsets")
        .count();
    assert!(
        statefulset_applies <= 3,
        "reconciles only on the idle requeue: {idle:?}"
    );
    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_image_change_rolls_through_the_controller_one_pod_at_a_time() {
    let server = TestApiServer::start().await;
    let (stop, task, brokers) = operator_with_ready_broker(&server).await;
    let apply = PatchParams::apply("kubectl");

    brokers
        .patch("qb", &apply, &apply_broker("quiver:2"))
        .await
        .unwrap();
    let started = Instant::now();
    let mut updated_order: Vec<String> = Vec::new();
    loop {
        let pods = server.pod_states("ns");
        let available = pods.iter().filter(|(_, _, ready)| *ready).count();
        assert!(
            available >= 2,
            "at most one broker down at a time: {pods:?}"
        );
        for (name, image, _) in &pods {
            if image == "quiver:2" && !updated_order.contains(name) {
                updated_order.push(name.clone());
            }
        }
        let done = pods.len() == 3
            && pods
                .iter()
                .all(|(_, image, ready)| image == "quiver:2" && *ready);
        if done && broker_ready(&server) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "rollout within 15 simulated minutes: {pods:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        updated_order,
        ["qb-2", "qb-1", "qb-0"],
        "highest ordinal first"
    );
    let status = server.object::<Broker>("ns", "qb").unwrap().status.unwrap();
    assert_eq!(status.observed_generation, Some(2));
    assert!(status.rollout.is_none(), "no rollout left in status");
    let reasons = server.event_reasons();
    assert!(
        reasons.iter().any(|reason| reason == "RolloutStarted"),
        "{reasons:?}"
    );
    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
}

/// leader.rs gives every replica the field manager "quiver-operator", but kube-lease-manager
/// takes an orphaned Lease with a non-forced apply and counts on a 409 to stop a second taker:
/// with one shared manager there is no conflict, so a second candidate racing on the same
/// orphaned Lease overwrites the first instead of failing.
#[tokio::test]
async fn only_distinct_field_managers_make_a_second_lease_taker_conflict() {
    let server = TestApiServer::start().await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(server.client(), "ops");
    let take = |holder: &str| {
        Patch::Apply(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lease", "namespace": "ops"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        }))
    };
    let as_manager = |manager: &str| PatchParams::apply(manager);
    leases
        .patch("lease", &as_manager("kube-lease-manager-a"), &take("a"))
        .await
        .unwrap();
    let error = leases
        .patch("lease", &as_manager("kube-lease-manager-b"), &take("b"))
        .await
        .unwrap_err();
    assert!(matches!(error, kube::Error::Api(status) if status.code == 409));

    leases
        .patch("other", &as_manager("quiver-operator"), &take("a"))
        .await
        .unwrap();
    let taken = leases
        .patch("other", &as_manager("quiver-operator"), &take("b"))
        .await
        .expect("one shared manager: no conflict");
    assert_eq!(taken.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn a_group_holds_its_finalizer_until_cleanup_and_a_deleted_broker_takes_its_objects() {
    let server = TestApiServer::start().await;
    let (stop, task, brokers) = operator_with_ready_broker(&server).await;
    let apply = PatchParams::apply("kubectl");

    let groups: Api<ConsumerGroup> = Api::namespaced(server.client(), "ns");
    let group = json!({"apiVersion": "quiver.io/v1alpha1", "kind": "ConsumerGroup",
        "metadata": {"name": "billing", "namespace": "ns"},
        "spec": {"brokerRef": "qb", "topics": ["orders"]}});
    groups
        .patch("billing", &apply, &Patch::Apply(group))
        .await
        .unwrap();
    eventually(Duration::from_secs(120), || {
        server
            .object::<ConsumerGroup>("ns", "billing")
            .is_some_and(|group| {
                !group.finalizers().is_empty()
                    && group
                        .status
                        .is_some_and(|s| s.observed_generation == Some(1))
            })
    })
    .await;
    groups.delete("billing", &Default::default()).await.unwrap();
    eventually(Duration::from_secs(120), || {
        server.raw::<ConsumerGroup>("ns", "billing").is_none()
    })
    .await;

    brokers.delete("qb", &Default::default()).await.unwrap();
    eventually(Duration::from_secs(60), || {
        server.list::<Pod>("ns").is_empty()
    })
    .await;
    assert!(
        server.list::<StatefulSet>("ns").is_empty(),
        "owned by the Broker: collected"
    );
    assert!(server
        .list::<k8s_openapi::api::core::v1::Service>("ns")
        .is_empty());
    assert_eq!(
        server.list::<PersistentVolumeClaim>("ns").len(),
        3,
        "Retain keeps the claims"
    );
    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap();
}
