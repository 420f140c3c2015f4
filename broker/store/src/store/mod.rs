//! `MessageStore`: the CommitLog, its ConsumeQueues, the flusher and recovery, behind one
//! narrow API. Writers serialise on one lock per put / put_batch; readers take snapshots.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::checkpoint::{self, Checkpoint};
use crate::commit_log::{CommitLog, LogWriter};
use crate::config::{FlushMode, StoreConfig};
use crate::consume_queue::{ConsumeQueue, Unit};
use crate::disk::{self, DiskStatus, RefusalReason, WriteGate, WriteRefusal};
use crate::dispatch::{is_safe_topic_dir, Dispatcher, QueueRegistry};
use crate::error::{chain, StoreError};
use crate::flush::{self, FlushControl, FlushTarget, FlushedHook};
use crate::index::{self, IndexProgress, IndexWriter, KeyMatch, MessageIndex};
use crate::mapped_file::sync_dir;
use crate::record::{self, NewMessage, Placement, Record, BLANK_FILLER_BYTES};
use crate::recovery::{self, RecoveryReport};
use crate::retention::{self, DeleteReason, Pressure, RetentionReport};
use crate::{CommitLogOffset, QueueOffset};

/// Where an appended message landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutResult {
    pub physical_offset: CommitLogOffset,
    pub queue_offset: QueueOffset,
    pub size: u32,
    pub store_timestamp_ms: i64,
}

/// Messages appended by [`MessageStore::append`], not yet known to be durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    pub results: Vec<PutResult>,
    /// The CommitLog end after them: they are durable once bytes below it are.
    pub end: CommitLogOffset,
}

/// The outcome of a pull from one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GetStatus {
    Found,
    /// Units were scanned but none passed the tag filter (or their records are gone).
    NoMatchedMessage,
    /// The queue is empty or does not exist.
    NoMessageInQueue,
    /// The offset is the max offset: nothing new yet (long-poll territory).
    OffsetOverflowOne,
    /// The offset is beyond the max offset.
    OffsetOverflowBadly,
    /// The offset is below the min offset (its files were deleted).
    OffsetTooSmall,
}

#[derive(Clone, Debug)]
pub struct GetResult {
    pub status: GetStatus,
    /// Whole encoded records, byte-exact: the pull body is their concatenation. Zero-copy
    /// views of the mapped CommitLog.
    pub messages: Vec<Bytes>,
    pub next_begin_offset: QueueOffset,
    pub min_offset: QueueOffset,
    pub max_offset: QueueOffset,
}

/// Which records a get returns: first by the ConsumeQueue unit's tags code (no CommitLog
/// read), then, if set, by the record's own bytes (in the mapping, before a view is made).
pub struct GetFilter<'a> {
    pub tags_code: &'a dyn Fn(i64) -> bool,
    pub record: Option<RecordFilter<'a>>,
}

/// Whether a get returns a record, judged on its stored bytes.
pub type RecordFilter<'a> = &'a dyn Fn(&[u8]) -> bool;

/// Messages found by key (QUERY_MESSAGE).
#[derive(Clone, Debug)]
pub struct QueryResult {
    /// Whole encoded records, oldest first: the response body is their concatenation.
    pub messages: Vec<Bytes>,
    /// How far the index has got.
    pub index: IndexProgress,
}

/// Tells the server a queue grew (to wake long polls).
#[derive(Clone, Copy, Debug)]
pub struct DispatchEvent<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub max_offset: QueueOffset,
}

/// Called after units are written; must be cheap and never block.
pub type DispatchHook = Arc<dyn Fn(&DispatchEvent<'_>) + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes between the min and max physical offsets.
    pub commitlog_bytes: u64,
    pub min_physical_offset: CommitLogOffset,
    pub max_physical_offset: CommitLogOffset,
    /// CommitLog bytes below this are durable.
    pub flushed_physical_offset: CommitLogOffset,
    pub consume_queues: usize,
    /// Of the data directory's file system.
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
}

/// A run of published CommitLog bytes for a replica ([`MessageStore::read_log`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    /// Whole records (or the blank filler that closes a segment), byte-exact: a zero-copy
    /// view of the mapped CommitLog. Empty at the log end.
    pub bytes: Bytes,
    /// Where the next chunk starts: after these bytes, or the next segment's base after a
    /// filler.
    pub next: CommitLogOffset,
}

/// What [`MessageStore::truncate_to`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TruncateReport {
    /// The log end before.
    pub old_end: CommitLogOffset,
    /// The log end now (the offset truncated to).
    pub new_end: CommitLogOffset,
    /// `old_end - new_end`.
    pub bytes: u64,
    /// CommitLog files deleted (wholly past the new end).
    pub deleted_segments: usize,
    /// Messages removed from each queue that lost some: (topic, queue id, count), sorted.
    pub messages: Vec<(String, u32, u64)>,
    /// Message index entries removed.
    pub index_entries: u64,
}

/// A unit written but not yet visible (`publish_on_confirm`): its queue's max offset moves
/// to `max` once the confirmed offset reaches `end`, its record's end.
struct PendingUnit {
    queue: Arc<ConsumeQueue>,
    max: u64,
    start: u64,
    end: u64,
}

/// The read fence of `publish_on_confirm`.
struct ConfirmState {
    /// Records below this are confirmed (acknowledged by the group): their units are visible.
    confirmed: u64,
    /// Units of unconfirmed records, in log order.
    pending: VecDeque<PendingUnit>,
}

/// What one replicated record or filler became.
enum Replicated {
    Message(PutResult, Arc<ConsumeQueue>),
    Filler(usize),
}

/// Units a single get scans at most, so a selective tag filter cannot stall a pull.
const MAX_UNITS_SCANNED_PER_GET: u64 = 800;

struct WriterState {
    log: LogWriter,
    dispatcher: Dispatcher,
    index: IndexWriter,
    /// Records recovery could not index (the disk was full), `[from, to)`: indexed before
    /// the next append's, and the checkpoint claims no index entry from `from` on.
    index_behind: Option<(u64, u64)>,
}

impl WriterState {
    /// Index entries exist for every record below this.
    fn indexed_to(&self) -> u64 {
        self.index_behind
            .map_or(self.log.write_pos(), |(from, _)| from)
    }
}

struct Shared {
    config: StoreConfig,
    commit_log: CommitLog,
    registry: QueueRegistry,
    index: MessageIndex,
    writer: Mutex<WriterState>,
    flush: FlushControl,
    hook: RwLock<Option<DispatchHook>>,
    shut_down: AtomicBool,
    report: RecoveryReport,
    /// One retention run at a time, so no file is chosen twice.
    retention: Mutex<()>,
    /// CommitLog files deleted since open, by `DeleteReason::ALL` index.
    deleted_segments: [AtomicU64; DeleteReason::ALL.len()],
    /// Whether writes are taken, and the last reading of the data file system.
    gate: WriteGate,
    /// The data directory's device and inode at open: a deleted one no longer matches.
    data_dir_identity: Option<(u64, u64)>,
    /// The dirty checkpoint could not be written at open (a full or read-only disk): writes
    /// stay refused until it is, so a crash never trusts an old clean one.
    dirty_checkpoint_pending: AtomicBool,
    /// Opened on a read-only file system: files are mapped read-only, so writes stay
    /// refused until a restart, even if the file system becomes writable.
    opened_read_only: bool,
    /// Holds the data directory's exclusive lock for the store's lifetime.
    _lock: std::fs::File,
    /// `publish_on_confirm`'s fence; taken after `writer` when both are.
    confirm: Mutex<ConfirmState>,
    /// Bumped by every truncation: a checkpoint computed before one is not written.
    truncations: AtomicU64,
    /// Held while a checkpoint is written, so a stale one never lands after a truncation's.
    checkpoint_lock: Mutex<()>,
}

/// The storage engine. `Send + Sync`; share it in an `Arc`. Call [`MessageStore::shutdown`]
/// for a clean stop; a store dropped without it recovers as after a crash.
pub struct MessageStore {
    shared: Arc<Shared>,
    /// The flusher and the housekeeper.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl FlushTarget for Shared {
    fn commit_log_committed(&self) -> u64 {
        self.commit_log.committed()
    }

    fn flush_commit_log(&self, from: u64, to: u64) -> std::io::Result<()> {
        self.commit_log.flush_range(from, to)
    }

