//! Cutting the log back to a record boundary (a returning old master's unacknowledged tail).

use std::sync::atomic::Ordering;

use super::shared::{Shared, WriterState};
use super::types::TruncateReport;
use crate::checkpoint::{self, Checkpoint};
use crate::error::StoreError;
use crate::CommitLogOffset;

impl Shared {
    /// `MessageStore::truncate_to`.
    pub(super) fn truncate_to(
        &self,
        offset: CommitLogOffset,
    ) -> Result<TruncateReport, StoreError> {
        // No retention run may pick segments the truncation deletes.
        let _one_at_a_time = self.retention.lock();
        let mut writer = self.writer.lock();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(StoreError::ShutDown);
        }
        let end = writer.log.write_pos();
        let min = self.commit_log.min_offset();
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
        // Dispatch stands at a record boundary even when the record there is damaged.
        if offset.0 != writer.dispatched_to() && !self.reader().is_record_boundary(offset.0) {
            return Err(StoreError::NotARecordBoundary {
                offset,
                end: CommitLogOffset(end),
            });
        }
        let truncated = self.truncate_locked(&mut writer, offset.0, &mut report);
        truncated.map_err(|error| self.refuse_on_disk_error(error))?;
        Ok(report)
    }

    /// `truncate_to` past its checks, under the write lock.
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
        self.flush_queues_and_index()?;
        {
            let _checkpoint = self.checkpoint_lock.lock();
            checkpoint::save(
                &self.config.data_dir,
                &Checkpoint {
                    clean_shutdown: false,
                    commit_log_durable_offset: self.flush.flushed().min(offset),
                    consume_queue_durable_offset: self
                        .fence
                        .durable_to(writer.dispatched_to())
                        .min(offset),
                    index_durable_offset: Some(writer.indexed_to().min(offset)),
                    confirmed_offset: self.fence.checkpointed(offset),
                },
            )?;
        }
        self.fence.truncate(offset);
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message, open_store, read, TOPIC};
    use crate::{CommitLogOffset, QueueOffset, StoreError};

    #[test]
    fn truncation_cuts_the_log_queues_and_index_back_to_a_record_boundary() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let results: Vec<_> = (0..4)
            .map(|n| store.put(&message(n % 2, b"x", "KEYS\u{1}k"), 1).unwrap())
            .collect();
        let end = store.log_end();
        let cut = results[1].physical_offset;
        let inside = CommitLogOffset(cut.0 + 1);
        let error = store.truncate_to(inside).unwrap_err();
        assert!(matches!(error, StoreError::NotARecordBoundary { .. }));
        let past = CommitLogOffset(end.0 + 1);
        let error = store.truncate_to(past).unwrap_err();
        assert!(matches!(error, StoreError::OffsetOutOfRange { .. }));
        assert_eq!(store.truncate_to(end).unwrap().bytes, 0);

        let report = store.truncate_to(cut).unwrap();
        assert_eq!((report.old_end, report.new_end), (end, cut));
        assert_eq!(report.bytes, end.0 - cut.0);
        assert_eq!(
            report.messages,
            [(TOPIC.to_owned(), 0, 1), (TOPIC.to_owned(), 1, 2)]
        );
        assert_eq!(report.index_entries, 3);
        assert_eq!(store.log_end(), cut);
        assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(0));
        assert_eq!(read(&store, 0, 0).messages.len(), 1);
        // The writer goes on from the cut: the removed queue offsets are handed out again.
        let again = store.put(&message(1, b"y", ""), 2).unwrap();
        assert_eq!(
            (again.physical_offset, again.queue_offset),
            (cut, QueueOffset(0))
        );
        store.shutdown().unwrap();
    }
}
