//! Table tests of [`plan`]: a world in, the steps and the status out. The test API server's
//! scenarios (src/scenarios) cover the executor, the watches and whole rollouts.

use super::observe::State;
use super::*;
use crate::admin::{BrokerAddr, ReplicaRole, ReplicaStatus};
use crate::controller::conditions::find;
use crate::controller::drain::{self, Backlog, LeavingBroker};
use crate::controller::expansion;
use crate::controller::replication::GroupObservation;
use crate::controller::rollout::REVISION_LABEL;
use crate::crd::{Broker, BrokerStatus, TopicSpec, PAUSE_ANNOTATION};
use crate::desired::{self, OperatorPods, RolloutPlan};
use crate::fixtures::BrokerFixture;
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use quiver_client::admin::standalone_status;
use std::collections::BTreeMap;

const NOW_MS: i64 = 1_700_000_000_000;

fn world(broker: Broker, cluster: Cluster) -> World {
    World {
        broker,
        namespace: "ns".to_string(),
        now_ms: NOW_MS,
        operator: OperatorPods::default(),
        state: State::Running(Box::new(cluster)),
    }
}

/// The StatefulSet the operator would have written for `broker` with `replicas` pods, its
/// status saying `ready` of them are Ready and all run the update revision.
fn statefulset(broker: &Broker, replicas: i32, ready: i32) -> StatefulSet {
    let plan = RolloutPlan {
        replicas,
        ..RolloutPlan::initial(broker)
    };
    let mut sts = desired::stateful_set(broker, &plan);
    sts.metadata.generation = Some(1);
    sts.status = Some(StatefulSetStatus {
        observed_generation: Some(1),
        replicas,
        ready_replicas: Some(ready),
        updated_replicas: Some(replicas),
        update_revision: Some("rev-2".to_string()),
        current_revision: Some("rev-2".to_string()),
        ..StatefulSetStatus::default()
    });
    sts
}

fn running(broker: &Broker, replicas: i32, ready: i32) -> Cluster {
    Cluster {
        statefulset: Some(statefulset(broker, replicas, ready)),
        ..Cluster::default()
    }
}

fn pod(name: &str, revision: &str, ready: bool) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                REVISION_LABEL.to_string(),
                revision.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Ready".to_string(),
                status: if ready { "True" } else { "False" }.to_string(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}

fn leaving(name: &str, backlog: Result<u64, &str>) -> LeavingBroker {
    LeavingBroker {
        name: name.to_string(),
        backlog: backlog
            .map(|messages| Backlog {
                group_messages: messages,
                pending_groups: (messages > 0)
                    .then(|| "billing".to_string())
                    .into_iter()
                    .collect(),
                ..Backlog::default()
            })
            .map_err(str::to_string),
    }
}

fn object_name(object: &Object) -> String {
    let (kind, name) = match object {
        Object::ConfigMap(o) => ("ConfigMap", o.metadata.name.clone()),
        Object::Service(o) => ("Service", o.metadata.name.clone()),
        Object::Budget(o) => ("PodDisruptionBudget", o.metadata.name.clone()),
        Object::NetworkPolicy(o) => ("NetworkPolicy", o.metadata.name.clone()),
        Object::StatefulSet(o) => ("StatefulSet", o.metadata.name.clone()),
    };
    format!("{kind}/{}", name.unwrap_or_default())
}

