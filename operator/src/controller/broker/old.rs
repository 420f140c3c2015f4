//! Broker reconciler: fetch, plan (drain, rollout), apply with server-side apply, write status.
//!
//! A failing step that does not make the rest wrong (a leaving broker that does not answer, a
//! pod that cannot be deleted, a claim patch refused, topics not created) becomes a [`Problem`]:
//! Degraded=True and a Warning event, while everything else is still applied. A failed API call
//! on the objects themselves fails the pass; [`reconcile`] reports it the same way.

use super::conditions::{self, is_true, Desired, Status};
use super::drain::{self, LeavingBroker};
use super::expansion::{self, Expansion};
use super::replication::{self, GroupObservation};
use super::rollout::{self, plan_rollout, ProgressMarkers, RolloutPhase};
use super::security;
use super::{
    error_chain, object_key, publish, read_own_write, report_failure, write_status_if_changed,
    Context, Error,
};
use crate::admin::{BrokerAddr, TopicConfig};
use crate::crd::{
    Broker, BrokerAddress, BrokerReplicationStatus, BrokerStatus, DrainStatus,
    ReplicationGroupStatus, RolloutStatus, BROKER_DISK_HIGH_WATER_PERCENT,
};
use crate::desired::{self, RolloutPlan, FIELD_MANAGER};
use crate::disk::{self, BrokerDisk, DiskProbe};
use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::instrument;

/// Requeue delay while something is in progress (drain, rollout, expansion, startup) or a step
/// failed.
pub const PROGRESS_REQUEUE: Duration = Duration::from_secs(10);
/// Requeue delay of a settled Broker (watches wake it earlier on changes).
pub const IDLE_REQUEUE: Duration = Duration::from_secs(300);
/// Requeue delay while DiskPressure is True, so the condition clears soon after the fix.
pub const DISK_PRESSURE_REQUEUE: Duration = Duration::from_secs(30);

/// Degraded reason: a reconcile failed (the message is the error chain).
pub const REASON_RECONCILE_ERROR: &str = "ReconcileError";
/// Degraded reason: pods went spec.progressDeadlineSeconds without progress.
pub const REASON_PROGRESS_DEADLINE: &str = "ProgressDeadlineExceeded";
/// Degraded reason: a leaving broker did not answer, so its drain cannot be checked.
pub const REASON_LEAVING_UNREACHABLE: &str = "LeavingBrokerUnreachable";
/// Degraded reason: a kept broker of a cancelled scale-down could not be made writable.
pub const REASON_KEPT_READ_ONLY: &str = "KeptBrokerReadOnly";
/// Degraded reason: the pods could not be listed, or a stuck pod could not be deleted.
pub const REASON_STUCK_POD: &str = "StuckPodNotDeleted";
/// Degraded reason: a spec topic could not be created on a broker.
pub const REASON_TOPICS: &str = "TopicCreationFailed";
/// Degraded reason: some brokers are not Ready although every pod runs the spec.
pub const REASON_UNAVAILABLE: &str = "BrokersUnavailable";

/// A step that failed without stopping the pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Degraded reason and Warning event reason.
    pub reason: &'static str,
    /// What failed, with the error chain.
    pub message: String,
}

impl Problem {
    pub(crate) fn new(reason: &'static str, message: impl Into<String>) -> Problem {
        Problem {
            reason,
            message: message.into(),
        }
    }
}

/// Entry point of the Broker controller.
pub async fn reconcile(broker: Arc<Broker>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_broker(&broker, &ctx).await;
    ctx.metrics.reconciled("broker", started.elapsed());
    match &result {
        Ok(_) => ctx.reset_backoff(&object_key(broker.as_ref())),
        Err(error) => report_reconcile_error(&broker, error, &ctx).await,
    }
    result
}

