//! ConsumerGroup reconciler: ensure the group on its brokers, apply offset resets once,
//! collect lag on every pass (requeued at the lag interval), clean up on delete.

use super::conditions::{self, Desired};
use super::{object_key, patch_status, publish, Context, Error};
use crate::admin::{AdminError, BrokerAddr, QueueConsumeStats, ResetTarget, SubscriptionGroup};
use crate::crd::{
    AppliedOffsetReset, Broker, ConsumeFromWhere, ConsumerGroup, ConsumerGroupStatus,
    OffsetResetTarget, QueueLagStatus, TopicLagStatus,
};
use crate::desired;
use crate::lag::{group_lag, GroupLag, Progress};
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
/// Polls with lag and no commit before Stalled, when the spec does not say.
pub const DEFAULT_STALLED_POLLS: u32 = 3;
/// Queues listed in `status.topQueues`.
pub const TOP_QUEUES: usize = 10;
/// Requeue delay while the referenced Broker does not exist.
pub const MISSING_BROKER_REQUEUE: Duration = Duration::from_secs(30);

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

/// Addresses of the brokers of the referenced Broker, including ones still draining.
fn broker_addresses(broker: &Broker) -> Vec<BrokerAddr> {
    let running = broker
        .status
        .as_ref()
        .map_or(0, |status| status.current_replicas);
    (0..broker.spec.replicas.max(running))
        .map(|ordinal| BrokerAddr(desired::broker_address(broker, ordinal)))
        .collect()
}

