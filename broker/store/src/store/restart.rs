//! Restarting the store at a later offset: a replica rebuilt from its master's oldest
//! retained segment drops everything it holds and starts its log there (RocketMQ's
//! syncFromLastFile). A marker file makes the restart whole across a crash.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use super::shared::{Shared, WriterState};
use crate::checkpoint::{self, Checkpoint};
use crate::dispatch::{Dispatcher, QueueWriter};
use crate::error::StoreError;
use crate::json_file::{backup_path, read_json_with_backup, write_json_into_existing_dir};
use crate::mapped_file::{sync_dir, MappedSegment};
use crate::CommitLogOffset;

/// What a restart replaced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestartReport {
    /// The log's range before: `[old_min, old_end)`.
    pub old_min: CommitLogOffset,
    pub old_end: CommitLogOffset,
    /// Where the log starts (and ends) now.
    pub start: CommitLogOffset,
}

/// `<data_dir>/restart`: a restart to `offset` began; present at open, it is finished first.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct RestartMarker {
    offset: u64,
}

fn marker_path(data_dir: &Path) -> PathBuf {
    data_dir.join("restart")
}

/// The directories a restart empties; at runtime the index empties itself (its writer holds
/// its last file), at open the index directory is emptied too.
const LOG_AND_QUEUES: [&str; 2] = ["commitlog", "consumequeue"];

impl Shared {
    /// `MessageStore::restart_at`.
    pub(super) fn restart_at(&self, offset: CommitLogOffset) -> Result<RestartReport, StoreError> {
        // No retention run may pick segments the restart deletes.
        let _one_at_a_time = self.retention.lock();
        let mut writer = self.writer.lock();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(StoreError::ShutDown);
        }
        let end = writer.log.write_pos();
        let report = RestartReport {
            old_min: CommitLogOffset(self.commit_log.min_offset()),
            old_end: CommitLogOffset(end),
            start: offset,
        };
        if offset.0 < end || offset.0 % self.commit_log.segment_size() != 0 {
            // Only a segment base past everything held: what the log has is never dropped
            // for what a truncation could keep.
            return Err(StoreError::NotARecordBoundary {
                offset,
                end: CommitLogOffset(end),
            });
        }
        let restarted = self.restart_locked(&mut writer, offset.0);
        restarted.map_err(|error| self.refuse_on_disk_error(error))?;
        Ok(report)
    }

    /// `restart_at` past its checks, under the write lock: the marker first, so a crash
    /// part-way is finished at the next open; readers lose the queues and the index, then
    /// the log; the new first segment; the checkpoint; the marker goes last.
    fn restart_locked(&self, writer: &mut WriterState, offset: u64) -> Result<(), StoreError> {
        let data_dir = &self.config.data_dir;
        write_json_into_existing_dir(&marker_path(data_dir), &RestartMarker { offset })?;
        // A checkpoint computed before this is stale: `housekeeping` drops it.
        self.truncations.fetch_add(1, Ordering::AcqRel);
        self.fence.truncate(0);
        self.registry.write().clear();
        let queue_root = data_dir.join("consumequeue");
        writer.dispatcher = Dispatcher::new(&queue_root, self.config.consume_queue_units_per_file);
        writer.index.truncate(&self.index, 0)?;
        self.index.delete_below(u64::MAX)?;
        writer.index_behind = None;
        let segments = self.commit_log.snapshot();
        self.commit_log.remove_segments(&segments);
        empty_dirs(data_dir, &LOG_AND_QUEUES)?;
        writer.log = self.commit_log.writer(offset)?;
        self.flush.rewind(offset);
        let _checkpoint = self.checkpoint_lock.lock();
        checkpoint::save(data_dir, &restarted_checkpoint(offset))?;
        remove_marker(data_dir)
    }
}

/// Deletes every file under the named directories of `data_dir` (the directories stay).
fn empty_dirs(data_dir: &Path, names: &[&str]) -> Result<(), StoreError> {
    for name in names {
        let dir = data_dir.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("create directory", &dir, e))?;
        for entry in crate::mapped_file::list_dir(&dir)? {
            let removed = if entry.is_dir() {
                std::fs::remove_dir_all(&entry)
            } else {
                std::fs::remove_file(&entry)
            };
            removed.map_err(|e| StoreError::io("delete", &entry, e))?;
        }
        // Deleted names must stay deleted after a crash.
        sync_dir(&dir)?;
    }
    Ok(())
}

/// A dirty checkpoint of a store whose log starts and ends at `offset`.
fn restarted_checkpoint(offset: u64) -> Checkpoint {
    Checkpoint {
        clean_shutdown: false,
        commit_log_durable_offset: offset,
        consume_queue_durable_offset: offset,
        index_durable_offset: Some(offset),
        confirmed_offset: None,
    }
}

fn remove_marker(data_dir: &Path) -> Result<(), StoreError> {
    let path = marker_path(data_dir);
    for file in [backup_path(&path), path.clone()] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io("delete", &file, e)),
        }
    }
    sync_dir(data_dir)
}

/// At open, before recovery: a restart a crash interrupted is finished (the log, queues and
/// index emptied, the first segment created at its offset). Returns the offset, if one was.
pub(super) fn finish_interrupted(
    data_dir: &Path,
    segment_size: u64,
) -> Result<Option<u64>, StoreError> {
    let Some(marker) = read_json_with_backup::<RestartMarker>(&marker_path(data_dir))? else {
        return Ok(None);
    };
    empty_dirs(data_dir, &[LOG_AND_QUEUES[0], LOG_AND_QUEUES[1], "index"])?;
    MappedSegment::create(&data_dir.join("commitlog"), marker.offset, segment_size)?;
    sync_dir(&data_dir.join("commitlog"))?;
    checkpoint::save(data_dir, &restarted_checkpoint(marker.offset))?;
    remove_marker(data_dir)?;
    tracing::warn!(
        offset = marker.offset,
        "finished a restart of the store that a crash interrupted: the log starts there, empty"
    );
    Ok(Some(marker.offset))
}

