//! The delivery of delayed messages: every [`SCAN_INTERVAL`] on the master, due messages of
//! the schedule topic's level queues go to their real topics (see `crate::schedule`).
//!
//! Each level's progress is the committed offset of [`DELAY_GROUP`] on the schedule topic's
//! queue of that level, written through the state log after every batch re-stored: it is
//! flushed and replicated with the CommitLog, so a new master goes on from where the old
//! one was (at most the batch in flight at a failover is delivered again).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quiver_protocol::message as msg;
use quiver_store::record::decode;
use quiver_store::{GetStatus, QueueOffset};
use serde::{Deserialize, Serialize};

use crate::broker::{blocking, Broker};
use crate::error::{chain, BrokerError};
use crate::periodic::{Flow, Round};
use crate::schedule::{released, DELAY_LEVELS_MS};
use crate::service::produce::{ensure_topic, store_message, StoreTarget};
use crate::state_log::{self, StateRecord};
use crate::topics::SCHEDULE_TOPIC;

/// The internal consumer group whose offsets are the delay levels' progress.
pub const DELAY_GROUP: &str = "CID_RMQ_SYS_QUIVER_DELAY";
/// How often due messages are looked for; delays are whole seconds, so this is precise enough.
const SCAN_INTERVAL: Duration = Duration::from_millis(100);
const SCAN_BATCH: u32 = 256;

/// The progress file of earlier versions, read once when the state log holds none.
#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DelayOffsets {
    offset_table: BTreeMap<u32, u64>,
}

fn legacy_offsets_path(broker: &Broker) -> PathBuf {
    broker
        .config()
        .data_dir
        .join("config")
        .join("delayOffset.json")
}

/// The delivery of delayed messages, one round every [`SCAN_INTERVAL`] on the master: moves
/// due messages to their real topics from the progress the state log holds.
pub(crate) struct DelayDelivery {
    broker: Arc<Broker>,
}

impl DelayDelivery {
    pub(crate) const EVERY: Duration = SCAN_INTERVAL;

    pub(crate) fn new(broker: Arc<Broker>) -> DelayDelivery {
        DelayDelivery { broker }
    }
}

impl Round for DelayDelivery {
    /// Only on the master, each round from the progress as the state log has it now (a new
    /// master's includes what the old one recorded).
    async fn round(&mut self) -> Flow {
        let broker = self.broker.clone();
        match blocking(&broker, deliver_due).await {
            Ok(Ok(())) => ControlFlow::Continue(None),
            Ok(Err(error)) => ControlFlow::Continue(Some(chain(&error))),
            Err(error) => {
                tracing::error!(error = %chain(&error), "schedule task failed");
                ControlFlow::Break(())
            }
        }
    }
}

/// The levels' progress: the state log's, else an earlier version's file (recorded in the
/// state log at once, so it is read only once).
fn progress(broker: &Broker) -> Result<Table, BrokerError> {
    let table: Table = broker
        .offsets()
        .table(DELAY_GROUP, SCHEDULE_TOPIC)
        .into_iter()
        .map(|(level, offset)| (level, offset.0))
        .collect();
    if !table.is_empty() {
        return Ok(table);
    }
    let legacy = crate::persist::read_json::<DelayOffsets>(&legacy_offsets_path(broker))?
        .unwrap_or_default()
        .offset_table;
    if !legacy.is_empty() {
        let record = StateRecord::commit(DELAY_GROUP, SCHEDULE_TOPIC, legacy.clone());
        state_log::append(broker, &record).map_err(record_error)?;
        tracing::info!(
            levels = legacy.len(),
            "delay offsets of delayOffset.json moved to the state log"
        );
    }
    Ok(legacy)
}

fn record_error(source: quiver_store::StoreError) -> BrokerError {
    BrokerError::Store {
        op: "record delay progress",
        source,
    }
}

type Table = BTreeMap<u32, u64>;

/// Re-stores every due message, recording each level's progress after every batch.
fn deliver_due(broker: &Broker) -> Result<(), BrokerError> {
    let mut table = progress(broker)?;
    // Retention keeps what is not delivered yet (`Broker::lowest_unread`).
    *broker.delay_delivered().lock() = table.clone();
    let now = crate::now_ms();
    for (index, delay_ms) in DELAY_LEVELS_MS.iter().enumerate() {
        deliver_level(broker, &mut table, index as u32, *delay_ms, now)?;
    }
    *broker.delay_delivered().lock() = table;
    Ok(())
}

/// Re-stores the due messages of one delay level, recording progress in `table` and the
/// state log after each batch stored (so a failure never re-delivers a stored batch).
fn deliver_level(
    broker: &Broker,
    table: &mut Table,
    queue_id: u32,
    delay_ms: i64,
    now: i64,
) -> Result<(), BrokerError> {
    let start = *table.get(&queue_id).unwrap_or(&0);
    let max = broker.store().max_offset(SCHEDULE_TOPIC, queue_id).0;
    let mut next = start.max(broker.store().min_offset(SCHEDULE_TOPIC, queue_id).0);
    while next < max {
        let got = broker
            .store()
            .get(
                SCHEDULE_TOPIC,
                queue_id,
                QueueOffset(next),
                SCAN_BATCH,
                16 * 1024 * 1024,
                &|_| true,
            )
            .map_err(|source| BrokerError::Store { op: "get", source })?;
        if got.status != GetStatus::Found {
            next = got
                .next_begin_offset
                .0
                .max(next + u64::from(got.messages.is_empty()));
            break;
        }
        let (due_targets, not_due) =
            due_in_batch(&got.messages, queue_id, delay_ms, now, &mut next);
        if !due_targets.is_empty() {
            for target in &due_targets {
                ensure_topic(broker, &target.topic);
            }
            store_message(broker, &due_targets)
                .map_err(|source| BrokerError::Store { op: "put", source })?;
        }
        record_progress(broker, table, queue_id, next)?;
        if not_due {
            break;
        }
    }
    record_progress(broker, table, queue_id, next)
}

/// Records a level's progress, in the state log when it moved.
fn record_progress(
    broker: &Broker,
    table: &mut Table,
    queue_id: u32,
    next: u64,
) -> Result<(), BrokerError> {
    // An absent level is at 0: nothing to record until it moves.
    if table.insert(queue_id, next).unwrap_or(0) == next {
        return Ok(());
    }
    let record = StateRecord::commit(DELAY_GROUP, SCHEDULE_TOPIC, [(queue_id, next)]);
    state_log::append(broker, &record).map_err(record_error)?;
    Ok(())
}

/// The due messages at the head of `messages`, moved past as they are taken (`next`), and
/// whether a message not yet due stopped the walk.
fn due_in_batch(
    messages: &[Bytes],
    queue_id: u32,
    delay_ms: i64,
    now: i64,
    next: &mut u64,
) -> (Vec<StoreTarget>, bool) {
    let mut due_targets = Vec::new();
    for raw in messages {
        let record = match decode(raw) {
            Ok((record, _)) => record,
            Err(error) => {
                tracing::error!(%error, queue_id, offset = *next, "undecodable scheduled message skipped");
                *next += 1;
                continue;
            }
        };
        if record.store_timestamp_ms + delay_ms > now {
            return (due_targets, true);
        }
        *next = record.queue_offset.0 + 1;
        match released(&record, &[msg::PROPERTY_DELAY]) {
            Some(target) => due_targets.push(target),
            None => tracing::warn!(queue_id, "scheduled message without REAL_TOPIC dropped"),
        }
    }
    (due_targets, false)
}