    fn housekeeping(&self) -> Result<(), StoreError> {
        // Writing a checkpoint would re-create a deleted data directory.
        if self.data_dir_changed() {
            return Ok(());
        }
        let truncations = self.truncations.load(Ordering::Acquire);
        // Under the write lock every record below the write position has its unit written,
        // so all of them are covered once the queues are flushed (pending units aside).
        let (dispatched, indexed) = {
            let writer = self.writer.lock();
            (
                self.queues_durable_to(writer.log.write_pos()),
                writer.indexed_to(),
            )
        };
        for queue in self.all_queues() {
            queue.flush()?;
        }
        self.index.flush()?;
        let _checkpoint = self.checkpoint_lock.lock();
        if self.truncations.load(Ordering::Acquire) != truncations {
            // The log was cut back since: the truncation wrote its own checkpoint.
            return Ok(());
        }
        checkpoint::save(
            &self.config.data_dir,
            &Checkpoint {
                clean_shutdown: false,
                commit_log_durable_offset: self.flush.flushed(),
                consume_queue_durable_offset: dispatched,
                index_durable_offset: Some(indexed),
                confirmed_offset: self.checkpointed_confirm(u64::MAX),
            },
        )
    }
}

impl Shared {
    /// Whether the data directory was deleted or replaced since open.
    fn data_dir_changed(&self) -> bool {
        disk::dir_identity(&self.config.data_dir).ok() != self.data_dir_identity
    }

    /// A refusal for `reason`, its sentence naming the disk and its usage now.
    fn refusal(&self, reason: RefusalReason, detail: &str) -> WriteRefusal {
        let usage = disk::read_usage(&self.config.data_dir).unwrap_or_else(|_| self.gate.usage());
        let high_water = self.config.disk_high_water_ratio;
        WriteRefusal {
            reason,
            message: disk::describe(reason, &self.config.data_dir, &usage, high_water, detail),
        }
    }

    /// Closes the gate when `error` is the disk failing (full, read-only, EIO, a failed
    /// flush, the directory gone); returns what the writer should see: the refusal, or a
    /// failed flush as it is (those messages are not acknowledged).
    fn refuse_on_disk_error(&self, error: StoreError) -> StoreError {
        let reason = match &error {
            StoreError::FlushFailed { .. } => Some(RefusalReason::FsyncFailed),
            other => other.io_source().and_then(|source| {
                let gone = source.kind() == std::io::ErrorKind::NotFound && self.data_dir_changed();
                if gone {
                    Some(RefusalReason::DataDirGone)
                } else {
                    RefusalReason::of_io_error(source)
                }
            }),
        };
        let Some(reason) = reason else {
            return error;
        };
        let refusal = self.refusal(reason, &format!(" ({})", chain(&error)));
        self.gate.close(refusal.clone());
        match error {
            StoreError::FlushFailed { .. } => error,
            _ => self.gate.refuse(refusal),
        }
    }

    /// One look at the data file system: closes the gate or opens it again.
    fn watch_disk(&self) {
        if self.opened_read_only {
            self.gate.close(WriteRefusal {
                reason: RefusalReason::ReadOnlyFs,
                message: disk::describe_opened_read_only(&self.config.data_dir),
            });
            return;
        }
        if self.data_dir_changed() {
            self.gate
                .close(self.refusal(RefusalReason::DataDirGone, ""));
            return;
        }
        let usage = match disk::read_usage(&self.config.data_dir) {
            Ok(usage) => usage,
            Err(error) => {
                tracing::warn!(%error, data_dir = %self.config.data_dir.display(), "cannot read the data disk's usage");
                return;
            }
        };
        self.gate.record_usage(&usage);
        if let Some(error) = self.flush.failure() {
            self.gate
                .close(self.refusal(RefusalReason::FsyncFailed, &format!(" ({error})")));
        }
        let current = self.gate.refusal().map(|r| r.reason);
        let high_water = self.config.disk_high_water_ratio;
        let mut verdict = disk::judge(&usage, current, high_water);
        if verdict.is_none() && self.dirty_checkpoint_pending.load(Ordering::Acquire) {
            match self.housekeeping() {
                Ok(()) => self
                    .dirty_checkpoint_pending
                    .store(false, Ordering::Release),
                Err(error) => {
                    verdict = Some(
                        error
                            .io_source()
                            .and_then(RefusalReason::of_io_error)
                            .unwrap_or(RefusalReason::NoSpace),
                    )
                }
            }
        }
        match verdict {
            Some(reason) => self.gate.close(WriteRefusal {
                reason,
                message: disk::describe(reason, &self.config.data_dir, &usage, high_water, ""),
            }),
            None => {
                self.gate.open();
            }
        }
    }

    fn all_queues(&self) -> Vec<Arc<ConsumeQueue>> {
        self.registry
            .read()
            .values()
            .flat_map(|queues| queues.values().cloned())
            .collect()
    }

    fn queue(&self, topic: &str, queue_id: u32) -> Option<Arc<ConsumeQueue>> {
        self.registry.read().get(topic)?.get(&queue_id).cloned()
    }

    /// Where queue flushes cover every unit below `log_end` from: units still pending
    /// confirmation are not flushed (flushes stop at the published max), so a checkpoint
    /// claims queues only up to the first of them (recovery re-dispatches the rest).
    fn queues_durable_to(&self, log_end: u64) -> u64 {
        if !self.config.publish_on_confirm {
            return log_end;
        }
        self.confirm
            .lock()
            .pending
            .front()
            .map_or(log_end, |p| p.start.min(log_end))
    }

    /// The confirmed offset a checkpoint records (`publish_on_confirm` only), at most `cap`.
    fn checkpointed_confirm(&self, cap: u64) -> Option<u64> {
        self.config
            .publish_on_confirm
            .then(|| self.confirm.lock().confirmed.min(cap))
    }

    /// At open: the records from `confirmed` on were not known confirmed when the store
    /// stopped. Their units are hidden again (each queue shows only the units before its
    /// first such record) and wait for `confirm`, as a new append's would.
    fn hold_unconfirmed(&self, confirmed: u64) -> Result<(), StoreError> {
        let end = self.commit_log.committed();
        let mut held: Vec<PendingUnit> = Vec::new();
        let mut at = confirmed.max(self.commit_log.min_offset());
        while at < end {
            let bytes = self.commit_log.record_at(at)?;
            let next = match record::scan_with(&bytes, record::BodyCrc::Skip) {
                record::Scanned::Message(header) => {
                    if let Some(queue) = self.queue(header.topic, header.queue_id) {
                        held.push(PendingUnit {
                            queue,
                            max: header.queue_offset.0 + 1,
                            start: at,
                            end: at + u64::from(header.size),
                        });
                    }
                    at + u64::from(header.size)
                }
                // The blank filler that ends a segment: its size is the rest.
                _ => at + bytes.len() as u64,
            };
            if next <= at {
                break;
            }
            at = next;
        }
        let mut state = self.confirm.lock();
        state.confirmed = confirmed;
        let mut hidden: Vec<&Arc<ConsumeQueue>> = Vec::new();
        for unit in &held {
            if !hidden.iter().any(|q| Arc::ptr_eq(q, &unit.queue)) {
                unit.queue.publish(unit.max - 1);
                hidden.push(&unit.queue);
            }
        }
        tracing::info!(
            confirmed,
            end,
            units = held.len(),
            "records past the checkpointed confirmed offset wait for the group to confirm them"
        );
        state.pending.extend(held);
        Ok(())
    }

    /// Whether `queue` has units written up to at least `offset` that wait for `confirm`.
    fn written_unconfirmed(&self, queue: &Arc<ConsumeQueue>, offset: u64) -> bool {
        self.pending_end(queue).is_some_and(|end| offset <= end)
    }

    /// The end of `queue`'s units that wait for `confirm`, if it has any.
    fn pending_end(&self, queue: &Arc<ConsumeQueue>) -> Option<u64> {
        if !self.config.publish_on_confirm {
            return None;
        }
        self.confirm
            .lock()
            .pending
            .iter()
            .rev()
            .find(|unit| Arc::ptr_eq(&unit.queue, queue))
            .map(|unit| unit.max)
    }

