//! The state log: consumer-group state changes (offset commits and resets, group deletions,
//! and the delay levels' progress as offsets of an internal group) kept as messages of an internal topic of the CommitLog, as Kafka keeps
//! `__consumer_offsets`. Through the one append pipeline a change is flushed with the flush
//! mode and copied to a group's replicas by the data plane, with no channel of its own.
//!
//! - The master (or a standalone broker) appends a record and applies it to its tables under
//!   [`ConsumerOffsets::log_position`], so the tables and the position move together.
//! - Replicas apply the records in log order as their confirmed log grows ([`catch_up`]);
//!   a member becoming master applies what it holds before it takes writes ([`take_over`]).
//! - The timer thread reads the `timerFired` records itself ([`timers_fired_since`]): they
//!   mark records of its own timer log, which no table holds.
//! - `consumerOffset.json` is a snapshot naming the position it covers; a start replays the
//!   records after it, so a commit answered before a kill -9 is not lost.

pub mod record;

use std::net::SocketAddr;
use std::sync::Arc;

use quiver_store::record::decode;
use quiver_store::{
    CommitLogOffset, ConsumerOffsets, GetStatus, MessageStore, NewMessage, PopState, QueueOffset,
    StoreError,
};

use crate::broker::Broker;
use crate::groups::GroupManager;
use crate::service::ServiceError;
pub use record::StateRecord;

pub use crate::topics::{STATE_QUEUE, STATE_TOPIC};
/// Records read per store get while catching up.
const READ_BATCH: u32 = 256;
const READ_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// What the state log's records change on a member.
pub struct Tables<'a> {
    pub offsets: &'a ConsumerOffsets,
    pub groups: &'a GroupManager,
    /// None where POP records are not applied (the master that wrote them).
    pub pop: Option<&'a PopState>,
}

