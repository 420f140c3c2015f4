//! RBAC is exactly what the code uses: every request the reconcilers, the controllers' watches
//! and the leader election make against the fake API server is recorded, turned into
//! (apiGroup, resource, verb), and compared with the rules of the chart's _rbac.tpl.

use super::broker_scale_down::settled_brokers;
use super::{addr, context, set_pod, set_revisions, set_storage_class, settle_statefulset};
use super::{stored_broker, stored_group, NOW_MS};
use crate::controller::{self, broker, group};
use crate::crd::{Broker, BrokerStatus, ConsumerGroup};
use crate::fixtures::ResourcePath;
use crate::fixtures::{paths, ApiCall, BrokerFixture, FakeAdmin, FakeApiServer, GroupFixture};
use crate::leader::{self, Candidate};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// (apiGroup, resource or resource/subresource, verb).
type Permission = (String, String, String);

const RBAC_TEMPLATE: &str = include_str!("../../../charts/quiver-operator/templates/_rbac.tpl");
const RBAC_MANIFEST: &str = include_str!("../../../charts/quiver-operator/templates/rbac.yaml");

/// The verb the API server authorizes a request as.
fn permissions_of(call: &ApiCall) -> Vec<Permission> {
    let Some(path) = ResourcePath::parse(&call.path) else {
        return Vec::new();
    };
    let resource = match &path.subresource {
        Some(sub) => format!("{}/{sub}", path.resource),
        None => path.resource.clone(),
    };
    let watching = call.query.split('&').any(|pair| pair.starts_with("watch="));
    let verbs: Vec<&str> = match (call.method.as_str(), path.name.is_some()) {
        ("GET", true) => vec!["get"],
        ("GET", false) if watching => vec!["watch"],
        ("GET", false) => vec!["list"],
        ("POST", _) => vec!["create"],
        ("PUT", _) => vec!["update"],
        // Server-side apply that creates the object is also authorized as create.
        ("PATCH", _) if call.created => vec!["patch", "create"],
        ("PATCH", _) => vec!["patch"],
        ("DELETE", true) => vec!["delete"],
        ("DELETE", false) => vec!["deletecollection"],
        _ => Vec::new(),
    };
    verbs
        .into_iter()
        .map(|verb| (path.group.clone(), resource.clone(), verb.to_string()))
        .collect()
}

/// Owner references with blockOwnerDeletion: the OwnerReferencesPermissionEnforcement admission
/// plugin demands update on the owner's finalizers subresource.
fn owner_finalizer_permissions(objects: &BTreeMap<String, Value>) -> BTreeSet<Permission> {
    let mut needed = BTreeSet::new();
    for object in objects.values() {
        for owner in object["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if owner["blockOwnerDeletion"] != true {
                continue;
            }
            let group = owner["apiVersion"]
                .as_str()
                .and_then(|version| version.rsplit_once('/'))
                .map_or("", |(group, _)| group);
            let plural = format!(
                "{}s",
                owner["kind"].as_str().unwrap_or_default().to_lowercase()
            );
            needed.insert((
                group.to_string(),
                format!("{plural}/finalizers"),
                "update".to_string(),
            ));
        }
    }
    needed
}

/// Everything the Broker reconciler does: create, roll (with a stuck pod), drain, expand, pause,
/// a failure report.
async fn broker_calls() -> (Vec<ApiCall>, BTreeMap<String, Value>) {
    let (api, admin, ctx) = settled_brokers(3).await;
    settle_statefulset(&api, 2, 0);
    set_revisions(&api, "rev1", "rev2");
    set_pod(&api, 2, "rev1", false);
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into();
        broker["spec"]["storage"]["size"] = "20Gi".into();
    });
    api.insert(
        &paths::pvc("data-qb-0"),
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "data-qb-0", "namespace": "ns"},
               "spec": {"resources": {"requests": {"storage": "10Gi"}}}}),
    );
    set_storage_class(&api, "standard", true, true);
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    for _ in 0..2 {
        broker::reconcile(Arc::new(stored_broker(&api)), ctx.clone())
            .await
            .expect("reconciles");
    }
    // Twice: the repeated Warning event is a patch of the event series.
    for _ in 0..2 {
        api.fail_next("PATCH", &paths::statefulset("qb"), 500);
        broker::reconcile(Arc::new(stored_broker(&api)), ctx.clone())
            .await
            .expect_err("a failure, reported on the Broker");
    }
    let paused = stored_broker(&api).paused();
    broker::reconcile(Arc::new(paused), ctx)
        .await
        .expect("paused");
    (api.calls(), api.objects())
}

/// Everything the ConsumerGroup reconciler does: finalizer, status, cleanup.
async fn group_calls() -> Vec<ApiCall> {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let owner = Broker::test().replicas(1).with_status(BrokerStatus {
        current_replicas: 1,
        ..BrokerStatus::default()
    });
    api.insert(&paths::broker("qb"), &owner);
    let mut consumer_group = ConsumerGroup::test();
    consumer_group.spec.delete_offsets_on_delete = true;
    api.insert(&paths::group("billing"), &consumer_group);
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        10,
        Some(4),
        Some(NOW_MS),
    );
    for _ in 0..2 {
        group::reconcile(Arc::new(stored_group(&api)), ctx.clone())
            .await
            .expect("applies");
    }
    api.edit(&paths::group("billing"), |group| {
        group["metadata"]["deletionTimestamp"] = "2026-11-29T12:00:00Z".into();
    });
    group::reconcile(Arc::new(stored_group(&api)), ctx)
        .await
        .expect("cleans up");
    api.calls()
}