/// A replicated record's queue offset `found` for a queue that has no unit yet, in a log
/// whose earlier records are gone (`log_min` > 0: rebuilt from the master's oldest segment,
/// or deleted by retention): the queue starts at `found`, as recovery starts such a queue.
/// Returns whether it did.
pub(super) fn start_empty_queue_at(queue: &mut QueueWriter, found: u64, log_min: u64) -> bool {
    let empty =
        queue.next_offset == queue.cq.min_offset() && queue.next_offset == queue.cq.max_offset();
    if log_min == 0 || !empty || found <= queue.next_offset {
        return false;
    }
    queue.cq.start_at(found);
    queue.next_offset = found;
    true
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message, open_store, read, TOPIC};
    use super::super::MessageStore;
    use super::*;
    use crate::index::KeyMatch;
    use crate::QueueOffset;

    /// A master whose first segment is full, then three records of queue 1 in its second;
    /// returns it with the queue offset of the first of those three.
    fn master_past_its_first_segment(dir: &Path) -> (MessageStore, u64) {
        let master = open_store(dir, false);
        let body = vec![7u8; 1024];
        let mut first_in_second = None;
        while first_in_second.is_none()
            || master.max_offset(TOPIC, 1).0 < first_in_second.unwrap() + 3
        {
            let put = master.put(&message(1, &body, "KEYS\u{1}k"), 1).unwrap();
            if put.physical_offset.0 >= master.segment_size() && first_in_second.is_none() {
                first_in_second = Some(put.queue_offset.0);
            }
        }
        (master, first_in_second.unwrap())
    }

    #[test]
    fn a_restarted_store_starts_at_the_offset_and_its_queues_at_their_first_record() {
        let (master_dir, dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (master, first) = master_past_its_first_segment(master_dir.path());
        let segment = master.segment_size();
        let mut store = open_store(dir.path(), false);
        store.put(&message(0, b"old", "KEYS\u{1}old"), 1).unwrap();
        let error = store.restart_at(CommitLogOffset(segment + 1)).unwrap_err();
        assert!(matches!(error, StoreError::NotARecordBoundary { .. }));

        let report = store.restart_at(CommitLogOffset(segment)).unwrap();
        assert_eq!(report.old_min, CommitLogOffset(0));
        assert_eq!(report.start, CommitLogOffset(segment));
        assert_eq!((store.log_min().0, store.log_end().0), (segment, segment));
        assert!(store.queues().is_empty());
        let old = store.query_by_key(TOPIC, "old", KeyMatch::AnyKey, 10, 0, i64::MAX);
        assert!(old.messages.is_empty());

        let chunk = master.read_log(CommitLogOffset(segment), 1 << 20).unwrap();
        let end = store
            .append_replicated(CommitLogOffset(segment), &chunk.bytes)
            .unwrap();
        store.dispatch_replicated(u64::MAX).unwrap();
        assert_eq!(end, master.log_end());
        assert_eq!(store.min_offset(TOPIC, 1), QueueOffset(first));
        assert_eq!(store.max_offset(TOPIC, 1), master.max_offset(TOPIC, 1));
        let copied = read(&store, 1, first).messages;
        assert_eq!(copied.len(), 3);
        assert_eq!(copied, read(&master, 1, first).messages[..3]);
        let keyed = store.query_by_key(TOPIC, "k", KeyMatch::AnyKey, 10, 0, i64::MAX);
        assert_eq!(keyed.messages.len(), 3);
        // Reopened, after a crash or not, the queue still starts at its first record.
        for clean in [true, false] {
            if clean {
                store.shutdown().unwrap();
            }
            drop(store);
            store = open_store(dir.path(), false);
            assert_eq!(
                store.min_offset(TOPIC, 1),
                QueueOffset(first),
                "clean: {clean}"
            );
            assert_eq!(read(&store, 1, first).messages, copied);
        }
        store.shutdown().unwrap();
        master.shutdown().unwrap();
    }

    #[test]
    fn a_restart_survives_a_reopen_and_one_a_crash_interrupted_is_finished() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        store.put(&message(0, b"old", ""), 1).unwrap();
        let segment = store.segment_size();
        store.restart_at(CommitLogOffset(2 * segment)).unwrap();
        store.shutdown().unwrap();
        drop(store);
        let store = open_store(dir.path(), false);
        assert_eq!(
            (store.log_min().0, store.log_end().0),
            (2 * segment, 2 * segment)
        );
        assert_eq!(store.max_offset(TOPIC, 0), QueueOffset(0));
        // A crash right after the marker: the old files are all there; the next open
        // finishes the restart.
        store.put(&message(0, b"x", ""), 1).unwrap();
        let marker = RestartMarker {
            offset: 5 * segment,
        };
        write_json_into_existing_dir(&marker_path(dir.path()), &marker).unwrap();
        drop(store);
        let store = open_store(dir.path(), false);
        assert_eq!(
            (store.log_min().0, store.log_end().0),
            (5 * segment, 5 * segment)
        );
        assert!(store.queues().is_empty());
        assert!(!marker_path(dir.path()).exists());
        let put = store.put(&message(0, b"y", ""), 1).unwrap();
        assert_eq!(put.physical_offset, CommitLogOffset(5 * segment));
        assert_eq!(read(&store, 0, 0).messages.len(), 1);
        store.shutdown().unwrap();
    }
}