impl<'a> Tables<'a> {
    /// Every table of `broker`.
    pub fn of(broker: &'a Broker) -> Tables<'a> {
        Tables {
            offsets: broker.offsets(),
            groups: broker.groups(),
            pop: Some(&broker.pop().state),
        }
    }
}

/// A message of the state topic carrying `body`, born and stored at `host`.
fn state_message(body: &[u8], born_timestamp_ms: i64, host: SocketAddr) -> NewMessage<'_> {
    NewMessage {
        topic: STATE_TOPIC,
        queue_id: STATE_QUEUE,
        flag: 0,
        body,
        properties: "",
        sys_flag: 0,
        born_timestamp_ms,
        born_host: host,
        store_host: host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// Appends `record` and applies it here, without waiting for durability (the record is in
/// the page cache: a kill -9 keeps it). Refused on a member that takes no writes. Returns
/// the CommitLog end to wait on with [`wait_held`].
pub fn append(broker: &Broker, record: &StateRecord) -> Result<CommitLogOffset, StoreError> {
    let body = record.encode();
    let end = {
        let _admitted = admit(broker)?;
        let mut position = broker.offsets().log_position();
        let message = state_message(&body, crate::now_ms(), broker.store_host());
        // The POP state logged its own record before handing it here.
        let tables = Tables {
            pop: None,
            ..Tables::of(broker)
        };
        // Commits go on when the store refuses writes (a full disk, a read-only or failed file
        // system: sends do not): kept in the tables, so an offset snapshot holds them when it
        // can, but not in the log. Checked first so that it is not counted as a refused write.
        let refused = broker.store().disk_status().refusal.filter(tables_only);
        let appended = match refused {
            Some(_) => None,
            None => match broker
                .store()
                .append(std::slice::from_ref(&message), crate::now_ms())
            {
                Ok(appended) => Some(appended),
                Err(StoreError::WritesRefused(refusal)) if tables_only(&refusal) => None,
                Err(error) => return Err(error),
            },
        };
        let Some(appended) = appended else {
            apply(&tables, record);
            // Nothing of it in the log to wait for.
            return Ok(CommitLogOffset(0));
        };
        apply(&tables, record);
        *position = appended.results[0].queue_offset.0 + 1;
        appended.end
    };
    if let Some(replication) = broker.replication() {
        replication.appended(broker.store());
    }
    Ok(end)
}

/// [`append`], answered once the record is as safe as a sent message: flushed in sync flush
/// mode, and held by the in-sync replicas in a sync group.
pub async fn write(broker: &Broker, record: &StateRecord) -> Result<(), ServiceError> {
    let end = append(broker, record)?;
    wait_held(broker, end).await
}

/// Waits until CommitLog bytes below `end` are as safe as an acknowledged message.
pub async fn wait_held(broker: &Broker, end: CommitLogOffset) -> Result<(), ServiceError> {
    broker.wait_durable(end).await?;
    if let Some(replication) = broker.replication() {
        replication.wait_confirmed(end).await?;
    }
    Ok(())
}

/// A refusal of the store itself (as opposed to a member that takes no writes), under which
/// a record is kept in the tables only, as commits were before they had a log.
fn tables_only(refusal: &quiver_store::WriteRefusal) -> bool {
    refusal.reason != quiver_store::RefusalReason::NotMaster
}

/// Whether this member may write the state log now; a replica's refusal names the master.
fn admit(broker: &Broker) -> Result<Option<parking_lot::RwLockReadGuard<'_, ()>>, StoreError> {
    let Some(replication) = broker.replication() else {
        return Ok(None);
    };
    replication.admit_write().map(Some).map_err(|refusal| {
        StoreError::WritesRefused(quiver_store::WriteRefusal {
            reason: quiver_store::RefusalReason::NotMaster,
            message: format!("consumer-group state is changed on the master: {refusal}"),
        })
    })
}

/// Applies one record to this member's tables.
pub fn apply(tables: &Tables<'_>, record: &StateRecord) {
    let Tables {
        offsets, groups, ..
    } = tables;
    match record {
        StateRecord::Commit {
            group,
            topic,
            offsets: queues,
        } => {
            let queues: Vec<(u32, QueueOffset)> = queues
                .iter()
                .map(|commit| (commit.queue_id, QueueOffset(commit.offset)))
                .collect();
            offsets.reset(group, topic, &queues);
        }
        StateRecord::DeleteGroup {
            group,
            drop_offsets,
        } => {
            groups.remove(group);
            if *drop_offsets {
                offsets.delete_group(group);
            }
        }
        StateRecord::Pop { record } => {
            let Some(pop) = tables.pop else {
                return;
            };
            let payload = serde_json::to_vec(record).unwrap_or_default();
            if let Err(error) = pop.apply_replicated(&payload) {
                tracing::warn!(error = %quiver_store::error_chain(&error), "cannot apply the master's POP record");
            }
        }
        // Read by the timer thread itself (`timers_fired_since`).
        StateRecord::TimerFired { .. } => {}
    }
}

/// The timer-queue offsets that `timerFired` records name, from state log offset `from` to
/// what this member can read (a replica: its confirmed log), and the offset to go on from.
pub fn timers_fired_since(store: &MessageStore, from: u64) -> Result<(Vec<u64>, u64), StoreError> {
    // Past a cut log's end (a returning member's unconfirmed tail), later records are new.
    let mut position = from.min(store.written_max_offset(STATE_TOPIC, STATE_QUEUE).0);
    let mut fired = Vec::new();
    loop {
        let got = store.get(
            STATE_TOPIC,
            STATE_QUEUE,
            QueueOffset(position),
            READ_BATCH,
            READ_MAX_BYTES,
            &|_| true,
        )?;
        match got.status {
            GetStatus::Found => {
                let records = got.messages.iter().filter_map(|bytes| {
                    let (message, _) = decode(bytes).ok()?;
                    StateRecord::decode(&message.body).ok()
                });
                for record in records {
                    if let StateRecord::TimerFired { queue_offsets } = record {
                        fired.extend(queue_offsets);
                    }
                }
                position = got.next_begin_offset.0;
            }
            GetStatus::OffsetTooSmall => position = got.min_offset.0,
            _ => return Ok((fired, position)),
        }
    }
}

/// Applies the records this member can read (up to its confirmed offset) that its tables
/// lack, in log order. Returns how many it applied.
pub fn catch_up(store: &MessageStore, tables: &Tables<'_>) -> Result<usize, StoreError> {
    let mut position = tables.offsets.log_position();
    let written = store.written_max_offset(STATE_TOPIC, STATE_QUEUE).0;
    if *position > written {
        // The log was cut back (a returning member's unconfirmed tail): records written
        // from here on are new ones.
        tracing::info!(
            from = *position,
            to = written,
            "state log position moved back to the end of this member's log"
        );
        *position = written;
    }
    let mut applied = 0;
    loop {
        let got = store.get(
            STATE_TOPIC,
            STATE_QUEUE,
            QueueOffset(*position),
            READ_BATCH,
            READ_MAX_BYTES,
            &|_| true,
        )?;
        match got.status {
            GetStatus::Found => {
                for bytes in &got.messages {
                    applied += apply_stored(tables, bytes);
                }
                *position = got.next_begin_offset.0;
            }
            GetStatus::OffsetTooSmall => {
                // Retention deleted records the snapshot did not cover: a rebuilt replica
                // fills what it lacks from the master's table (`replication::metadata`).
                tracing::warn!(
                    from = *position,
                    to = got.min_offset.0,
                    "state log records already deleted; going on from the oldest kept"
                );
                *position = got.min_offset.0;
            }
            _ => return Ok(applied),
        }
    }
}

/// Applies a stored state log message; 0 when it is no record this member knows.
fn apply_stored(tables: &Tables<'_>, bytes: &[u8]) -> usize {
    let record = decode(bytes)
        .map_err(|error| error.to_string())
        .and_then(|(message, _)| {
            StateRecord::decode(&message.body).map_err(|error| error.to_string())
        });
    match record {
        Ok(record) => {
            apply(tables, &record);
            1
        }
        Err(error) => {
            tracing::warn!(
                error,
                "skipping a state log message this member cannot read"
            );
            0
        }
    }
}

/// Before a member takes writes: applies every record it can read, then counts the rest of
/// its log (written, not yet confirmed: never acknowledged in sync mode) as covered, since
/// from here on its own appends change its tables directly.
pub fn take_over(store: &MessageStore, tables: &Tables<'_>) -> Result<usize, StoreError> {
    let applied = catch_up(store, tables)?;
    let written = store.written_max_offset(STATE_TOPIC, STATE_QUEUE).0;
    let mut position = tables.offsets.log_position();
    *position = (*position).max(written);
    Ok(applied)
}

/// A group member's POP state hands every record it logs to this: the master appends them
/// to the state log, in the POP state's order, from a task of its own (the hook must not
/// block). A record not appended (no longer master) is dropped: the new master's own.
pub(crate) fn hook_pop_records(broker: &Broker) -> tokio::sync::mpsc::UnboundedReceiver<Vec<u8>> {
    let (records, received) = tokio::sync::mpsc::unbounded_channel();
    broker.pop().state.set_record_hook(Box::new(move |payload| {
        let _ = records.send(payload.to_vec());
    }));
    received
}

/// Appends the POP records [`hook_pop_records`] hears until `stop` flips.
pub(crate) async fn forward_pop_records(
    broker: Arc<Broker>,
    mut records: tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let payload = tokio::select! {
            _ = stop.changed() => return,
            payload = records.recv() => match payload {
                Some(payload) => payload,
                None => return,
            },
        };
        let Some(record) = StateRecord::pop(&payload) else {
            continue;
        };
        if let Err(error) = append(&broker, &record) {
            tracing::debug!(error = %quiver_store::error_chain(&error), "POP record not copied to the replicas");
        }
    }
}