/// Resources the controllers have listed, and those they went on to watch.
fn listed_and_watched(api: &FakeApiServer) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut listed = BTreeSet::new();
    let mut watched = BTreeSet::new();
    for call in api.calls().into_iter().filter(|call| call.method == "GET") {
        let Some(path) = ResourcePath::parse(&call.path).filter(|path| path.name.is_none()) else {
            continue;
        };
        if call.query.contains("watch=") {
            watched.insert(path.resource);
        } else {
            listed.insert(path.resource);
        }
    }
    (listed, watched)
}

/// Resolves once every listed resource is watched too and nothing new was listed for 3 s:
/// every stream of both controllers is running.
async fn watches_settled(api: Arc<FakeApiServer>) {
    let mut last = BTreeSet::new();
    let mut stable_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (listed, watched) = listed_and_watched(&api);
        if listed != last {
            last = listed;
            stable_since = tokio::time::Instant::now();
        } else if !last.is_empty()
            && watched == last
            && stable_since.elapsed() > Duration::from_secs(3)
        {
            return;
        }
    }
}

/// The controllers' watches and the leader election, run under the Lease until every watch
/// started.
async fn controller_and_lease_calls() -> Vec<ApiCall> {
    let (client, api) = FakeApiServer::start();
    let api = Arc::new(api);
    let ctx = context(client.clone(), Arc::new(FakeAdmin::default()));
    let candidate = Candidate {
        namespace: "ns".into(),
        identity: "operator-a".into(),
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        leader::run_while_leading(
            client,
            candidate,
            watches_settled(api.clone()),
            |shutdown| controller::run(ctx, Some("ns".to_string()), shutdown),
        ),
    )
    .await
    .unwrap_or_else(|_| panic!("stops within 30 s: {:?}", listed_and_watched(&api)))
    .expect("election works");
    assert_eq!(outcome, leader::Leadership::Stopped);
    api.calls()
}

/// The rules of one `define` block of _rbac.tpl.
fn template_rules(define: &str) -> BTreeSet<Permission> {
    let start = RBAC_TEMPLATE
        .find(&format!("define \"{define}\""))
        .unwrap_or_else(|| panic!("no {define} in _rbac.tpl"));
    let body = &RBAC_TEMPLATE[start..];
    let body = &body[body.find("-}}").expect("define closes") + 3..];
    let body = &body[..body.find("{{- end").expect("define ends")];
    let rules: Vec<Value> = serde_yaml::from_str(body).expect("rules are YAML");
    let mut permissions = BTreeSet::new();
    for rule in rules {
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap_or_else(|| panic!("{key} in {rule}"))
                .iter()
                .map(|value| value.as_str().expect("string").to_string())
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    permissions.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    permissions
}

fn diff(used: &BTreeSet<Permission>, granted: &BTreeSet<Permission>) -> String {
    format!(
        "used but not granted: {:?}\ngranted but not used: {:?}",
        used.difference(granted).collect::<Vec<_>>(),
        granted.difference(used).collect::<Vec<_>>()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_grants_exactly_what_the_code_calls() {
    let (mut calls, objects) = broker_calls().await;
    calls.extend(group_calls().await);
    calls.extend(controller_and_lease_calls().await);
    let mut used: BTreeSet<Permission> = calls.iter().flat_map(permissions_of).collect();
    used.extend(owner_finalizer_permissions(&objects));

    let is_lease = |p: &Permission| p.0 == "coordination.k8s.io";
    // Cluster-scoped: only ever called without a namespace.
    let namespaced: BTreeSet<String> = calls
        .iter()
        .filter_map(|call| ResourcePath::parse(&call.path))
        .filter(|path| path.namespace.is_some())
        .map(|path| path.resource)
        .collect();
    let is_cluster = |p: &Permission| {
        let resource = p.1.split('/').next().unwrap_or_default();
        !namespaced.contains(resource)
    };
    let leader_used: BTreeSet<Permission> = used.iter().filter(|p| is_lease(p)).cloned().collect();
    let cluster_used: BTreeSet<Permission> = used
        .iter()
        .filter(|p| !is_lease(p) && is_cluster(p))
        .cloned()
        .collect();
    let managed_used: BTreeSet<Permission> = used
        .iter()
        .filter(|p| !is_lease(p) && !is_cluster(p))
        .cloned()
        .collect();

    for (define, used) in [
        ("quiver-operator.managedRules", &managed_used),
        ("quiver-operator.clusterRules", &cluster_used),
        ("quiver-operator.leaderElectionRules", &leader_used),
    ] {
        let granted = template_rules(define);
        assert_eq!(used, &granted, "{define}:\n{}", diff(used, &granted));
        assert!(
            RBAC_MANIFEST.contains(&format!("include \"{define}\"")),
            "rbac.yaml does not use {define}"
        );
    }
}
