//! A Broker of two groups of three: six pods, each group's pods told their group's members,
//! their replica id and the replication settings; a PodDisruptionBudget per group letting one
//! of its pods go at a time; pods spread over zones and nodes; OnDelete updates; and each
//! group's master, epoch and in-sync set in the status.

use super::{addr, condition, eventually, Scenario};
use crate::crd::Broker;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_replicated_broker_renders_groups_budgets_spread_and_flags() {
    let scenario = Scenario::settled_replicated(2, 3, 2).await;
    let sts = scenario.statefulset();
    assert_eq!(sts.spec.replicas, Some(6), "two groups of three pods");
    let strategy = sts.spec.update_strategy.clone().expect("a strategy");
    assert_eq!(strategy.type_.as_deref(), Some("OnDelete"));
    assert_eq!(scenario.pods().len(), 6);

    let pod = sts.spec.template.spec.clone().expect("a pod spec");
    let spread: Vec<(String, i32, String)> = pod
        .topology_spread_constraints
        .expect("spread")
        .into_iter()
        .map(|c| (c.topology_key, c.max_skew, c.when_unsatisfiable))
        .collect();
    assert_eq!(
        spread,
        [
            (
                "topology.kubernetes.io/zone".into(),
                1,
                "ScheduleAnyway".into()
            ),
            ("kubernetes.io/hostname".into(), 1, "ScheduleAnyway".into()),
        ]
    );

    assert_group_budgets(&scenario);
    assert_member_configs(&scenario);
    assert_group_status(&scenario);

    // Spec topics go to each group's master; its replicas follow it.
    scenario.edit_broker(|broker| {
        broker["spec"]["topics"] = serde_json::json!([{"name": "orders", "queues": 4}]);
    });
    let has_orders = |ordinal: i32| {
        scenario
            .admin
            .topics(&addr(ordinal))
            .iter()
            .any(|topic| topic.name == "orders")
    };
    eventually(Duration::from_secs(120), || has_orders(0) && has_orders(3)).await;
    for replica in [1, 2, 4, 5] {
        assert!(!has_orders(replica), "qb-{replica} is a replica");
    }
    scenario.stop().await;
}

/// One budget per group (none for the Broker), each letting one of its pods go.
fn assert_group_budgets(scenario: &Scenario) {
    let budgets = scenario.server.list::<PodDisruptionBudget>("ns");
    let mut names: Vec<String> = budgets
        .iter()
        .map(|b| b.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["qb-g0", "qb-g1"],
        "one budget per group, none for the Broker"
    );
    let second = budgets
        .iter()
        .find(|b| b.metadata.name.as_deref() == Some("qb-g1"))
        .and_then(|b| b.spec.clone())
        .expect("qb-g1's budget");
    assert_eq!(second.max_unavailable, Some(IntOrString::Int(1)));
    let expression = second
        .selector
        .unwrap()
        .match_expressions
        .unwrap()
        .remove(0);
    assert_eq!(expression.values.unwrap(), ["qb-3", "qb-4", "qb-5"]);
}

/// Each member's config file names its group, replica id, the settings and the members.
fn assert_member_configs(scenario: &Scenario) {
    let config: ConfigMap = scenario
        .server
        .object("ns", "qb-config")
        .expect("the ConfigMap");
    let files = config.data.expect("files");
    let file = |pod: &str| -> serde_json::Value {
        serde_json::from_str(&files[&format!("{pod}.json")]).expect("JSON")
    };
    let member = file("qb-4");
    assert_eq!(member["broker-name"], "qb-g1");
    assert_eq!(member["replica-id"], 1);
    assert_eq!(member["replication"], "sync");
    assert_eq!(member["min-in-sync-replicas"], 2);
    assert_eq!(
        member["group-members"],
        serde_json::json!([
            "0=qb-3.qb-headless.ns.svc:10911",
            "1=qb-4.qb-headless.ns.svc:10911",
            "2=qb-5.qb-headless.ns.svc:10911"
        ])
    );
    assert_eq!(file("qb-0")["replica-id"], 0);
    assert_eq!(file("qb-2")["broker-name"], "qb-g0");
}

/// Each group's master, epoch and in-sync set in the status, and ReplicationDegraded False.
fn assert_group_status(scenario: &Scenario) {
    let status = scenario.status();
    let groups = status.replication.expect("replication status").groups;
    let summary: Vec<String> = groups
        .iter()
        .map(|g| {
            let master = g.master.as_deref().unwrap_or("none");
            let epoch = g.epoch.unwrap_or_default();
            format!(
                "{} epoch {epoch} master {master} in sync {}",
                g.name,
                g.in_sync.join(",")
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            "qb-g0 epoch 1 master qb-0 in sync qb-0,qb-1,qb-2",
            "qb-g1 epoch 1 master qb-3 in sync qb-3,qb-4,qb-5",
        ]
    );
    let roles: Vec<&str> = groups[1].members.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["Master", "Replica", "Replica"]);
    assert_eq!(
        condition(&scenario.status().conditions, "ReplicationDegraded"),
        ("False".into(), "InSync".into())
    );
}

#[tokio::test(start_paused = true)]
async fn a_broker_without_replication_has_no_replication_status_or_condition() {
    let scenario = Scenario::settled(2).await;
    let broker: Broker = scenario.broker();
    assert!(broker.spec.replication.is_none());
    let status = scenario.status();
    assert!(status.replication.is_none());
    assert!(status
        .conditions
        .iter()
        .all(|c| c.type_ != "ReplicationDegraded"));
    let budgets = scenario.server.list::<PodDisruptionBudget>("ns");
    let names: Vec<_> = budgets
        .iter()
        .map(|b| b.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["qb"], "the Broker's one budget, as before");
    scenario.stop().await;
}
