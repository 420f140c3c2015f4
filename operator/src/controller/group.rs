//! ConsumerGroup reconciler: ensure the group on its brokers, apply offset resets once,
//! poll lag once per lag interval and judge the group's progress over a wall-clock window,
//! surface every failure, clean up on delete.
//!
//! Status is written only when something in it changed, and a poll runs at most once per lag
//! interval: a lagging group costs one status write per interval, a quiet one none.

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

/// What one poll of the group's brokers found.
struct Poll {
    lag: GroupLag,
    members: usize,
    brokers: usize,
    unanswered: Unanswered,
    applied_offset_reset: Option<AppliedOffsetReset>,
}

/// Ensures the group on the brokers, applies a pending offset reset and reads the lag.
async fn poll(
    group: &ConsumerGroup,
    broker: &Broker,
    ctx: &Context,
    now_ms: i64,
) -> Result<Poll, Error> {
    let addresses = broker_addresses(broker);
    let mut unanswered = Unanswered::default();
    ensure_group(group, &addresses, &mut unanswered, ctx).await?;
    unanswered.fail_if_none_answered(addresses.len())?;
    // Members heartbeat to every broker: the union is the group's membership.
    let mut members = BTreeSet::new();
    for addr in unanswered.answering(&addresses) {
        let connected = ctx.admin.members(&addr, &group.name_any()).await;
        if let Some(connected) = unanswered.check(&addr, "listing live members", connected)? {
            members.extend(connected);
        }
    }
    let applied_offset_reset =
        apply_offset_reset(group, &addresses, &unanswered, ctx, now_ms).await?;
    let mut stats = Vec::with_capacity(addresses.len());
    for addr in unanswered.answering(&addresses) {
        let broker_stats = ctx.admin.consume_stats(&addr, &group.name_any()).await;
        if let Some(broker_stats) =
            unanswered.check(&addr, "reading consume stats", broker_stats)?
        {
            stats.extend(broker_stats.queues);
        }
    }
    let answering = unanswered.answering(&addresses);
    stats.extend(uncommitted_topics(group, &stats, &answering, &mut unanswered, ctx).await?);
    unanswered.fail_if_none_answered(addresses.len())?;
    Ok(Poll {
        lag: group_lag(&stats, &group.spec.topics, now_ms),
        members: members.len(),
        brokers: addresses.len(),
        unanswered,
        applied_offset_reset,
    })
}

/// Upserts the group where needed. Upserting persists the broker's group table: only for a new
/// spec or a broker that lacks the group (new, or its store was replaced), not on every poll.
async fn ensure_group(
    group: &ConsumerGroup,
    addresses: &[BrokerAddr],
    unanswered: &mut Unanswered,
    ctx: &Context,
) -> Result<(), Error> {
    let name = group.name_any();
    let previous = group.status.clone().unwrap_or_default();
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
    let spec_applied = previous.observed_generation.is_some()
        && previous.observed_generation == group.metadata.generation
        && conditions::is_true(&previous.conditions, "Ready");
    for addr in addresses {
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
    Ok(())
}

/// Applies `spec.offsetReset` once per id, on every broker or not at all (half-applied, it
/// would look done); the record of the last reset applied.
async fn apply_offset_reset(
    group: &ConsumerGroup,
    addresses: &[BrokerAddr],
    unanswered: &Unanswered,
    ctx: &Context,
    now_ms: i64,
) -> Result<Option<AppliedOffsetReset>, Error> {
    let applied = group
        .status
        .as_ref()
        .and_then(|status| status.applied_offset_reset.clone());
    let Some(reset) = &group.spec.offset_reset else {
        return Ok(applied);
    };
    if applied
        .as_ref()
        .is_some_and(|applied| applied.id == reset.id)
    {
        return Ok(applied);
    }
    if !unanswered.is_empty() {
        tracing::info!(reset = %reset.id, "offset reset waits until every broker answers");
        return Ok(applied);
    }
    let target = match reset.to {
        OffsetResetTarget::Earliest => ResetTarget::Earliest,
        OffsetResetTarget::Latest => ResetTarget::Latest,
        OffsetResetTarget::Timestamp => ResetTarget::Timestamp(reset.timestamp_millis.unwrap_or(0)),
    };
    for addr in addresses {
        for topic in &group.spec.topics {
            ctx.admin
                .reset_offsets(addr, &group.name_any(), topic, target)
                .await
                .map_err(Error::admin("resetting offsets"))?;
        }
    }
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
    Ok(Some(AppliedOffsetReset {
        id: reset.id.clone(),
        to: reset.to,
        applied_at: timestamp(now_ms).to_string(),
    }))
}

/// The wall-clock window of the judgement: `windowSeconds`, or the deprecated `stalledPolls`
/// read as that many lag intervals, or [`DEFAULT_WINDOW`].
pub fn judgement_window(thresholds: &LagThresholds, lag_interval: Duration) -> Duration {
    match (thresholds.window_seconds, thresholds.stalled_polls) {
        (Some(seconds), _) => Duration::from_secs(seconds),
        (None, Some(polls)) => lag_interval.saturating_mul(polls.max(1)),
        (None, None) => DEFAULT_WINDOW,
    }
}

/// The judgement of a successful poll, and why there is none when there is none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Judged {
    progress: Progress,
    /// Since when lag waited with no commit, once that lasted the whole window (members or not).
    stalled_since_ms: Option<i64>,
    unknown_reason: &'static str,
    window: Duration,
}

