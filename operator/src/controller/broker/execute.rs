//! The third step of a pass: take the plan's steps, in order. A failed API call on the
//! objects fails the pass there; what fails without making the rest wrong (a pod not deleted,
//! a switchover refused, a claim patch refused, a topic not created, a broker left read-only)
//! is reported in the [`Outcome`], for the status.

use super::observe::World;
use super::plan::{Note, Object, Step};
use super::status::onto_stored;
use super::{Problem, REASON_KEPT_READ_ONLY, REASON_TOPICS};
use crate::controller::conditions::Desired;
use crate::controller::replication::{self, MEMBERSHIP_TIMEOUT, SWITCHOVER_TIMEOUT};
use crate::controller::{
    drain, error_chain, expansion, publish, report_failure, write_status as write_status_over,
    Context, Error,
};
use crate::crd::{Broker, BrokerStatus};
use crate::desired::{self, FIELD_MANAGER};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// What the steps reported, for the status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// The plan's problems and the failed steps', in step order.
    pub problems: Vec<Problem>,
    /// Kept brokers of a cancelled scale-down that could not be made writable, by name.
    pub still_read_only: Vec<String>,
    /// The VolumeExpansion condition when a claim patch was refused.
    pub claims_rejected: Option<Desired>,
}

/// Takes `steps` in order.
pub async fn execute(world: &World, steps: &[Step], ctx: &Context) -> Result<Outcome, Error> {
    let mut outcome = Outcome::default();
    for step in steps {
        take(world, step, ctx, &mut outcome).await?;
    }
    Ok(outcome)
}

async fn take(
    world: &World,
    step: &Step,
    ctx: &Context,
    outcome: &mut Outcome,
) -> Result<(), Error> {
    let broker = &world.broker;
    let namespace = world.namespace.as_str();
    match step {
        Step::Publish(note) => announce(broker, note, ctx).await,
        Step::Problem(problem) => outcome.problems.push(problem.clone()),
        Step::RestoreWritable(ordinals) => restore_writable(broker, ordinals, ctx, outcome).await,
        Step::DeletePod { pod, done, failed } => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
            match pods.delete(pod, &DeleteParams::default()).await {
                Ok(_) => announce(broker, done, ctx).await,
                Err(error) => outcome.problems.push(failure(failed, &error)),
            }
        }
        Step::Apply(object) => apply_object(ctx, namespace, object).await?,
        Step::RestoreTemplate { statefulset, patch } => {
            let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            api.patch(statefulset, &params, &Patch::Merge(patch))
                .await
                .map_err(Error::kube(format!(
                    "restoring the pod template of StatefulSet {statefulset}"
                )))?;
        }
        Step::Delete(object) => delete_object(ctx, namespace, object).await?,
        Step::OrphanStatefulSet(done) => {
            let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
            let name = broker.name_any();
            api.delete(&name, &DeleteParams::orphan())
                .await
                .map_err(Error::kube(format!(
                    "deleting StatefulSet {name}, orphaning its pods"
                )))?;
            announce(broker, done, ctx).await;
        }
        Step::Switchover {
            addr,
            target,
            done,
            failed,
        } => match ctx
            .admin
            .switchover(addr, *target, SWITCHOVER_TIMEOUT)
            .await
        {
            Ok(()) => announce(broker, done, ctx).await,
            Err(error) => outcome.problems.push(failure(failed, &error)),
        },
        Step::ChangeMembership {
            addr,
            change,
            done,
            failed,
        } => match ctx
            .admin
            .change_membership(addr, change, MEMBERSHIP_TIMEOUT)
            .await
        {
            Ok(members) => {
                tracing::info!(broker = %addr, ?members, "membership changed");
                announce(broker, done, ctx).await;
            }
            Err(error) => outcome.problems.push(failure(failed, &error)),
        },
        Step::ResizeClaims { claims, size } => {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
            outcome.claims_rejected = expansion::patch_claims(&api, claims, size).await;
        }
        Step::CreateTopics(creations) => {
            for (addr, config) in creations {
                if let Err(error) = ctx.admin.create_topic(addr, config).await {
                    let error = Error::admin("creating a spec topic")(error);
                    outcome
                        .problems
                        .push(Problem::new(REASON_TOPICS, error_chain(&error)));
                    break;
                }
            }
        }
        Step::ReportFailure(failure) => report_failure(ctx, broker, failure, "Reconcile").await,
    }
    Ok(())
}