/// Degraded=True with reason ReconcileError and a Warning event, before the error goes back to
/// kube-runtime's retry. An object without namespace or uid is not a stored one: nothing to do.
async fn report_reconcile_error(broker: &Broker, error: &Error, ctx: &Context) {
    if matches!(error, Error::MissingField { .. }) {
        return;
    }
    let previous = broker
        .status
        .as_ref()
        .map(|status| status.conditions.as_slice())
        .unwrap_or_default();
    let failure = Desired::new("Degraded", true, REASON_RECONCILE_ERROR, error_chain(error));
    report_failure(ctx, broker, previous, &failure, "Reconcile").await;
}

fn checked_namespace(broker: &Broker) -> Result<String, Error> {
    let missing = |field| Error::MissingField {
        kind: "Broker",
        name: broker.name_any(),
        field,
    };
    // Owner references need the uid; the builders rely on it being there.
    broker.uid().ok_or_else(|| missing("uid"))?;
    broker.namespace().ok_or_else(|| missing("namespace"))
}

#[instrument(skip(broker, ctx), fields(broker = %broker.name_any()))]
async fn reconcile_broker(broker: &Broker, ctx: &Context) -> Result<Action, Error> {
    let namespace = checked_namespace(broker)?;
    let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), &namespace);
    let stored = read_own_write(&brokers, broker, ctx).await?;
    let broker = stored.as_ref().unwrap_or(broker);
    let now_ms = (ctx.clock)();
    if broker.is_paused() {
        return reconcile_paused(broker, &brokers, now_ms, ctx).await;
    }
    let secrets = match security::resolve(broker, &namespace, ctx).await? {
        Ok(resolved) => resolved,
        Err(problem) => return hold_for_secrets(broker, &problem, ctx).await,
    };
    let scope = desired::broker_scope(broker);
    ctx.admin.use_access(&scope, secrets.access);
    let name = broker.name_any();
    let previous = broker.status.clone().unwrap_or_default();
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = statefulsets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading StatefulSet {name}")))?;
    let mut problems = Vec::new();
    let scale = scale(
        broker,
        existing.as_ref(),
        &previous,
        now_ms,
        ctx,
        &mut problems,
    )
    .await;
    let (plan, phase) = plan_rollout(broker, existing.as_ref(), scale.replicas, secrets.hash);
    announce_rollout(broker, &phase, &plan, existing.is_some(), ctx).await;
    if let Some(sts) = &existing {
        unstick_rollout(broker, sts, &namespace, ctx, &mut problems).await;
    }
    let draining_from = scale.drain.is_some().then_some(scale.wanted);
    apply_objects(broker, &namespace, &plan, draining_from, ctx).await?;
    let observations: Option<Vec<GroupObservation>> = match existing {
        Some(_) if broker.is_replicated() => {
            Some(replication::observe(broker, plan.replicas, ctx).await)
        }
        _ => None,
    };
    let replicated_rolling = match (&existing, &observations) {
        (Some(sts), Some(observations)) => {
            replication::step_rollout(broker, sts, &namespace, observations, ctx, &mut problems)
                .await
        }
        _ => false,
    };
    let replication_groups = observations.as_ref().map(|observations| {
        observations
            .iter()
            .map(|observation| replication::group_status(broker, observation))
            .collect::<Vec<_>>()
    });
    let expansion = match existing {
        Some(_) => expansion::expand_volumes(broker, &namespace, &plan, ctx).await?,
        None => Expansion::default(),
    };
    let sts_status = existing
        .as_ref()
        .and_then(|sts| sts.status.clone())
        .unwrap_or_default();
    if !broker.spec.topics.is_empty() && sts_status.ready_replicas.unwrap_or(0) >= plan.replicas {
        let targets = topic_targets(broker, plan.replicas, observations.as_deref());
        if let Err(error) = ensure_topics(broker, &targets, ctx).await {
            problems.push(Problem::new(REASON_TOPICS, error_chain(&error)));
        }
    }
    let disks = match existing {
        Some(_) => probe_disks(broker, plan.replicas, ctx).await,
        None => Vec::new(),
    };
    let observed = Observed {
        statefulset_exists: existing.is_some(),
        sts_status,
        plan: &plan,
        scale: &scale,
        expansion: &expansion,
        disk: disk::disk_pressure(
            &disks,
            default_high_water(broker),
            &broker.spec.storage.size,
        ),
        problems: &problems,
        now: Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH),
        replication: replication_groups,
        replicated_rolling,
    };
    let (status, outlook) = broker_status(broker, &previous, &observed);
    publish_transitions(
        broker,
        &previous.conditions,
        &status.conditions,
        &problems,
        ctx,
    )
    .await;
    write_status_if_changed(&brokers, &name, broker.status.as_ref(), &status, ctx).await?;
    Ok(Action::requeue(outlook.requeue()))
}

