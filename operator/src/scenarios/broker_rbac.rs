//! RBAC is exactly what the code uses: every request the real operator (controllers, leader
//! election) makes against the test API server while a Broker is created, given a
//! NetworkPolicy and relieved of it, given TLS from a Secret and relieved of it, rolled past a stuck pod, expanded, drained, failed and
//! paused, and a ConsumerGroup is created and deleted, and a replicated Broker loses a group, and an older operator's
//! StatefulSet is migrated, is turned into (apiGroup, resource,
//! verb) and compared with the rules of the chart's _rbac.tpl.

use super::{addr, condition, eventually, Scenario};
use crate::crd::{Broker, ConsumerGroup, PAUSE_ANNOTATION};
use crate::fixtures::{BrokerFixture, GroupFixture};
use crate::testapi::{PodBehaviour, RequestRecord};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;

/// (apiGroup, resource or resource/subresource, verb).
type Permission = (String, String, String);

const RBAC_TEMPLATE: &str = include_str!("../../../charts/quiver-operator/templates/_rbac.tpl");
const RBAC_MANIFEST: &str = include_str!("../../../charts/quiver-operator/templates/rbac.yaml");
const LONG: Duration = Duration::from_secs(900);

/// The verbs the API server authorizes a request as: an apply that creates is also a create.
fn permissions_of(request: &RequestRecord) -> Vec<Permission> {
    let resource = match request.subresource.as_str() {
        "" => request.resource.clone(),
        sub => format!("{}/{sub}", request.resource),
    };
    let mut verbs = vec![request.verb.clone()];
    if request.created {
        verbs.push("create".to_string());
    }
    verbs
        .into_iter()
        .map(|verb| (request.group.clone(), resource.clone(), verb))
        .collect()
}

/// Owner references with blockOwnerDeletion on what the operator applies: the
/// OwnerReferencesPermissionEnforcement admission plugin demands update on the owner's
/// finalizers subresource.
fn owner_finalizer_permissions(scenario: &Scenario) -> BTreeSet<Permission> {
    fn raw_all<K: Resource<DynamicType = ()> + DeserializeOwned + serde::Serialize>(
        scenario: &Scenario,
    ) -> Vec<Value> {
        let objects = scenario.server.list::<K>("ns");
        objects
            .iter()
            .map(|o| serde_json::to_value(o).expect("json"))
            .collect()
    }
    let mut objects = raw_all::<StatefulSet>(scenario);
    objects.extend(raw_all::<Service>(scenario));
    objects.extend(raw_all::<ConfigMap>(scenario));
    objects.extend(raw_all::<PodDisruptionBudget>(scenario));
    objects.extend(raw_all::<k8s_openapi::api::networking::v1::NetworkPolicy>(
        scenario,
    ));
    let mut needed = BTreeSet::new();
    for object in objects {
        let owners = object["metadata"]["ownerReferences"].as_array().cloned();
        for owner in owners.unwrap_or_default() {
            if owner["blockOwnerDeletion"] != true {
                continue;
            }
            let group = owner["apiVersion"]
                .as_str()
                .and_then(|version| version.rsplit_once('/'))
                .map_or("", |(group, _)| group);
            let kind = owner["kind"].as_str().unwrap_or_default().to_lowercase();
            needed.insert((
                group.to_string(),
                format!("{kind}s/finalizers"),
                "update".into(),
            ));
        }
    }
    needed
}

/// Rolled to a crash-looping image past the deadline, then fixed: the stuck pod is listed and
/// deleted.
async fn roll_past_a_stuck_pod(scenario: &Scenario) {
    scenario
        .server
        .set_image_behaviour("quiver:bad", PodBehaviour::CrashLoop);
    scenario.edit_broker(|broker| {
        broker["spec"]["image"] = "quiver:bad".into();
        broker["spec"]["progressDeadlineSeconds"] = 60.into();
    });
    eventually(LONG, || {
        !scenario.events("ProgressDeadlineExceeded").is_empty()
    })
    .await;
    scenario.set_image("quiver:2");
    eventually(LONG, || {
        scenario.pods_ready_on(3, "quiver:2") && scenario.broker_ready()
    })
    .await;
}