/// The problem of a failed step: its reason, its message prefix and the error chain.
fn failure(
    (reason, prefix): &(&'static str, String),
    error: &(dyn std::error::Error + 'static),
) -> Problem {
    Problem::new(reason, format!("{prefix}: {}", error_chain(error)))
}

async fn announce(broker: &Broker, note: &Note, ctx: &Context) {
    publish(
        ctx,
        broker,
        note.type_,
        note.reason,
        note.action,
        &note.note,
    )
    .await;
}

/// Makes the kept brokers writable again, each on its own: an event names those restored,
/// each failure is a problem.
async fn restore_writable(broker: &Broker, ordinals: &[i32], ctx: &Context, outcome: &mut Outcome) {
    let failed = drain::restore_kept(broker, ordinals, ctx).await;
    let restored: Vec<String> = ordinals
        .iter()
        .map(|ordinal| desired::pod_name(broker, *ordinal))
        .filter(|name| !failed.contains_key(name))
        .collect();
    if !restored.is_empty() {
        let note = Note {
            type_: EventType::Normal,
            reason: "DrainCancelled",
            action: "ScaleDown",
            note: format!(
                "scale-down cancelled: {} writable again",
                restored.join(", ")
            ),
        };
        announce(broker, &note, ctx).await;
    }
    for (name, error) in &failed {
        let message = format!("{name} stays read-only after the cancelled scale-down: {error}");
        outcome
            .problems
            .push(Problem::new(REASON_KEPT_READ_ONLY, message));
    }
    outcome.still_read_only = failed.into_keys().collect();
}

async fn apply_object(ctx: &Context, namespace: &str, object: &Object) -> Result<(), Error> {
    match object {
        Object::ConfigMap(config) => apply(ctx, namespace, config.as_ref()).await,
        Object::Service(service) => apply(ctx, namespace, service.as_ref()).await,
        Object::Budget(budget) => apply(ctx, namespace, budget.as_ref()).await,
        Object::NetworkPolicy(policy) => apply(ctx, namespace, policy.as_ref()).await,
        Object::StatefulSet(statefulset) => apply(ctx, namespace, statefulset.as_ref()).await,
    }
}

async fn delete_object(ctx: &Context, namespace: &str, object: &Object) -> Result<(), Error> {
    match object {
        Object::ConfigMap(config) => delete(ctx, namespace, config.as_ref()).await,
        Object::Service(service) => delete(ctx, namespace, service.as_ref()).await,
        Object::Budget(budget) => delete(ctx, namespace, budget.as_ref()).await,
        Object::NetworkPolicy(policy) => delete(ctx, namespace, policy.as_ref()).await,
        Object::StatefulSet(statefulset) => delete(ctx, namespace, statefulset.as_ref()).await,
    }
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

async fn delete<K>(ctx: &Context, namespace: &str, object: &K) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.name_any();
    api.delete(&name, &DeleteParams::default())
        .await
        .map_err(Error::kube(format!("deleting {} {name}", K::kind(&()))))?;
    Ok(())
}

/// The events of the conditions that changed.
pub async fn publish_transitions(
    broker: &Broker,
    events: Vec<(EventType, String, String)>,
    ctx: &Context,
) {
    for (type_, reason, note) in events {
        let action = match reason.as_str() {
            crate::disk::CONDITION | "DiskPressureRelieved" => "DiskCheck",
            replication::CONDITION | "ReplicationRecovered" => "ReplicationCheck",
            _ => "Reconcile",
        };
        publish(ctx, broker, type_, &reason, action, &note).await;
    }
}

/// Writes the pass's status over the stored one ([`onto_stored`]): the condition types of
/// `drops` the pass did not set are removed, other writers' conditions are kept.
pub async fn write_status(
    world: &World,
    status: &BrokerStatus,
    drops: &[&str],
    ctx: &Context,
) -> Result<(), Error> {
    let now = Timestamp::from_millisecond(world.now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
    let update = |stored: Option<&BrokerStatus>| onto_stored(status, drops, stored, now);
    write_status_over(ctx, &world.broker, world.broker.status.as_ref(), update).await?;
    Ok(())
}