/// A Secret of spec.security is missing or incomplete: Degraded names it, and nothing is
/// applied (pods that cannot mount it, or would run without ACL, must not roll out). The
/// Secret's creation or change wakes the next pass.
async fn hold_for_secrets(
    broker: &Broker,
    problem: &Problem,
    ctx: &Context,
) -> Result<Action, Error> {
    let previous = broker
        .status
        .as_ref()
        .map(|status| status.conditions.as_slice())
        .unwrap_or_default();
    let failure = Desired::new("Degraded", true, problem.reason, problem.message.clone());
    report_failure(ctx, broker, previous, &failure, "Reconcile").await;
    Ok(Action::requeue(PROGRESS_REQUEUE))
}

/// Paused: only the Paused and Progressing conditions change; nothing is applied.
async fn reconcile_paused(
    broker: &Broker,
    brokers: &Api<Broker>,
    now_ms: i64,
    ctx: &Context,
) -> Result<Action, Error> {
    let previous = broker.status.clone().unwrap_or_default();
    if !is_true(&previous.conditions, "Paused") {
        publish(
            ctx,
            broker,
            EventType::Normal,
            "Paused",
            "Pause",
            "reconciliation paused by the quiver.io/paused annotation",
        )
        .await;
    }
    let now = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
    let mut conditions = conditions::merge(
        &previous.conditions,
        &[
            Desired::new(
                "Paused",
                true,
                "PauseAnnotation",
                "reconciliation stopped by the quiver.io/paused annotation",
            ),
            Desired::new(
                "Progressing",
                false,
                "Paused",
                "changes are not applied while paused",
            ),
        ],
        broker.metadata.generation,
        now,
    );
    conditions.extend(
        previous
            .conditions
            .iter()
            .filter(|c| c.type_ != "Paused" && c.type_ != "Progressing")
            .cloned(),
    );
    let status = BrokerStatus {
        conditions,
        ..previous
    };
    write_status_if_changed(
        brokers,
        &broker.name_any(),
        broker.status.as_ref(),
        &status,
        ctx,
    )
    .await?;
    Ok(Action::await_change())
}

/// How many brokers run this pass, and the drain holding the leaving ones.
struct Scale {
    /// spec.replicas (at least 1).
    wanted: i32,
    /// Pods to run: above `wanted` while the drain holds.
    replicas: i32,
    /// The drain in progress.
    drain: Option<DrainStatus>,
    /// Brokers left read-only: draining, or kept but not writable yet.
    read_only: Vec<String>,
}

