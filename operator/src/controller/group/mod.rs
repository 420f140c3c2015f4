//! ConsumerGroup reconciler: ensure the group on its brokers, apply offset resets once,
//! poll lag once per lag interval and judge the group's progress over a wall-clock window,
//! surface every failure, clean up on delete.
//!
//! Status is written only when something in it changed, and a poll runs at most once per lag
//! interval: a lagging group costs one status write per interval, a quiet one none.
//!
//! [`poll`] makes the calls to the group's brokers (upsert, offset reset, members, consume and
//! topic stats); [`judge`] turns what a poll found into the progress judgement, the conditions
//! and the status, purely; this module reads the Broker, writes status, events and metrics.

mod judge;
mod plan;
mod poll;
mod reset;
#[cfg(test)]
mod tests;

pub use judge::judgement_window;
use judge::*;
use plan::*;
use poll::*;
use reset::*;

use super::conditions::{self, Desired, Status};
use super::security;
use super::{error_chain, object_key, publish, report_failure, write_status, Context, Error};
use crate::admin::{
    AdminError, BrokerAddr, QueueConsumeStats, QueueOffset, ResetTarget, SubscriptionGroup,
};
use crate::crd::{
    AppliedOffsetReset, Broker, ConsumeFromWhere, ConsumerGroup, ConsumerGroupStatus,
    LagThresholds, LagWindowStatus, OffsetResetTarget, QueueLagStatus, StalledQueueStatus,
    TopicLagStatus,
};
use crate::desired;
use crate::lag::{
    group_lag, GroupLag, LagWindow, Progress, QueueKey, QueueRun, QueueWindows, Sample,
    StalledQueues,
};
use crate::metrics::GroupLabels;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{finalizer, Event};
use kube::{Api, ResourceExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::instrument;

/// Finalizer that removes the group from its brokers before the resource goes away.
pub const FINALIZER: &str = "quiver.io/consumer-group-cleanup";
/// Window the progress is judged over, when the spec does not say.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(600);
/// Queues listed in `status.topQueues`.
pub const TOP_QUEUES: usize = 10;
/// Queues listed in `status.stalledQueues` (and given a stalled-since series).
pub const STALLED_QUEUES: usize = 10;
/// Condition type: queues with lag and no commit for the whole window.
pub const QUEUES_STALLED: &str = "QueuesStalled";
/// QueuesStalled reason: queues stalled while the group consumes elsewhere.
pub const REASON_QUEUE_COMMITS_NOT_MOVING: &str = "QueueCommitsNotMoving";
/// QueuesStalled reason: queues stalled because the group is Stalled or Stopped as a whole.
pub const REASON_GROUP_NOT_CONSUMING: &str = "GroupNotConsuming";
/// Requeue delay while the referenced Broker does not exist.
pub const MISSING_BROKER_REQUEUE: Duration = Duration::from_secs(30);

/// When a group was last polled, so a reconcile woken early (a status write, a resync) waits
/// for the interval instead of polling again, and what the next poll judges its queues from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastPoll {
    /// Time of the poll, ms since the epoch; `None`: the next pass polls at once.
    pub polled_at_ms: Option<i64>,
    /// The generation it polled for: a new spec is acted on at once.
    pub generation: Option<i64>,
    /// Each lagging queue's run without a commit (too many to keep in status).
    pub queues: QueueWindows,
}

/// Entry point of the ConsumerGroup controller.
pub async fn reconcile(group: Arc<ConsumerGroup>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let key = object_key(group.as_ref());
    let namespace = group.namespace().ok_or_else(|| Error::MissingField {
        kind: "ConsumerGroup",
        name: group.name_any(),
        field: "namespace",
    })?;
    let api: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), &namespace);
    let result = finalizer(&api, FINALIZER, group, |event| async {
        match event {
            Event::Apply(group) => apply(&group, &namespace, &ctx).await,
            Event::Cleanup(group) => cleanup(&group, &namespace, &ctx).await,
        }
    })
    .await
    .map_err(|source| Error::Finalizer {
        object: key.clone(),
        source: Box::new(source),
    });
    ctx.metrics.reconciled("consumergroup", started.elapsed());
    if result.is_ok() {
        ctx.reset_backoff(&key);
    }
    result
}