    /// Whether the record at `offset`, `len` bytes, may be read by clients: with
    /// `publish_on_confirm`, only once it is confirmed.
    fn readable(&self, offset: u64, len: usize) -> bool {
        !self.config.publish_on_confirm || offset + len as u64 <= self.confirm.lock().confirmed
    }

    /// Publishes the pending units the confirmed offset covers, in order, and tells the hook.
    fn release_confirmed(&self) {
        let mut grown: Vec<(Arc<ConsumeQueue>, u64)> = Vec::new();
        {
            let mut state = self.confirm.lock();
            let confirmed = state.confirmed;
            while state.pending.front().is_some_and(|p| p.end <= confirmed) {
                let unit = state.pending.pop_front().expect("checked above");
                unit.queue.publish(unit.max);
                match grown.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &unit.queue)) {
                    Some((_, max)) => *max = unit.max,
                    None => grown.push((unit.queue, unit.max)),
                }
            }
        }
        for (queue, max) in grown {
            self.notify(queue.topic(), queue.queue_id(), max);
        }
    }

    /// Tells the hook about the queues `results` grew (default mode: they are visible).
    fn notify_appended(&self, results: &[PutResult], queues: &[Arc<ConsumeQueue>]) {
        if self.config.publish_on_confirm {
            self.release_confirmed();
            return;
        }
        for (i, (result, queue)) in results.iter().zip(queues).enumerate() {
            let next_same_queue = queues.get(i + 1).is_some_and(|n| Arc::ptr_eq(n, queue));
            if !next_same_queue {
                self.notify(queue.topic(), queue.queue_id(), result.queue_offset.0 + 1);
            }
        }
    }

    /// Appends one record of a chunk read from the master (`rest` starts with it), or the
    /// blank filler that ends the chunk; the caller holds the write lock and publishes.
    fn append_replicated_one(
        &self,
        writer: &mut WriterState,
        rest: &[u8],
    ) -> Result<Replicated, StoreError> {
        let offset = CommitLogOffset(writer.log.write_pos());
        let bad = |reason: &str| StoreError::ReplicaBadChunk {
            offset,
            reason: reason.to_owned(),
        };
        let segment_mismatch = |reason: String| StoreError::ReplicaSegmentMismatch {
            offset,
            segment_size: self.commit_log.segment_size(),
            reason,
        };
        let Some(head) = record::head(rest) else {
            return Err(bad("shorter than a record header"));
        };
        let size = head.size;
        if head.is_blank() {
            let remaining = writer.log.tail_remaining();
            if i64::from(size) != remaining as i64 {
                return Err(segment_mismatch(format!(
                    "the master's blank filler is {size} bytes, the replica's segment has {remaining} left"
                )));
            }
            if rest.len() != size as usize {
                return Err(bad("a blank filler must end the chunk, whole"));
            }
            self.commit_log.close_tail(&mut writer.log)?;
            return Ok(Replicated::Filler(size as usize));
        }
        let size = usize::try_from(size)
            .ok()
            .filter(|s| *s > BLANK_FILLER_BYTES && *s <= rest.len())
            .ok_or_else(|| bad("record size out of range"))?;
        let bytes = &rest[..size];
        let header = match record::scan_with(bytes, record::BodyCrc::Verify) {
            record::Scanned::Message(header) => header,
            record::Scanned::Damaged(source) => {
                return Err(StoreError::BadRecord { offset, source })
            }
            _ => return Err(bad("not a message record")),
        };
        if header.physical_offset != offset {
            return Err(StoreError::ReplicaOffsetMismatch {
                expected: offset,
                found: header.physical_offset,
            });
        }
        let remaining = writer.log.tail_remaining();
        if remaining > 0 && (size + BLANK_FILLER_BYTES) as u64 > remaining {
            return Err(segment_mismatch(format!(
                "a record of {size} bytes does not fit the {remaining} bytes left in the replica's segment"
            )));
        }
        let WriterState {
            log,
            dispatcher,
            index: index_writer,
            ..
        } = writer;
        let queue = dispatcher.queue(&self.registry, header.topic, header.queue_id)?;
        let queue_offset = header.queue_offset;
        if queue_offset.0 != queue.next_offset {
            return Err(StoreError::ReplicaQueueOffsetMismatch {
                offset,
                topic: header.topic.to_owned(),
                queue_id: header.queue_id,
                expected: queue.next_offset,
                found: queue_offset.0,
            });
        }
        queue.cq.prepare(&mut queue.tail, queue_offset.0)?;
        let keys = index::index_keys(header.properties)
            .take(index_writer.max_entries_per_record() as usize);
        index_writer.prepare(&self.index, log.write_pos(), keys.clone().count() as u32)?;
        // The same segment size makes the same fill-or-roll decision as on the master.
        let placed = self.commit_log.append(log, size, true, |dst, _| {
            dst.copy_from_slice(bytes);
            Ok::<(), StoreError>(())
        })?;
        assert_eq!(
            placed, offset,
            "replicated record placed elsewhere than checked"
        );
        queue.stage(Unit {
            physical_offset: offset.0,
            size: size as u32,
            tags_code: header.tags_code(),
        });
        for key in keys {
            index_writer.stage(header.topic, key, offset.0, header.store_timestamp_ms);
        }
        let result = PutResult {
            physical_offset: offset,
            queue_offset,
            size: size as u32,
            store_timestamp_ms: header.store_timestamp_ms,
        };
        Ok(Replicated::Message(result, Arc::clone(&queue.cq)))
    }

    /// Whether a record or a blank filler starts at `offset` (below the log end).
    fn is_record_boundary(&self, offset: u64) -> bool {
        let Ok(bytes) = self.commit_log.record_at(offset) else {
            return false;
        };
        match record::scan_with(&bytes, record::BodyCrc::Skip) {
            record::Scanned::Message(header) => header.physical_offset.0 == offset,
            record::Scanned::Blank { .. } => true,
            _ => false,
        }
    }

    fn notify(&self, topic: &str, queue_id: u32, max_offset: u64) {
        if let Some(hook) = self.hook.read().as_ref() {
            hook(&DispatchEvent {
                topic,
                queue_id,
                max_offset: QueueOffset(max_offset),
            });
        }
    }

    /// Appends one message and writes its unit and index entries, all unpublished until
    /// `publish_appended`; the caller holds the write lock. Returns the queue for
    /// `publish_appended`.
    fn append(
        &self,
        writer: &mut WriterState,
        msg: &NewMessage<'_>,
        in_batch: bool,
        now_ms: i64,
    ) -> Result<(PutResult, Arc<ConsumeQueue>), StoreError> {
        let size = self.check_size(msg)?;
        let WriterState {
            log,
            dispatcher,
            index: index_writer,
            ..
        } = writer;
        let queue = dispatcher.queue(&self.registry, msg.topic, msg.queue_id)?;
        let queue_offset = QueueOffset(queue.next_offset);
        queue.cq.prepare(&mut queue.tail, queue_offset.0)?;
        let keys =
            index::index_keys(msg.properties).take(index_writer.max_entries_per_record() as usize);
        index_writer.prepare(&self.index, log.write_pos(), keys.clone().count() as u32)?;
        let physical_offset =
            self.commit_log
                .append(log, size, in_batch, |dst, physical_offset| {
                    let placement = Placement {
                        queue_offset,
                        physical_offset,
                        store_timestamp_ms: now_ms,
                    };
                    record::encode_into(dst, msg, placement)
                        .map(drop)
                        .map_err(StoreError::InvalidMessage)
                })?;
        let tags_code =
            record::property(msg.properties, record::TAGS_PROPERTY).map_or(0, record::tags_code);
        queue.stage(Unit {
            physical_offset: physical_offset.0,
            size: size as u32,
            tags_code,
        });
        for key in keys {
            index_writer.stage(msg.topic, key, physical_offset.0, now_ms);
        }
        let result = PutResult {
            physical_offset,
            queue_offset,
            size: size as u32,
            store_timestamp_ms: now_ms,
        };
        Ok((result, Arc::clone(&queue.cq)))
    }

    /// Writes the staged records, then publishes them, then their units: a reader who sees a
    /// unit sees its record. `queues[i]` holds `results[i]`. Records a failed write left out
    /// are not published, and their queues hand out the same offsets again.
    fn publish_appended(
        &self,
        writer: &mut WriterState,
        results: &[PutResult],
        queues: &[Arc<ConsumeQueue>],
    ) -> Result<(), StoreError> {
        let written = self.commit_log.write_staged(&mut writer.log);
        let log_end = writer.log.write_pos();
        for (result, queue) in results.iter().zip(queues).rev() {
            if result.physical_offset.0 >= log_end {
                writer
                    .dispatcher
                    .queue(&self.registry, queue.topic(), queue.queue_id())?
                    .unstage(result.queue_offset.0);
            }
        }
        writer.index.unstage_from(&self.index, log_end);
        self.commit_log.publish(log_end);
        if self.config.publish_on_confirm {
            // Visible once confirmed (`release_confirmed`); the records themselves are
            // published above, for replicas.
            let mut state = self.confirm.lock();
            for (result, queue) in results.iter().zip(queues) {
                if result.physical_offset.0 < log_end {
                    state.pending.push_back(PendingUnit {
                        queue: Arc::clone(queue),
                        max: result.queue_offset.0 + 1,
                        start: result.physical_offset.0,
                        end: result.physical_offset.0 + u64::from(result.size),
                    });
                }
            }
        } else {
            for (result, queue) in results.iter().zip(queues) {
                if result.physical_offset.0 < log_end {
                    queue.publish(result.queue_offset.0 + 1);
                }
            }
        }
        writer.index.publish();
        written
    }

    /// `MessageStore::truncate_to` past its checks, under the write lock.
    fn truncate_locked(
        &self,
        writer: &mut WriterState,
        offset: u64,
        report: &mut TruncateReport,
    ) -> Result<(), StoreError> {
        // First a checkpoint that claims nothing from `offset` on, so a crash part-way
        // leaves a store that recovery makes whole: the records still in the log are
        // re-dispatched and re-indexed (the truncation did not happen), or the log ends at
        // `offset`. A checkpoint computed before is dropped (`truncations`).
        self.truncations.fetch_add(1, Ordering::AcqRel);
        for queue in self.all_queues() {
            queue.flush()?;
        }
        self.index.flush()?;
        {
            let _checkpoint = self.checkpoint_lock.lock();
            checkpoint::save(
                &self.config.data_dir,
                &Checkpoint {
                    clean_shutdown: false,
                    commit_log_durable_offset: self.flush.flushed().min(offset),
                    consume_queue_durable_offset: self
                        .queues_durable_to(writer.log.write_pos())
                        .min(offset),
                    index_durable_offset: Some(writer.indexed_to().min(offset)),
                    confirmed_offset: self.checkpointed_confirm(offset),
                },
            )?;
        }
        {
            let mut state = self.confirm.lock();
            let kept = state.pending.partition_point(|p| p.start < offset);
            state.pending.truncate(kept);
            state.confirmed = state.confirmed.min(offset);
        }
        // Readers lose the units and index entries first, then the records.
        report.messages = writer.dispatcher.truncate_past(offset)?;
        report.index_entries = writer.index.truncate(&self.index, offset)?;
        writer.index_behind = writer
            .index_behind
            .filter(|(from, _)| *from < offset)
            .map(|(from, to)| (from, to.min(offset)));
        let (_, deleted) = self.commit_log.truncate(&mut writer.log, offset)?;
        report.deleted_segments = deleted;
        report.bytes = report.old_end.0 - offset;
        self.flush.rewind(offset);
        Ok(())
    }

    /// Indexes the records recovery could not (the disk was full), before any new one.
    fn catch_up_index(&self, writer: &mut WriterState) -> Result<(), StoreError> {
        while let Some((from, to)) = writer.index_behind {
            // Retention may have deleted records since.
            let at = from.max(self.commit_log.min_offset());
            if at >= to {
                writer.index_behind = None;
                break;
            }
            let bytes = self.commit_log.record_at(at)?;
            let next = match record::scan_with(&bytes, record::BodyCrc::Skip) {
                record::Scanned::Message(header) => {
                    writer.index.reindex(&self.index, &header)?;
                    at + u64::from(header.size)
                }
                // The blank filler that ends a segment: its size is the rest.
                _ => at + bytes.len() as u64,
            };
            if next <= at {
                tracing::warn!(at, "cannot read on to index the records recovery could not");
                writer.index_behind = None;
                break;
            }
            writer.index_behind = Some((next, to));
        }
        Ok(())
    }

    fn check_size(&self, msg: &NewMessage<'_>) -> Result<usize, StoreError> {
        let size = record::encoded_len(msg).map_err(StoreError::InvalidMessage)?;
        if size > self.config.max_message_size_bytes as usize {
            return Err(StoreError::MessageTooLarge {
                size: size as u64,
                max: self.config.max_message_size_bytes,
            });
        }
        Ok(size)
    }

    fn wait_durable(&self, end: u64) -> Result<(), StoreError> {
        match self.config.flush_mode {
            FlushMode::Sync => self
                .flush
                .wait_durable(end)
                .map_err(|error| self.refuse_on_disk_error(error)),
            FlushMode::Async => Ok(()),
        }
    }

    fn flush_all(&self) -> Result<(), StoreError> {
        let rewinds = self.flush.rewinds();
        let committed = self.commit_log.committed();
        let flushed = self.flush.flushed();
        self.flush.complete(
            rewinds,
            committed,
            self.commit_log.flush_range(flushed, committed),
        )?;
        for queue in self.all_queues() {
            queue.flush()?;
        }
        self.index.flush()
    }
}