/// Restores the kept brokers of a cancelled scale-down, then drains the leaving ones, each
/// broker on its own: a failure is a problem, never an error.
async fn scale(
    broker: &Broker,
    existing: Option<&StatefulSet>,
    previous: &BrokerStatus,
    now_ms: i64,
    ctx: &Context,
    problems: &mut Vec<Problem>,
) -> Scale {
    // Pods: every broker group has group_size() of them.
    let wanted = desired::pods_of_groups(broker, broker.spec.replicas.max(1));
    let running = existing.and_then(|sts| sts.spec.replicas).unwrap_or(0);
    let mut read_only = restore_kept(broker, previous, wanted, ctx, problems).await;
    if existing.is_none() || wanted >= running {
        return Scale {
            wanted,
            replicas: wanted,
            drain: None,
            read_only,
        };
    }
    let inspections =
        (wanted..running).map(|ordinal| drain::inspect_leaving(broker, ordinal, ctx, now_ms));
    let leaving: Vec<LeavingBroker> = futures::future::join_all(inspections).await;
    let held = hold_for_drain(broker, wanted, &leaving, previous, ctx).await;
    let Some(status) = held else {
        return Scale {
            wanted,
            replicas: wanted,
            drain: None,
            read_only: Vec::new(),
        };
    };
    for unanswered in &leaving {
        if let Err(error) = &unanswered.backlog {
            let message = format!("leaving broker {} did not answer: {error}", unanswered.name);
            problems.push(Problem::new(REASON_LEAVING_UNREACHABLE, message));
        }
    }
    read_only.extend(status.brokers.iter().cloned());
    Scale {
        wanted,
        replicas: running,
        drain: Some(status),
        read_only,
    }
}

/// The drain that holds the leaving brokers, or None when they may go: drained, or forced by the
/// annotation (with a Warning event naming what is dropped).
async fn hold_for_drain(
    broker: &Broker,
    wanted: i32,
    leaving: &[LeavingBroker],
    previous: &BrokerStatus,
    ctx: &Context,
) -> Option<DrainStatus> {
    let status = drain::drain_status(leaving);
    let names = status.brokers.join(", ");
    if drain::is_drained(leaving) {
        let note = format!("{names} consumed to the end; scaling to {wanted}");
        publish(
            ctx,
            broker,
            EventType::Normal,
            "Drained",
            "ScaleDown",
            &note,
        )
        .await;
        return None;
    }
    if broker.force_scale_down() {
        let note = format!(
            "quiver.io/force-scale-down: scaling to {wanted} without waiting; dropped with \
             {names}: {}",
            drain::describe(&status)
        );
        publish(
            ctx,
            broker,
            EventType::Warning,
            "ForcedScaleDown",
            "ScaleDown",
            &note,
        )
        .await;
        return None;
    }
    if previous.drain.is_none() {
        let note = format!("{names} read-only until what they hold is read");
        publish(
            ctx,
            broker,
            EventType::Normal,
            "DrainStarted",
            "ScaleDown",
            &note,
        )
        .await;
    }
    Some(status)
}

/// Makes the kept brokers of a reverted scale-down writable again; returns those still
/// read-only, each a problem.
async fn restore_kept(
    broker: &Broker,
    previous: &BrokerStatus,
    wanted: i32,
    ctx: &Context,
    problems: &mut Vec<Problem>,
) -> Vec<String> {
    let kept = drain::kept_read_only(broker, previous, wanted);
    if kept.is_empty() {
        return Vec::new();
    }
    let failed = drain::restore_kept(broker, &kept, ctx).await;
    let restored: Vec<String> = kept
        .iter()
        .map(|ordinal| desired::pod_name(broker, *ordinal))
        .filter(|name| !failed.contains_key(name))
        .collect();
    if !restored.is_empty() {
        let note = format!(
            "scale-down cancelled: {} writable again",
            restored.join(", ")
        );
        publish(
            ctx,
            broker,
            EventType::Normal,
            "DrainCancelled",
            "ScaleDown",
            &note,
        )
        .await;
    }
    for (name, error) in &failed {
        let message = format!("{name} stays read-only after the cancelled scale-down: {error}");
        problems.push(Problem::new(REASON_KEPT_READ_ONLY, message));
    }
    failed.into_keys().collect()
}

async fn announce_rollout(
    broker: &Broker,
    phase: &RolloutPhase,
    plan: &RolloutPlan,
    statefulset_exists: bool,
    ctx: &Context,
) {
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
        _ => return,
    };
    publish(ctx, broker, EventType::Normal, reason, "Rollout", &note).await;
}

