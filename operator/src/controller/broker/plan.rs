//! The second step of a pass, pure: from a [`World`], the [`Step`]s to take, in order, and the
//! status to write. Every decision of the Broker controller is here or in the pure modules it
//! calls (drain, rollout, replication, expansion, disk, desired); nothing here does I/O.

use super::observe::{Cluster, State, World};
use super::status::{paused_status, Draft, ReadOnly, Scale};
use super::{drift, restart};
use super::{Problem, REASON_LEAVING_UNREACHABLE, REASON_MEMBERSHIP, REASON_STUCK_POD};
use crate::admin::{BrokerAddr, MembershipChange, TopicConfig};
use crate::controller::conditions::{is_true, Desired};
use crate::controller::drain::{self, LeavingBroker};
use crate::controller::expansion;
use crate::controller::membership::{self, BeforeDelete, MemberStep};
use crate::controller::replication::{self, GroupObservation, REASON_ROLLOUT_STEP};
use crate::controller::rollout::{self, plan_rollout, GroupStep, RolloutPhase};
use crate::crd::{Broker, BrokerStatus, BROKER_DISK_HIGH_WATER_PERCENT};
use crate::desired::{self, RolloutPlan};
use crate::disk;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

/// What a pass does and what it writes.
#[derive(Clone, Debug)]
pub struct Plan {
    /// In order; a failed API call among them fails the pass there.
    pub steps: Vec<Step>,
    pub status: StatusPlan,
}

/// The status a pass writes.
#[derive(Clone, Debug, PartialEq)]
pub enum StatusPlan {
    /// Paused: this status, then wait for a change.
    Paused(Box<BrokerStatus>),
    /// A Secret is missing: the [`Step::ReportFailure`] step writes the condition.
    Held,
    /// The status once the steps ran: [`Draft::finish`] with their outcome.
    Running(Box<Draft>),
}

/// An event the pass publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub type_: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

impl Note {
    pub(super) fn normal(reason: &'static str, action: &'static str, note: String) -> Note {
        Note {
            type_: EventType::Normal,
            reason,
            action,
            note,
        }
    }

    pub(super) fn warning(reason: &'static str, action: &'static str, note: String) -> Note {
        Note {
            type_: EventType::Warning,
            ..Note::normal(reason, action, note)
        }
    }
}

/// An object the pass applies (server-side apply, forced, under the operator's field manager)
/// or deletes.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    ConfigMap(Box<ConfigMap>),
    Service(Box<Service>),
    Budget(Box<PodDisruptionBudget>),
    NetworkPolicy(Box<NetworkPolicy>),
    StatefulSet(Box<StatefulSet>),
}