/// One line per step.
fn summary(step: &Step) -> String {
    match step {
        Step::Publish(note) => format!("event {}", note.reason),
        Step::Problem(problem) => format!("problem {}", problem.reason),
        Step::RestoreWritable(ordinals) => format!("restore {ordinals:?}"),
        Step::DeletePod { pod, .. } => format!("delete pod {pod}"),
        Step::Apply(object) => format!("apply {}", object_name(object)),
        Step::RestoreTemplate { statefulset, .. } => format!("restore template {statefulset}"),
        Step::Delete(object) => format!("delete {}", object_name(object)),
        Step::OrphanStatefulSet(_) => "orphan StatefulSet".to_string(),
        Step::Switchover { addr, target, .. } => format!("switchover {} to {target}", addr.0),
        Step::ChangeMembership { addr, change, .. } => {
            format!("{} {} at {}", change.action(), change.member(), addr.0)
        }
        Step::ResizeClaims { claims, size } => format!("resize {} to {size}", claims.join(",")),
        Step::CreateTopics(creations) => {
            let each: Vec<String> = creations
                .iter()
                .map(|(addr, topic)| format!("{}@{}", topic.name, addr.0))
                .collect();
            format!("create {}", each.join(","))
        }
        Step::ReportFailure(failure) => format!("fail {}", failure.reason),
    }
}

/// The steps other than applies, one line each.
fn actions(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .filter(|step| !matches!(step, Step::Apply(_)))
        .map(summary)
        .collect()
}

fn draft(plan: &Plan) -> &Draft {
    match &plan.status {
        StatusPlan::Running(draft) => draft,
        other => panic!("not running: {other:?}"),
    }
}

/// The status with no step failing.
fn status(world: &World, plan: &Plan) -> (BrokerStatus, Outlook) {
    let previous = world.broker.status.clone().unwrap_or_default();
    draft(plan).finish(&world.broker, &previous, &Outcome::default())
}

fn condition(status: &BrokerStatus, type_: &str) -> (String, String) {
    let found = find(&status.conditions, type_).expect("condition set");
    (found.status.clone(), found.reason.clone())
}

fn config_of(plan: &Plan, pod: &str) -> serde_json::Value {
    let config = plan.steps.iter().find_map(|step| match step {
        Step::Apply(Object::ConfigMap(config)) => Some(config),
        _ => None,
    });
    let text = &config.expect("a ConfigMap").data.as_ref().expect("data")[&format!("{pod}.json")];
    serde_json::from_str(text).expect("json")
}

#[test]
fn a_new_broker_applies_its_objects_in_order_and_starts() {
    let broker = Broker::test().replicas(2);
    let world = world(broker, Cluster::default());
    let plan = decide(&world);
    let steps: Vec<String> = plan.steps.iter().map(summary).collect();
    assert_eq!(
        steps,
        [
            "apply ConfigMap/qb-config",
            "apply Service/qb-headless",
            "apply Service/qb",
            "apply PodDisruptionBudget/qb",
            "apply StatefulSet/qb",
        ]
    );
    let (status, outlook) = status(&world, &plan);
    assert_eq!(
        condition(&status, "Progressing"),
        ("True".into(), "BrokersStarting".into())
    );
    assert_eq!(
        condition(&status, "Ready"),
        ("False".into(), "BrokersNotReady".into())
    );
    assert_eq!(
        condition(&status, "Degraded"),
        ("False".into(), "AsExpected".into())
    );
    assert_eq!(status.current_replicas, 2);
    assert_eq!(outlook.requeue(), PROGRESS_REQUEUE);
}

#[test]
fn a_settled_broker_only_applies_and_idles() {
    let broker = Broker::test().replicas(2);
    let world = world(broker.clone(), running(&broker, 2, 2));
    let plan = decide(&world);
    assert!(actions(&plan).is_empty(), "{:?}", actions(&plan));
    let (status, outlook) = status(&world, &plan);
    assert_eq!(
        condition(&status, "Progressing"),
        ("False".into(), "Stable".into())
    );
    assert_eq!(
        condition(&status, "Ready"),
        ("True".into(), "AllBrokersReady".into())
    );
    assert_eq!(outlook.requeue(), IDLE_REQUEUE);
}