/// Takes an exclusive `flock` on `<data_dir>/lock` (on the directory itself on a read-only
/// file system): two stores on one directory would corrupt each other. The kernel drops it
/// when the process dies, even by kill -9.
fn lock_data_dir(data_dir: &std::path::Path, read_only: bool) -> Result<std::fs::File, StoreError> {
    let path = if read_only {
        data_dir.to_path_buf()
    } else {
        data_dir.join("lock")
    };
    let opened = if read_only {
        std::fs::File::open(&path)
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
    };
    let file = opened.map_err(|e| StoreError::io("open lock file", &path, e))?;
    let mut attempts = 0;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            // A child this process is spawning shares the previous holder's lock until it
            // execs, and a stopping process lets go a moment late: wait that moment out.
            Err(rustix::io::Errno::WOULDBLOCK) if attempts < LOCK_ATTEMPTS => {
                attempts += 1;
                std::thread::sleep(LOCK_RETRY);
            }
            Err(errno) => {
                return Err(StoreError::Locked {
                    path,
                    source: errno.into(),
                })
            }
        }
    }
}

/// How long a held data directory lock is waited for before the store refuses to open:
/// `LOCK_ATTEMPTS` x `LOCK_RETRY`, 2 s.
const LOCK_ATTEMPTS: u32 = 20;
const LOCK_RETRY: Duration = Duration::from_millis(100);

/// Writes the checkpoint that marks the store dirty until `shutdown()`. On a full or read-only
/// disk that fails: the store then opens refusing writes until it can be written (the reason
/// and the error are returned for the gate).
fn save_dirty_checkpoint(
    config: &StoreConfig,
    log_end: u64,
    indexed_to: u64,
    confirmed: u64,
) -> Result<Option<(RefusalReason, StoreError)>, StoreError> {
    let saved = checkpoint::save(
        &config.data_dir,
        &Checkpoint {
            clean_shutdown: false,
            commit_log_durable_offset: log_end,
            consume_queue_durable_offset: log_end,
            index_durable_offset: Some(indexed_to),
            confirmed_offset: config.publish_on_confirm.then_some(confirmed),
        },
    );
    match saved {
        Ok(()) => Ok(None),
        Err(error) => match error.io_source().and_then(RefusalReason::of_io_error) {
            Some(reason) => Ok(Some((reason, error))),
            None => Err(error),
        },
    }
}

/// What one of the store's threads runs.
type StoreThread = fn(&Shared);