/// One round of a member that takes no writes: applies what its log gained.
pub(crate) async fn follow_round(broker: Arc<Broker>) -> crate::periodic::Flow {
    if broker.takes_writes() {
        return std::ops::ControlFlow::Continue(None);
    }
    let caught_up = crate::broker::blocking(&broker, |broker| {
        catch_up(broker.store(), &Tables::of(broker))
            .map_err(crate::error::BrokerError::store("apply the state log"))
    })
    .await;
    let failure = match caught_up {
        Ok(Ok(_)) => None,
        Ok(Err(error)) | Err(error) => Some(crate::error::chain(&error)),
    };
    std::ops::ControlFlow::Continue(failure)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use quiver_store::StoreConfig;

    use super::*;

    fn open_store(dir: &Path, publish_on_confirm: bool) -> MessageStore {
        MessageStore::open(StoreConfig {
            data_dir: dir.to_path_buf(),
            segment_size_bytes: quiver_store::MIN_SEGMENT_SIZE_BYTES,
            max_message_size_bytes: 16 * 1024,
            // The machine's own disk usage must not refuse writes here.
            disk_high_water_ratio: 1.0,
            disk_clean_ratio: 1.0,
            disk_force_clean_ratio: 1.0,
            publish_on_confirm,
            ..StoreConfig::default()
        })
        .unwrap()
    }

    /// Appends `record` as a master would, without applying it anywhere.
    fn log(store: &MessageStore, record: &StateRecord) -> CommitLogOffset {
        let body = record.encode();
        let host = "127.0.0.1:10911".parse().unwrap();
        store
            .append(&[state_message(&body, 1, host)], 1)
            .unwrap()
            .end
    }

    struct Member {
        offsets: ConsumerOffsets,
        groups: GroupManager,
    }

    impl Member {
        fn tables(&self) -> Tables<'_> {
            Tables {
                offsets: &self.offsets,
                groups: &self.groups,
                pop: None,
            }
        }
    }

    fn member(dir: &Path) -> Member {
        Member {
            offsets: ConsumerOffsets::load(&dir.join("config")).unwrap(),
            groups: GroupManager::load(dir, 16).unwrap(),
        }
    }

    #[test]
    fn records_apply_in_log_order_and_a_deletion_drops_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir.path().join("store"), false);
        let replica = member(dir.path());
        replica.groups.get_or_create("g");
        log(&store, &StateRecord::commit("g", "T", [(0, 5), (1, 7)]));
        log(&store, &StateRecord::commit("g", "T", [(0, 3)]));
        log(&store, &StateRecord::commit("h", "T", [(0, 9)]));
        let offsets = &replica.offsets;
        assert_eq!(catch_up(&store, &replica.tables()).unwrap(), 3);
        assert_eq!(
            offsets.query("g", "T", 0),
            Some(QueueOffset(3)),
            "a reset applies"
        );
        assert_eq!(offsets.query("g", "T", 1), Some(QueueOffset(7)));
        let delete = StateRecord::DeleteGroup {
            group: "g".into(),
            drop_offsets: true,
        };
        log(&store, &delete);
        assert_eq!(catch_up(&store, &replica.tables()).unwrap(), 1);
        assert_eq!(offsets.query("g", "T", 0), None);
        assert!(replica.groups.get("g").is_none());
        assert_eq!(offsets.query("h", "T", 0), Some(QueueOffset(9)));
        assert_eq!(*offsets.log_position(), 4);
    }

    #[test]
    fn a_restart_replays_only_what_its_snapshot_lacks() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir.path().join("store"), false);
        let before = member(dir.path());
        log(&store, &StateRecord::commit("g", "T", [(0, 5)]));
        catch_up(&store, &before.tables()).unwrap();
        before.offsets.persist().unwrap();
        // Changed in memory after the snapshot, then the log says otherwise: replay must
        // not apply the record the snapshot covers again, only the later one.
        log(&store, &StateRecord::commit("g", "T", [(1, 8)]));
        let after = member(dir.path());
        after.offsets.commit("g", "T", 0, QueueOffset(6));
        assert_eq!(catch_up(&store, &after.tables()).unwrap(), 1);
        assert_eq!(after.offsets.query("g", "T", 0), Some(QueueOffset(6)));
        assert_eq!(after.offsets.query("g", "T", 1), Some(QueueOffset(8)));
    }

    #[test]
    fn a_member_applies_only_confirmed_records_until_it_takes_over() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir.path().join("store"), true);
        let replica = member(dir.path());
        let offsets = &replica.offsets;
        let confirmed = log(&store, &StateRecord::commit("g", "T", [(0, 5)]));
        log(&store, &StateRecord::commit("g", "T", [(0, 6)]));
        store.confirm(confirmed);
        assert_eq!(catch_up(&store, &replica.tables()).unwrap(), 1);
        assert_eq!(offsets.query("g", "T", 0), Some(QueueOffset(5)));
        // The unconfirmed tail was never acknowledged: a new master counts it covered.
        assert_eq!(take_over(&store, &replica.tables()).unwrap(), 0);
        assert_eq!(*offsets.log_position(), 2);
    }

    #[test]
    fn the_timer_thread_reads_the_fired_marks_a_member_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir.path().join("store"), true);
        let fired = |queue_offsets: Vec<u64>| StateRecord::TimerFired { queue_offsets };
        log(&store, &fired(vec![0, 2]));
        log(&store, &StateRecord::commit("g", "T", [(0, 5)]));
        let confirmed = log(&store, &fired(vec![1]));
        log(&store, &fired(vec![7]));
        store.confirm(confirmed);
        assert_eq!(timers_fired_since(&store, 0).unwrap(), (vec![0, 2, 1], 3));
        assert_eq!(timers_fired_since(&store, 3).unwrap(), (vec![], 3));
        // A position past the log's end (a cut tail) goes on from that end.
        assert_eq!(timers_fired_since(&store, 9).unwrap(), (vec![], 4));
        store.confirm(store.log_end());
        assert_eq!(timers_fired_since(&store, 3).unwrap(), (vec![7], 4));
    }

    #[test]
    fn a_position_past_a_cut_log_moves_back_and_foreign_messages_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(&dir.path().join("store"), false);
        let replica = member(dir.path());
        let offsets = &replica.offsets;
        *offsets.log_position() = 10;
        assert_eq!(catch_up(&store, &replica.tables()).unwrap(), 0);
        assert_eq!(*offsets.log_position(), 0);
        let host = "127.0.0.1:10911".parse().unwrap();
        store
            .append(&[state_message(b"not a record", 1, host)], 1)
            .unwrap();
        log(&store, &StateRecord::commit("g", "T", [(2, 4)]));
        assert_eq!(catch_up(&store, &replica.tables()).unwrap(), 1);
        assert_eq!(offsets.query("g", "T", 2), Some(QueueOffset(4)));
        assert_eq!(*offsets.log_position(), 2);
    }
}