#[test]
fn paused_publishes_once_and_changes_only_paused_and_progressing() {
    let mut broker = Broker::test();
    broker
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(PAUSE_ANNOTATION.to_string(), "true".to_string());
    let mut world = world(broker, Cluster::default());
    world.state = State::Paused;
    let first = decide(&world);
    assert_eq!(actions(&first), ["event Paused"]);
    let StatusPlan::Paused(status) = first.status else {
        panic!("paused")
    };
    assert_eq!(
        condition(&status, "Paused"),
        ("True".into(), "PauseAnnotation".into())
    );
    assert_eq!(
        condition(&status, "Progressing"),
        ("False".into(), "Paused".into())
    );
    world.broker.status = Some(*status);
    assert!(decide(&world).steps.is_empty(), "the event is not repeated");
}

#[test]
fn a_missing_secret_holds_everything() {
    let mut world = world(Broker::test(), Cluster::default());
    let problem = Problem::new("SecuritySecretUnavailable", "Secret ns/acl does not exist");
    world.state = State::SecretsMissing(problem);
    let plan = decide(&world);
    assert_eq!(actions(&plan), ["fail SecuritySecretUnavailable"]);
    assert_eq!(plan.status, StatusPlan::Held);
}

/// Scale-downs from three brokers to one: the leaving brokers as measured, the steps, the
/// pods kept, and the brokers listed read-only.
#[test]
fn scale_down_drains_then_releases() {
    struct Case {
        name: &'static str,
        leaving: Vec<LeavingBroker>,
        forced: bool,
        steps: &'static [&'static str],
        replicas: i32,
        read_only: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "unread messages hold the brokers",
            leaving: vec![leaving("qb-1", Ok(5)), leaving("qb-2", Ok(0))],
            forced: false,
            steps: &["event DrainStarted"],
            replicas: 3,
            read_only: &["qb-1", "qb-2"],
        },
        Case {
            name: "drained brokers go",
            leaving: vec![leaving("qb-1", Ok(0)), leaving("qb-2", Ok(0))],
            forced: false,
            // Fewer brokers change the peer lists only: the brokers that stay do not roll.
            steps: &["event Drained"],
            replicas: 1,
            read_only: &[],
        },
        Case {
            name: "forced brokers go with what they hold",
            leaving: vec![leaving("qb-1", Ok(5)), leaving("qb-2", Ok(0))],
            forced: true,
            steps: &["event ForcedScaleDown"],
            replicas: 1,
            read_only: &[],
        },
        Case {
            name: "a broker that does not answer holds and is a problem",
            leaving: vec![leaving("qb-1", Err("timed out")), leaving("qb-2", Ok(0))],
            forced: false,
            steps: &["event DrainStarted", "problem LeavingBrokerUnreachable"],
            replicas: 3,
            read_only: &["qb-1", "qb-2"],
        },
    ];
    for case in cases {
        let mut broker = Broker::test().replicas(1);
        if case.forced {
            broker.metadata.annotations.get_or_insert_default().insert(
                crate::crd::FORCE_SCALE_DOWN_ANNOTATION.to_string(),
                "true".to_string(),
            );
        }
        let cluster = Cluster {
            leaving: case.leaving,
            ..running(&broker, 3, 3)
        };
        let world = world(broker, cluster);
        let plan = decide(&world);
        assert_eq!(actions(&plan), case.steps, "{}", case.name);
        let (status, _) = status(&world, &plan);
        assert_eq!(status.current_replicas, case.replicas, "{}", case.name);
        assert_eq!(status.read_only_brokers, case.read_only, "{}", case.name);
        let held = case.replicas == 3;
        assert_eq!(status.drain.is_some(), held, "{}", case.name);
        if held {
            assert_eq!(
                config_of(&plan, "qb-2")["broker-permission"],
                4,
                "{}",
                case.name
            );
            assert!(config_of(&plan, "qb-0").get("broker-permission").is_none());
            assert_eq!(condition(&status, "Progressing").1, "Draining");
        }
    }
}