/// The store's threads: the flusher, the housekeeper and the disk watcher. If one cannot
/// start, those started are stopped and joined.
fn spawn_threads(shared: &Arc<Shared>) -> Result<Vec<JoinHandle<()>>, StoreError> {
    let runs: [(&str, StoreThread); 3] = [
        ("quiver-store-flush", |shared| {
            let config = &shared.config;
            flush::run_flusher(
                &shared.flush,
                shared,
                config.flush_mode,
                Duration::from_millis(config.flush_interval_ms),
                flush::least_bytes(config.flush_least_pages),
            )
        }),
        ("quiver-store-checkpoint", |shared| {
            let interval = Duration::from_millis(shared.config.flush_interval_ms);
            flush::run_housekeeper(&shared.flush, shared, interval)
        }),
        ("quiver-store-disk", |shared| {
            let interval = Duration::from_millis(shared.config.disk_check_interval_ms);
            while shared.flush.wait_while_running(interval) {
                shared.watch_disk();
            }
        }),
    ];
    let mut threads = Vec::with_capacity(runs.len());
    for (name, run) in runs {
        let shared_for_thread = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(&shared_for_thread));
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                shared.flush.stop();
                threads.into_iter().for_each(|thread| drop(thread.join()));
                return Err(StoreError::io("spawn thread", &shared.config.data_dir, e));
            }
        }
    }
    Ok(threads)
}