#[instrument(skip(group, ctx), fields(group = %group.name_any()))]
async fn apply(group: &ConsumerGroup, namespace: &str, ctx: &Context) -> Result<Action, Error> {
    let name = group.name_any();
    let groups: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), namespace);
    let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), namespace);
    let previous = group.status.clone().unwrap_or_default();
    let now_ms = (ctx.clock)();
    let now = Timestamp::from_millisecond(now_ms).unwrap_or(Timestamp::UNIX_EPOCH);
    let broker_ref = &group.spec.broker_ref;

    let Some(broker) = brokers
        .get_opt(broker_ref)
        .await
        .map_err(Error::kube(format!("reading Broker {broker_ref}")))?
    else {
        let conditions = conditions::merge(
            &previous.conditions,
            &[Desired::new(
                "Ready",
                false,
                "BrokerNotFound",
                format!("Broker {broker_ref} does not exist"),
            )],
            group.metadata.generation,
            now,
        );
        let status = ConsumerGroupStatus {
            observed_generation: group.metadata.generation,
            conditions,
            ..previous
        };
        patch_status(&groups, &name, &status).await?;
        return Ok(Action::requeue(MISSING_BROKER_REQUEUE));
    };
    let addresses = broker_addresses(&broker);

    let subscription = SubscriptionGroup {
        group: name.clone(),
        consume_enable: group.spec.consume_enable,
        consume_from_min_enable: matches!(
            group.spec.consume_from_where,
            ConsumeFromWhere::ConsumeFromFirstOffset
        ),
        retry_queue_nums: 1,
        max_reconsume_times: group.spec.max_reconsume_times,
    };
    // Upserting persists the broker's group table: do it only for a new spec or a broker that
    // lacks the group (new, or its store was replaced), not on every lag poll.
    let spec_applied = previous.observed_generation.is_some()
        && previous.observed_generation == group.metadata.generation
        && conditions::is_true(&previous.conditions, "Ready");
    let mut unanswered = Unanswered::default();
    for addr in &addresses {
        let present = if spec_applied {
            let listed = ctx.admin.groups(addr).await;
            match unanswered.check(addr, "listing subscription groups", listed)? {
                Some(groups) => groups.contains(&name),
                None => continue,
            }
        } else {
            false
        };
        if !present {
            let upserted = ctx.admin.upsert_group(addr, &subscription).await;
            unanswered.check(addr, "creating the subscription group", upserted)?;
        }
    }
    unanswered.fail_if_none_answered(addresses.len())?;

    // Members heartbeat to every broker: the union is the group's membership.
    let mut members = BTreeSet::new();
    for addr in unanswered.answering(&addresses) {
        let connected = ctx.admin.members(&addr, &name).await;
        if let Some(connected) = unanswered.check(&addr, "listing live members", connected)? {
            members.extend(connected);
        }
    }

    let mut applied_offset_reset = previous.applied_offset_reset.clone();
    if let Some(reset) = &group.spec.offset_reset {
        let already_applied = applied_offset_reset
            .as_ref()
            .is_some_and(|applied| applied.id == reset.id);
        // A reset goes to every broker or waits: half-applied, it would look done.
        if !already_applied && !unanswered.is_empty() {
            tracing::info!(reset = %reset.id, "offset reset waits until every broker answers");
        }
        if !already_applied && unanswered.is_empty() {
            let target = match reset.to {
                OffsetResetTarget::Earliest => ResetTarget::Earliest,
                OffsetResetTarget::Latest => ResetTarget::Latest,
                OffsetResetTarget::Timestamp => {
                    ResetTarget::Timestamp(reset.timestamp_millis.unwrap_or(0))
                }
            };
            for addr in &addresses {
                for topic in &group.spec.topics {
                    ctx.admin
                        .reset_offsets(addr, &name, topic, target)
                        .await
                        .map_err(Error::admin("resetting offsets"))?;
                }
            }
            applied_offset_reset = Some(AppliedOffsetReset {
                id: reset.id.clone(),
                to: reset.to,
                applied_at: now.to_string(),
            });
            let note = format!(
                "offsets of {} reset to {:?} (request {})",
                group.spec.topics.join(", "),
                reset.to,
                reset.id
            );
            publish(
                ctx,
                group,
                EventType::Normal,
                "OffsetsReset",
                "OffsetsReset",
                &note,
            )
            .await;
        }
    }

    let mut stats = Vec::with_capacity(addresses.len());
    for addr in unanswered.answering(&addresses) {
        let broker_stats = ctx.admin.consume_stats(&addr, &name).await;
        if let Some(broker_stats) =
            unanswered.check(&addr, "reading consume stats", broker_stats)?
        {
            stats.extend(broker_stats.queues);
        }
    }
    let answering = unanswered.answering(&addresses);
    stats.extend(uncommitted_topics(group, &stats, &answering, &mut unanswered, ctx).await?);
    unanswered.fail_if_none_answered(addresses.len())?;
    let lag = group_lag(&stats, &group.spec.topics, now_ms);
    let thresholds = group.spec.lag_thresholds.clone().unwrap_or_default();
    let (progress, last_commit_ms) = {
        let mut trackers = ctx
            .stall_trackers
            .lock()
            .expect("stall tracker lock poisoned");
        let tracker = trackers.entry(object_key(group)).or_default();
        let progress = tracker.observe(
            &lag,
            thresholds.stalled_polls.unwrap_or(DEFAULT_STALLED_POLLS),
            now_ms,
        );
        (progress, tracker.last_commit_ms())
    };
    ctx.metrics.set_group_lag(broker_ref, &name, &lag, progress);

    let status = ConsumerGroupStatus {
        observed_generation: group.metadata.generation,
        total_lag: lag.total_messages(),
        lag_seconds: lag.max_latency_ms().map(|ms| ms as f64 / 1000.0),
        topics: topic_statuses(&lag),
        top_queues: lag
            .top_queues(TOP_QUEUES)
            .into_iter()
            .map(|(key, lag)| QueueLagStatus {
                topic: key.topic.clone(),
                broker: key.broker.clone(),
                queue_id: key.queue_id,
                lag,
            })
            .collect(),
        conditions: conditions::merge(
            &previous.conditions,
            &lag_conditions(
                &lag,
                progress,
                &thresholds,
                addresses.len(),
                members.len(),
                &unanswered.note(addresses.len()),
            ),
            group.metadata.generation,
            now,
        ),
        applied_offset_reset,
        last_commit_time: last_commit_ms
            .and_then(|ms| Timestamp::from_millisecond(ms).ok())
            .map(|time| time.to_string())
            .or(previous.last_commit_time),
        members: Some(u32::try_from(members.len()).unwrap_or(u32::MAX)),
    };
    patch_status(&groups, &name, &status).await?;
    Ok(Action::requeue(ctx.lag_interval))
}

