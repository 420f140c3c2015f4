//! One poll of a ConsumerGroup's brokers: the group upserted where missing, a pending offset
//! reset applied everywhere or nowhere, then members, consume stats and the spec topics nobody
//! committed on. A broker that does not answer is left out of this poll (and named), not a
//! failure, unless none answers.

use super::*;

/// What one poll of the group's brokers found.
pub(super) struct Poll {
    pub(super) lag: GroupLag,
    pub(super) members: usize,
    pub(super) brokers: usize,
    pub(super) unanswered: Unanswered,
    pub(super) applied_offset_reset: Option<AppliedOffsetReset>,
    /// The per-queue windows of this operator's last poll of the group (observe fills it in).
    pub(super) remembered_queues: Option<QueueWindows>,
}

/// Ensures the group on the brokers, applies a pending offset reset and reads the lag.
pub(super) async fn poll(
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
        remembered_queues: None,
    })
}

/// Upserts the group where needed. Upserting persists the broker's group table: only for a new
/// spec or a broker that lacks the group (new, or its store was replaced), not on every poll.
pub(super) async fn ensure_group(
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

/// Queues of spec topics the group never committed on (the broker's consume stats list only
/// topics with offsets), so status shows them as unknown rather than leaving them out.
pub(super) async fn uncommitted_topics(
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
pub(super) struct Unanswered {
    pub(super) brokers: BTreeSet<BrokerAddr>,
    pub(super) last_error: Option<AdminError>,
}

impl Unanswered {
    pub(super) fn is_empty(&self) -> bool {
        self.brokers.is_empty()
    }

    pub(super) fn contains(&self, addr: &BrokerAddr) -> bool {
        self.brokers.contains(addr)
    }

    /// The brokers of `addresses` that have answered so far.
    pub(super) fn answering(&self, addresses: &[BrokerAddr]) -> Vec<BrokerAddr> {
        addresses
            .iter()
            .filter(|addr| !self.contains(addr))
            .cloned()
            .collect()
    }

    pub(super) fn note_unreachable(&mut self, addr: &BrokerAddr, error: AdminError) {
        tracing::warn!(%error, broker = %addr.0, "broker did not answer; lag without it this poll");
        self.brokers.insert(addr.clone());
        self.last_error = Some(error);
    }

    /// The answer; None when the broker is unreachable (noted); other errors fail the poll.
    pub(super) fn check<T>(
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
    pub(super) fn fail_if_none_answered(&mut self, brokers: usize) -> Result<(), Error> {
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
    pub(super) fn note(&self, brokers: usize) -> String {
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