impl MessageStore {
    /// Opens the store under `config.data_dir`, running recovery first.
    pub fn open(config: StoreConfig) -> Result<MessageStore, StoreError> {
        config.validate()?;
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| StoreError::io("create directory", &config.data_dir, e))?;
        // On a read-only file system the store serves what it has and refuses writes until
        // it is restarted on a writable one.
        let opened_read_only = disk::read_usage(&config.data_dir).is_ok_and(|u| u.read_only);
        let lock = lock_data_dir(&config.data_dir, opened_read_only)?;
        let recovered = recovery::recover(&config)?;
        tracing::info!(data_dir = %config.data_dir.display(), "store recovered: {}", recovered.report);
        let log = recovered.commit_log.writer(recovered.log_end)?;
        if !opened_read_only {
            sync_dir(&config.data_dir)?;
        }
        let indexed_to = recovered
            .index_behind
            .map_or(recovered.log_end, |(from, _)| from);
        // A group member shows only what its group had confirmed before it stopped: the rest
        // may yet be truncated by the group's next epoch.
        let confirmed = if config.publish_on_confirm {
            recovered.confirmed_offset.unwrap_or(0)
        } else {
            recovered.log_end
        };
        let pending = save_dirty_checkpoint(&config, recovered.log_end, indexed_to, confirmed)?;
        let usage = disk::read_usage(&config.data_dir)
            .map_err(|e| StoreError::io("statvfs", &config.data_dir, e))?;
        let shared = Arc::new(Shared {
            gate: WriteGate::new(usage),
            data_dir_identity: disk::dir_identity(&config.data_dir).ok(),
            dirty_checkpoint_pending: AtomicBool::new(pending.is_some()),
            opened_read_only,
            deleted_segments: Default::default(),
            flush: FlushControl::new(recovered.log_end),
            commit_log: recovered.commit_log,
            registry: recovered.registry,
            index: recovered.index,
            writer: Mutex::new(WriterState {
                log,
                dispatcher: recovered.dispatcher,
                index: recovered.index_writer,
                index_behind: recovered.index_behind,
            }),
            hook: RwLock::new(None),
            shut_down: AtomicBool::new(false),
            report: recovered.report,
            config,
            retention: Mutex::new(()),
            _lock: lock,
            // Recovery published every unit; `hold_unconfirmed` hides the unconfirmed again.
            confirm: Mutex::new(ConfirmState {
                confirmed: recovered.log_end,
                pending: VecDeque::new(),
            }),
            truncations: AtomicU64::new(0),
            checkpoint_lock: Mutex::new(()),
        });
        if let Some((reason, error)) = pending {
            shared
                .gate
                .close(shared.refusal(reason, &format!(" ({})", chain(&error))));
        }
        if confirmed < shared.commit_log.committed() {
            shared.hold_unconfirmed(confirmed)?;
        }
        shared.watch_disk();
        let threads = spawn_threads(&shared)?;
        Ok(MessageStore {
            shared,
            threads: Mutex::new(threads),
        })
    }

    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.shared.report
    }

    /// Appends one message. Sync mode returns once it is durable (group commit); it is
    /// visible to `get` when this returns (with `publish_on_confirm`, once confirmed).
    pub fn put(&self, msg: &NewMessage<'_>, now_ms: i64) -> Result<PutResult, StoreError> {
        let appended = self.append(std::slice::from_ref(msg), now_ms)?;
        self.shared.wait_durable(appended.end.0)?;
        Ok(appended.results[0])
    }

    /// Appends messages under one lock and one durability wait. Sizes are checked before
    /// anything is written; an I/O error part-way leaves the earlier messages stored.
    pub fn put_batch(
        &self,
        msgs: &[NewMessage<'_>],
        now_ms: i64,
    ) -> Result<Vec<PutResult>, StoreError> {
        let appended = self.append(msgs, now_ms)?;
        self.shared.wait_durable(appended.end.0)?;
        Ok(appended.results)
    }

    /// Appends messages under one lock without waiting for durability: visible to `get` at
    /// once (with `publish_on_confirm`, once `confirm` covers them); in Sync mode acknowledge them only after `request_durable` / `durable_status`
    /// say `end` is durable. Never blocks on the disk (page faults aside).
    pub fn append(&self, msgs: &[NewMessage<'_>], now_ms: i64) -> Result<Appended, StoreError> {
        let shared = &*self.shared;
        for msg in msgs {
            shared.check_size(msg)?;
        }
        shared.gate.check()?;
        let mut results = Vec::with_capacity(msgs.len());
        let mut queues = Vec::with_capacity(msgs.len());
        let end = {
            let mut writer = shared.writer.lock();
            if shared.shut_down.load(Ordering::Acquire) {
                return Err(StoreError::ShutDown);
            }
            shared
                .catch_up_index(&mut writer)
                .map_err(|error| shared.refuse_on_disk_error(error))?;
            let mut failure = None;
            for msg in msgs {
                match shared.append(&mut writer, msg, msgs.len() > 1, now_ms) {
                    Ok((result, queue)) => {
                        results.push(result);
                        queues.push(queue);
                    }
                    Err(error) => {
                        failure = Some(shared.refuse_on_disk_error(error));
                        break;
                    }
                }
            }
            // The messages before a failure stay stored, as before staging.
            shared
                .publish_appended(&mut writer, &results, &queues)
                .map_err(|error| shared.refuse_on_disk_error(error))?;
            if let Some(error) = failure {
                return Err(error);
            }
            writer.log.write_pos()
        };
        shared.notify_appended(&results, &queues);
        Ok(Appended {
            results,
            end: CommitLogOffset(end),
        })
    }

    /// Joins group commit for CommitLog bytes below `end` without blocking; `true` when they
    /// are already durable (always in Async mode). Then wait for the flushed hook and ask
    /// `durable_status`.
    pub fn request_durable(&self, end: CommitLogOffset) -> bool {
        match self.shared.config.flush_mode {
            FlushMode::Sync => self.shared.flush.request(end.0),
            FlushMode::Async => true,
        }
    }

    /// Whether bytes below `end` are durable: `None` while a flush may still cover them;
    /// an error when the flush covering them failed or the store stopped.
    pub fn durable_status(&self, end: CommitLogOffset) -> Option<Result<(), StoreError>> {
        match self.shared.config.flush_mode {
            FlushMode::Sync => self
                .shared
                .flush
                .durable_status(end.0)
                .map(|status| status.map_err(|error| self.shared.refuse_on_disk_error(error))),
            FlushMode::Async => Some(Ok(())),
        }
    }

    /// Runs `hook` on the flusher thread after every flush and at shutdown, so non-blocking
    /// writers know when to look at `durable_status` again. It must not block.
    pub fn set_flushed_hook(&self, hook: FlushedHook) {
        self.shared.flush.set_flushed_hook(hook);
    }

    /// Reads up to `max_msgs` records (and about `max_bytes`, at least one) from `offset`,
    /// skipping those whose tags code fails `tag_filter`.
    pub fn get(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
        max_msgs: u32,
        max_bytes: u64,
        tag_filter: &dyn Fn(i64) -> bool,
    ) -> Result<GetResult, StoreError> {
        let filter = GetFilter {
            tags_code: tag_filter,
            record: None,
        };
        self.get_filtered(topic, queue_id, offset, max_msgs, max_bytes, &filter)
    }

    /// [`MessageStore::get`] with a second filter on each record's bytes (a property
    /// filter), run after the tags code one; what it skips counts towards neither limit.
    pub fn get_filtered(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
        max_msgs: u32,
        max_bytes: u64,
        filter: &GetFilter<'_>,
    ) -> Result<GetResult, StoreError> {
        let empty = |status, next, min, max| GetResult {
            status,
            messages: Vec::new(),
            next_begin_offset: QueueOffset(next),
            min_offset: QueueOffset(min),
            max_offset: QueueOffset(max),
        };
        let Some(queue) = self.shared.queue(topic, queue_id) else {
            return Ok(empty(GetStatus::NoMessageInQueue, 0, 0, 0));
        };
        let (min, max) = (queue.min_offset(), queue.max_offset());
        let offset = offset.0;
        if offset > max && self.shared.written_unconfirmed(&queue, offset) {
            // Written but not confirmed yet (a restarted member, a replica behind the fence):
            // nothing to read yet, and the reader's position stands.
            return Ok(empty(GetStatus::OffsetOverflowOne, offset, min, max));
        }
        if max == 0 {
            return Ok(empty(GetStatus::NoMessageInQueue, 0, min, max));
        }
        if offset < min {
            return Ok(empty(GetStatus::OffsetTooSmall, min, min, max));
        }
        if offset == max {
            return Ok(empty(GetStatus::OffsetOverflowOne, offset, min, max));
        }
        if offset > max {
            // RocketMQ's correction: back to the start of a queue that begins at 0, else the
            // end. A group member's reader past everything written read a tail a failover
            // cut: back to the start, so it receives again rather than skips what follows.
            let next = if min == 0 || self.shared.config.publish_on_confirm {
                min
            } else {
                max
            };
            return Ok(empty(GetStatus::OffsetOverflowBadly, next, min, max));
        }
        let units = queue.snapshot();
        let log = self.shared.commit_log.snapshot();
        let log_min = log.first().map_or(0, |s| s.base());
        let scan_end = max.min(offset + MAX_UNITS_SCANNED_PER_GET.max(u64::from(max_msgs)));
        let mut messages = Vec::new();
        let mut bytes_total = 0u64;
        let mut next = offset;
        while next < scan_end && messages.len() < max_msgs as usize {
            let Some(unit) = queue.unit(&units, next) else {
                break;
            };
            if unit.is_empty()
                || unit.physical_offset < log_min
                || !(filter.tags_code)(unit.tags_code)
            {
                next += 1;
                continue;
            }
            if !messages.is_empty() && bytes_total + u64::from(unit.size) > max_bytes {
                break;
            }
            if let Some(record) = self.shared.commit_log.view_if(
                &log,
                unit.physical_offset,
                unit.size as usize,
                filter.record,
            ) {
                bytes_total += u64::from(unit.size);
                messages.push(record);
            }
            next += 1;
        }
        let status = if messages.is_empty() {
            GetStatus::NoMatchedMessage
        } else {
            GetStatus::Found
        };
        Ok(GetResult {
            status,
            messages,
            next_begin_offset: QueueOffset(next),
            min_offset: QueueOffset(min),
            max_offset: QueueOffset(max),
        })
    }

    /// Units written to the queue; 0 when it does not exist.
    pub fn max_offset(&self, topic: &str, queue_id: u32) -> QueueOffset {
        QueueOffset(
            self.shared
                .queue(topic, queue_id)
                .map_or(0, |q| q.max_offset()),
        )
    }

    pub fn min_offset(&self, topic: &str, queue_id: u32) -> QueueOffset {
        QueueOffset(
            self.shared
                .queue(topic, queue_id)
                .map_or(0, |q| q.min_offset()),
        )
    }

    /// STORETIMESTAMP of the message at `index` of `queue`, if still readable.
    fn timestamp_at(
        &self,
        queue: &ConsumeQueue,
        units: &crate::mapped_file::SegmentList,
        log: &crate::mapped_file::SegmentList,
        index: u64,
    ) -> Option<i64> {
        let unit = queue.unit(units, index).filter(|u| !u.is_empty())?;
        let record = self
            .shared
            .commit_log
            .view(log, unit.physical_offset, unit.size as usize)?;
        record::store_timestamp_of(&record)
    }

    /// The first offset whose store time is >= `timestamp_ms` (the max offset if none).
    pub fn search_offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<QueueOffset, StoreError> {
        let Some(queue) = self.shared.queue(topic, queue_id) else {
            return Ok(QueueOffset(0));
        };
        let (units, log) = (queue.snapshot(), self.shared.commit_log.snapshot());
        let (mut low, mut high) = (queue.min_offset(), queue.max_offset());
        while low < high {
            let mid = low + (high - low) / 2;
            match self.timestamp_at(&queue, &units, &log, mid) {
                Some(ts) if ts >= timestamp_ms => high = mid,
                _ => low = mid + 1,
            }
        }
        Ok(QueueOffset(low))
    }

    /// Store time of the message at `offset`, `None` if it is not (or no longer) stored.
    pub fn store_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
    ) -> Result<Option<i64>, StoreError> {
        let Some(queue) = self.shared.queue(topic, queue_id) else {
            return Ok(None);
        };
        if offset.0 < queue.min_offset() || offset.0 >= queue.max_offset() {
            return Ok(None);
        }
        let (units, log) = (queue.snapshot(), self.shared.commit_log.snapshot());
        Ok(self.timestamp_at(&queue, &units, &log, offset.0))
    }

    /// Up to `max_messages` messages of `topic` carrying `key` (per `key_match`) and stored
    /// within `[begin_ms, end_ms]`, oldest first; the newest are kept when there are more.
    pub fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        key_match: KeyMatch,
        max_messages: usize,
        begin_ms: i64,
        end_ms: i64,
    ) -> QueryResult {
        let message_index = &self.shared.index;
        let mut found: Vec<(u64, Bytes)> = Vec::new();
        if max_messages > 0 {
            message_index.lookup(index::key_hash(topic, key), begin_ms, end_ms, |at| {
                // Another key may share the hash: only records that carry this one count.
                if !found.iter().any(|(seen, _)| *seen == at) {
                    if let Some(record) = self.record_with_key(at, topic, key, key_match) {
                        found.push((at, record));
                    }
                }
                found.len() < max_messages
            });
        }
        found.sort_unstable_by_key(|(at, _)| *at);
        QueryResult {
            messages: found.into_iter().map(|(_, record)| record).collect(),
            index: message_index.progress(),
        }
    }

    /// The record at `offset` if it is still stored, of `topic` and carries `key`.
    fn record_with_key(
        &self,
        offset: u64,
        topic: &str,
        key: &str,
        key_match: KeyMatch,
    ) -> Option<Bytes> {
        let bytes = self.shared.commit_log.record_at(offset).ok()?;
        if !self.shared.readable(offset, bytes.len()) {
            return None;
        }
        let carries = match record::scan_with(&bytes, record::BodyCrc::Skip) {
            record::Scanned::Message(header) => {
                header.topic == topic && key_match.matches(header.properties, key)
            }
            _ => false,
        };
        carries.then_some(bytes)
    }

    /// The message record at `offset` (VIEW_MESSAGE_BY_ID), zero-copy; an error unless a
    /// whole, valid record starts exactly there.
    pub fn message_at(&self, offset: CommitLogOffset) -> Result<Bytes, StoreError> {
        let bytes = self.shared.commit_log.record_at(offset.0)?;
        if !self.shared.readable(offset.0, bytes.len()) {
            return Err(StoreError::OffsetOutOfRange {
                offset,
                min: self.log_min(),
                max: self.confirmed(),
            });
        }
        let (record, _) =
            record::decode(&bytes).map_err(|source| StoreError::BadRecord { offset, source })?;
        if record.physical_offset != offset {
            return Err(StoreError::BadRecord {
                offset,
                source: record::RecordError::WrongPosition {
                    stored: record.physical_offset.0,
                    actual: offset.0,
                },
            });
        }
        Ok(bytes)
    }

    /// Store time of the oldest message still in the queue (GET_EARLIEST_MSG_STORETIME);
    /// `None` for an empty or unknown queue.
    pub fn earliest_store_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
    ) -> Result<Option<i64>, StoreError> {
        self.store_timestamp(topic, queue_id, self.min_offset(topic, queue_id))
    }

    /// The decoded record at a physical offset (e.g. for CONSUMER_SEND_MSG_BACK).
    pub fn read_record(&self, offset: CommitLogOffset) -> Result<Record, StoreError> {
        let bytes = self.shared.commit_log.record_at(offset.0)?;
        let (record, _) =
            record::decode(&bytes).map_err(|source| StoreError::BadRecord { offset, source })?;
        Ok(record)
    }

    /// The raw encoded record at a physical offset, zero-copy.
    pub fn read_record_bytes(&self, offset: CommitLogOffset) -> Result<Bytes, StoreError> {
        self.shared.commit_log.record_at(offset.0)
    }

    /// Published CommitLog bytes from `from` for a replica to mirror, zero-copy: whole
    /// records up to `max_bytes` (at least one, however large), never past the end of
    /// `from`'s segment. At the blank filler that closes a segment, the filler (to the segment
    /// end) alone, with `next` the next segment's base, so the replica rolls where the master
    /// did. `from` must be a record boundary: the log end, or a previous chunk's `next`.
    /// Empty at the log end; `OffsetOutOfRange` below the oldest segment or past the end.
    pub fn read_log(
        &self,
        from: CommitLogOffset,
        max_bytes: usize,
    ) -> Result<LogChunk, StoreError> {
        let (bytes, next) = self.shared.commit_log.read_chunk(from.0, max_bytes)?;
        Ok(LogChunk {
            bytes,
            next: CommitLogOffset(next),
        })
    }

    /// The published CommitLog end: where the next append (or replicated chunk) goes.
    pub fn log_end(&self) -> CommitLogOffset {
        CommitLogOffset(self.shared.commit_log.committed())
    }

    /// The oldest readable CommitLog offset (the base of the oldest segment).
    pub fn log_min(&self) -> CommitLogOffset {
        CommitLogOffset(self.shared.commit_log.min_offset())
    }

    /// Bytes per CommitLog segment. A replica must have the master's, or their blank fillers
    /// and rolls would differ: compare before replicating.
    pub fn segment_size(&self) -> u64 {
        self.shared.commit_log.segment_size()
    }

    /// The replica side of [`MessageStore::read_log`]: appends a chunk the master read at
    /// `at`, which must be this log's end, byte for byte, and dispatches it as a put would
    /// (ConsumeQueue units, index keys with each record's own store time, the dispatch hook),
    /// so the replica serves the same offsets. Each record must sit where it is written and
    /// carry its queue's next offset, or the logs diverged (an error, nothing of that record
    /// written); a blank filler must end the chunk and close the segment exactly (the same
    /// segment size). Records before a failure stay appended. Returns the new log end. Does
    /// not wait for durability: ask `request_durable` / `durable_status` as after `append`.
    pub fn append_replicated(
        &self,
        at: CommitLogOffset,
        bytes: &[u8],
    ) -> Result<CommitLogOffset, StoreError> {
        let shared = &*self.shared;
        shared.gate.check()?;
        let mut results = Vec::new();
        let mut queues = Vec::new();
        let (end, failure) = {
            let mut writer = shared.writer.lock();
            if shared.shut_down.load(Ordering::Acquire) {
                return Err(StoreError::ShutDown);
            }
            let end = CommitLogOffset(writer.log.write_pos());
            if at != end {
                return Err(StoreError::ReplicaOffsetMismatch {
                    expected: end,
                    found: at,
                });
            }
            shared
                .catch_up_index(&mut writer)
                .map_err(|error| shared.refuse_on_disk_error(error))?;
            let mut failure = None;
            let mut pos = 0;
            while pos < bytes.len() {
                match shared.append_replicated_one(&mut writer, &bytes[pos..]) {
                    Ok(Replicated::Message(result, queue)) => {
                        pos += result.size as usize;
                        results.push(result);
                        queues.push(queue);
                    }
                    Ok(Replicated::Filler(size)) => pos += size,
                    Err(error) => {
                        failure = Some(shared.refuse_on_disk_error(error));
                        break;
                    }
                }
            }
            // The records before a failure stay stored, as for `append`.
            shared
                .publish_appended(&mut writer, &results, &queues)
                .map_err(|error| shared.refuse_on_disk_error(error))?;
            (writer.log.write_pos(), failure)
        };
        shared.notify_appended(&results, &queues);
        match failure {
            Some(error) => Err(error),
            None => Ok(CommitLogOffset(end)),
        }
    }

    /// Cuts the log back to `offset`, for a returning old master whose tail the new epoch
    /// never acknowledged. `offset` must be a record boundary (a record or a blank filler
    /// starts there) at or below the end and not below the oldest segment. Queue units,
    /// pending (unconfirmed) units and index entries of records from `offset` go first, then
    /// the CommitLog bytes (zeroed and flushed; later segments deleted), and the writer goes
    /// on from `offset`: new messages get the removed ones' queue offsets. The flushed
    /// position, the confirmed offset and a dirty checkpoint move back too, so neither
    /// readers nor a restart see the old tail. Views handed out before (pull results, chunks)
    /// may change under their holders: truncate only a tail nobody consumed (with
    /// `publish_on_confirm`, one never confirmed).
    pub fn truncate_to(&self, offset: CommitLogOffset) -> Result<TruncateReport, StoreError> {
        let shared = &*self.shared;
        // No retention run may pick segments the truncation deletes.
        let _one_at_a_time = shared.retention.lock();
        let mut writer = shared.writer.lock();
        if shared.shut_down.load(Ordering::Acquire) {
            return Err(StoreError::ShutDown);
        }
        let end = writer.log.write_pos();
        let min = shared.commit_log.min_offset();
        if offset.0 > end || offset.0 < min {
            return Err(StoreError::OffsetOutOfRange {
                offset,
                min: CommitLogOffset(min),
                max: CommitLogOffset(end),
            });
        }
        let mut report = TruncateReport {
            old_end: CommitLogOffset(end),
            new_end: offset,
            ..TruncateReport::default()
        };
        if offset.0 == end {
            return Ok(report);
        }
        if !shared.is_record_boundary(offset.0) {
            return Err(StoreError::NotARecordBoundary {
                offset,
                end: CommitLogOffset(end),
            });
        }
        let truncated = shared.truncate_locked(&mut writer, offset.0, &mut report);
        truncated.map_err(|error| shared.refuse_on_disk_error(error))?;
        Ok(report)
    }

    /// Raises the confirmed offset to `offset` (lower values are ignored): with
    /// `publish_on_confirm`, the units of records ending at or below it become visible, in
    /// log order, and the dispatch hook hears of them. Without it, only recorded.
    pub fn confirm(&self, offset: CommitLogOffset) {
        let shared = &*self.shared;
        {
            let mut state = shared.confirm.lock();
            state.confirmed = state.confirmed.max(offset.0);
        }
        if shared.config.publish_on_confirm {
            shared.release_confirmed();
        }
    }

    /// Records below this are confirmed. At open it is the recovered log end: with
    /// `publish_on_confirm`, what recovery kept is visible at once (a restarted store cannot
    /// tell what was confirmed before; the replication layer truncates what the group lacks).
    pub fn confirmed(&self) -> CommitLogOffset {
        CommitLogOffset(self.shared.confirm.lock().confirmed)
    }

    pub fn set_dispatch_hook(&self, hook: DispatchHook) {
        *self.shared.hook.write() = Some(hook);
    }

    /// Every (topic, queueId) with a ConsumeQueue, sorted.
    pub fn queues(&self) -> Vec<(String, u32)> {
        let registry = self.shared.registry.read();
        let set: BTreeSet<(String, u32)> = registry
            .iter()
            .flat_map(|(topic, queues)| queues.keys().map(move |q| (topic.clone(), *q)))
            .collect();
        set.into_iter().collect()
    }

    /// Drops the topic's ConsumeQueues (its records stay in the CommitLog until retention).
    pub fn delete_topic(&self, topic: &str) -> Result<(), StoreError> {
        if !is_safe_topic_dir(topic) {
            return Err(StoreError::InvalidTopic {
                topic: topic.to_owned(),
            });
        }
        // Under the write lock, so a concurrent put cannot re-create a queue mid-removal.
        let mut writer = self.shared.writer.lock();
        writer.dispatcher.remove_topic(topic);
        self.shared.registry.write().remove(topic);
        let root = self.shared.config.data_dir.join("consumequeue");
        let topic_dir = root.join(topic);
        if topic_dir.exists() {
            std::fs::remove_dir_all(&topic_dir)
                .map_err(|e| StoreError::io("delete topic", &topic_dir, e))?;
        }
        // The deletion must survive a crash, or recovery would bring the queues back.
        sync_dir(&root)
    }

    /// Flushes the CommitLog and every ConsumeQueue now.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.shared.flush_all()
    }

    /// Deletes expired CommitLog files; under disk pressure also those every subscribed group
    /// has read (above `disk_clean_ratio`) and, above `disk_force_clean_ratio`, the oldest
    /// whatever groups still need. Never the active one; queue min offsets follow.
    /// `needed_from` is the lowest CommitLog offset a subscribed group has yet to read.
    pub fn run_retention(
        &self,
        now_ms: i64,
        needed_from: Option<CommitLogOffset>,
    ) -> Result<RetentionReport, StoreError> {
        let shared = &*self.shared;
        let _one_at_a_time = shared.retention.lock();
        let config = &shared.config;
        let usage = disk::read_usage(&config.data_dir)
            .map_err(|e| StoreError::io("statvfs", &config.data_dir, e))?;
        let pressure = Pressure {
            now_ms,
            reserved_ms: (config.file_reserved_hours as i64).saturating_mul(3_600_000),
            used: usage.used,
            total: usage.total,
            clean_ratio: config.disk_clean_ratio,
            force_clean_ratio: config.disk_force_clean_ratio,
            needed_from: needed_from.map(|offset| offset.0),
        };
        let chosen = retention::choose(&shared.commit_log.snapshot(), &pressure)?;
        let mut report = RetentionReport {
            disk_used_ratio: usage.ratio(),
            ..RetentionReport::default()
        };
        if !chosen.is_empty() {
            let doomed: Vec<_> = chosen
                .iter()
                .map(|(segment, _)| Arc::clone(segment))
                .collect();
            shared.commit_log.remove_segments(&doomed);
            for (segment, reason) in &chosen {
                segment.delete()?;
                let path = segment.path().display();
                if *reason == DeleteReason::DiskForceClean {
                    tracing::warn!(%path, disk_used_ratio = usage.ratio(),
                        "deleted a commitlog file that consumer groups had not read yet: the disk is above disk-force-clean-ratio");
                } else {
                    tracing::info!(%path, reason = reason.as_str(), "deleted commitlog file");
                }
                let index = DeleteReason::ALL.iter().position(|r| r == reason);
                shared.deleted_segments[index.expect("every reason is listed")]
                    .fetch_add(1, Ordering::Relaxed);
                report
                    .deleted_segments
                    .push((segment.path().to_path_buf(), *reason));
            }
            // Deleted names must stay deleted after a crash.
            sync_dir(shared.commit_log.dir())?;
        }
        let log_min = shared.commit_log.min_offset();
        for queue in shared.all_queues() {
            report.deleted_queue_files += queue.advance_min(log_min)?;
        }
        report.deleted_index_files = shared.index.delete_below(log_min)?;
        report.min_physical_offset = CommitLogOffset(log_min);
        Ok(report)
    }

    /// Where the message at `offset` of a queue lives in the CommitLog, if it is still there.
    /// The end of everything written to `topic`/`queue_id`, units still waiting for
    /// `confirm` included (`max_offset` without `publish_on_confirm`).
    pub fn written_max_offset(&self, topic: &str, queue_id: u32) -> QueueOffset {
        let Some(queue) = self.shared.queue(topic, queue_id) else {
            return QueueOffset(0);
        };
        let visible = queue.max_offset();
        QueueOffset(
            self.shared
                .pending_end(&queue)
                .map_or(visible, |end| end.max(visible)),
        )
    }

    /// The first queue offset of `topic`/`queue_id` whose record starts at or after
    /// `log_offset` (the readable end when none does): where the queue stood when the
    /// CommitLog reached `log_offset`.
    pub fn queue_offset_at(
        &self,
        topic: &str,
        queue_id: u32,
        log_offset: CommitLogOffset,
    ) -> QueueOffset {
        let mut low = self.min_offset(topic, queue_id).0;
        let mut high = self.max_offset(topic, queue_id).0;
        while low < high {
            let middle = low + (high - low) / 2;
            match self.physical_offset_at(topic, queue_id, QueueOffset(middle)) {
                Some(at) if at < log_offset => low = middle + 1,
                _ => high = middle,
            }
        }
        QueueOffset(low)
    }

    pub fn physical_offset_at(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
    ) -> Option<CommitLogOffset> {
        let queue = self.shared.queue(topic, queue_id)?;
        if offset.0 < queue.min_offset() || offset.0 >= queue.max_offset() {
            return None;
        }
        let unit = queue.unit(&queue.snapshot(), offset.0)?;
        (!unit.is_empty()).then_some(CommitLogOffset(unit.physical_offset))
    }

    /// CommitLog files deleted since open, by reason.
    pub fn deleted_segments(&self) -> Vec<(DeleteReason, u64)> {
        DeleteReason::ALL
            .iter()
            .zip(&self.shared.deleted_segments)
            .map(|(reason, count)| (*reason, count.load(Ordering::Relaxed)))
            .collect()
    }

    /// The data file system as last read, and whether writes are refused and why.
    pub fn disk_status(&self) -> DiskStatus {
        let shared = &*self.shared;
        let usage = shared.gate.usage();
        DiskStatus {
            data_dir: shared.config.data_dir.clone(),
            used_bytes: usage.used,
            total_bytes: usage.total,
            available_bytes: usage.available,
            used_ratio: usage.ratio(),
            high_water_ratio: shared.config.disk_high_water_ratio,
            refusal: shared.gate.refusal(),
        }
    }

    /// Writes refused since open, by reason.
    pub fn write_refusals(&self) -> Vec<(RefusalReason, u64)> {
        self.shared.gate.refused_counts()
    }

    pub fn stats(&self) -> StoreStats {
        let shared = &*self.shared;
        let min = shared.commit_log.min_offset();
        let max = shared.commit_log.committed();
        let usage = shared.gate.usage();
        StoreStats {
            commitlog_bytes: max.saturating_sub(min),
            min_physical_offset: CommitLogOffset(min),
            max_physical_offset: CommitLogOffset(max),
            flushed_physical_offset: CommitLogOffset(shared.flush.flushed()),
            consume_queues: shared.registry.read().values().map(|q| q.len()).sum(),
            disk_used_bytes: usage.used,
            disk_total_bytes: usage.total,
        }
    }

    /// Flushes everything and writes the clean-shutdown checkpoint. Idempotent; later puts
    /// fail with `ShutDown`.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        let shared = &*self.shared;
        let indexed_to = {
            let writer = shared.writer.lock();
            if shared.shut_down.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
            writer.index_behind.map(|(from, _)| from)
        };
        let flushed = shared.flush_all();
        self.stop_threads();
        flushed?;
        if shared.data_dir_changed() {
            tracing::warn!(data_dir = %shared.config.data_dir.display(), "the data directory was deleted; no checkpoint written");
            return Ok(());
        }
        let end = shared.commit_log.committed();
        let saved = checkpoint::save(
            &shared.config.data_dir,
            &Checkpoint {
                clean_shutdown: true,
                commit_log_durable_offset: end,
                consume_queue_durable_offset: shared.queues_durable_to(end),
                index_durable_offset: Some(indexed_to.unwrap_or(end)),
                confirmed_offset: shared.checkpointed_confirm(end),
            },
        );
        match saved {
            // Everything is flushed: the next start only scans more, as after a crash.
            Err(error)
                if error
                    .io_source()
                    .and_then(RefusalReason::of_io_error)
                    .is_some() =>
            {
                tracing::warn!(error = %chain(&error), "cannot write the clean-shutdown checkpoint; the next start recovers as after a crash");
                Ok(())
            }
            saved => saved,
        }
    }

    fn stop_threads(&self) {
        self.shared.commit_log.stop_background();
        self.shared.flush.stop();
        for handle in self.threads.lock().drain(..) {
            if handle.join().is_err() {
                tracing::error!("a store thread panicked");
            }
        }
    }
}

impl Drop for MessageStore {
    fn drop(&mut self) {
        self.stop_threads();
    }
}