/// Queues of spec topics the group never committed on (the broker's consume stats list only
/// topics with offsets), so status shows them as unknown rather than leaving them out.
async fn uncommitted_topics(
    group: &ConsumerGroup,
    stats: &[QueueConsumeStats],
    addresses: &[BrokerAddr],
    unanswered: &mut Unanswered,
    ctx: &Context,
) -> Result<Vec<QueueConsumeStats>, Error> {
    let mut queues = Vec::new();
    for topic in &group.spec.topics {
        if stats.iter().any(|queue| &queue.topic == topic) {
            continue;
        }
        for addr in addresses {
            if unanswered.contains(addr) {
                continue;
            }
            match ctx.admin.topic_stats(addr, topic).await {
                Ok(topic_stats) => {
                    queues.extend(
                        topic_stats
                            .queues
                            .into_iter()
                            .map(|queue| QueueConsumeStats {
                                topic: topic.clone(),
                                broker_name: queue.broker_name,
                                queue_id: queue.queue_id,
                                broker_offset: queue.max_offset,
                                consumer_offset: None,
                                oldest_unconsumed_store_ms: None,
                            }),
                    )
                }
                // The topic does not exist on that broker (yet): nothing to report there.
                Err(AdminError::Rejected { .. }) => {}
                Err(source @ AdminError::Unreachable { .. }) => {
                    unanswered.note_unreachable(addr, source);
                }
                Err(source) => {
                    return Err(Error::Admin {
                        action: "reading topic stats",
                        source,
                    })
                }
            }
        }
    }
    Ok(queues)
}

/// Brokers that did not answer during one poll: skipped for the rest of it, left out of the
/// lag (their queues are unknown, not carried over) and named in the conditions.
#[derive(Default)]
struct Unanswered {
    brokers: BTreeSet<BrokerAddr>,
    last_error: Option<AdminError>,
}

impl Unanswered {
    fn is_empty(&self) -> bool {
        self.brokers.is_empty()
    }

    fn contains(&self, addr: &BrokerAddr) -> bool {
        self.brokers.contains(addr)
    }

    /// The brokers of `addresses` that have answered so far.
    fn answering(&self, addresses: &[BrokerAddr]) -> Vec<BrokerAddr> {
        addresses
            .iter()
            .filter(|addr| !self.contains(addr))
            .cloned()
            .collect()
    }

    fn note_unreachable(&mut self, addr: &BrokerAddr, error: AdminError) {
        tracing::warn!(%error, broker = %addr.0, "broker did not answer; lag without it this poll");
        self.brokers.insert(addr.clone());
        self.last_error = Some(error);
    }

    /// The answer; None when the broker is unreachable (noted); other errors fail the poll.
    fn check<T>(
        &mut self,
        addr: &BrokerAddr,
        action: &'static str,
        result: Result<T, AdminError>,
    ) -> Result<Option<T>, Error> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(error @ AdminError::Unreachable { .. }) => {
                self.note_unreachable(addr, error);
                Ok(None)
            }
            Err(source) => Err(Error::Admin { action, source }),
        }
    }

    /// With no broker answering there is nothing to report: the poll fails as before.
    fn fail_if_none_answered(&mut self, brokers: usize) -> Result<(), Error> {
        match self.last_error.take() {
            Some(source) if self.brokers.len() >= brokers => Err(Error::Admin {
                action: "reaching any broker of the group",
                source,
            }),
            kept => {
                self.last_error = kept;
                Ok(())
            }
        }
    }

    /// The conditions' note: empty when every broker answered.
    fn note(&self, brokers: usize) -> String {
        if self.brokers.is_empty() {
            return String::new();
        }
        let names: Vec<&str> = self.brokers.iter().map(|addr| addr.0.as_str()).collect();
        format!(
            "; lag from {} of {brokers} brokers, unknown on {} (did not answer)",
            brokers - self.brokers.len(),
            names.join(", ")
        )
    }
}

fn topic_statuses(lag: &GroupLag) -> Vec<TopicLagStatus> {
    lag.topics
        .iter()
        .map(|(topic, topic_lag)| TopicLagStatus {
            topic: topic.clone(),
            lag: topic_lag.messages,
            lag_latency_millis: topic_lag.latency_ms,
            uncommitted_queues: topic_lag.uncommitted_queues,
        })
        .collect()
}