#[test]
fn a_cancelled_scale_down_restores_the_kept_brokers_first() {
    let mut broker = Broker::test().replicas(3);
    broker.status = Some(BrokerStatus {
        drain: Some(drain::drain_status(&[
            leaving("qb-1", Ok(5)),
            leaving("qb-2", Ok(5)),
        ])),
        ..BrokerStatus::default()
    });
    let world = world(broker.clone(), running(&broker, 3, 3));
    let plan = decide(&world);
    assert_eq!(actions(&plan), ["restore [1, 2]"]);
    let outcome = Outcome {
        problems: vec![Problem::new(REASON_KEPT_READ_ONLY, "qb-2 stays read-only")],
        still_read_only: vec!["qb-2".into()],
        ..Outcome::default()
    };
    let previous = world.broker.status.clone().unwrap_or_default();
    let (status, outlook) = draft(&plan).finish(&world.broker, &previous, &outcome);
    assert_eq!(status.read_only_brokers, ["qb-2"]);
    assert_eq!(
        condition(&status, "Degraded"),
        ("True".into(), REASON_KEPT_READ_ONLY.into())
    );
    assert_eq!(status.drain, None);
    assert_eq!(outlook.requeue(), PROGRESS_REQUEUE);
}

#[test]
fn a_template_change_starts_from_the_highest_ordinal() {
    let before = Broker::test().replicas(3);
    let after = before.clone().image("quiver:2");
    let world = world(after, running(&before, 3, 3));
    let plan = decide(&world);
    assert_eq!(actions(&plan), ["event RolloutStarted"]);
    assert_eq!(draft(&plan).plan.partition, 2);
    let (status, _) = status(&world, &plan);
    assert_eq!(
        condition(&status, "Progressing"),
        ("True".into(), "RollingUpdate".into())
    );
    assert_eq!(status.rollout.map(|r| r.partition), Some(2));
}

#[test]
fn a_pod_stuck_at_an_outdated_revision_is_deleted_and_a_failed_list_is_a_problem() {
    let broker = Broker::test().replicas(2);
    let mut cluster = running(&broker, 2, 1);
    let pods = vec![pod("qb-0", "rev-2", true), pod("qb-1", "rev-1", false)];
    cluster.pods = Some(Ok(pods));
    let plan = decide(&world(broker.clone(), cluster.clone()));
    assert_eq!(actions(&plan), ["delete pod qb-1"]);
    cluster.pods = Some(Err("forbidden".to_string()));
    let world = world(broker, cluster);
    let plan = decide(&world);
    assert_eq!(actions(&plan), ["problem StuckPodNotDeleted"]);
    let outcome = Outcome {
        problems: vec![Problem::new(
            REASON_STUCK_POD,
            "cannot list the broker pods: forbidden",
        )],
        ..Outcome::default()
    };
    let previous = BrokerStatus::default();
    let (status, _) = draft(&plan).finish(&world.broker, &previous, &outcome);
    assert_eq!(
        condition(&status, "Degraded"),
        ("True".into(), REASON_STUCK_POD.into())
    );
}

fn group(group: i32, master: Option<u64>, in_sync: &[u64]) -> GroupObservation {
    let first = group * 3;
    let mut status = standalone_status(
        &format!("qb-g{group}"),
        &format!(
            "qb-{}.qb-headless.ns.svc:10911",
            first + master.unwrap_or(0) as i32
        ),
    );
    status.master_id = master;
    status.epoch = 2;
    status.in_sync_replicas = in_sync.to_vec();
    status.replicas = (0..3)
        .map(|id| ReplicaStatus {
            replica_id: id,
            address: format!("qb-{}.qb-headless.ns.svc:10911", first + id as i32),
            role: if Some(id) == master {
                ReplicaRole::Master
            } else {
                ReplicaRole::Replica
            },
            in_sync: in_sync.contains(&id),
            log_end: 100,
            lag_bytes: 0,
            lag_ms: 0,
        })
        .collect();
    GroupObservation {
        group,
        name: format!("qb-g{group}"),
        status: Some(status),
        answered: vec![0, 1, 2],
    }
}