/// Addresses of the brokers of the referenced Broker, including ones still draining. Of a
/// replicated group only its master (as the Broker's status last named it, else replica 0):
/// consumers commit there, and every member holds the same queues.
fn broker_addresses(broker: &Broker) -> Vec<BrokerAddr> {
    let status = broker.status.as_ref();
    let running = status.map_or(0, |status| status.current_replicas);
    let pods = desired::pods_of_groups(broker, broker.spec.replicas).max(running);
    if !broker.is_replicated() {
        return (0..pods)
            .map(|ordinal| BrokerAddr(desired::broker_address(broker, ordinal)))
            .collect();
    }
    let groups = status.and_then(|status| status.replication.as_ref());
    (0..desired::groups_of_pods(broker, pods))
        .map(|group| {
            let name = desired::group_name(broker, group);
            let master = groups
                .and_then(|groups| groups.groups.iter().find(|g| g.name == name))
                .and_then(|g| g.master.clone());
            let ordinal = desired::group_ordinals(broker, group)
                .find(|ordinal| Some(desired::pod_name(broker, *ordinal)) == master)
                .unwrap_or_else(|| desired::group_ordinals(broker, group).start);
            BrokerAddr(desired::broker_address(broker, ordinal))
        })
        .collect()
}

fn series_of(group: &ConsumerGroup, namespace: &str) -> GroupLabels {
    GroupLabels::new(namespace, &group.spec.broker_ref, &group.name_any())
}

fn timestamp(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH)
}

/// A pass over a live group: observe, plan, execute.
#[instrument(skip(group, ctx), fields(group = %group.name_any()))]
async fn apply(group: &ConsumerGroup, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let now_ms = (ctx.clock)();
    let found = observe(group, namespace, ctx, now_ms).await;
    let (steps, then) = plan(group, &found, ctx.lag_interval, now_ms);
    for step in steps {
        execute(group, namespace, &found, step, ctx, now_ms).await?;
    }
    match (then, found) {
        (Then::Requeue(wait), _) => Ok(Action::requeue(wait)),
        (Then::Fail, Found::Failed(error)) => Err(error),
        (Then::Fail, _) => unreachable!("only a failed pass fails"),
    }
}

/// Reads the Broker and polls its brokers (the poll also upserts the group where it is
/// missing and applies a pending offset reset: its later reads depend on them).
async fn observe(group: &ConsumerGroup, namespace: &str, ctx: &Context, now_ms: i64) -> Found {
    if let Some(wait) = poll_not_due(ctx, group, now_ms) {
        return Found::NotDue(wait);
    }
    let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), namespace);
    let broker_ref = &group.spec.broker_ref;
    let polled = match brokers.get_opt(broker_ref).await {
        Ok(Some(broker)) => match security::use_broker_access(&broker, namespace, ctx).await {
            Ok(()) => poll(group, &broker, ctx, now_ms).await,
            Err(error) => Err(error),
        },
        Ok(None) => return Found::BrokerMissing,
        Err(source) => Err(Error::Kube {
            action: format!("reading Broker {broker_ref}"),
            source,
        }),
    };
    match polled {
        Ok(mut poll) => {
            poll.remembered_queues = remembered_queues(ctx, group);
            Found::Polled(poll)
        }
        Err(error) => Found::Failed(error),
    }
}

/// Time left before the next poll is due; `None` when due (first poll, new spec, interval up).
fn poll_not_due(ctx: &Context, group: &ConsumerGroup, now_ms: i64) -> Option<Duration> {
    let polls = ctx.lag_polls.lock().expect("lag polls lock poisoned");
    let last = polls.get(&object_key(group))?;
    let polled_at_ms = last.polled_at_ms?;
    if last.generation != group.metadata.generation {
        return None;
    }
    let elapsed = Duration::from_millis(u64::try_from(now_ms - polled_at_ms).ok()?);
    ctx.lag_interval
        .checked_sub(elapsed)
        .filter(|wait| !wait.is_zero())
}

