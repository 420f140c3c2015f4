//! `MessageStore`: the CommitLog, its ConsumeQueues, the message index, the flusher and
//! recovery, behind one narrow API. A thin facade over its parts:
//!
//! - `append.rs`: the one append pipeline (local sends encoded in place, replicated records
//!   passed through), under the one write lock; publish-before-units; the dispatch hook.
//! - `reput.rs`: a replica's chunks appended with framing checks, dispatched behind.
//! - `reader.rs`: gets (tags code, then record filters), timestamps, key queries, records
//!   by offset, log chunks for replicas.
//! - `fence.rs`: the confirm fence of `publish_on_confirm`.
//! - `truncate.rs`: cutting the log back to a record boundary.
//! - `restart.rs`: restarting an emptied log at a later segment (a replica's rebuild).
//! - `upkeep.rs`: the disk watch, retention, topic deletion, readings.
//! - `open.rs`: open (recovery, the dirty checkpoint, threads) and the clean shutdown.
//! - `shared.rs`: what the parts share, and the flusher's and housekeeper's view of it.
//!
//! Writers serialise on one lock per append; readers take snapshots.

mod append;
mod fence;
mod open;
mod reader;
mod reput;
mod restart;
mod shared;
mod truncate;
mod types;
mod upkeep;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::config::{FlushMode, StoreConfig};
use crate::disk::{DiskStatus, RefusalReason};
use crate::error::StoreError;
use crate::flush::FlushedHook;
use crate::index::KeyMatch;
use crate::record::{NewMessage, Record};
use crate::recovery::RecoveryReport;
use crate::retention::{DeleteReason, ReplicaHold, ReplicaHoldStats, RetentionReport};
use crate::{CommitLogOffset, QueueOffset};
use append::Batch;
pub use reput::ReplicaDispatch;
pub use restart::RestartReport;
use shared::Shared;
pub use types::{
    Appended, DispatchEvent, DispatchHook, GetFilter, GetResult, GetStatus, LogChunk, PutResult,
    QueryResult, RecordFilter, StoreStats, TruncateReport,
};