/// A replicated group of three rolls replicas first, then switches mastership over.
#[test]
fn a_replicated_group_rolls_replicas_then_switches_over() {
    struct Case {
        name: &'static str,
        revisions: [&'static str; 3],
        steps: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "the highest outdated replica first",
            revisions: ["rev-1", "rev-1", "rev-1"],
            steps: &["delete pod qb-2"],
        },
        Case {
            name: "then the next replica",
            revisions: ["rev-1", "rev-1", "rev-2"],
            steps: &["delete pod qb-1"],
        },
        Case {
            name: "then mastership moves to an updated in-sync replica",
            revisions: ["rev-1", "rev-2", "rev-2"],
            steps: &["switchover qb-0.qb-headless.ns.svc:10911 to 1"],
        },
        Case {
            name: "every member updated",
            revisions: ["rev-2", "rev-2", "rev-2"],
            steps: &[],
        },
    ];
    let broker = Broker::test().replicas(1).replicated(3, 2);
    for case in cases {
        let mut cluster = running(&broker, 3, 3);
        let pods = (0..3)
            .map(|i| pod(&format!("qb-{i}"), case.revisions[i], true))
            .collect();
        cluster.pods = Some(Ok(pods));
        cluster.groups = Some(vec![group(0, Some(0), &[0, 1, 2])]);
        let world = world(broker.clone(), cluster);
        let plan = decide(&world);
        assert_eq!(actions(&plan), case.steps, "{}", case.name);
        assert_eq!(
            draft(&plan).replicated_rolling,
            !case.steps.is_empty(),
            "{}",
            case.name
        );
    }
}

#[test]
fn spec_topics_go_to_every_ready_broker_that_lacks_them() {
    let mut broker = Broker::test().replicas(2);
    broker.spec.topics = vec![TopicSpec {
        name: "orders".into(),
        queues: 4,
    }];
    let mut cluster = running(&broker, 2, 2);
    let first = BrokerAddr("qb-0.qb-headless.ns.svc:10911".into());
    cluster.topic_queues.insert((first, "orders".into()), 4);
    let plan = decide(&world(broker.clone(), cluster));
    assert_eq!(
        actions(&plan),
        ["create orders@qb-1.qb-headless.ns.svc:10911"]
    );
    let starting = plan_of(&broker, running(&broker, 2, 1));
    assert!(
        actions(&starting).is_empty(),
        "not before every broker is Ready"
    );
}

fn plan_of(broker: &Broker, cluster: Cluster) -> Plan {
    decide(&world(broker.clone(), cluster))
}

fn decide(world: &World) -> Plan {
    plan(world)
}

fn claim(name: &str, size: &str) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    k8s_openapi::api::core::v1::PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..Default::default()
    }
}

fn class(expands: bool) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("standard".into()),
            annotations: Some(BTreeMap::from([(
                expansion::DEFAULT_CLASS_ANNOTATION.into(),
                "true".into(),
            )])),
            ..ObjectMeta::default()
        },
        allow_volume_expansion: Some(expands),
        ..StorageClass::default()
    }
}