/// Claims grown, a drain held then finished.
async fn expand_and_drain(scenario: &Scenario) {
    scenario.edit_broker(|broker| broker["spec"]["storage"]["size"] = "20Gi".into());
    eventually(LONG, || {
        scenario
            .condition("VolumeExpansion")
            .is_some_and(|(_, reason)| reason == "VolumesExpanded")
    })
    .await;
    let admin = &scenario.admin;
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    scenario.scale_to(2);
    eventually(LONG, || scenario.status().drain.is_some()).await;
    admin.consume_all(&addr(2), "billing");
    eventually(LONG, || {
        scenario.sts_replicas() == 2 && scenario.broker_ready()
    })
    .await;
}

/// Two failed applies (the repeated Warning event patches its series), then a pause.
async fn fail_then_pause(scenario: &Scenario) {
    let path = "/apis/apps/v1/namespaces/ns/statefulsets/qb";
    scenario.server.fail_next(http::Method::PATCH, path, 2, 500);
    scenario.set_image("quiver:3");
    eventually(LONG, || {
        scenario.pods_ready_on(2, "quiver:3") && scenario.broker_ready()
    })
    .await;
    scenario.annotate(PAUSE_ANNOTATION, "true");
    eventually(LONG, || {
        condition(&scenario.status().conditions, "Paused").0 == "True"
    })
    .await;
}

/// A group with deleteOffsetsOnDelete: finalizer, status, cleanup on delete.
async fn group_lifecycle(scenario: &Scenario) {
    let mut group = ConsumerGroup::test();
    (group.metadata.uid, group.metadata.generation) = (None, None);
    group.spec.delete_offsets_on_delete = true;
    scenario.server.insert(&group);
    eventually(LONG, || {
        let stored = scenario.server.object::<ConsumerGroup>("ns", "billing");
        stored.is_some_and(|group| group.status.is_some() && group.metadata.finalizers.is_some())
    })
    .await;
    scenario
        .server
        .delete::<ConsumerGroup>("ns", "billing")
        .expect("deleted");
    eventually(LONG, || {
        scenario
            .server
            .raw::<ConsumerGroup>("ns", "billing")
            .is_none()
    })
    .await;
}

/// A NetworkPolicy asked for (create, then patch on each pass), then dropped (delete).
async fn network_policy_on_then_off(scenario: &Scenario) {
    let policy = || {
        scenario
            .server
            .raw::<k8s_openapi::api::networking::v1::NetworkPolicy>("ns", "qb")
    };
    scenario.edit_broker(|broker| broker["spec"]["networkPolicy"] = serde_json::json!({}));
    eventually(LONG, || policy().is_some()).await;
    scenario.edit_broker(|broker| {
        broker["spec"]["networkPolicy"]["allowSameNamespace"] = false.into();
    });
    eventually(LONG, || {
        policy().is_some_and(|policy| {
            policy["spec"]["ingress"][0]["from"]
                .as_array()
                .map(Vec::len)
                == Some(1)
        })
    })
    .await;
    scenario.edit_broker(|broker| {
        broker["spec"]
            .as_object_mut()
            .unwrap()
            .remove("networkPolicy");
    });
    eventually(LONG, || policy().is_none()).await;
}

