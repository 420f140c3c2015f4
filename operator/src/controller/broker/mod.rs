//! Broker reconciler in three steps: [`observe`] reads the world (the Broker, its Secrets, its
//! StatefulSet, pods, claims, budgets, and what its brokers answer) into a [`World`];
//! [`plan`] decides, purely, the [`Step`]s to take and the status to write; [`execute`] takes
//! the steps (server-side apply, deletes, admin calls, events) and reports what failed, which
//! [`Draft::finish`] folds into the status, again purely.
//!
//! A failing step that does not make the rest wrong (a leaving broker that does not answer, a
//! pod that cannot be deleted, a claim patch refused, topics not created) becomes a [`Problem`]:
//! Degraded=True and a Warning event, while everything else is still applied. A failed API call
//! on the objects themselves fails the pass; [`reconcile`] reports it the same way.

mod drift;
mod execute;
mod observe;
mod plan;
mod restart;
mod status;
#[cfg(test)]
mod tests;

pub use execute::{execute, Outcome};
pub use observe::{observe, Cluster, World};
pub use plan::{plan, Note, Object, Plan, StatusPlan, Step};
pub use status::{transition_events, Draft, Outlook, ReadOnly, Scale, CONDITIONS};

use super::conditions::Desired;
use super::{error_chain, object_key, report_failure, Context, Error};
use crate::crd::Broker;
use kube::runtime::controller::Action;
use kube::ResourceExt;
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
/// Degraded reason: a replicated group's membership change (add or remove a member) failed.
pub const REASON_MEMBERSHIP: &str = "MembershipChangeFailed";
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
    let failure = Desired::new("Degraded", true, REASON_RECONCILE_ERROR, error_chain(error));
    report_failure(ctx, broker, &failure, "Reconcile").await;
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

/// Observe, plan, execute, then write the status the plan and the outcome give.
#[instrument(skip(broker, ctx), fields(broker = %broker.name_any()))]
async fn reconcile_broker(broker: &Broker, ctx: &Context) -> Result<Action, Error> {
    let namespace = checked_namespace(broker)?;
    let world = observe(broker, namespace, ctx).await?;
    let Plan { steps, status } = plan(&world);
    let outcome = execute(&world, &steps, ctx).await?;
    match status {
        StatusPlan::Paused(status) => {
            execute::write_status(&world, &status, &[], ctx).await?;
            Ok(Action::await_change())
        }
        StatusPlan::Held => Ok(Action::requeue(PROGRESS_REQUEUE)),
        StatusPlan::Running(draft) => {
            let previous = world.broker.status.clone().unwrap_or_default();
            let (status, outlook) = draft.finish(&world.broker, &previous, &outcome);
            let events =
                transition_events(&previous.conditions, &status.conditions, &outcome.problems);
            execute::publish_transitions(&world.broker, events, ctx).await;
            execute::write_status(&world, &status, &CONDITIONS, ctx).await?;
            Ok(Action::requeue(outlook.requeue()))
        }
    }
}
