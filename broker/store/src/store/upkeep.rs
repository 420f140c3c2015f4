//! Keeping the store within its disk: the disk watch that closes and reopens the write
//! gate, retention, topic deletion, and the readings the server reports.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::shared::Shared;
use super::types::StoreStats;
use crate::disk::{self, DiskStatus, RefusalReason, Verdict, WriteRefusal};
use crate::dispatch::is_safe_topic_dir;
use crate::error::StoreError;
use crate::flush::FlushTarget;
use crate::mapped_file::sync_dir;
use crate::retention::{self, DeleteReason, Pressure, RetentionReport};
use crate::CommitLogOffset;

impl Shared {
    /// One look at the data file system: closes the gate or opens it again.
    pub(super) fn watch_disk(&self) {
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
        if let Some(error) = self.flush.failure() {
            self.gate
                .close(self.refusal(RefusalReason::FsyncFailed, &format!(" ({error})")));
        }
        let data_dir = &self.config.data_dir;
        let high_water = self.config.disk_high_water_ratio;
        // The dirty checkpoint is written once a first reading finds room, outside the gate's
        // lock (writing it takes the write lock, which a writer holds while it reads the disk).
        let mut checkpoint_failed = None;
        if self.dirty_checkpoint_pending.load(Ordering::Acquire) {
            let current = self.gate.refusal().map(|r| r.reason);
            let room = disk::read_usage(data_dir)
                .is_ok_and(|usage| disk::judge(&usage, current, high_water).is_none());
            if room {
                match self.housekeeping() {
                    Ok(()) => self
                        .dirty_checkpoint_pending
                        .store(false, Ordering::Release),
                    Err(error) => {
                        checkpoint_failed = Some(
                            error
                                .io_source()
                                .and_then(RefusalReason::of_io_error)
                                .unwrap_or(RefusalReason::NoSpace),
                        )
                    }
                }
            }
        }
        // Until it is written, writes stay refused.
        let pending = self.dirty_checkpoint_pending.load(Ordering::Acquire);
        let applied = self.gate.apply_reading(
            || disk::read_usage(data_dir),
            |usage, current| {
                let verdict = disk::judge(usage, current, high_water).or_else(|| {
                    pending.then(|| {
                        checkpoint_failed
                            .or(current)
                            .unwrap_or(RefusalReason::NoSpace)
                    })
                });
                match verdict {
                    Some(reason) => Verdict::Refuse(WriteRefusal {
                        reason,
                        message: disk::describe(reason, data_dir, usage, high_water, ""),
                    }),
                    None => Verdict::Accept,
                }
            },
        );
        if let Err(error) = applied {
            tracing::warn!(%error, data_dir = %data_dir.display(), "cannot read the data disk's usage");
        }
    }

    /// The writer's own look at the disk where disk use grows in steps: it is about to create
    /// a CommitLog segment, a ConsumeQueue file or an index file (the caller holds the write
    /// lock). Above `disk_high_water_ratio` the gate closes and the write is refused. Between
    /// two such looks the store only fills files it already has (at most a segment, a queue
    /// file and an index file; with `warm_segments`, also the next segment prepared), so with
    /// that much room above the mark writes are refused before the disk fills, however late
    /// the watcher's next reading comes. A disk whose usage cannot be read is left to the
    /// write itself.
    pub(super) fn ensure_room(&self) -> Result<(), StoreError> {
        let data_dir = &self.config.data_dir;
        let high_water = self.config.disk_high_water_ratio;
        if high_water >= 1.0 {
            // Never above: ENOSPC closes the gate.
            return Ok(());
        }
        let mut above = false;
        let held = self.gate.apply_reading(
            || disk::read_usage(data_dir),
            |usage, _| {
                if usage.ratio() <= high_water {
                    return Verdict::Keep;
                }
                above = true;
                let reason = RefusalReason::DiskHighWater;
                Verdict::Refuse(WriteRefusal {
                    reason,
                    message: disk::describe(reason, data_dir, usage, high_water, ""),
                })
            },
        );
        match held {
            Ok(Some(refusal)) if above => Err(self.gate.refuse(refusal)),
            _ => Ok(()),
        }
    }