/// Deletes a pod stuck not Ready at an outdated revision, so the StatefulSet recreates it at the
/// update revision instead of waiting for it forever.
async fn unstick_rollout(
    broker: &Broker,
    sts: &StatefulSet,
    namespace: &str,
    ctx: &Context,
    problems: &mut Vec<Problem>,
) {
    if !rollout::may_have_stuck_pod(sts) {
        return;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let listed = pods
        .list(&ListParams::default().labels(&desired::pod_selector(broker)))
        .await;
    let pod_list = match listed {
        Ok(list) => list.items,
        Err(error) => {
            let message = format!("cannot list the broker pods: {}", error_chain(&error));
            problems.push(Problem::new(REASON_STUCK_POD, message));
            return;
        }
    };
    let Some(stuck) = rollout::stuck_pod(broker, sts, &pod_list) else {
        return;
    };
    match pods.delete(&stuck, &DeleteParams::default()).await {
        Ok(_) => {
            let note = format!(
                "{stuck} was not Ready at an outdated revision; deleted so the StatefulSet \
                 recreates it at the current template"
            );
            publish(
                ctx,
                broker,
                EventType::Warning,
                "StuckPodDeleted",
                "Rollout",
                &note,
            )
            .await;
        }
        Err(error) => {
            let message = format!("cannot delete stuck pod {stuck}: {}", error_chain(&error));
            problems.push(Problem::new(REASON_STUCK_POD, message));
        }
    }
}

async fn apply_objects(
    broker: &Broker,
    namespace: &str,
    plan: &RolloutPlan,
    draining_from: Option<i32>,
    ctx: &Context,
) -> Result<(), Error> {
    let config = desired::config_map(broker, plan.replicas, draining_from);
    apply(ctx, namespace, &config).await?;
    apply(ctx, namespace, &desired::headless_service(broker)).await?;
    apply(ctx, namespace, &desired::client_service(broker)).await?;
    let budgets = desired::pod_disruption_budgets(broker, plan.replicas);
    for budget in &budgets {
        apply(ctx, namespace, budget).await?;
    }
    if broker.is_replicated() {
        delete_stale_group_budgets(broker, namespace, &budgets, ctx).await?;
    }
    apply_network_policy(broker, namespace, ctx).await?;
    apply(ctx, namespace, &desired::stateful_set(broker, plan)).await
}

/// Deletes the PodDisruptionBudgets of broker groups scaled away.
async fn delete_stale_group_budgets(
    broker: &Broker,
    namespace: &str,
    wanted: &[PodDisruptionBudget],
    ctx: &Context,
) -> Result<(), Error> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{},{}", desired::pod_selector(broker), desired::GROUP_LABEL);
    let listed = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube("listing PodDisruptionBudgets".to_string()))?;
    for budget in listed.items {
        let name = budget.name_any();
        let owned = budget
            .owner_references()
            .iter()
            .any(|owner| Some(&owner.uid) == broker.metadata.uid.as_ref());
        if owned
            && !wanted
                .iter()
                .any(|w| w.metadata.name.as_ref() == Some(&name))
        {
            api.delete(&name, &DeleteParams::default())
                .await
                .map_err(Error::kube(format!("deleting PodDisruptionBudget {name}")))?;
        }
    }
    Ok(())
}

/// Applies the Broker's NetworkPolicy, or deletes the one it owned once the spec drops it.
async fn apply_network_policy(
    broker: &Broker,
    namespace: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let operator = desired::OperatorPods {
        namespace: ctx.client.default_namespace().to_string(),
        labels: ctx.operator_pod_labels.clone(),
    };
    if let Some(policy) = desired::network_policy(broker, &operator) {
        return apply(ctx, namespace, &policy).await;
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), namespace);
    let name = broker.name_any();
    let existing = policies
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading NetworkPolicy {name}")))?;
    let owned = existing.is_some_and(|policy| {
        policy
            .owner_references()
            .iter()
            .any(|owner| Some(&owner.uid) == broker.metadata.uid.as_ref())
    });
    if owned {
        policies
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(Error::kube(format!("deleting NetworkPolicy {name}")))?;
    }
    Ok(())
}