/// The storage engine. `Send + Sync`; share it in an `Arc`. Call [`MessageStore::shutdown`]
/// for a clean stop; a store dropped without it recovers as after a crash.
pub struct MessageStore {
    shared: Arc<Shared>,
    /// The flusher, the housekeeper and the disk watcher.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl MessageStore {
    /// Opens the store under `config.data_dir`, running recovery first.
    pub fn open(config: StoreConfig) -> Result<MessageStore, StoreError> {
        let (shared, threads) = open::open(config)?;
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
        let mut batch = Batch::with_capacity(msgs.len());
        let (end, failure) = shared.append_locked(
            &mut batch,
            |_| Ok(()),
            |shared, writer, batch| shared.append_messages(writer, batch, msgs, now_ms),
        )?;
        if let Some(error) = failure {
            return Err(error);
        }
        shared.notify_appended(&batch);
        Ok(Appended {
            results: batch.results,
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
        let limits = (max_msgs, max_bytes);
        Ok(self
            .shared
            .reader()
            .get((topic, queue_id), offset.0, limits, filter))
    }

    /// Units written to the queue; 0 when it does not exist.
    pub fn max_offset(&self, topic: &str, queue_id: u32) -> QueueOffset {
        QueueOffset(self.shared.reader().max_offset(topic, queue_id))
    }

    pub fn min_offset(&self, topic: &str, queue_id: u32) -> QueueOffset {
        QueueOffset(self.shared.reader().min_offset(topic, queue_id))
    }

    /// The first offset whose store time is >= `timestamp_ms` (the max offset if none).
    pub fn search_offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<QueueOffset, StoreError> {
        let reader = self.shared.reader();
        Ok(QueueOffset(reader.search_offset_by_timestamp(
            topic,
            queue_id,
            timestamp_ms,
        )))
    }

    /// Store time of the message at `offset`, `None` if it is not (or no longer) stored.
    pub fn store_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
    ) -> Result<Option<i64>, StoreError> {
        Ok(self
            .shared
            .reader()
            .store_timestamp(topic, queue_id, offset.0))
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
        let window = (begin_ms, end_ms);
        self.shared
            .reader()
            .query_by_key(topic, key, key_match, max_messages, window)
    }

    /// The message record at `offset` (VIEW_MESSAGE_BY_ID), zero-copy; an error unless a
    /// whole, valid record starts exactly there.
    pub fn message_at(&self, offset: CommitLogOffset) -> Result<Bytes, StoreError> {
        self.shared.reader().message_at(offset)
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
        self.shared.reader().read_record(offset)
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
        self.shared.reader().read_log(from, max_bytes)
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
    /// `at`, which must be this log's end, byte for byte, with framing checks only: each
    /// record's size and magic, and its physical offset where it is written; a blank filler
    /// must end the chunk and close the segment exactly (the same segment size). Records
    /// before a failure stay appended. Its records are dispatched later, by
    /// [`MessageStore::dispatch_replicated`] (or before the next local append). Returns the
    /// new log end. Does not wait for durability: ask `request_durable` / `durable_status` as
    /// after `append`.
    pub fn append_replicated(
        &self,
        at: CommitLogOffset,
        bytes: &[u8],
    ) -> Result<CommitLogOffset, StoreError> {
        let shared = &*self.shared;
        shared.gate.check()?;
        let mut batch = Batch::default();
        let at_end = |writer: &shared::WriterState| {
            let end = CommitLogOffset(writer.log.write_pos());
            match at == end {
                true => Ok(()),
                false => Err(StoreError::ReplicaOffsetMismatch {
                    expected: end,
                    found: at,
                }),
            }
        };
        let (end, failure) = shared.append_locked(&mut batch, at_end, |shared, writer, _| {
            shared.append_chunk(writer, bytes)
        })?;
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
        self.shared.truncate_to(offset)
    }

    /// Drops every segment, ConsumeQueue and index file and starts the log, empty, at
    /// `offset`: a replica whose next byte its master's retention deleted is rebuilt from the
    /// master's oldest segment (RocketMQ's syncFromLastFile). `offset` must be a segment base
    /// at or past the log end. Each queue then starts at the queue offset of its first
    /// replicated record. The confirmed offset drops to 0 until the group confirms again. A
    /// marker file makes the restart finish at the next open if a crash interrupts it.
    pub fn restart_at(&self, offset: CommitLogOffset) -> Result<RestartReport, StoreError> {
        self.shared.restart_at(offset)
    }

    /// Raises the confirmed offset to `offset` (lower values are ignored): with
    /// `publish_on_confirm`, the units of records ending at or below it become visible, in
    /// log order, and the dispatch hook hears of them. Without it, only recorded.
    pub fn confirm(&self, offset: CommitLogOffset) {
        let shared = &*self.shared;
        shared.fence.raise(offset.0);
        if shared.fence.enabled() {
            shared.release_confirmed();
        }
    }

    /// Records below this are confirmed. At open it is the recovered log end: with
    /// `publish_on_confirm`, what recovery kept is visible at once (a restarted store cannot
    /// tell what was confirmed before; the replication layer truncates what the group lacks).
    pub fn confirmed(&self) -> CommitLogOffset {
        CommitLogOffset(self.shared.fence.confirmed())
    }

    pub fn set_dispatch_hook(&self, hook: DispatchHook) {
        *self.shared.hook.write() = Some(hook);
    }

    /// Every (topic, queueId) with a ConsumeQueue, sorted.
    pub fn queues(&self) -> Vec<(String, u32)> {
        self.shared.reader().queues()
    }

    /// Drops the topic's ConsumeQueues (its records stay in the CommitLog until retention).
    pub fn delete_topic(&self, topic: &str) -> Result<(), StoreError> {
        self.shared.delete_topic(topic)
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
        self.shared.run_retention(now_ms, needed_from)
    }

    /// On a group's master: retention keeps the files in-sync replicas still need (bytes at
    /// or above `hold.from`), up to `hold.cap_bytes` of them, except above the force-clean
    /// ratio. `None` lifts the hold.
    pub fn set_replica_hold(&self, hold: Option<ReplicaHold>) {
        self.shared.replica_hold.set(hold);
    }

    /// What the replica hold kept at the last retention run, and where it gave way.
    pub fn replica_hold_stats(&self) -> ReplicaHoldStats {
        self.shared.replica_hold.stats()
    }

    /// The end of everything written to `topic`/`queue_id`, units still waiting for
    /// `confirm` included (`max_offset` without `publish_on_confirm`).
    pub fn written_max_offset(&self, topic: &str, queue_id: u32) -> QueueOffset {
        QueueOffset(self.shared.reader().written_max_offset(topic, queue_id))
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
        QueueOffset(
            self.shared
                .reader()
                .queue_offset_at(topic, queue_id, log_offset.0),
        )
    }

    /// Where the message at `offset` of a queue lives in the CommitLog, if it is still there.
    pub fn physical_offset_at(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
    ) -> Option<CommitLogOffset> {
        let reader = self.shared.reader();
        reader
            .physical_offset_at(topic, queue_id, offset.0)
            .map(CommitLogOffset)
    }

    /// CommitLog files deleted since open, by reason.
    pub fn deleted_segments(&self) -> Vec<(DeleteReason, u64)> {
        self.shared.deleted_segments.read()
    }

    /// The data file system as last read, and whether writes are refused and why.
    pub fn disk_status(&self) -> DiskStatus {
        self.shared.disk_status()
    }

    /// Writes refused since open, by reason.
    pub fn write_refusals(&self) -> Vec<(RefusalReason, u64)> {
        self.shared.gate.refused_counts()
    }

    pub fn stats(&self) -> StoreStats {
        self.shared.stats()
    }

    /// Flushes everything and writes the clean-shutdown checkpoint. Idempotent; later puts
    /// fail with `ShutDown`.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        let Some((indexed_to, flushed)) = self.shared.stop_writes() else {
            return Ok(());
        };
        self.stop_threads();
        flushed?;
        self.shared.save_clean_checkpoint(indexed_to)
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
