//! The delivery of delayed messages: every [`SCAN_INTERVAL`] on the master, due messages of
//! the schedule topic's level queues go to their real topics (see `crate::schedule`).

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
use crate::topics::SCHEDULE_TOPIC;

/// How often due messages are looked for; delays are whole seconds, so this is precise enough.
const SCAN_INTERVAL: Duration = Duration::from_millis(100);
const SCAN_BATCH: u32 = 256;

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct DelayOffsets {
    offset_table: BTreeMap<u32, u64>,
}

fn offsets_path(broker: &Broker) -> PathBuf {
    broker
        .config()
        .data_dir
        .join("config")
        .join("delayOffset.json")
}

/// The delivery of delayed messages, one round every [`SCAN_INTERVAL`] on the master: moves
/// due messages to their real topics. The offsets delivered up to are loaded at the first
/// round and kept between rounds.
pub(crate) struct DelayDelivery {
    broker: Arc<Broker>,
    offsets: Option<DelayOffsets>,
}

impl DelayDelivery {
    pub(crate) const EVERY: Duration = SCAN_INTERVAL;

    pub(crate) fn new(broker: Arc<Broker>) -> DelayDelivery {
        DelayDelivery {
            broker,
            offsets: None,
        }
    }
}

impl Round for DelayDelivery {
    /// Only on the master (a new master starts from its own saved delay offsets: at worst
    /// it delivers again what the old one had delivered).
    async fn round(&mut self) -> Flow {
        let broker = self.broker.clone();
        let offsets = match &mut self.offsets {
            Some(offsets) => offsets,
            None => self.offsets.insert(load_offsets(&broker).await),
        };
        // Retention keeps what is not delivered yet (`Broker::lowest_unread`).
        *broker.delay_delivered().lock() = offsets.offset_table.clone();
        let table = std::mem::take(&mut offsets.offset_table);
        match blocking(&broker, move |broker| deliver_due(broker, table)).await {
            Ok(Ok(table)) => {
                offsets.offset_table = table;
                ControlFlow::Continue(None)
            }
            Ok(Err((table, error))) => {
                offsets.offset_table = table;
                ControlFlow::Continue(Some(chain(&error)))
            }
            Err(error) => {
                tracing::error!(error = %chain(&error), "schedule task failed");
                ControlFlow::Break(())
            }
        }
    }
}

async fn load_offsets(broker: &Arc<Broker>) -> DelayOffsets {
    let loaded = blocking(broker, |broker| {
        crate::persist::read_json::<DelayOffsets>(&offsets_path(broker))
    })
    .await;
    match loaded {
        Ok(Ok(found)) => found.unwrap_or_default(),
        Ok(Err(error)) | Err(error) => {
            tracing::error!(error = %chain(&error), "cannot load delay offsets; starting from the queue heads");
            DelayOffsets::default()
        }
    }
}

type Table = BTreeMap<u32, u64>;

/// Re-stores every due message; returns the advanced offsets (persisted when they moved).
fn deliver_due(broker: &Broker, mut table: Table) -> Result<Table, (Table, BrokerError)> {
    let now = crate::now_ms();
    let mut moved = false;
    for (index, delay_ms) in DELAY_LEVELS_MS.iter().enumerate() {
        match deliver_level(broker, &mut table, index as u32, *delay_ms, now) {
            Ok(level_moved) => moved |= level_moved,
            Err(error) => return Err((table, error)),
        }
    }
    if moved {
        if let Err(error) = crate::persist::write_json(
            &offsets_path(broker),
            &DelayOffsets {
                offset_table: table.clone(),
            },
        ) {
            return Err((table, error));
        }
    }
    Ok(table)
}

/// Re-stores the due messages of one delay level, recording progress in `table` after each
/// batch stored (so a failure never re-delivers a stored batch); true if the offset moved.
fn deliver_level(
    broker: &Broker,
    table: &mut Table,
    queue_id: u32,
    delay_ms: i64,
    now: i64,
) -> Result<bool, BrokerError> {
    let start = *table.get(&queue_id).unwrap_or(&0);
    let max = broker.store().max_offset(SCHEDULE_TOPIC, queue_id).0;
    let mut next = start.max(broker.store().min_offset(SCHEDULE_TOPIC, queue_id).0);
    let mut moved = false;
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
        moved |= next != start;
        table.insert(queue_id, next);
        if not_due {
            break;
        }
    }
    table.insert(queue_id, next);
    Ok(moved)
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