/// Takes one step of the plan.
async fn execute(
    group: &ConsumerGroup,
    namespace: &str,
    found: &Found,
    step: GroupStep,
    ctx: &Context,
    now_ms: i64,
) -> Result<(), Error> {
    let series = series_of(group, namespace);
    match step {
        GroupStep::LagMetrics {
            progress,
            stalled,
            stalled_queues,
        } => {
            if let Found::Polled(poll) = found {
                ctx.metrics
                    .set_group_lag(&series, &poll.lag, progress, stalled);
            }
            ctx.metrics
                .set_stalled_queues(&series, stalled_queues.as_ref());
        }
        GroupStep::LagUnknown => ctx.metrics.lag_unknown(&series),
        GroupStep::ForgetPoll => poll_again_at_once(ctx, group),
        GroupStep::RememberPoll { queues } => {
            let last = LastPoll {
                polled_at_ms: Some(now_ms),
                generation: group.metadata.generation,
                queues,
            };
            let mut polls = ctx.lag_polls.lock().expect("lag polls lock poisoned");
            polls.insert(object_key(group), last);
        }
        GroupStep::Warn {
            reason,
            action,
            message,
        } => publish(ctx, group, EventType::Warning, reason, action, &message).await,
        GroupStep::WriteStatus {
            status,
            best_effort,
        } => {
            let now = timestamp(now_ms);
            let update = |stored: Option<&ConsumerGroupStatus>| onto_stored(&status, stored, now);
            let written = write_status(ctx, group, group.status.as_ref(), update).await;
            match written {
                Err(error) if best_effort => {
                    tracing::warn!(%error, "could not write the poll failure to status");
                }
                other => {
                    other?;
                }
            }
        }
    }
    Ok(())
}

/// Deletion of the group: removed from its brokers when asked, then its series and memory. A
/// failure keeps the finalizer (the object stays, with its deletionTimestamp) and is made
/// visible: Ready=False with reason CleanupFailed and the cause, and a Warning event.
#[instrument(skip(group, ctx), fields(group = %group.name_any()))]
async fn cleanup(group: &ConsumerGroup, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    if let Err(error) = delete_from_brokers(group, namespace, ctx).await {
        let message = format!(
            "deletion waits: removing the group from its brokers failed: {}",
            error_chain(&error)
        );
        let failure = Desired::new("Ready", false, "CleanupFailed", message);
        report_failure(ctx, group, &failure, "DeletingGroup").await;
        return Err(error);
    }
    ctx.metrics.forget_group(&series_of(group, namespace));
    forget_last_poll(ctx, group);
    Ok(Action::await_change())
}

/// With `deleteOffsetsOnDelete`, deletes the group and its offsets on every broker.
async fn delete_from_brokers(
    group: &ConsumerGroup,
    namespace: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let name = group.name_any();
    if group.spec.delete_offsets_on_delete {
        let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), namespace);
        let broker_ref = &group.spec.broker_ref;
        // A deleted Broker took its brokers' offsets with it: nothing left to remove.
        if let Some(broker) = brokers
            .get_opt(broker_ref)
            .await
            .map_err(Error::kube(format!("reading Broker {broker_ref}")))?
        {
            security::use_broker_access(&broker, namespace, ctx).await?;
            for addr in broker_addresses(&broker) {
                ctx.admin
                    .delete_group(&addr, &name)
                    .await
                    .map_err(Error::admin("deleting the group"))?;
            }
            publish(
                ctx,
                group,
                EventType::Normal,
                "GroupDeleted",
                "GroupDeleted",
                "group and its offsets removed from the brokers",
            )
            .await;
        }
    }
    Ok(())
}

/// The per-queue windows of the last poll, if this operator polled the group before.
fn remembered_queues(ctx: &Context, group: &ConsumerGroup) -> Option<QueueWindows> {
    let polls = ctx.lag_polls.lock().expect("lag polls lock poisoned");
    polls
        .get(&object_key(group))
        .map(|last| last.queues.clone())
}

/// Makes the next pass poll at once, keeping the per-queue windows (a failed poll judges
/// nothing, so the queues' runs go on).
fn poll_again_at_once(ctx: &Context, group: &ConsumerGroup) {
    let mut polls = ctx.lag_polls.lock().expect("lag polls lock poisoned");
    if let Some(last) = polls.get_mut(&object_key(group)) {
        last.polled_at_ms = None;
    }
}

fn forget_last_poll(ctx: &Context, group: &ConsumerGroup) {
    ctx.lag_polls
        .lock()
        .expect("lag polls lock poisoned")
        .remove(&object_key(group));
}