/// A bigger spec.storage.size: claims are patched only when their class allows it.
#[test]
fn volumes_grow_only_where_the_class_allows() {
    let before = Broker::test().replicas(2);
    let after = before.clone().storage_size("20Gi");
    let claims = vec![claim("data-qb-0", "10Gi"), claim("data-qb-1", "10Gi")];
    let cases = [
        (
            Some(Ok(vec![class(true)])),
            vec!["resize data-qb-0,data-qb-1 to 20Gi"],
            expansion::REASON_EXPANDING,
        ),
        (
            Some(Ok(vec![class(false)])),
            vec![],
            expansion::REASON_FORBIDDEN,
        ),
        (
            Some(Err("forbidden".to_string())),
            vec![],
            expansion::REASON_CLASS_UNREADABLE,
        ),
    ];
    for (classes, steps, reason) in cases {
        let cluster = Cluster {
            claims: claims.clone(),
            storage_classes: classes,
            ..running(&before, 2, 2)
        };
        let world = world(after.clone(), cluster);
        let plan = decide(&world);
        assert_eq!(actions(&plan), steps, "{reason}");
        let (status, _) = status(&world, &plan);
        assert_eq!(condition(&status, expansion::CONDITION).1, reason);
    }
    let cluster = Cluster {
        claims,
        storage_classes: Some(Ok(vec![class(true)])),
        ..running(&before, 2, 2)
    };
    let world = world(after, cluster);
    let plan = decide(&world);
    let refused = Outcome {
        claims_rejected: Some(expansion::progress("20Gi", 0, 2)),
        ..Outcome::default()
    };
    let (status, _) = draft(&plan).finish(&world.broker, &BrokerStatus::default(), &refused);
    assert_eq!(status.storage.map(|s| s.total_claims), Some(2));
}

// The rows below were scenarios on the test API server (src/scenarios) whose assertions are
// decisions: a world in, the steps, the status and the events out.
mod conditions;
mod drain_rows;
mod membership_rows;
mod objects;
mod restart_rows;
mod rollouts;

/// The cluster of a running world, to change between passes.
fn cluster_mut(world: &mut World) -> &mut Cluster {
    match &mut world.state {
        State::Running(cluster) => cluster,
        other => panic!("not running: {other:?}"),
    }
}

/// One pass with every step succeeding: the plan, the status written, what it says about the
/// next pass, and the events published ("Normal Drained", "Warning DiskPressure"): the steps'
/// own, then those of the conditions that changed, as the executor and the status writer
/// publish them.
struct Pass {
    plan: Plan,
    status: BrokerStatus,
    outlook: Outlook,
    events: Vec<String>,
}

fn pass(world: &World) -> Pass {
    let plan = decide(world);
    let mut events: Vec<String> = plan
        .steps
        .iter()
        .filter_map(|step| match step {
            Step::Publish(note)
            | Step::DeletePod { done: note, .. }
            | Step::Switchover { done: note, .. }
            | Step::ChangeMembership { done: note, .. } => {
                Some(format!("{:?} {}", note.type_, note.reason))
            }
            _ => None,
        })
        .collect();
    let previous = world.broker.status.clone().unwrap_or_default();
    let (status, outlook) = draft(&plan).finish(&world.broker, &previous, &Outcome::default());
    for (type_, reason, _) in transition_events(&previous.conditions, &status.conditions, &[]) {
        events.push(format!("{type_:?} {reason}"));
    }
    Pass {
        plan,
        status,
        outlook,
        events,
    }
}

/// The next pass sees the status this one wrote.
fn next(world: &mut World, done: &Pass) {
    world.broker.status = Some(done.status.clone());
}