/// spec.security naming a TLS Secret: the Secret is read (get) and its changes watched.
async fn security_on_then_off(scenario: &Scenario) {
    let mut tls = k8s_openapi::api::core::v1::Secret::default();
    tls.metadata.name = Some("quiver-tls".into());
    tls.metadata.namespace = Some("ns".into());
    let mut value = serde_json::to_value(&tls).expect("json");
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    value["data"] = serde_json::json!({"tls.crt": "Q0VSVA==", "tls.key": "S0VZ"});
    scenario.server.insert(&value);
    scenario.edit_broker(|broker| {
        broker["spec"]["security"] = serde_json::json!({"tls": {"secretName": "quiver-tls"}});
    });
    eventually(LONG, || {
        let sts = scenario.statefulset();
        let annotations = sts.spec.template.metadata.and_then(|m| m.annotations);
        annotations.is_some_and(|a| a.contains_key(crate::desired::SECURITY_HASH_ANNOTATION))
    })
    .await;
    eventually(LONG, || scenario.broker_ready()).await;
    scenario.edit_broker(|broker| {
        broker["spec"].as_object_mut().unwrap().remove("security");
    });
    eventually(LONG, || scenario.broker_ready()).await;
}

/// A replicated Broker of two groups scaled to one: the leaving group's PodDisruptionBudget is
/// deleted.
async fn replicated_groups_scaled_down(scenario: &Scenario) {
    let mut replicated = Broker::test()
        .replicas(2)
        .replicated(2, 1)
        .image("quiver:1");
    replicated.metadata.name = Some("qr".into());
    scenario.create_broker(replicated);
    let budget = |name: &str| scenario.server.raw::<PodDisruptionBudget>("ns", name);
    eventually(LONG, || budget("qr-g1").is_some()).await;
    scenario
        .server
        .edit::<Broker>("ns", "qr", |broker| broker["spec"]["replicas"] = 1.into());
    eventually(LONG, || {
        budget("qr-g1").is_none() && budget("qr-g0").is_some()
    })
    .await;
}

/// A Broker whose StatefulSet an older operator made (OrderedReady) gets one of Parallel
/// pod management: deleted (orphaning its pods) and created again.
async fn older_operators_statefulset_migrated(scenario: &Scenario) {
    super::broker_statefulset_migration::broker_of_an_older_operator(scenario, "ql").await;
    eventually(LONG, || {
        super::broker_statefulset_migration::parallel(scenario, "ql")
    })
    .await;
}

/// Every request of one operator run through all of the above.
async fn operator_requests() -> (Vec<RequestRecord>, BTreeSet<Permission>) {
    let scenario = Scenario::start_elected().await;
    scenario.create_broker(Broker::test().replicas(3).image("quiver:1"));
    eventually(LONG, || scenario.broker_ready()).await;
    network_policy_on_then_off(&scenario).await;
    security_on_then_off(&scenario).await;
    roll_past_a_stuck_pod(&scenario).await;
    expand_and_drain(&scenario).await;
    fail_then_pause(&scenario).await;
    group_lifecycle(&scenario).await;
    replicated_groups_scaled_down(&scenario).await;
    older_operators_statefulset_migrated(&scenario).await;
    let owners = owner_finalizer_permissions(&scenario);
    let requests = scenario.server.requests();
    scenario.stop().await;
    (requests, owners)
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

#[tokio::test(start_paused = true)]
async fn the_chart_grants_exactly_what_the_code_calls() {
    let (requests, owners) = operator_requests().await;
    // Only the operator talks to the server in this scenario (the test's own reads and edits
    // go around HTTP), so every request is one of its calls.
    let mut used: BTreeSet<Permission> = requests.iter().flat_map(permissions_of).collect();
    used.extend(owners);
    let is_lease = |p: &Permission| p.0 == "coordination.k8s.io";
    // Cluster-scoped: only ever called without a namespace.
    let namespaced: BTreeSet<&str> = requests
        .iter()
        .filter(|request| !request.namespace.is_empty())
        .map(|request| request.resource.as_str())
        .collect();
    let is_cluster = |p: &Permission| !namespaced.contains(p.1.split('/').next().unwrap_or(""));
    let (leader_used, rest): (BTreeSet<Permission>, BTreeSet<Permission>) =
        used.into_iter().partition(|p| is_lease(p));
    let (cluster_used, managed_used): (BTreeSet<Permission>, BTreeSet<Permission>) =
        rest.into_iter().partition(|p| is_cluster(p));
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