/// Everything a pass observed, for the status.
struct Observed<'a> {
    statefulset_exists: bool,
    sts_status: StatefulSetStatus,
    plan: &'a RolloutPlan,
    scale: &'a Scale,
    expansion: &'a Expansion,
    disk: Desired,
    problems: &'a [Problem],
    now: Timestamp,
    /// Each broker group's replication, with spec.replication only.
    replication: Option<Vec<ReplicationGroupStatus>>,
    /// A replicated Broker's pods are being restarted group by group.
    replicated_rolling: bool,
}

/// What the status says about the next pass.
struct Outlook {
    progressing: bool,
    disk_pressure: bool,
    problems: bool,
    replication_degraded: bool,
}

impl Outlook {
    fn requeue(&self) -> Duration {
        if self.progressing || self.problems {
            PROGRESS_REQUEUE
        } else if self.disk_pressure || self.replication_degraded {
            DISK_PRESSURE_REQUEUE
        } else {
            IDLE_REQUEUE
        }
    }
}

/// The Progressing condition: the first of draining, rolling, expanding, starting.
fn progressing(observed: &Observed<'_>, ready: i32) -> Desired {
    let plan = observed.plan;
    let (holds, reason, message) = if let Some(drain) = &observed.scale.drain {
        (
            true,
            "Draining",
            format!(
                "waiting for the leaving brokers to be read: {}",
                drain::describe(drain)
            ),
        )
    } else if observed.replicated_rolling {
        (
            true,
            "RollingUpdate",
            "broker groups restart one pod at a time: replicas first, then the master after \
             a switchover"
                .to_string(),
        )
    } else if plan.partition > 0 {
        (
            true,
            "RollingUpdate",
            format!("pods from ordinal {} run the new template", plan.partition),
        )
    } else if observed.expansion.in_progress() {
        (
            true,
            "ExpandingVolumes",
            "volume claims are being resized".to_string(),
        )
    } else if ready < plan.replicas {
        (
            true,
            "BrokersStarting",
            format!("{ready}/{} brokers ready", plan.replicas),
        )
    } else {
        (
            false,
            "Stable",
            "every broker runs the current spec".to_string(),
        )
    };
    Desired::new("Progressing", holds, reason, message)
}

/// The Degraded condition: the pass's problems first, then the progress deadline, then brokers
/// not Ready although every pod runs the spec.
fn degraded(observed: &Observed<'_>, deadline_exceeded: bool, deadline_s: i64) -> Desired {
    let ready = observed.sts_status.ready_replicas.unwrap_or(0);
    let replicas = observed.plan.replicas;
    if let Some(first) = observed.problems.first() {
        let messages: Vec<&str> = observed
            .problems
            .iter()
            .map(|p| p.message.as_str())
            .collect();
        return Desired::new("Degraded", true, first.reason, messages.join("; "));
    }
    if deadline_exceeded {
        let message = format!(
            "no progress for more than {deadline_s}s (spec.progressDeadlineSeconds): \
             {ready}/{replicas} brokers ready, pods from ordinal {} at the new template; a pod \
             not Ready at the new template needs a spec fix",
            observed.plan.partition
        );
        return Desired::new("Degraded", true, REASON_PROGRESS_DEADLINE, message);
    }
    let unavailable = observed.statefulset_exists
        && ready < replicas
        && observed.scale.drain.is_none()
        && observed.plan.partition == 0
        && !observed.replicated_rolling
        && observed.sts_status.updated_replicas.unwrap_or(0) >= replicas;
    let message = format!("{ready}/{} brokers ready", observed.scale.wanted);
    if unavailable {
        Desired::new("Degraded", true, REASON_UNAVAILABLE, message)
    } else {
        Desired::new("Degraded", false, "AsExpected", message)
    }
}