fn lag_conditions(
    lag: &GroupLag,
    progress: Progress,
    thresholds: &crate::crd::LagThresholds,
    brokers: usize,
    members: usize,
    unanswered_note: &str,
) -> Vec<Desired> {
    let total = lag.total_messages();
    let latency_ms = lag.max_latency_ms();
    let over_messages =
        matches!((total, thresholds.messages), (Some(total), Some(limit)) if total > limit);
    let over_seconds = matches!((latency_ms, thresholds.seconds), (Some(ms), Some(limit)) if ms > limit.saturating_mul(1000));
    let lagging = over_messages || over_seconds;
    let lag_message = match total {
        Some(total) => format!(
            "{total} messages behind, {:.1}s{unanswered_note}",
            latency_ms.unwrap_or(0) as f64 / 1000.0
        ),
        None => format!("nothing committed yet: lag unknown{unanswered_note}"),
    };
    let stalled_message = match progress {
        Progress::Stalled { unmoved_polls } => {
            format!("lag > 0 and no commit for {unmoved_polls} polls")
        }
        Progress::Moving => "committed offsets move or nothing is pending".to_string(),
    };
    vec![
        Desired::new(
            "Ready",
            true,
            "GroupConfigured",
            format!("group present on {brokers} brokers; {members} live members{unanswered_note}"),
        ),
        Desired::new(
            "Lagging",
            lagging,
            if lagging {
                "ThresholdExceeded"
            } else {
                "WithinThresholds"
            },
            lag_message,
        ),
        Desired::new(
            "Stalled",
            matches!(progress, Progress::Stalled { .. }),
            if matches!(progress, Progress::Stalled { .. }) {
                "CommitsNotMoving"
            } else {
                "Progressing"
            },
            stalled_message,
        ),
    ]
}

#[instrument(skip(group, ctx), fields(group = %group.name_any()))]
async fn cleanup(group: &ConsumerGroup, namespace: &str, ctx: &Context) -> Result<Action, Error> {
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
    ctx.metrics.forget_group(&group.spec.broker_ref, &name);
    ctx.stall_trackers
        .lock()
        .expect("stall tracker lock poisoned")
        .remove(&object_key(group));
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::QueueOffset;
    use crate::crd::LagThresholds;

    fn lag_of(messages: u64, latency_ms: i64) -> GroupLag {
        let queue = QueueConsumeStats {
            topic: "orders".into(),
            broker_name: "qb-0".into(),
            queue_id: 0,
            broker_offset: QueueOffset(100),
            consumer_offset: Some(QueueOffset(100 - messages)),
            oldest_unconsumed_store_ms: Some(10_000 - latency_ms),
        };
        group_lag(&[queue], &[], 10_000)
    }

    fn lagging(conditions: &[Desired]) -> (bool, &'static str) {
        let found = conditions
            .iter()
            .find(|c| c.type_ == "Lagging")
            .expect("Lagging");
        (found.status == conditions::Status::True, found.reason)
    }

    #[test]
    fn either_threshold_sets_lagging() {
        let thresholds = LagThresholds {
            messages: Some(50),
            seconds: Some(3),
            stalled_polls: None,
        };
        let calm = lag_conditions(&lag_of(10, 1_000), Progress::Moving, &thresholds, 1, 0, "");
        assert_eq!(lagging(&calm), (false, "WithinThresholds"));
        let many = lag_conditions(&lag_of(60, 1_000), Progress::Moving, &thresholds, 1, 0, "");
        assert_eq!(lagging(&many), (true, "ThresholdExceeded"));
        let old = lag_conditions(&lag_of(10, 4_000), Progress::Moving, &thresholds, 1, 0, "");
        assert_eq!(lagging(&old), (true, "ThresholdExceeded"));
    }

    #[test]
    fn no_thresholds_never_lagging_and_stall_is_reported() {
        let conditions = lag_conditions(
            &lag_of(90, 60_000),
            Progress::Stalled { unmoved_polls: 4 },
            &LagThresholds::default(),
            2,
            0,
            "",
        );
        assert_eq!(lagging(&conditions), (false, "WithinThresholds"));
        let stalled = conditions
            .iter()
            .find(|c| c.type_ == "Stalled")
            .expect("Stalled");
        assert_eq!(stalled.status, conditions::Status::True);
        assert!(stalled.message.contains("4 polls"), "{}", stalled.message);
    }
}
