//! The objects a pass applies and deletes, and pausing (were the scenarios broker_grpc_port,
//! broker_network_policy, broker_replicated_create and broker_pause).

use super::*;
use crate::crd::BrokerNetworkPolicy;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

fn port_named(ports: &Value, name: &str) -> Option<Value> {
    ports
        .as_array()?
        .iter()
        .find(|port| port["name"] == name)
        .cloned()
}

/// The gRPC port of the 5.x clients: on the pods, both Services and the NetworkPolicy, and
/// each pod's config advertises its own gRPC address.
#[test]
fn every_applied_object_exposes_the_grpc_port() {
    let mut broker = Broker::test().replicas(2).image("quiver:1");
    broker.spec.network_policy = Some(BrokerNetworkPolicy::default());
    let plan = decide(&world(broker, Cluster::default()));

    let set = applied(&plan, "StatefulSet/qb");
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        port_named(&container["ports"], "grpc"),
        Some(json!({"name": "grpc", "containerPort": 8081, "protocol": "TCP"}))
    );
    for service in ["Service/qb-headless", "Service/qb"] {
        let applied = applied(&plan, service);
        let grpc = port_named(&applied["spec"]["ports"], "grpc").expect(service);
        assert_eq!(
            (&grpc["port"], &grpc["targetPort"]),
            (&json!(8081), &json!("grpc"))
        );
    }
    for ordinal in 0..2 {
        let config = config_of(&plan, &format!("qb-{ordinal}"));
        assert_eq!(config["grpc-listen"], "0.0.0.0:8081");
        assert_eq!(
            config["grpc-advertise"],
            format!("qb-{ordinal}.qb-headless.ns.svc:8081")
        );
    }
    let policy = applied(&plan, "NetworkPolicy/qb");
    assert_eq!(
        policy["spec"]["ingress"][0]["ports"],
        json!([{"port": 10911, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]),
        "client namespaces reach both the remoting and the gRPC port"
    );
}

/// The steps about the NetworkPolicy, one line each.
fn policy_steps(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .map(summary)
        .filter(|step| step.contains("NetworkPolicy"))
        .collect()
}

/// spec.networkPolicy set: the Broker owns a policy admitting clients, its own pods and the
/// operator, the metrics namespaces; edited, the policy follows; dropped, the policy goes,
/// while a policy of the same name that the Broker does not own stays.
#[test]
fn a_network_policy_follows_the_spec_and_goes_with_it() {
    let plain = Broker::test();
    let mut wanted = plain.clone();
    // Defaults filled in by the CRD's schema, as the API server does.
    wanted.spec.network_policy = Some(BrokerNetworkPolicy::default());
    let mut payments = wanted.clone();
    payments
        .spec
        .network_policy
        .as_mut()
        .expect("set")
        .client_namespace_selector = LabelSelector {
        match_labels: Some(BTreeMap::from([("team".into(), "payments".into())])),
        ..LabelSelector::default()
    };
    let owned = desired::network_policy(&wanted, &OperatorPods::default()).expect("wanted");
    let users = NetworkPolicy {
        metadata: ObjectMeta {
            owner_references: None,
            ..owned.metadata.clone()
        },
        ..owned.clone()
    };
    let rows = [
        ("none unless asked for", &plain, None, vec![], None),
        (
            "asked for",
            &wanted,
            None,
            vec!["apply NetworkPolicy/qb"],
            Some(json!({"matchLabels": {"quiver.io/client": "true"}})),
        ),
        (
            "edited",
            &payments,
            Some(&owned),
            vec!["apply NetworkPolicy/qb"],
            Some(json!({"matchLabels": {"team": "payments"}})),
        ),
        (
            "dropped",
            &plain,
            Some(&owned),
            vec!["delete NetworkPolicy/qb"],
            None,
        ),
        (
            "a user's own policy named like the Broker is not the operator's to delete",
            &plain,
            Some(&users),
            vec![],
            None,
        ),
    ];
    for (name, broker, existing, steps, clients) in rows {
        let cluster = Cluster {
            network_policy: existing.cloned(),
            ..running(broker, 1, 1)
        };
        let plan = decide(&world(broker.clone(), cluster));
        assert_eq!(policy_steps(&plan), steps, "{name}");
        let Some(clients) = clients else { continue };
        let policy = applied(&plan, "NetworkPolicy/qb");
        let rules = policy["spec"]["ingress"].as_array().expect("rules");
        assert_eq!(
            rules.len(),
            3,
            "clients, the Broker and the operator, metrics"
        );
        assert_eq!(rules[0]["from"][0]["namespaceSelector"], clients, "{name}");
        assert_eq!(policy["metadata"]["ownerReferences"][0]["uid"], "uid-qb");
    }
}