    /// `MessageStore::run_retention`.
    pub(super) fn run_retention(
        &self,
        now_ms: i64,
        needed_from: Option<CommitLogOffset>,
    ) -> Result<RetentionReport, StoreError> {
        let _one_at_a_time = self.retention.lock();
        let config = &self.config;
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
            hold: self.replica_hold.get(),
        };
        let choice = retention::choose(&self.commit_log.snapshot(), &pressure)?;
        self.replica_hold.record(&choice);
        let mut report = RetentionReport {
            disk_used_ratio: usage.ratio(),
            held_for_replicas_bytes: choice.held_bytes,
            past_hold_cap: choice.past_cap,
            past_hold_forced: choice.past_forced,
            ..RetentionReport::default()
        };
        log_hold_give_way(&choice, pressure.hold, &report);
        if !choice.delete.is_empty() {
            self.delete_segments(&choice.delete, &mut report)?;
        }
        let log_min = self.commit_log.min_offset();
        for queue in self.all_queues() {
            report.deleted_queue_files += queue.advance_min(log_min)?;
        }
        report.deleted_index_files = self.index.delete_below(log_min)?;
        report.min_physical_offset = CommitLogOffset(log_min);
        Ok(report)
    }

    /// Deletes the CommitLog files retention chose, logging and counting each (the replica
    /// hold's give-way is logged by `log_hold_give_way`).
    fn delete_segments(
        &self,
        chosen: &[(Arc<crate::mapped_file::MappedSegment>, DeleteReason)],
        report: &mut RetentionReport,
    ) -> Result<(), StoreError> {
        let doomed: Vec<_> = chosen
            .iter()
            .map(|(segment, _)| Arc::clone(segment))
            .collect();
        self.commit_log.remove_segments(&doomed);
        for (segment, reason) in chosen {
            segment.delete()?;
            let path = segment.path().display();
            if *reason == DeleteReason::DiskForceClean {
                tracing::warn!(%path, disk_used_ratio = report.disk_used_ratio,
                    "deleted a commitlog file that consumer groups had not read yet: the disk is above disk-force-clean-ratio");
            } else {
                tracing::info!(%path, reason = reason.as_str(), "deleted commitlog file");
            }
            self.deleted_segments.add(*reason);
            report
                .deleted_segments
                .push((segment.path().to_path_buf(), *reason));
        }
        // Deleted names must stay deleted after a crash.
        sync_dir(self.commit_log.dir())
    }

    /// `MessageStore::delete_topic`.
    pub(super) fn delete_topic(&self, topic: &str) -> Result<(), StoreError> {
        if !is_safe_topic_dir(topic) {
            return Err(StoreError::InvalidTopic {
                topic: topic.to_owned(),
            });
        }
        // Under the write lock, so a concurrent put cannot re-create a queue mid-removal.
        let mut writer = self.writer.lock();
        writer.dispatcher.remove_topic(topic);
        self.registry.write().remove(topic);
        let root = self.config.data_dir.join("consumequeue");
        let topic_dir = root.join(topic);
        if topic_dir.exists() {
            std::fs::remove_dir_all(&topic_dir)
                .map_err(|e| StoreError::io("delete topic", &topic_dir, e))?;
        }
        // The deletion must survive a crash, or recovery would bring the queues back.
        sync_dir(&root)
    }

    /// The data file system as last read, and whether writes are refused and why.
    pub(super) fn disk_status(&self) -> DiskStatus {
        let usage = self.gate.usage();
        DiskStatus {
            data_dir: self.config.data_dir.clone(),
            used_bytes: usage.used,
            total_bytes: usage.total,
            available_bytes: usage.available,
            used_ratio: usage.ratio(),
            high_water_ratio: self.config.disk_high_water_ratio,
            refusal: self.gate.refusal(),
        }
    }

    pub(super) fn stats(&self) -> StoreStats {
        let min = self.commit_log.min_offset();
        let max = self.commit_log.committed();
        let usage = self.gate.usage();
        StoreStats {
            commitlog_bytes: max.saturating_sub(min),
            min_physical_offset: CommitLogOffset(min),
            max_physical_offset: CommitLogOffset(max),
            flushed_physical_offset: CommitLogOffset(self.flush.flushed()),
            consume_queues: self.registry.read().values().map(|q| q.len()).sum(),
            disk_used_bytes: usage.used,
            disk_total_bytes: usage.total,
        }
    }
}