/// The status for what the pass observed: pure.
fn broker_status(
    broker: &Broker,
    previous: &BrokerStatus,
    observed: &Observed<'_>,
) -> (BrokerStatus, Outlook) {
    let plan = observed.plan;
    let ready = observed.sts_status.ready_replicas.unwrap_or(0);
    let wanted = observed.scale.wanted;
    let rolling = plan.partition > 0 || observed.replicated_rolling;
    let rollout = rolling.then(|| RolloutStatus {
        partition: plan.partition,
        updated_replicas: observed.sts_status.updated_replicas.unwrap_or(0),
    });
    let markers = ProgressMarkers {
        generation: broker.metadata.generation,
        ready,
        replicas: plan.replicas,
        rollout: rollout.as_ref().map(|r| (r.partition, r.updated_replicas)),
    };
    let last_progress = rollout::last_progress(previous, &markers, observed.now);
    let pods_pending = rolling || ready < plan.replicas;
    let deadline_s = broker.spec.progress_deadline_seconds;
    let stuck = pods_pending
        && observed.scale.drain.is_none()
        && rollout::deadline_exceeded(last_progress, observed.now, deadline_s);
    let progressing = progressing(observed, ready);
    let degraded = degraded(observed, stuck, deadline_s);
    let ready_condition = if ready >= wanted {
        Desired::new(
            "Ready",
            true,
            "AllBrokersReady",
            format!("{ready}/{wanted} brokers ready"),
        )
    } else {
        Desired::new(
            "Ready",
            false,
            "BrokersNotReady",
            format!("{ready}/{wanted} brokers ready"),
        )
    };
    let replication_condition = observed
        .replication
        .as_ref()
        .map(|groups| replication::condition(broker, groups));
    let outlook = Outlook {
        progressing: progressing.status == Status::True,
        disk_pressure: observed.disk.status == Status::True,
        problems: !observed.problems.is_empty(),
        replication_degraded: replication_condition
            .as_ref()
            .is_some_and(|condition| condition.status == Status::True),
    };
    let mut desired_conditions = vec![
        ready_condition,
        progressing,
        degraded,
        Desired::new("Paused", false, "NotPaused", "reconciling"),
        observed.disk.clone(),
    ];
    desired_conditions.extend(observed.expansion.condition.clone());
    desired_conditions.extend(replication_condition);
    let status = BrokerStatus {
        observed_generation: broker.metadata.generation,
        ready_replicas: ready,
        current_replicas: plan.replicas,
        brokers: (0..plan.replicas)
            .map(|ordinal| BrokerAddress {
                name: desired::pod_name(broker, ordinal),
                address: desired::broker_address(broker, ordinal),
            })
            .collect(),
        conditions: conditions::merge(
            &previous.conditions,
            &desired_conditions,
            broker.metadata.generation,
            observed.now,
        ),
        read_only_brokers: observed.scale.read_only.clone(),
        last_progress_time: Some(last_progress.to_string()),
        drain: observed.scale.drain.clone(),
        rollout,
        storage: observed.expansion.storage.clone(),
        replication: observed
            .replication
            .clone()
            .map(|groups| BrokerReplicationStatus { groups }),
    };
    (status, outlook)
}