/// Two groups of three: six pods, OnDelete, spread over zones and nodes; a budget per group
/// letting one of its pods go; each member's config naming its group, replica id, settings and
/// members; each group's master, epoch and in-sync set in the status; spec topics created on
/// each group's master only (its replicas follow it).
#[test]
fn a_replicated_broker_renders_groups_budgets_spread_and_flags() {
    let mut broker = Broker::test()
        .replicas(2)
        .replicated(3, 2)
        .image("quiver:1");
    broker.spec.topics = vec![TopicSpec {
        name: "orders".into(),
        queues: 4,
    }];
    let all = [0, 1, 2];
    let cluster = Cluster {
        groups: Some(vec![
            members(0, 1, Some(0), &all),
            members(1, 1, Some(0), &all),
        ]),
        ..running(&broker, 6, 6)
    };
    let done = pass(&world(broker, cluster));

    let sts = sts_of(&done.plan);
    assert_eq!(sts.spec.replicas, Some(6), "two groups of three pods");
    let strategy = sts.spec.update_strategy.clone().expect("a strategy");
    assert_eq!(strategy.type_.as_deref(), Some("OnDelete"));
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

    let budgets: Vec<String> = applied_names(&done.plan)
        .into_iter()
        .filter(|name| name.starts_with("PodDisruptionBudget/"))
        .collect();
    assert_eq!(
        budgets,
        ["PodDisruptionBudget/qb-g0", "PodDisruptionBudget/qb-g1"],
        "one budget per group, none for the Broker"
    );
    let second = applied(&done.plan, "PodDisruptionBudget/qb-g1");
    assert_eq!(
        second["spec"]["maxUnavailable"],
        serde_json::to_value(IntOrString::Int(1)).expect("json")
    );
    assert_eq!(
        second["spec"]["selector"]["matchExpressions"][0]["values"],
        json!(["qb-3", "qb-4", "qb-5"])
    );

    let member = config_of(&done.plan, "qb-4");
    assert_eq!(member["broker-name"], "qb-g1");
    assert_eq!(member["replica-id"], 1);
    assert_eq!(member["replication"], "sync");
    assert_eq!(member["min-in-sync-replicas"], 2);
    assert_eq!(
        member["group-members"],
        json!([
            "0=qb-3.qb-headless.ns.svc:10911",
            "1=qb-4.qb-headless.ns.svc:10911",
            "2=qb-5.qb-headless.ns.svc:10911"
        ])
    );
    assert_eq!(config_of(&done.plan, "qb-0")["replica-id"], 0);
    assert_eq!(config_of(&done.plan, "qb-2")["broker-name"], "qb-g0");

    let groups = done.status.replication.clone().expect("replication").groups;
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
        condition(&done.status, "ReplicationDegraded"),
        ("False".into(), "InSync".into())
    );
    assert_eq!(
        actions(&done.plan),
        ["create orders@qb-0.qb-headless.ns.svc:10911,orders@qb-3.qb-headless.ns.svc:10911"],
        "qb-1, qb-2, qb-4 and qb-5 are replicas"
    );
}

#[test]
fn a_broker_without_replication_has_no_replication_status_or_condition() {
    let broker = Broker::test().replicas(2);
    let done = pass(&world(broker.clone(), running(&broker, 2, 2)));
    assert!(done.status.replication.is_none());
    assert!(done
        .status
        .conditions
        .iter()
        .all(|c| c.type_ != "ReplicationDegraded"));
    let budgets: Vec<String> = applied_names(&done.plan)
        .into_iter()
        .filter(|name| name.starts_with("PodDisruptionBudget/"))
        .collect();
    assert_eq!(
        budgets,
        ["PodDisruptionBudget/qb"],
        "the Broker's one budget, as before"
    );
}

/// A change made while paused: nothing applied, one Paused event, Progressing False Paused;
/// the annotation removed, the change is applied.
#[test]
fn a_change_made_while_paused_waits_for_the_annotation_to_go() {
    let before = Broker::test().replicas(3).image("quiver:1");
    let mut after = before.clone().image("quiver:2");
    after
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(PAUSE_ANNOTATION.to_string(), "true".to_string());
    let mut world = world(after, running(&before, 3, 3));
    let cluster = std::mem::replace(&mut world.state, State::Paused);

    let paused = decide(&world);
    assert_eq!(actions(&paused), ["event Paused"]);
    assert!(
        applied_names(&paused).is_empty(),
        "nothing applied while paused"
    );
    let StatusPlan::Paused(status) = paused.status else {
        panic!("paused")
    };
    assert_eq!(
        condition(&status, "Progressing"),
        ("False".into(), "Paused".into())
    );
    world.broker.status = Some(*status);
    assert!(
        decide(&world).steps.is_empty(),
        "one event for the pause, nothing applied"
    );

    world
        .broker
        .metadata
        .annotations
        .get_or_insert_default()
        .remove(PAUSE_ANNOTATION);
    world.state = cluster;
    let resumed = pass(&world);
    assert_eq!(actions(&resumed.plan), ["event RolloutStarted"]);
    let image = sts_of(&resumed.plan)
        .spec
        .template
        .spec
        .clone()
        .expect("pod spec")
        .containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("quiver:2"));
    assert_eq!(
        condition(&resumed.status, "Paused"),
        ("False".into(), "NotPaused".into())
    );
    assert_eq!(
        resumed.status.observed_generation,
        world.broker.metadata.generation
    );
}