impl Judged {
    /// Whether the group is stalled; `None` when not judged.
    fn stalled(&self) -> Option<bool> {
        (self.progress != Progress::Unknown).then_some(self.stalled_since_ms.is_some())
    }
}

/// Feeds a complete poll into the window (a poll with silent brokers or no commit would
/// distort it) and judges; the window is the one persisted in status, so a new leader goes on.
fn judge(
    previous: &ConsumerGroupStatus,
    poll: &Poll,
    window: Duration,
    now_ms: i64,
) -> (Option<LagWindow>, Judged) {
    let remembered = window_from_status(previous);
    let sample = Sample::of(&poll.lag, now_ms);
    let unknown = |reason| Judged {
        progress: Progress::Unknown,
        stalled_since_ms: None,
        unknown_reason: reason,
        window,
    };
    match sample {
        None => (remembered, unknown("LagUnknown")),
        Some(_) if !poll.unanswered.is_empty() => (remembered, unknown("BrokersUnanswered")),
        Some(sample) => {
            let observed = LagWindow::observe(remembered.as_ref(), sample);
            let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
            let judged = Judged {
                progress: observed.judge(now_ms, window_ms, poll.members),
                stalled_since_ms: observed.stalled_since(now_ms, window_ms),
                unknown_reason: "",
                window,
            };
            (Some(observed), judged)
        }
    }
}

