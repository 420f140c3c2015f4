//! The revive loop: every 500 ms, messages whose invisible time ran out go to the group's
//! retry topic (reconsume times + 1, RETRY_TOPIC and ORIGIN_MESSAGE_ID kept as Apache does),
//! or to `%DLQ%<group>` after `retryMaxTimes` + 1 deliveries; in-order groups get them again
//! in place, so the loop only wakes their receives.

use std::sync::Arc;
use std::time::Duration;

use std::ops::ControlFlow;

use crate::broker::{blocking, Broker};
use crate::error::chain;
use crate::pop::PopError;
use crate::service::pop::{move_message, Destination};

const REVIVE_INTERVAL: Duration = Duration::from_millis(500);
/// Expired messages one round handles at most.
const REVIVE_BATCH: usize = 4096;

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
        // A group a new master has no config for yet (copied once a second) is revived with
        // the defaults: skipped, its messages would stay in flight for good.
        let group = broker.groups().get_or_default(&key.group);
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