/// The text of the event `reason` the plan publishes (a step's own, or a deleted pod's).
fn note_of(plan: &Plan, reason: &str) -> String {
    plan.steps
        .iter()
        .find_map(|step| match step {
            Step::Publish(note)
            | Step::DeletePod { done: note, .. }
            | Step::Switchover { done: note, .. }
            | Step::ChangeMembership { done: note, .. }
                if note.reason == reason =>
            {
                Some(note.note.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {reason} event in {:?}", actions(plan)))
}

fn message(status: &BrokerStatus, type_: &str) -> String {
    find(&status.conditions, type_)
        .expect("condition set")
        .message
        .clone()
}

/// The object named "Kind/name" as the plan applies it, as JSON.
fn applied(plan: &Plan, name: &str) -> serde_json::Value {
    let object = plan
        .steps
        .iter()
        .find_map(|step| match step {
            Step::Apply(object) if object_name(object) == name => Some(object),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{name} not applied: {:?}", applied_names(plan)));
    let json = match object {
        Object::ConfigMap(o) => serde_json::to_value(o),
        Object::Service(o) => serde_json::to_value(o),
        Object::Budget(o) => serde_json::to_value(o),
        Object::NetworkPolicy(o) => serde_json::to_value(o),
        Object::StatefulSet(o) => serde_json::to_value(o),
    };
    json.expect("serializable")
}

/// "Kind/name" of each object applied, in order.
fn applied_names(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .filter_map(|step| match step {
            Step::Apply(object) => Some(object_name(object)),
            _ => None,
        })
        .collect()
}

/// The StatefulSet the plan applies.
fn sts_of(plan: &Plan) -> &StatefulSet {
    plan.steps
        .iter()
        .find_map(|step| match step {
            Step::Apply(Object::StatefulSet(sts)) => Some(sts.as_ref()),
            _ => None,
        })
        .expect("a StatefulSet applied")
}

/// The StatefulSet of `broker`'s template with `replicas` pods at `partition`, its status (about
/// that template) saying `updated` pods run the update revision rev-2 and `ready` are Ready.
fn rolling(
    broker: &Broker,
    replicas: i32,
    partition: i32,
    updated: i32,
    ready: i32,
) -> StatefulSet {
    let plan = RolloutPlan {
        replicas,
        partition,
        ..RolloutPlan::initial(broker)
    };
    let mut sts = desired::stateful_set(broker, &plan);
    sts.metadata.generation = Some(1);
    sts.status = Some(StatefulSetStatus {
        observed_generation: Some(1),
        replicas,
        ready_replicas: Some(ready),
        updated_replicas: Some(updated),
        update_revision: Some("rev-2".to_string()),
        current_revision: Some("rev-1".to_string()),
        ..StatefulSetStatus::default()
    });
    sts
}

/// `sts` with these update and current revisions.
fn revisions(mut sts: StatefulSet, update: &str, current: &str) -> StatefulSet {
    let status = sts.status.get_or_insert_default();
    status.update_revision = Some(update.to_string());
    status.current_revision = Some(current.to_string());
    sts
}

/// Pods qb-0, qb-1, ... at these revisions, Ready or not.
fn pods(each: &[(&str, bool)]) -> Vec<Pod> {
    each.iter()
        .enumerate()
        .map(|(ordinal, (revision, ready))| pod(&format!("qb-{ordinal}"), revision, *ready))
        .collect()
}

/// Group `group` of three as its members answer (as the in-memory brokers do): at `epoch`,
/// replica `master` its master (None: no master), `in_sync` in sync, the others 3072 bytes
/// behind.
fn members(group: i32, epoch: u64, master: Option<u64>, in_sync: &[u64]) -> GroupObservation {
    let address = |id: u64| format!("qb-{}.qb-headless.ns.svc:10911", group * 3 + id as i32);
    let mut status = standalone_status(&format!("qb-g{group}"), &address(0));
    status.master_id = master;
    status.master_address = master.map(address);
    status.epoch = epoch;
    status.in_sync_replicas = in_sync.to_vec();
    status.replicas = (0..3)
        .map(|id| ReplicaStatus {
            replica_id: id,
            address: address(id),
            role: match master {
                Some(master) if master == id => ReplicaRole::Master,
                Some(_) => ReplicaRole::Replica,
                None => ReplicaRole::Unknown,
            },
            in_sync: in_sync.contains(&id),
            log_end: if in_sync.contains(&id) { 4096 } else { 1024 },
            lag_bytes: if in_sync.contains(&id) { 0 } else { 3072 },
            lag_ms: 0,
        })
        .collect();
    GroupObservation {
        group,
        name: format!("qb-g{group}"),
        status: Some(status),
        answered: vec![0, 1, 2],
    }
}
