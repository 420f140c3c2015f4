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
mod poll;
#[cfg(test)]
mod tests;

pub use judge::judgement_window;
use judge::*;
use poll::*;

use super::conditions::{self, Desired, Status};
use super::security;
use super::{
    error_chain, object_key, publish, report_failure, write_status_if_changed, Context, Error,
};
use crate::admin::{AdminError, BrokerAddr, QueueConsumeStats, ResetTarget, SubscriptionGroup};
use crate::crd::{
    AppliedOffsetReset, Broker, ConsumeFromWhere, ConsumerGroup, ConsumerGroupStatus,
    LagThresholds, LagWindowStatus, OffsetResetTarget, QueueLagStatus, TopicLagStatus,
};
use crate::desired;
use crate::lag::{group_lag, GroupLag, LagWindow, Progress, Sample};
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
/// Requeue delay while the referenced Broker does not exist.
pub const MISSING_BROKER_REQUEUE: Duration = Duration::from_secs(30);

/// When a group was last polled, so a reconcile woken early (a status write, a resync) waits
/// for the interval instead of polling again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastPoll {
    /// Time of the poll, ms since the epoch.
    pub polled_at_ms: i64,
    /// The generation it polled for: a new spec is acted on at once.
    pub generation: Option<i64>,
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

#[instrument(skip(group, ctx), fields(group = %group.name_any()))]
async fn apply(group: &ConsumerGroup, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let now_ms = (ctx.clock)();
    if let Some(wait) = poll_not_due(ctx, group, now_ms) {
        return Ok(Action::requeue(wait));
    }
    let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), namespace);
    let broker_ref = &group.spec.broker_ref;
    let polled = match brokers.get_opt(broker_ref).await {
        Ok(Some(broker)) => match security::use_broker_access(&broker, namespace, ctx).await {
            Ok(()) => poll(group, &broker, ctx, now_ms).await,
            Err(error) => Err(error),
        },
        Ok(None) => return broker_missing(group, namespace, ctx, now_ms).await,
        Err(source) => Err(Error::Kube {
            action: format!("reading Broker {broker_ref}"),
            source,
        }),
    };
    match polled {
        Ok(poll) => record_poll(group, namespace, ctx, poll, now_ms).await,
        Err(error) => {
            record_failure(group, namespace, ctx, &error, now_ms).await;
            Err(error)
        }
    }
}

/// Time left before the next poll is due; `None` when due (first poll, new spec, interval up).
fn poll_not_due(ctx: &Context, group: &ConsumerGroup, now_ms: i64) -> Option<Duration> {
    let polls = ctx.lag_polls.lock().expect("lag polls lock poisoned");
    let last = polls.get(&object_key(group))?;
    if last.generation != group.metadata.generation {
        return None;
    }
    let elapsed = Duration::from_millis(u64::try_from(now_ms - last.polled_at_ms).ok()?);
    ctx.lag_interval
        .checked_sub(elapsed)
        .filter(|wait| !wait.is_zero())
}

/// Writes what a successful poll found (status only if changed), its metrics and events.
async fn record_poll(
    group: &ConsumerGroup,
    namespace: &str,
    ctx: &Context,
    poll: Poll,
    now_ms: i64,
) -> Result<Action, Error> {
    let polled = polled(group, &poll, ctx.lag_interval, now_ms);
    ctx.metrics.set_group_lag(
        &series_of(group, namespace),
        &poll.lag,
        polled.judged.progress,
        polled.judged.stalled(),
    );
    if let Some((reason, message)) = &polled.alarm {
        publish(ctx, group, EventType::Warning, reason, reason, message).await;
    }
    let groups: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), namespace);
    write_status_if_changed(
        &groups,
        &group.name_any(),
        group.status.as_ref(),
        &polled.status,
        ctx,
    )
    .await?;
    ctx.lag_polls
        .lock()
        .expect("lag polls lock poisoned")
        .insert(
            object_key(group),
            LastPoll {
                polled_at_ms: now_ms,
                generation: group.metadata.generation,
            },
        );
    Ok(Action::requeue(ctx.lag_interval))
}

/// The Broker does not exist: nothing to poll. Said in status, as a Warning event and by the
/// metrics, then retried later (not an error: the user has to create the Broker).
async fn broker_missing(
    group: &ConsumerGroup,
    namespace: &str,
    ctx: &Context,
    now_ms: i64,
) -> Result<Action, Error> {
    let message = format!("Broker {} does not exist", group.spec.broker_ref);
    let status = lag_unknown(group, namespace, ctx, "BrokerNotFound", &message, now_ms).await;
    let groups: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), namespace);
    write_status_if_changed(
        &groups,
        &group.name_any(),
        group.status.as_ref(),
        &status,
        ctx,
    )
    .await?;
    Ok(Action::requeue(MISSING_BROKER_REQUEUE))
}

/// A failed poll, made visible: conditions with the cause, a Warning event, lag series dropped
/// and `quiver_lag_poll_success` 0. Best effort: the poll's error is what the caller returns.
async fn record_failure(
    group: &ConsumerGroup,
    namespace: &str,
    ctx: &Context,
    error: &Error,
    now_ms: i64,
) {
    let message = format!("lag poll failed: {}", error_chain(error));
    let status = lag_unknown(group, namespace, ctx, "PollFailed", &message, now_ms).await;
    let groups: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), namespace);
    if let Err(write_error) = write_status_if_changed(
        &groups,
        &group.name_any(),
        group.status.as_ref(),
        &status,
        ctx,
    )
    .await
    {
        tracing::warn!(error = %write_error, "could not write the poll failure to status");
    }
}

/// The steps shared when the lag cannot be known: the next try polls rather than waiting for
/// the interval, the lag series are dropped, a Warning event says why; returns the status.
async fn lag_unknown(
    group: &ConsumerGroup,
    namespace: &str,
    ctx: &Context,
    reason: &'static str,
    message: &str,
    now_ms: i64,
) -> ConsumerGroupStatus {
    forget_last_poll(ctx, group);
    ctx.metrics.lag_unknown(&series_of(group, namespace));
    publish(
        ctx,
        group,
        EventType::Warning,
        reason,
        "PollingLag",
        message,
    )
    .await;
    lag_unknown_status(group, reason, message, now_ms)
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
        let previous = group
            .status
            .as_ref()
            .map(|status| status.conditions.clone())
            .unwrap_or_default();
        let failure = Desired::new("Ready", false, "CleanupFailed", message);
        report_failure(ctx, group, &previous, &failure, "DeletingGroup").await;
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

fn forget_last_poll(ctx: &Context, group: &ConsumerGroup) {
    ctx.lag_polls
        .lock()
        .expect("lag polls lock poisoned")
        .remove(&object_key(group));
}