/// Writes what a successful poll found (status only if changed), its metrics and events.
async fn record_poll(
    group: &ConsumerGroup,
    namespace: &str,
    ctx: &Context,
    poll: Poll,
    now_ms: i64,
) -> Result<Action, Error> {
    let previous = group.status.clone().unwrap_or_default();
    let thresholds = group.spec.lag_thresholds.clone().unwrap_or_default();
    let window = judgement_window(&thresholds, ctx.lag_interval);
    let (lag_window, judged) = judge(&previous, &poll, window, now_ms);
    ctx.metrics.set_group_lag(
        &series_of(group, namespace),
        &poll.lag,
        judged.progress,
        judged.stalled(),
    );
    let desired = lag_conditions(&poll, &judged, &thresholds);
    publish_progress_change(ctx, group, &previous.conditions, &desired).await;
    let lag = &poll.lag;
    let status = ConsumerGroupStatus {
        observed_generation: group.metadata.generation,
        total_lag: lag.total_messages(),
        lag_seconds: lag.max_latency_ms().map(|ms| ms as f64 / 1000.0),
        topics: topic_statuses(lag),
        top_queues: top_queues(lag),
        conditions: conditions::merge(
            &previous.conditions,
            &desired,
            group.metadata.generation,
            timestamp(now_ms),
        ),
        applied_offset_reset: poll.applied_offset_reset,
        last_commit_time: lag_window
            .and_then(|window| window.last_commit_ms)
            .map(|ms| timestamp(ms).to_string())
            .or(previous.last_commit_time.clone()),
        members: Some(u32::try_from(poll.members).unwrap_or(u32::MAX)),
        lag_window: lag_window.map(|window| window_status(&window)),
    };
    let groups: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), namespace);
    write_status_if_changed(
        &groups,
        &group.name_any(),
        group.status.as_ref(),
        &status,
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

/// A Warning event when the group enters FallingBehind, Stalled or Stopped.
async fn publish_progress_change(
    ctx: &Context,
    group: &ConsumerGroup,
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    desired: &[Desired],
) {
    let Some(consuming) = desired.iter().find(|c| c.type_ == "Consuming") else {
        return;
    };
    let was = previous
        .iter()
        .find(|condition| condition.type_ == "Consuming")
        .map(|condition| condition.reason.as_str());
    let alarming = matches!(consuming.reason, "FallingBehind" | "Stalled" | "Stopped");
    if alarming && was != Some(consuming.reason) {
        let reason = consuming.reason;
        publish(
            ctx,
            group,
            EventType::Warning,
            reason,
            reason,
            &consuming.message,
        )
        .await;
    }
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

/// Status when the lag cannot be known: lag figures cleared (unknown, not stale), every
/// condition saying why; the window and last commit kept for the next poll.
fn lag_unknown_status(
    group: &ConsumerGroup,
    reason: &'static str,
    message: &str,
    now_ms: i64,
) -> ConsumerGroupStatus {
    let previous = group.status.clone().unwrap_or_default();
    let unknown = |type_| Desired::new(type_, Status::Unknown, reason, message);
    let desired = [
        Desired::new("Ready", false, reason, message),
        unknown("Lagging"),
        unknown("Consuming"),
        unknown("Stalled"),
    ];
    ConsumerGroupStatus {
        conditions: conditions::merge(
            &previous.conditions,
            &desired,
            group.metadata.generation,
            timestamp(now_ms),
        ),
        total_lag: None,
        lag_seconds: None,
        topics: Vec::new(),
        top_queues: Vec::new(),
        members: None,
        ..previous
    }
}

fn window_status(window: &LagWindow) -> LagWindowStatus {
    LagWindowStatus {
        committed_offsets: window.committed,
        lag: window.lag,
        stuck_since: window.stuck_since_ms.map(|ms| timestamp(ms).to_string()),
        growing_since: timestamp(window.growing_since_ms).to_string(),
        growing_from: window.growing_from,
    }
}

/// The window a previous leader (or this one) persisted; `None` when absent or unreadable.
fn window_from_status(status: &ConsumerGroupStatus) -> Option<LagWindow> {
    let millis = |text: &str| text.parse::<Timestamp>().ok().map(|t| t.as_millisecond());
    let persisted = status.lag_window.as_ref()?;
    let stuck_since_ms = match &persisted.stuck_since {
        Some(text) => Some(millis(text)?),
        None => None,
    };
    Some(LagWindow {
        committed: persisted.committed_offsets,
        lag: persisted.lag,
        last_commit_ms: status.last_commit_time.as_deref().and_then(millis),
        stuck_since_ms,
        growing_since_ms: millis(&persisted.growing_since)?,
        growing_from: persisted.growing_from,
    })
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

fn top_queues(lag: &GroupLag) -> Vec<QueueLagStatus> {
    lag.top_queues(TOP_QUEUES)
        .into_iter()
        .map(|(key, lag)| QueueLagStatus {
            topic: key.topic.clone(),
            broker: key.broker.clone(),
            queue_id: key.queue_id,
            lag,
        })
        .collect()
}

/// "10m" or "90s": how condition messages name the window.
fn window_text(window: Duration) -> String {
    match window.as_secs() {
        seconds if seconds % 60 == 0 => format!("{}m", seconds / 60),
        seconds => format!("{seconds}s"),
    }
}

fn time_text(ms: i64) -> String {
    timestamp(ms).to_string()
}

fn lag_conditions(poll: &Poll, judged: &Judged, thresholds: &LagThresholds) -> Vec<Desired> {
    let note = poll.unanswered.note(poll.brokers);
    let total = poll.lag.total_messages();
    let latency_ms = poll.lag.max_latency_ms();
    let over_messages =
        matches!((total, thresholds.messages), (Some(total), Some(limit)) if total > limit);
    let over_seconds = matches!((latency_ms, thresholds.seconds), (Some(ms), Some(limit)) if ms > limit.saturating_mul(1000));
    let lagging = over_messages || over_seconds;
    let lag_message = match total {
        Some(total) => format!(
            "{total} messages behind, {:.1}s{note}",
            latency_ms.unwrap_or(0) as f64 / 1000.0
        ),
        None => format!("nothing committed yet: lag unknown{note}"),
    };
    let consuming = consuming_condition(total.unwrap_or(0), judged, &note);
    let stalled = stalled_condition(total.unwrap_or(0), judged, &consuming);
    vec![
        Desired::new(
            "Ready",
            true,
            "GroupConfigured",
            format!(
                "group present on {} brokers; {} live members{note}",
                poll.brokers, poll.members
            ),
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
        consuming,
        stalled,
    ]
}

/// The Stalled condition: lag waited with no commit for the whole window, whether or not
/// consumers are connected (Consuming says Stopped first when none are).
fn stalled_condition(lag: u64, judged: &Judged, consuming: &Desired) -> Desired {
    let window = window_text(judged.window);
    match (judged.progress, judged.stalled_since_ms) {
        (Progress::Unknown, _) => Desired::new(
            "Stalled",
            Status::Unknown,
            judged.unknown_reason,
            consuming.message.clone(),
        ),
        (_, Some(since_ms)) => Desired::new(
            "Stalled",
            true,
            "CommitsNotMoving",
            format!(
                "{lag} messages waiting and no commit since {} (window {window})",
                time_text(since_ms)
            ),
        ),
        (_, None) => Desired::new(
            "Stalled",
            false,
            "Progressing",
            format!("messages have not waited {window} without a commit"),
        ),
    }
}

/// The Consuming condition: the judged progress, its reason and what it is based on.
fn consuming_condition(lag: u64, judged: &Judged, note: &str) -> Desired {
    let window = window_text(judged.window);
    let (status, reason, message) = match judged.progress {
        Progress::Unknown if judged.unknown_reason == "LagUnknown" => (
            Status::Unknown,
            "LagUnknown",
            format!("nothing committed yet: progress unknown{note}"),
        ),
        Progress::Unknown => (
            Status::Unknown,
            judged.unknown_reason,
            format!("progress is judged on polls every broker answers{note}"),
        ),
        Progress::Ok if lag == 0 => (
            Status::True,
            "CaughtUp",
            "no messages waiting".to_string(),
        ),
        Progress::Ok => (
            Status::True,
            "Progressing",
            format!("{lag} messages waiting; neither stalled nor falling behind over {window}"),
        ),
        Progress::Warning { since_ms, from } => (
            Status::True,
            "FallingBehind",
            format!(
                "lag has not gone down since {} and rose from {from} to {lag} messages while commits move (window {window})",
                time_text(since_ms)
            ),
        ),
        Progress::Stalled { since_ms } => (
            Status::False,
            "Stalled",
            format!(
                "{lag} messages waiting and no commit since {} (window {window})",
                time_text(since_ms)
            ),
        ),
        Progress::Stopped => (
            Status::False,
            "Stopped",
            format!("{lag} messages waiting and no consumer connected"),
        ),
    };
    Desired::new("Consuming", status, reason, message)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::QueueOffset;

    #[test]
    fn lag_is_polled_on_every_broker_or_on_each_groups_master() {
        use crate::crd::{BrokerReplicationStatus, BrokerStatus, ReplicationGroupStatus};
        use crate::fixtures::BrokerFixture;
        let plain = Broker::test().replicas(2);
        let addresses: Vec<String> = broker_addresses(&plain).into_iter().map(|a| a.0).collect();
        assert_eq!(
            addresses,
            [
                "qb-0.qb-headless.ns.svc:10911",
                "qb-1.qb-headless.ns.svc:10911"
            ]
        );
        let mut replicated = Broker::test().replicas(2).replicated(3, 2);
        let first_members: Vec<String> = broker_addresses(&replicated)
            .into_iter()
            .map(|a| a.0)
            .collect();
        assert_eq!(
            first_members,
            [
                "qb-0.qb-headless.ns.svc:10911",
                "qb-3.qb-headless.ns.svc:10911"
            ],
            "replica 0 of each group while no master is known"
        );
        replicated.status = Some(BrokerStatus {
            current_replicas: 6,
            replication: Some(BrokerReplicationStatus {
                groups: vec![ReplicationGroupStatus {
                    name: "qb-g1".into(),
                    master: Some("qb-5".into()),
                    ..ReplicationGroupStatus::default()
                }],
            }),
            ..BrokerStatus::default()
        });
        let masters: Vec<String> = broker_addresses(&replicated)
            .into_iter()
            .map(|a| a.0)
            .collect();
        assert_eq!(
            masters,
            [
                "qb-0.qb-headless.ns.svc:10911",
                "qb-5.qb-headless.ns.svc:10911"
            ]
        );
    }

    fn poll_of(messages: u64, latency_ms: i64) -> Poll {
        let queue = QueueConsumeStats {
            topic: "orders".into(),
            broker_name: "qb-0".into(),
            queue_id: 0,
            broker_offset: QueueOffset(100),
            consumer_offset: Some(QueueOffset(100 - messages)),
            oldest_unconsumed_store_ms: Some(10_000 - latency_ms),
        };
        Poll {
            lag: group_lag(&[queue], &[], 10_000),
            members: 1,
            brokers: 1,
            unanswered: Unanswered::default(),
            applied_offset_reset: None,
        }
    }

    fn judged(progress: Progress) -> Judged {
        let stalled_since_ms = match progress {
            Progress::Stalled { since_ms } => Some(since_ms),
            _ => None,
        };
        Judged {
            progress,
            stalled_since_ms,
            unknown_reason: "LagUnknown",
            window: DEFAULT_WINDOW,
        }
    }

    fn found<'a>(conditions: &'a [Desired], type_: &str) -> &'a Desired {
        conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_}"))
    }

    fn lagging(conditions: &[Desired]) -> (bool, &'static str) {
        let found = found(conditions, "Lagging");
        (found.status == Status::True, found.reason)
    }

    #[test]
    fn either_threshold_sets_lagging() {
        let thresholds = LagThresholds {
            messages: Some(50),
            seconds: Some(3),
            ..LagThresholds::default()
        };
        let ok = judged(Progress::Ok);
        let calm = lag_conditions(&poll_of(10, 1_000), &ok, &thresholds);
        assert_eq!(lagging(&calm), (false, "WithinThresholds"));
        let many = lag_conditions(&poll_of(60, 1_000), &ok, &thresholds);
        assert_eq!(lagging(&many), (true, "ThresholdExceeded"));
        let old = lag_conditions(&poll_of(10, 4_000), &ok, &thresholds);
        assert_eq!(lagging(&old), (true, "ThresholdExceeded"));
    }

    #[test]
    fn each_judgement_has_its_consuming_and_stalled_conditions() {
        let cases = [
            (
                Progress::Ok,
                0,
                ("True", "CaughtUp"),
                ("False", "Progressing"),
            ),
            (
                Progress::Ok,
                9,
                ("True", "Progressing"),
                ("False", "Progressing"),
            ),
            (
                Progress::Warning {
                    since_ms: 0,
                    from: 1,
                },
                9,
                ("True", "FallingBehind"),
                ("False", "Progressing"),
            ),
            (
                Progress::Stalled { since_ms: 0 },
                9,
                ("False", "Stalled"),
                ("True", "CommitsNotMoving"),
            ),
            (
                Progress::Stopped,
                9,
                ("False", "Stopped"),
                ("False", "Progressing"),
            ),
            (
                Progress::Unknown,
                9,
                ("Unknown", "LagUnknown"),
                ("Unknown", "LagUnknown"),
            ),
        ];
        for (progress, lag, consuming, stalled) in cases {
            let conditions = lag_conditions(
                &poll_of(lag, 1_000),
                &judged(progress),
                &LagThresholds::default(),
            );
            let pair = |type_| {
                let c = found(&conditions, type_);
                (c.status.as_str(), c.reason)
            };
            assert_eq!(pair("Consuming"), consuming, "{progress:?}");
            assert_eq!(pair("Stalled"), stalled, "{progress:?}");
        }
        let stalled = lag_conditions(
            &poll_of(9, 1_000),
            &judged(Progress::Stalled { since_ms: 0 }),
            &LagThresholds::default(),
        );
        assert_eq!(
            found(&stalled, "Consuming").message,
            "9 messages waiting and no commit since 1970-01-01T00:00:00Z (window 10m)"
        );
    }

    #[test]
    fn the_window_comes_from_window_seconds_or_the_deprecated_polls() {
        let interval = Duration::from_secs(30);
        let window = |window_seconds, stalled_polls| {
            judgement_window(
                &LagThresholds {
                    window_seconds,
                    stalled_polls,
                    ..LagThresholds::default()
                },
                interval,
            )
        };
        assert_eq!(window(None, None), DEFAULT_WINDOW);
        assert_eq!(window(Some(120), None), Duration::from_secs(120));
        assert_eq!(window(None, Some(5)), Duration::from_secs(150));
        assert_eq!(window_text(DEFAULT_WINDOW), "10m");
        assert_eq!(window_text(Duration::from_secs(90)), "90s");
    }

    #[test]
    fn window_seconds_and_stalled_polls_are_validated() {
        use kube::core::cel::validate_cel;
        let group = |thresholds: serde_json::Value| -> ConsumerGroup {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "quiver.io/v1alpha1",
                "kind": "ConsumerGroup",
                "metadata": {"name": "billing", "namespace": "ns"},
                "spec": {"brokerRef": "qb", "lagThresholds": thresholds},
            }))
            .expect("valid group")
        };
        validate_cel(&group(serde_json::json!({"windowSeconds": 600}))).expect("window alone");
        validate_cel(&group(serde_json::json!({"stalledPolls": 5}))).expect("deprecated alone");
        let both = validate_cel(&group(
            serde_json::json!({"windowSeconds": 600, "stalledPolls": 5}),
        ))
        .unwrap_err();
        assert!(
            format!("{both:?}").contains("stalledPolls is deprecated"),
            "{both:?}"
        );
        let zero = validate_cel(&group(serde_json::json!({"windowSeconds": 0}))).unwrap_err();
        assert!(
            format!("{zero:?}").contains("windowSeconds must be between"),
            "{zero:?}"
        );
    }

    #[test]
    fn the_window_round_trips_through_status() {
        let window = LagWindow {
            committed: 40,
            lag: 7,
            last_commit_ms: Some(1_700_000_000_123),
            stuck_since_ms: Some(1_700_000_030_456),
            growing_since_ms: 1_700_000_000_000,
            growing_from: 3,
        };
        let status = ConsumerGroupStatus {
            last_commit_time: Some(time_text(1_700_000_000_123)),
            lag_window: Some(window_status(&window)),
            ..ConsumerGroupStatus::default()
        };
        assert_eq!(window_from_status(&status), Some(window));
        let unreadable = ConsumerGroupStatus {
            lag_window: Some(LagWindowStatus {
                growing_since: "yesterday".into(),
                ..window_status(&window)
            }),
            ..ConsumerGroupStatus::default()
        };
        assert_eq!(window_from_status(&unreadable), None);
    }
}