/// Warning events for what newly went wrong, Normal ones for what recovered: only on change, so
/// a condition that holds does not repeat its event every pass.
pub fn transition_events(
    previous: &[Condition],
    next: &[Condition],
    problems: &[Problem],
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    let before = |type_: &str| conditions::find(previous, type_);
    let after = |type_: &str| conditions::find(next, type_);
    if let Some(now) = after("Degraded").filter(|c| c.status == "True") {
        let was = before("Degraded").filter(|c| c.status == "True");
        if problems.is_empty() {
            if was.is_none_or(|was| was.reason != now.reason) {
                events.push((EventType::Warning, now.reason.clone(), now.message.clone()));
            }
        } else {
            for problem in problems {
                if was.is_none_or(|was| !was.message.contains(&problem.message)) {
                    events.push((
                        EventType::Warning,
                        problem.reason.to_string(),
                        problem.message.clone(),
                    ));
                }
            }
        }
    }
    if let Some(now) = after(expansion::CONDITION).filter(|c| c.status == "False") {
        let same = before(expansion::CONDITION).is_some_and(|was| {
            was.status == now.status && was.reason == now.reason && was.message == now.message
        });
        if !same {
            events.push((EventType::Warning, now.reason.clone(), now.message.clone()));
        }
    }
    let replication_was = before(replication::CONDITION).map(|c| c.status.as_str());
    if let Some(now) = after(replication::CONDITION) {
        match (replication_was == Some("True"), now.status.as_str()) {
            (false, "True") => events.push((
                EventType::Warning,
                replication::CONDITION.to_string(),
                now.message.clone(),
            )),
            (true, "False") => events.push((
                EventType::Normal,
                "ReplicationRecovered".to_string(),
                now.message.clone(),
            )),
            _ => {}
        }
    }
    let disk_was = before(disk::CONDITION).map(|c| c.status.as_str());
    if let Some(now) = after(disk::CONDITION) {
        match (disk_was == Some("True"), now.status.as_str()) {
            (false, "True") => events.push((
                EventType::Warning,
                disk::CONDITION.to_string(),
                now.message.clone(),
            )),
            (true, "False") => events.push((
                EventType::Normal,
                "DiskPressureRelieved".to_string(),
                now.message.clone(),
            )),
            _ => {}
        }
    }
    events
}

async fn publish_transitions(
    broker: &Broker,
    previous: &[Condition],
    next: &[Condition],
    problems: &[Problem],
    ctx: &Context,
) {
    for (type_, reason, note) in transition_events(previous, next, problems) {
        let action = match reason.as_str() {
            disk::CONDITION | "DiskPressureRelieved" => "DiskCheck",
            replication::CONDITION | "ReplicationRecovered" => "ReplicationCheck",
            _ => "Reconcile",
        };
        publish(ctx, broker, type_, &reason, action, &note).await;
    }
}

/// Asks every broker for its disk state, all at once; never fails (a broker that does not
/// answer is reported as such, for the DiskPressure condition to say).
async fn probe_disks(broker: &Broker, replicas: i32, ctx: &Context) -> Vec<BrokerDisk> {
    let probes = (0..replicas).map(|ordinal| async move {
        let addr = BrokerAddr(desired::broker_address(broker, ordinal));
        let result = ctx.admin.runtime_info(&addr).await;
        if let Err(error) = &result {
            tracing::debug!(broker = %addr, %error, "no runtime info");
        }
        BrokerDisk {
            broker: desired::pod_name(broker, ordinal),
            probe: DiskProbe::from_result(result),
        }
    });
    futures::future::join_all(probes).await
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
fn topic_targets(
    broker: &Broker,
    replicas: i32,
    observations: Option<&[GroupObservation]>,
) -> Vec<BrokerAddr> {
    match observations {
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

/// Creates the spec's topics on `targets` (idempotent on the broker side).
async fn ensure_topics(
    broker: &Broker,
    targets: &[BrokerAddr],
    ctx: &Context,
) -> Result<(), Error> {
    for addr in targets {
        for topic in &broker.spec.topics {
            // Creating persists the broker's topic table: skip topics already as specified.
            if let Ok(stats) = ctx.admin.topic_stats(addr, &topic.name).await {
                if usize::try_from(topic.queues).is_ok_and(|queues| queues == stats.queues.len()) {
                    continue;
                }
            }
            let config = TopicConfig {
                name: topic.name.clone(),
                queues: topic.queues,
            };
            ctx.admin
                .create_topic(addr, &config)
                .await
                .map_err(Error::admin("creating a spec topic"))?;
        }
    }
    Ok(())
}

async fn apply<K>(ctx: &Context, namespace: &str, object: &K) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(Error::kube(format!("applying {} {name}", K::kind(&()))))?;
    Ok(())
}
