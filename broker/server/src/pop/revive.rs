//! The revive loop: every 500 ms, messages whose invisible time ran out go to the group's
//! retry topic (reconsume times + 1, RETRY_TOPIC and ORIGIN_MESSAGE_ID kept as Apache does),
//! or to `%DLQ%<group>` after `retryMaxTimes` + 1 deliveries; in-order groups get them again
//! in place, so the loop only wakes their receives.

use std::sync::Arc;
use std::time::Duration;

use quiver_store::record::{decode, encode_properties};
use quiver_store::{Delivery, PopKey};
use std::ops::ControlFlow;

use super::{read_one, retry_topic, PopError, PopService, RevivedTo};
use crate::broker::{blocking, Broker};
use crate::error::chain;
use crate::service::produce::{ensure_topic, retry_properties, store_message, StoreTarget};
use crate::topics::{DLQ_PREFIX, RETRY_PREFIX};

const REVIVE_INTERVAL: Duration = Duration::from_millis(500);
/// Expired messages one round handles at most.
const REVIVE_BATCH: usize = 4096;
/// How long a message being moved stays invisible: a crash mid-move revives it after this.
const MOVE_LEASE_MS: i64 = 30_000;

/// Where a revived message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    Retry,
    DeadLetter,
}

/// How often expired messages are revived (on the master only: a replica's are revived by
/// the master).
pub const EVERY: Duration = REVIVE_INTERVAL;

/// One round of the revive loop, off the async workers; a full disk refuses every re-put:
/// expired messages wait in flight until there is room.
pub async fn round(broker: Arc<Broker>) -> ControlFlow<(), Option<String>> {
    match blocking(&broker, |broker| revive_due(broker, crate::now_ms())).await {
        Ok(Ok(())) => ControlFlow::Continue(None),
        Ok(Err(error)) => ControlFlow::Continue(Some(chain(&error))),
        Err(error) => {
            tracing::error!(error = %chain(&error), "POP revive task failed");
            ControlFlow::Break(())
        }
    }
}

/// One round: moves (or, in order, wakes) what expired by `now_ms`, then snapshots the state
/// when its log has grown enough. Blocking.
pub fn revive_due(broker: &Broker, now_ms: i64) -> Result<(), PopError> {
    let pop = broker.pop();
    for (key, delivery) in pop.state.expired(now_ms, REVIVE_BATCH) {
        let Some(group) = broker.groups().get(&key.group) else {
            continue;
        };
        let max_deliveries = u32::try_from(group.retry_max_times).unwrap_or(0) + 1;
        let exhausted = delivery.entry.attempt >= max_deliveries;
        if group.consume_message_orderly && !exhausted {
            pop.wakers.wake(&key.topic);
            continue;
        }
        let destination = if exhausted {
            Destination::DeadLetter
        } else {
            Destination::Retry
        };
        match move_message(pop, broker, &key, delivery, destination) {
            // Acked or changed between the scan and the move: nothing to revive.
            Ok(()) | Err(PopError::HandleExpired) => {}
            Err(error) => return Err(error),
        }
    }
    pop.state.snapshot_if_due(false)?;
    Ok(())
}

/// Stores a copy of an in-flight message at `destination` and takes it out of flight. The
/// message is leased first (its handle stops working), so an ack cannot race the copy; a
/// crash between the copy and the removal revives it again (at least once).
pub(super) fn move_message(
    pop: &PopService,
    broker: &Broker,
    key: &PopKey,
    delivery: Delivery,
    destination: Destination,
) -> Result<(), PopError> {
    let lease_until = crate::now_ms().saturating_add(MOVE_LEASE_MS);
    let leased = pop
        .state
        .renew(key, delivery.offset, delivery.entry.revision, lease_until)?;
    let leased = Delivery {
        offset: delivery.offset,
        entry: leased,
    };
    let Some(stored) = read_one(broker, key, delivery.offset) else {
        return pop.drop_gone(broker, key, leased);
    };
    let record = match decode(&stored) {
        Ok((record, _)) => record,
        // Undeliverable by any path: dropped (loudly) rather than stalling every later round.
        Err(source) => {
            let error = PopError::BadRecord {
                topic: key.topic.clone(),
                queue_id: key.queue_id,
                offset: delivery.offset,
                source,
            };
            tracing::error!(group = %key.group, error = %chain(&error), "in-flight message cannot be decoded");
            return pop.drop_gone(broker, key, leased);
        }
    };
    let topic = match destination {
        Destination::DeadLetter => format!("{DLQ_PREFIX}{}", key.group),
        Destination::Retry if key.topic.starts_with(RETRY_PREFIX) => key.topic.clone(),
        Destination::Retry => retry_topic(&key.group, &key.topic),
    };
    ensure_topic(broker, &topic);
    let queues = broker
        .topics()
        .get(&topic)
        .map_or(1, |t| t.write_queue_nums.max(1));
    let properties = retry_properties(&record, None);
    let target = StoreTarget {
        queue_id: u32::try_from(delivery.offset % u64::from(queues)).unwrap_or(0),
        topic,
        flag: record.flag,
        body: record.body.clone(),
        properties: encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        sys_flag: record.sys_flag,
        born_timestamp_ms: record.born_timestamp_ms,
        born_host: record.born_host,
        reconsume_times: record.reconsume_times + 1,
        prepared_transaction_offset: 0,
    };
    store_message(broker, &[target])?;
    let removed = pop
        .state
        .remove(key, leased.offset, leased.entry.revision)?;
    pop.after_remove(broker, key, removed);
    let to = match destination {
        Destination::Retry => RevivedTo::Retry,
        Destination::DeadLetter => RevivedTo::DeadLetter,
    };
    pop.count_revived(to, 1);
    tracing::debug!(group = %key.group, topic = %key.topic, queue = key.queue_id, offset = delivery.offset, to = to.label(), "POP message revived");
    Ok(())
}