/// Says when retention deletes files in-sync replicas still need: the hold's cap, or a disk
/// above the force-clean ratio.
fn log_hold_give_way(
    choice: &retention::Choice,
    hold: Option<retention::ReplicaHold>,
    report: &RetentionReport,
) {
    let Some(hold) = hold else {
        return;
    };
    if choice.past_cap > 0 {
        tracing::warn!(
            files = choice.past_cap,
            replicas_need_from = hold.from.0,
            cap_bytes = hold.cap_bytes,
            still_held_bytes = choice.held_bytes,
            "deleting commitlog files in-sync replicas still need: what they need is past the replica retention cap"
        );
    }
    if choice.past_forced > 0 {
        tracing::warn!(
            files = choice.past_forced,
            replicas_need_from = hold.from.0,
            disk_used_ratio = report.disk_used_ratio,
            "deleting commitlog files in-sync replicas still need: the disk is above disk-force-clean-ratio"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message, open_store, TOPIC};
    use crate::{QueueOffset, StoreError};

    #[test]
    fn readings_follow_appends_and_a_deleted_topic_loses_its_queues_not_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let put = store.put(&message(3, b"x", ""), 1).unwrap();
        let stats = store.stats();
        assert_eq!(stats.consume_queues, 1);
        assert_eq!(stats.max_physical_offset, store.log_end());
        assert_eq!(stats.commitlog_bytes, u64::from(put.size));
        assert_eq!(store.disk_status().refusal, None);
        assert!(store.deleted_segments().iter().all(|(_, n)| *n == 0));

        let error = store.delete_topic("../x").unwrap_err();
        assert!(matches!(error, StoreError::InvalidTopic { .. }));
        store.delete_topic(TOPIC).unwrap();
        assert!(store.queues().is_empty());
        assert!(!dir.path().join("consumequeue").join(TOPIC).exists());
        assert_eq!(store.max_offset(TOPIC, 3), QueueOffset(0));
        assert!(store.read_record_bytes(put.physical_offset).is_ok());
        let retention = store.run_retention(0, None).unwrap();
        assert!(retention.deleted_segments.is_empty());
        store.shutdown().unwrap();
    }

    #[test]
    fn retention_keeps_what_the_replica_hold_covers_up_to_its_cap() {
        use crate::retention::ReplicaHold;
        use crate::CommitLogOffset;

        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let segment = store.segment_size();
        let body = vec![1u8; 4096];
        while store.log_end().0 < 5 * segment {
            store.put(&message(0, &body, ""), 1).unwrap();
        }
        // Everything is expired a year from now; a replica holds up to inside the third file.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let later = now_ms + 365 * 24 * 3_600_000;
        let needed = 2 * segment + 100;
        store.set_replica_hold(Some(ReplicaHold {
            from: CommitLogOffset(needed),
            cap_bytes: u64::MAX,
        }));
        let report = store.run_retention(later, None).unwrap();
        assert_eq!(report.deleted_segments.len(), 2);
        assert_eq!(store.log_min(), CommitLogOffset(2 * segment));
        assert_eq!(report.held_for_replicas_bytes, 3 * segment);
        assert_eq!(store.replica_hold_stats().held_bytes, 3 * segment);

        // A cap of one file: two more go, counted, and one stays held.
        store.set_replica_hold(Some(ReplicaHold {
            from: CommitLogOffset(needed),
            cap_bytes: segment,
        }));
        let report = store.run_retention(later, None).unwrap();
        assert_eq!(
            (report.deleted_segments.len(), report.past_hold_cap),
            (2, 2)
        );
        let stats = store.replica_hold_stats();
        assert_eq!((stats.held_bytes, stats.cap_hits), (segment, 2));
        assert!(store.min_offset(TOPIC, 0).0 > 0, "queue min offsets follow");

        // Lifted: everything but the active file goes.
        store.set_replica_hold(None);
        let report = store.run_retention(later, None).unwrap();
        assert_eq!(report.deleted_segments.len(), 1);
        assert_eq!(store.replica_hold_stats().held_bytes, 0);
        store.shutdown().unwrap();
    }
}