/// One thing a pass does.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Publish an event.
    Publish(Note),
    /// A problem the plan found: Degraded names it (in step order).
    Problem(Problem),
    /// Make these brokers (ordinals) of a cancelled scale-down writable again: an event names
    /// those restored, each failure is a problem and the broker stays listed read-only.
    RestoreWritable(Vec<i32>),
    /// Delete a pod: `done` is published when it went; else a problem with the reason and the
    /// message prefix of `failed`.
    DeletePod {
        pod: String,
        done: Note,
        failed: (&'static str, String),
    },
    Apply(Object),
    /// Put the StatefulSet's pod template back to the operator's: a JSON merge patch of the
    /// template as read (fields another manager added set to null) and the update strategy. No
    /// resourceVersion: the StatefulSet controller's status writes would make it a conflict, and
    /// a template field added since the read is found and undone by the next pass.
    RestoreTemplate {
        statefulset: String,
        patch: serde_json::Value,
    },
    /// Delete an object the operator owns (a group budget scaled away, a dropped policy).
    Delete(Object),
    /// Delete the StatefulSet with orphan propagation (its pods and claims stay), then publish
    /// this: a field it cannot change differs, and the next pass creates it again.
    OrphanStatefulSet(Note),
    /// Ask the master at `addr` to hand mastership to replica `target`.
    Switchover {
        addr: BrokerAddr,
        target: u64,
        done: Note,
        failed: (&'static str, String),
    },
    /// Ask the master at `addr` to change its group's membership.
    ChangeMembership {
        addr: BrokerAddr,
        change: MembershipChange,
        done: Note,
        failed: (&'static str, String),
    },
    /// Patch these claims to request `size`; a refusal becomes the VolumeExpansion condition.
    ResizeClaims {
        claims: Vec<String>,
        size: String,
    },
    /// Create these topics, in order; the first failure stops and is a problem.
    CreateTopics(Vec<(BrokerAddr, TopicConfig)>),
    /// Set this failure condition with a Warning event (the pass applies nothing).
    ReportFailure(Desired),
}

/// The plan of one pass.
pub fn plan(world: &World) -> Plan {
    let broker = &world.broker;
    match &world.state {
        State::Paused => plan_paused(world),
        State::SecretsMissing(problem) => Plan {
            // Pods that cannot mount the Secret, or would run without ACL, must not roll
            // out; the Secret's creation or change wakes the next pass.
            steps: vec![Step::ReportFailure(Desired::new(
                "Degraded",
                true,
                problem.reason,
                problem.message.clone(),
            ))],
            status: StatusPlan::Held,
        },
        State::Running(cluster) => plan_running(broker, world, cluster),
    }
}

/// Paused: only the Paused and Progressing conditions change; nothing is applied.
fn plan_paused(world: &World) -> Plan {
    let broker = &world.broker;
    let previous = broker.status.clone().unwrap_or_default();
    let mut steps = Vec::new();
    if !is_true(&previous.conditions, "Paused") {
        steps.push(Step::Publish(Note::normal(
            "Paused",
            "Pause",
            "reconciliation paused by the quiver.io/paused annotation".to_string(),
        )));
    }
    let status = paused_status(broker, previous, now(world));
    Plan {
        steps,
        status: StatusPlan::Paused(Box::new(status)),
    }
}

fn now(world: &World) -> Timestamp {
    Timestamp::from_millisecond(world.now_ms).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn plan_running(broker: &Broker, world: &World, cluster: &Cluster) -> Plan {
    let previous = broker.status.clone().unwrap_or_default();
    let existing = cluster.statefulset.as_ref();
    let sticky = restart::with_sticky_token(broker, existing);
    let broker = &*sticky;
    let mut steps = Vec::new();
    let mut scale = plan_scale(broker, existing, &previous, &cluster.leaving, &mut steps);
    if let (Some(sts), Some(groups)) = (existing, &cluster.groups) {
        let running = sts.spec.replicas.unwrap_or(0);
        scale.replicas = scale
            .replicas
            .max(membership::kept_pods(broker, groups, running));
    }
    let memberships = memberships_of(cluster.groups.as_deref());
    let (mut plan, phase) = plan_rollout(
        broker,
        existing,
        scale.replicas,
        cluster.security_hash.clone(),
    );
    let restart_started = restart::requested(broker, existing);
    if let Some(token) = restart_started {
        steps.push(Step::Publish(restart::started_note(broker, token)));
    }
    steps.extend(announce_rollout(broker, &phase, &plan, existing.is_some()));
    let drifted =
        existing.is_some_and(|sts| plan_drift(broker, sts, cluster, &mut plan, &mut steps));
    let deleted = existing.and_then(|sts| plan_stuck_pod(broker, sts, cluster, &mut steps));
    let draining_from = scale.drain.is_some().then_some(scale.wanted);
    plan_objects(
        broker,
        world,
        cluster,
        &plan,
        draining_from,
        &memberships,
        &mut steps,
    );
    let replicated_rolling = match (existing, &cluster.groups) {
        // The update revision read is the drifted template's: step once it is restored.
        (Some(_), Some(_)) if drifted => true,
        (Some(sts), Some(groups)) => {
            let pods = pods_after(cluster.pods.as_ref(), deleted.as_deref(), world.now_ms);
            plan_group_changes(broker, sts, groups, pods.as_ref(), &mut steps)
        }
        _ => false,
    };
    let settled = restart::settled(
        existing,
        plan.partition > 0 || replicated_rolling || drifted,
    );
    let restart = restart::next_status(previous.restart.as_ref(), restart_started, settled);
    steps.extend(
        restart::completed_note(previous.restart.as_ref(), restart.as_ref()).map(Step::Publish),
    );
    let (expansion, to_grow) = match existing {
        Some(_) => expansion::plan(
            broker,
            &plan,
            &cluster.claims,
            cluster.storage_classes.as_ref(),
        ),
        None => Default::default(),
    };
    if !to_grow.is_empty() {
        let size = broker.spec.storage.size.clone();
        steps.push(Step::ResizeClaims {
            claims: to_grow,
            size,
        });
    }
    let creations = topic_creations(broker, &plan, cluster);
    if !creations.is_empty() {
        steps.push(Step::CreateTopics(creations));
    }
    let draft = Draft {
        statefulset_exists: existing.is_some(),
        sts_status: existing
            .and_then(|sts| sts.status.clone())
            .unwrap_or_default(),
        plan,
        scale,
        expansion,
        disk: disk::disk_pressure(
            &cluster.disks,
            default_high_water(broker),
            &broker.spec.storage.size,
        ),
        now: now(world),
        replication: cluster.groups.as_ref().map(|groups| {
            groups
                .iter()
                .map(|group| replication::group_status(broker, group))
                .collect()
        }),
        replicated_rolling,
        restart,
    };
    Plan {
        steps,
        status: StatusPlan::Running(Box::new(draft)),
    }
}

/// The ordinals a scale-down removes (from spec.replicas' pods up to the StatefulSet's whole
/// groups), None when nothing leaves.
pub fn leaving_ordinals(
    broker: &Broker,
    existing: Option<&StatefulSet>,
) -> Option<std::ops::Range<i32>> {
    let wanted = wanted_pods(broker);
    let running = existing?.spec.replicas.unwrap_or(0);
    // Whole groups only: the pods past them are members a replicas decrease removes (through
    // the group's consensus, never fenced), not brokers that drain.
    let running = desired::pods_of_groups(broker, running / broker.group_size());
    (wanted < running).then_some(wanted..running)
}

/// Pods of spec.replicas' broker groups (at least one group).
fn wanted_pods(broker: &Broker) -> i32 {
    desired::pods_of_groups(broker, broker.spec.replicas.max(1))
}

/// Whether the drain holds the leaving brokers: they still hold unread messages (or did not
/// answer) and the scale-down is not forced.
fn drain_holds(broker: &Broker, leaving: &[LeavingBroker]) -> bool {
    !leaving.is_empty() && !drain::is_drained(leaving) && !broker.force_scale_down()
}

/// Pods this pass runs: the StatefulSet's while the drain holds, else spec.replicas'.
pub fn pods_to_run(
    broker: &Broker,
    existing: Option<&StatefulSet>,
    leaving: &[LeavingBroker],
) -> i32 {
    match leaving_ordinals(broker, existing) {
        Some(range) if drain_holds(broker, leaving) => range.end,
        _ => wanted_pods(broker),
    }
}

/// Restores the kept brokers of a cancelled scale-down, then holds the leaving ones until
/// they are drained (or the scale-down is forced), with an event for each turn.
fn plan_scale(
    broker: &Broker,
    existing: Option<&StatefulSet>,
    previous: &BrokerStatus,
    leaving: &[LeavingBroker],
    steps: &mut Vec<Step>,
) -> Scale {
    let wanted = wanted_pods(broker);
    let kept = drain::kept_read_only(broker, previous, wanted);
    if !kept.is_empty() {
        steps.push(Step::RestoreWritable(kept));
    }
    let settled = Scale {
        wanted,
        replicas: wanted,
        drain: None,
        read_only: ReadOnly::failed_restores(),
    };
    let Some(range) = leaving_ordinals(broker, existing) else {
        return settled;
    };
    let status = drain::drain_status(leaving);
    let names = status.brokers.join(", ");
    if drain::is_drained(leaving) {
        let mut note = format!("{names} consumed to the end; scaling to {wanted}");
        if let Some(dead_letters) = drain::dead_letters_left(&status) {
            note = format!("{note}; {dead_letters}");
        }
        steps.push(Step::Publish(Note::normal("Drained", "ScaleDown", note)));
        return Scale {
            read_only: ReadOnly::none(),
            ..settled
        };
    }
    if broker.force_scale_down() {
        let note = format!(
            "quiver.io/force-scale-down: scaling to {wanted} without waiting; dropped with \
             {names}: {}",
            drain::describe(&status)
        );
        steps.push(Step::Publish(Note::warning(
            "ForcedScaleDown",
            "ScaleDown",
            note,
        )));
        return Scale {
            read_only: ReadOnly::none(),
            ..settled
        };
    }
    if previous.drain.is_none() {
        let note = format!("{names} read-only until what they hold is read");
        steps.push(Step::Publish(Note::normal(
            "DrainStarted",
            "ScaleDown",
            note,
        )));
    }
    for unanswered in leaving {
        if let Err(error) = &unanswered.backlog {
            let message = format!("leaving broker {} did not answer: {error}", unanswered.name);
            steps.push(Step::Problem(Problem::new(
                REASON_LEAVING_UNREACHABLE,
                message,
            )));
        }
    }
    Scale {
        replicas: range.end,
        read_only: ReadOnly::failed_restores_and(status.brokers.clone()),
        drain: Some(status),
        ..settled
    }
}

/// The event of a rollout that starts or moves on.
fn announce_rollout(
    broker: &Broker,
    phase: &RolloutPhase,
    plan: &RolloutPlan,
    statefulset_exists: bool,
) -> Option<Step> {
    let (reason, note) = match phase {
        RolloutPhase::Started if statefulset_exists && broker.is_replicated() => (
            "RolloutStarted",
            "template changed; each broker group restarts its replicas first, then switches \
             mastership over and restarts the old master"
                .to_string(),
        ),
        RolloutPhase::Started if statefulset_exists => (
            "RolloutStarted",
            format!(
                "template changed; updating {} first",
                desired::pod_name(broker, plan.partition)
            ),
        ),
        RolloutPhase::Stepped => (
            "RolloutStep",
            format!("updating {}", desired::pod_name(broker, plan.partition)),
        ),
        _ => return None,
    };
    Some(Step::Publish(Note::normal(reason, "Rollout", note)))
}

/// A pod template changed behind the operator (managedFields name another writer of its
/// fields): a Warning event naming the drift, the template restored before the apply, and the
/// pods the StatefulSet controller rolled to the drifted template rolled back under the
/// operator's partition (from the highest such ordinal down; a replicated Broker's OnDelete
/// rolled none). Returns whether the template drifted.
fn plan_drift(
    broker: &Broker,
    sts: &StatefulSet,
    cluster: &Cluster,
    plan: &mut RolloutPlan,
    steps: &mut Vec<Step>,
) -> bool {
    let drift = drift::template_drift(sts);
    if drift.is_empty() {
        return false;
    }
    let rolled = match cluster.pods.as_ref() {
        Some(Ok(pods)) if !broker.is_replicated() => drift::rolled_outside(broker, sts, pods),
        _ => Vec::new(),
    };
    let highest = rolled
        .iter()
        .filter_map(|name| name.rsplit('-').next()?.parse::<i32>().ok())
        .max();
    if let Some(ordinal) = highest.filter(|_| plan.partition == 0) {
        plan.partition = ordinal.min(plan.replicas - 1).max(0);
    }
    let note = drift::describe(&sts.name_any(), &drift, &rolled);
    steps.push(Step::Publish(Note::warning(
        "TemplateDrift",
        "Rollout",
        note,
    )));
    let wanted = desired::stateful_set(broker, plan);
    let json = |value| serde_json::to_value(value).unwrap_or_default();
    let template = drift::merge_patch(&json(&sts.spec.template), &json(&wanted.spec.template));
    let patch = serde_json::json!({
        "spec": {"template": template, "updateStrategy": wanted.spec.update_strategy},
    });
    steps.push(Step::RestoreTemplate {
        statefulset: sts.name_any(),
        patch,
    });
    true
}

/// Deletes a pod stuck not Ready at an outdated revision, so the StatefulSet recreates it at
/// the update revision instead of waiting for it forever. Returns the pod deleted.
fn plan_stuck_pod(
    broker: &Broker,
    sts: &StatefulSet,
    cluster: &Cluster,
    steps: &mut Vec<Step>,
) -> Option<String> {
    if !rollout::may_have_stuck_pod(sts) {
        return None;
    }
    let pods = match cluster.pods.as_ref()? {
        Ok(pods) => pods,
        Err(error) => {
            let message = format!("cannot list the broker pods: {error}");
            steps.push(Step::Problem(Problem::new(REASON_STUCK_POD, message)));
            return None;
        }
    };
    let stuck = rollout::stuck_pod(broker, sts, pods)?;
    let done = Note::warning(
        "StuckPodDeleted",
        "Rollout",
        format!(
            "{stuck} was not Ready at an outdated revision; deleted so the StatefulSet \
             recreates it at the current template"
        ),
    );
    let failed = (REASON_STUCK_POD, format!("cannot delete stuck pod {stuck}"));
    let step = delete_pod_step(
        broker,
        cluster.groups.as_deref(),
        pods,
        &stuck,
        done,
        failed,
    );
    let deletes = matches!(step, Step::DeletePod { .. });
    steps.push(step);
    deletes.then_some(stuck)
}

/// Each group's membership as its members reported it (groups that answered).
fn memberships_of(groups: Option<&[GroupObservation]>) -> desired::Memberships {
    groups
        .into_iter()
        .flatten()
        .filter_map(|group| Some((group.group, group.membership()?)))
        .collect()
}

/// The step that deletes `pod`: the deletion, or for a replicated group's master the
/// switchover that must come first (the deletion waits for a later pass, when the pod is a
/// replica). A master deleted without one (it does not answer, or no in-sync replica can take
/// over) is an election: its event is a Warning that says so.
fn delete_pod_step(
    broker: &Broker,
    groups: Option<&[GroupObservation]>,
    pods: &[Pod],
    pod: &str,
    mut done: Note,
    failed: (&'static str, String),
) -> Step {
    let delete = |done: Note| Step::DeletePod {
        pod: pod.to_string(),
        done,
        failed: failed.clone(),
    };
    let member = groups
        .filter(|_| broker.is_replicated())
        .and_then(|groups| {
            let memberships = memberships_of(Some(groups));
            let prefix = format!("{}-", broker.name_any());
            let ordinal: i32 = pod.strip_prefix(&prefix)?.parse().ok()?;
            let (group, replica) = desired::placement(broker, ordinal, &memberships);
            let observation = groups.iter().find(|observed| observed.group == group)?;
            Some((observation, u64::try_from(replica).ok()?))
        });
    let Some((observation, id)) = member else {
        return delete(done);
    };
    let up = |replica: u64| {
        let first = desired::group_ordinals(broker, observation.group).start;
        let name = desired::pod_name(broker, first + i32::try_from(replica).unwrap_or(0));
        pods.iter()
            .any(|pod| pod.name_any() == name && rollout::is_up(pod))
    };
    match membership::before_delete(observation, id, up) {
        BeforeDelete::Delete => delete(done),
        BeforeDelete::Switchover { master, target } => {
            replication::switchover_step(broker, observation, master, target, "deleting")
        }
        BeforeDelete::Election(why) => {
            done.type_ = EventType::Warning;
            done.note = format!("{}; {why}", done.note);
            delete(done)
        }
    }
}

/// The pods as the rest of the pass sees them: one deleted this pass is terminating.
fn pods_after(
    pods: Option<&Result<Vec<Pod>, String>>,
    deleted: Option<&str>,
    now_ms: i64,
) -> Option<Result<Vec<Pod>, String>> {
    let mut pods = pods?.clone();
    if let (Ok(pods), Some(deleted)) = (&mut pods, deleted) {
        let now = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
        for pod in pods.iter_mut().filter(|pod| pod.name_any() == deleted) {
            pod.metadata.deletion_timestamp.get_or_insert(Time(now));
        }
    }
    Some(pods)
}

/// The objects of this pass: config, Services, budgets (and those of groups scaled away),
/// the NetworkPolicy (or the deletion of the one the spec dropped), then the StatefulSet.
fn plan_objects(
    broker: &Broker,
    world: &World,
    cluster: &Cluster,
    plan: &RolloutPlan,
    draining_from: Option<i32>,
    memberships: &desired::Memberships,
    steps: &mut Vec<Step>,
) {
    let config = desired::config_map_of_members(broker, plan.replicas, draining_from, memberships);
    steps.push(Step::Apply(Object::ConfigMap(Box::new(config))));
    let headless_service = desired::headless_service(broker);
    steps.push(Step::Apply(Object::Service(Box::new(headless_service))));
    let client_service = desired::client_service(broker);
    steps.push(Step::Apply(Object::Service(Box::new(client_service))));
    let budgets = desired::pod_disruption_budgets(broker, plan.replicas);
    // Group budgets are listed for replicated Brokers only: those of groups scaled away go.
    let stale: Vec<Step> = cluster
        .group_budgets
        .iter()
        .filter(|budget| {
            owned_by(broker, *budget)
                && !budgets
                    .iter()
                    .any(|wanted| wanted.metadata.name == budget.metadata.name)
        })
        .map(|budget| Step::Delete(Object::Budget(Box::new(budget.clone()))))
        .collect();
    steps.extend(
        budgets
            .into_iter()
            .map(|b| Step::Apply(Object::Budget(Box::new(b)))),
    );
    steps.extend(stale);
    match desired::network_policy(broker, &world.operator) {
        Some(policy) => steps.push(Step::Apply(Object::NetworkPolicy(Box::new(policy)))),
        None => {
            let owned = cluster.network_policy.iter().find(|p| owned_by(broker, *p));
            if let Some(policy) = owned {
                steps.push(Step::Delete(Object::NetworkPolicy(Box::new(
                    policy.clone(),
                ))));
            }
        }
    }
    let mut statefulset = desired::stateful_set(broker, plan);
    let existing = cluster.statefulset.as_ref();
    let recreate = existing.and_then(|sts| Some((sts, desired::recreate_reason(sts)?)));
    match recreate {
        // Not while pods move (a drain, a rollout, a start): the new StatefulSet would know
        // nothing of them. Until then the apply keeps the field it cannot change.
        Some((sts, _)) if draining_from.is_some() || !rollout::is_settled(sts, plan.replicas) => {
            statefulset.spec.pod_management_policy = sts.spec.pod_management_policy.clone();
            steps.push(Step::Apply(Object::StatefulSet(Box::new(statefulset))));
        }
        Some((_, reason)) => {
            let note = format!(
                "{reason}: StatefulSet {} deleted with its pods and claims orphaned; it is \
                 created again and adopts them, restarting none",
                broker.name_any()
            );
            let note = Note::normal("StatefulSetReplaced", "Migrate", note);
            steps.push(Step::OrphanStatefulSet(note));
        }
        None => steps.push(Step::Apply(Object::StatefulSet(Box::new(statefulset)))),
    }
}

fn owned_by<K: Resource>(broker: &Broker, object: &K) -> bool {
    object
        .owner_references()
        .iter()
        .any(|owner| Some(&owner.uid) == broker.metadata.uid.as_ref())
}

/// Whether a replicated Broker's StatefulSet lets the group rollout step: it has an update
/// revision and a status about the current template.
pub fn steps_groups(broker: &Broker, sts: &StatefulSet) -> bool {
    let status = sts.status.as_ref();
    broker.is_replicated()
        && status.is_some_and(|s| s.update_revision.is_some())
        && status.and_then(|s| s.observed_generation) >= sts.metadata.generation
}

/// The membership changes and the rollout of a replicated Broker: the first group (by index)
/// whose membership is not spec's takes its next membership step (membership first: a rollout
/// waits for every member of spec's size to be in sync); else every group not yet at the
/// update revision takes its next rollout step, each on its own (a group waiting for a pod,
/// a crash-looping one too, holds back no other group; each group's budget allows one pod
/// down). Returns whether either is in progress.
fn plan_group_changes(
    broker: &Broker,
    sts: &StatefulSet,
    groups: &[GroupObservation],
    pods: Option<&Result<Vec<Pod>, String>>,
    steps: &mut Vec<Step>,
) -> bool {
    let update_revision = sts.status.as_ref().and_then(|s| s.update_revision.clone());
    let (Some(update_revision), Some(pods)) = (update_revision, pods) else {
        return false;
    };
    if !steps_groups(broker, sts) {
        return false;
    }
    let pods = match pods {
        Ok(pods) => pods,
        Err(error) => {
            let message = format!("cannot list the broker pods: {error}");
            steps.push(Step::Problem(Problem::new(REASON_ROLLOUT_STEP, message)));
            return true;
        }
    };
    for group in groups {
        if let Some(step) = plan_membership(broker, group, pods) {
            steps.extend(step);
            return true;
        }
    }
    let size = usize::try_from(broker.group_size()).unwrap_or(1);
    let mut rolling = false;
    for group in groups {
        let members = rollout::member_pods(broker, group.group, pods, &update_revision);
        let step = match rollout::next_group_step(size, &members, group.status.as_ref()) {
            GroupStep::Done => continue,
            GroupStep::Wait(reason) => {
                tracing::debug!(group = %group.name, %reason, "rollout waits");
                None
            }
            GroupStep::DeletePod(pod) => {
                Some(group_restart_step(broker, groups, group, pods, &pod))
            }
            GroupStep::Switchover { master, target } => Some(replication::switchover_step(
                broker,
                group,
                master,
                target,
                "restarting",
            )),
        };
        steps.extend(step);
        rolling = true;
    }
    rolling
}

/// The deletion of `pod` as a step of its group's rollout.
fn group_restart_step(
    broker: &Broker,
    groups: &[GroupObservation],
    group: &GroupObservation,
    pods: &[Pod],
    pod: &str,
) -> Step {
    let done = Note::normal(
        "RolloutStep",
        "Rollout",
        format!("restarting {pod} of {} at the current template", group.name),
    );
    let failed = (
        REASON_ROLLOUT_STEP,
        format!("cannot delete {pod} of {}", group.name),
    );
    delete_pod_step(broker, Some(groups), pods, pod, done, failed)
}

/// The group's next membership change toward spec's size: None when its membership is spec's
/// (or unknown), else the step to take (none while it waits).
fn plan_membership(
    broker: &Broker,
    group: &GroupObservation,
    pods: &[Pod],
) -> Option<Option<Step>> {
    let size = u64::try_from(broker.group_size()).unwrap_or(1);
    let first = desired::group_ordinals(broker, group.group).start;
    let ordinal = |id: u64| first + i32::try_from(id).unwrap_or(0);
    let running = |id: u64| {
        let name = desired::pod_name(broker, ordinal(id));
        pods.iter()
            .any(|pod| pod.name_any() == name && pod.metadata.deletion_timestamp.is_none())
    };
    let master_addr = || {
        let status = group.status.as_ref();
        let master = status.and_then(|status| status.master_id).unwrap_or(0);
        let addr = status.and_then(|status| status.master_address.clone());
        BrokerAddr(addr.unwrap_or_else(|| desired::broker_address(broker, ordinal(master))))
    };
    let (change, verb) = match membership::next_member_step(size, group, running) {
        MemberStep::Done => return None,
        MemberStep::Wait(reason) => {
            tracing::debug!(group = %group.name, %reason, "membership change waits");
            return Some(None);
        }
        MemberStep::Switchover { master, target } => {
            let step = replication::switchover_step(broker, group, master, target, "removing");
            return Some(Some(step));
        }
        MemberStep::Add(member) => {
            let address = desired::broker_address(broker, ordinal(member));
            (
                MembershipChange::Add { member, address },
                ("MemberAdded", "added to"),
            )
        }
        MemberStep::Remove(member) => (
            MembershipChange::Remove { member },
            ("MemberRemoved", "removed from"),
        ),
    };
    let pod = desired::pod_name(broker, ordinal(change.member()));
    let (reason, done_verb) = verb;
    Some(Some(Step::ChangeMembership {
        addr: master_addr(),
        done: Note::normal(
            reason,
            "Scale",
            format!(
                "{pod} (replica {}) {done_verb} {}'s membership",
                change.member(),
                group.name
            ),
        ),
        failed: (
            REASON_MEMBERSHIP,
            format!(
                "cannot {} replica {} ({pod}) of {}",
                change.action(),
                change.member(),
                group.name
            ),
        ),
        change,
    }))
}

/// The high water the brokers run with, for a broker that does not report its own.
fn default_high_water(broker: &Broker) -> f64 {
    let percent = broker
        .spec
        .retention
        .as_ref()
        .and_then(|retention| retention.disk_high_water_percent)
        .filter(|percent| (1..=100).contains(percent))
        .unwrap_or(BROKER_DISK_HIGH_WATER_PERCENT);
    f64::from(percent) / 100.0
}

/// Where the spec's topics are created: every broker; of a replicated group only its master
/// (its replicas follow it), none while the group has no master.
pub fn topic_targets(
    broker: &Broker,
    replicas: i32,
    groups: Option<&[GroupObservation]>,
) -> Vec<BrokerAddr> {
    match groups {
        Some(groups) if broker.is_replicated() => groups
            .iter()
            .filter_map(|group| group.status.as_ref()?.master_address.clone())
            .map(BrokerAddr)
            .collect(),
        _ => (0..replicas)
            .map(|ordinal| BrokerAddr(desired::broker_address(broker, ordinal)))
            .collect(),
    }
}

/// Whether the spec's topics are created this pass: there are some, and every one of
/// `replicas` brokers is Ready.
pub fn creates_topics(broker: &Broker, existing: Option<&StatefulSet>, replicas: i32) -> bool {
    let ready = existing
        .and_then(|sts| sts.status.as_ref())
        .and_then(|status| status.ready_replicas)
        .unwrap_or(0);
    !broker.spec.topics.is_empty() && ready >= replicas
}

/// The spec topics to create once every broker is Ready: on each target, those not already
/// there with the spec's queues (creating persists the broker's topic table).
fn topic_creations(
    broker: &Broker,
    plan: &RolloutPlan,
    cluster: &Cluster,
) -> Vec<(BrokerAddr, TopicConfig)> {
    if !creates_topics(broker, cluster.statefulset.as_ref(), plan.replicas) {
        return Vec::new();
    }
    let mut creations = Vec::new();
    for addr in topic_targets(broker, plan.replicas, cluster.groups.as_deref()) {
        for topic in &broker.spec.topics {
            let queues = cluster
                .topic_queues
                .get(&(addr.clone(), topic.name.clone()));
            if queues.is_some_and(|queues| usize::try_from(topic.queues) == Ok(*queues)) {
                continue;
            }
            let config = TopicConfig {
                name: topic.name.clone(),
                queues: topic.queues,
            };
            creations.push((addr.clone(), config));
        }
    }
    creations
}
