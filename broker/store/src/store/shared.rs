//! What the store's parts share: the files, the writer's state behind the one write lock,
//! the write gate and the fence; the flusher's and housekeeper's view of them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::fence::ConfirmFence;
use super::reader::Reader;
use super::types::{DispatchEvent, DispatchHook};
use crate::checkpoint::{self, Checkpoint};
use crate::commit_log::{CommitLog, LogWriter};
use crate::config::{FlushMode, StoreConfig};
use crate::consume_queue::ConsumeQueue;
use crate::disk::{self, RefusalReason, WriteGate, WriteRefusal};
use crate::dispatch::{Dispatcher, QueueRegistry};
use crate::error::{chain, StoreError};
use crate::flush::{FlushControl, FlushTarget};
use crate::index::{IndexWriter, MessageIndex};
use crate::recovery::RecoveryReport;
use crate::retention::DeleteReason;
use crate::tally::Tally;
use crate::QueueOffset;

/// What the one write lock guards: the CommitLog's writer, the queues' and the index's.
pub(super) struct WriterState {
    pub log: LogWriter,
    pub dispatcher: Dispatcher,
    pub index: IndexWriter,
    /// Records recovery could not index (the disk was full), `[from, to)`: indexed before
    /// the next append's, and the checkpoint claims no index entry from `from` on.
    pub index_behind: Option<(u64, u64)>,
}

impl WriterState {
    /// Index entries exist for every record below this.
    pub(super) fn indexed_to(&self) -> u64 {
        self.index_behind
            .map_or(self.log.write_pos(), |(from, _)| from)
            .min(self.dispatched_to())
    }

    /// Queue units (and index entries) exist for every record below this: a replica's
    /// appended records wait for dispatch.
    pub(super) fn dispatched_to(&self) -> u64 {
        self.dispatcher
            .behind_from()
            .unwrap_or(self.log.write_pos())
    }
}

pub(super) struct Shared {
    pub config: StoreConfig,
    pub commit_log: CommitLog,
    pub registry: QueueRegistry,
    pub index: MessageIndex,
    pub writer: Mutex<WriterState>,
    pub flush: FlushControl,
    pub hook: RwLock<Option<DispatchHook>>,
    pub shut_down: AtomicBool,
    pub report: RecoveryReport,
    /// One retention run at a time, so no file is chosen twice.
    pub retention: Mutex<()>,
    /// CommitLog files deleted since open, by reason.
    pub deleted_segments: Tally<DeleteReason, { DeleteReason::ALL.len() }>,
    /// What retention keeps for a group's in-sync replicas (set by the master).
    pub replica_hold: crate::retention::HoldState,
    /// Whether writes are taken, and the last reading of the data file system.
    pub gate: WriteGate,
    /// The data directory's device and inode at open: a deleted one no longer matches.
    pub data_dir_identity: Option<(u64, u64)>,
    /// The dirty checkpoint could not be written at open (a full or read-only disk): writes
    /// stay refused until it is, so a crash never trusts an old clean one.
    pub dirty_checkpoint_pending: AtomicBool,
    /// Opened on a read-only file system: files are mapped read-only, so writes stay
    /// refused until a restart, even if the file system becomes writable.
    pub opened_read_only: bool,
    /// Holds the data directory's exclusive lock for the store's lifetime.
    pub _lock: std::fs::File,
    /// `publish_on_confirm`'s read fence; its lock is taken after `writer` when both are.
    pub fence: ConfirmFence,
    /// Bumped by every truncation: a checkpoint computed before one is not written.
    pub truncations: AtomicU64,
    /// Held while a checkpoint is written, so a stale one never lands after a truncation's.
    pub checkpoint_lock: Mutex<()>,
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
        // Under the write lock every record below the dispatched position has its unit
        // written, so all of them are covered once the queues are flushed (pending units
        // aside).
        let (dispatched, indexed) = {
            let writer = self.writer.lock();
            (
                self.fence.durable_to(writer.dispatched_to()),
                writer.indexed_to(),
            )
        };
        self.flush_queues_and_index()?;
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
                confirmed_offset: self.fence.checkpointed(u64::MAX),
            },
        )
    }
}

impl Shared {
    /// The read side, borrowed.
    pub(super) fn reader(&self) -> Reader<'_> {
        Reader {
            commit_log: &self.commit_log,
            registry: &self.registry,
            index: &self.index,
            fence: &self.fence,
        }
    }

    /// Whether the data directory was deleted or replaced since open.
    pub(super) fn data_dir_changed(&self) -> bool {
        disk::dir_identity(&self.config.data_dir).ok() != self.data_dir_identity
    }

    /// A refusal for `reason`, its sentence naming the disk and its usage now.
    pub(super) fn refusal(&self, reason: RefusalReason, detail: &str) -> WriteRefusal {
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
    pub(super) fn refuse_on_disk_error(&self, error: StoreError) -> StoreError {
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

    pub(super) fn all_queues(&self) -> Vec<Arc<ConsumeQueue>> {
        self.registry
            .read()
            .values()
            .flat_map(|queues| queues.values().cloned())
            .collect()
    }

    /// Tells the dispatch hook that a queue grew to `max_offset`.
    pub(super) fn notify(&self, topic: &str, queue_id: u32, max_offset: u64) {
        if let Some(hook) = self.hook.read().as_ref() {
            hook(&DispatchEvent {
                topic,
                queue_id,
                max_offset: QueueOffset(max_offset),
            });
        }
    }

    /// Publishes the pending units the confirmed offset covers and tells the hook.
    pub(super) fn release_confirmed(&self) {
        for (queue, max) in self.fence.release() {
            self.notify(queue.topic(), queue.queue_id(), max);
        }
    }

    pub(super) fn wait_durable(&self, end: u64) -> Result<(), StoreError> {
        match self.config.flush_mode {
            FlushMode::Sync => self
                .flush
                .wait_durable(end)
                .map_err(|error| self.refuse_on_disk_error(error)),
            FlushMode::Async => Ok(()),
        }
    }

    /// Msyncs every ConsumeQueue's and the index's writes since their last flush.
    pub(super) fn flush_queues_and_index(&self) -> Result<(), StoreError> {
        for queue in self.all_queues() {
            queue.flush()?;
        }
        self.index.flush()
    }

    pub(super) fn flush_all(&self) -> Result<(), StoreError> {
        let rewinds = self.flush.rewinds();
        let committed = self.commit_log.committed();
        let flushed = self.flush.flushed();
        self.flush.complete(
            rewinds,
            committed,
            self.commit_log.flush_range(flushed, committed),
        )?;
        self.flush_queues_and_index()
    }
}
