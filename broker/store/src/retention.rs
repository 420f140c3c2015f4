//! Retention: delete whole CommitLog files that are too old, or, under disk pressure, the
//! oldest ones no group still needs (any, past the force-clean ratio); never the active
//! file. ConsumeQueue min offsets follow. A replicated group's master holds the files its
//! in-sync replicas still need (up to a cap), except at the force-clean ratio.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::error::StoreError;
use crate::mapped_file::MappedSegment;
use crate::CommitLogOffset;

/// Why a file was deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// Last modified more than `file_reserved_hours` ago.
    Expired,
    /// The disk was above `disk_clean_ratio` and no subscribed group still needed the file.
    DiskClean,
    /// The disk was above `disk_force_clean_ratio`: deleted although a group had not read it.
    DiskForceClean,
}

impl DeleteReason {
    pub const ALL: [DeleteReason; 3] = [
        DeleteReason::Expired,
        DeleteReason::DiskClean,
        DeleteReason::DiskForceClean,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteReason::Expired => "expired",
            DeleteReason::DiskClean => "disk-clean",
            DeleteReason::DiskForceClean => "disk-force-clean",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetentionReport {
    pub deleted_segments: Vec<(PathBuf, DeleteReason)>,
    pub deleted_queue_files: usize,
    /// Message index files whose every entry pointed at deleted records.
    pub deleted_index_files: usize,
    /// The CommitLog's first readable offset afterwards.
    pub min_physical_offset: CommitLogOffset,
    /// Used / total bytes of the data directory's file system, before deleting.
    pub disk_used_ratio: f64,
    /// Bytes of files kept only because in-sync replicas still need them (the replica hold).
    pub held_for_replicas_bytes: u64,
    /// Files deleted although a replica still needed them: the hold was past its cap.
    pub past_hold_cap: usize,
    /// Files deleted although a replica still needed them: the disk was above the
    /// force-clean ratio.
    pub past_hold_forced: usize,
}

/// The master's hold for its in-sync replicas: no file with bytes at or above `from` is
/// deleted for age or disk-clean pressure, as long as such files total at most `cap_bytes`
/// (past it the oldest go); at the force-clean ratio the hold gives way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaHold {
    pub from: CommitLogOffset,
    pub cap_bytes: u64,
}

/// What the replica hold kept and where it gave way, since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaHoldStats {
    /// Bytes of files the last retention run kept only for the hold.
    pub held_bytes: u64,
    /// Files deleted although the hold wanted them, because of its cap.
    pub cap_hits: u64,
    /// Files deleted although the hold wanted them, because of the force-clean ratio.
    pub forced: u64,
}

/// The hold as set, and its readings.
#[derive(Debug, Default)]
pub(crate) struct HoldState {
    setting: parking_lot::Mutex<Option<ReplicaHold>>,
    held_bytes: AtomicU64,
    cap_hits: AtomicU64,
    forced: AtomicU64,
}

impl HoldState {
    pub(crate) fn set(&self, hold: Option<ReplicaHold>) {
        *self.setting.lock() = hold;
        if hold.is_none() {
            self.held_bytes.store(0, Ordering::Release);
        }
    }

    pub(crate) fn get(&self) -> Option<ReplicaHold> {
        *self.setting.lock()
    }

    /// Records what one retention run's choice kept and gave way.
    pub(crate) fn record(&self, choice: &Choice) {
        self.held_bytes.store(choice.held_bytes, Ordering::Release);
        self.cap_hits
            .fetch_add(choice.past_cap as u64, Ordering::AcqRel);
        self.forced
            .fetch_add(choice.past_forced as u64, Ordering::AcqRel);
    }

    pub(crate) fn stats(&self) -> ReplicaHoldStats {
        ReplicaHoldStats {
            held_bytes: self.held_bytes.load(Ordering::Acquire),
            cap_hits: self.cap_hits.load(Ordering::Acquire),
            forced: self.forced.load(Ordering::Acquire),
        }
    }
}

/// What retention weighs, besides the files themselves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pressure {
    pub now_ms: i64,
    pub reserved_ms: i64,
    pub used: u64,
    pub total: u64,
    pub clean_ratio: f64,
    pub force_clean_ratio: f64,
    /// The lowest CommitLog offset a subscribed group has yet to read; `None`: none has.
    pub needed_from: Option<u64>,
    /// What in-sync replicas still need (on a group's master).
    pub hold: Option<ReplicaHold>,
}

/// The files retention deletes, oldest first, and what the replica hold did.
#[derive(Default)]
pub(crate) struct Choice {
    pub delete: Vec<(Arc<MappedSegment>, DeleteReason)>,
    /// Bytes of the files kept only for the hold.
    pub held_bytes: u64,
    /// Of `delete`, how many the hold wanted but its cap let go (the last ones).
    pub past_cap: usize,
    /// Of `delete`, how many the hold wanted but the force-clean ratio took.
    pub past_forced: usize,
}

impl Pressure {
    fn above(&self, used: u64, ratio: f64) -> bool {
        self.total > 0 && used as f64 / self.total as f64 > ratio
    }
}

fn modified_ms(segment: &MappedSegment) -> Result<i64, StoreError> {
    let modified = std::fs::metadata(segment.path())
        .and_then(|m| m.modified())
        .map_err(|e| StoreError::io("stat segment", segment.path(), e))?;
    Ok(modified
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64))
}

fn allocated_bytes(segment: &MappedSegment) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(segment.path()).map_or(0, |m| m.blocks() * 512)
}

/// Picks the oldest files to delete, never the active (last) one: the expired ones; then,
/// above the clean ratio, those wholly below what every group has read, until usage would
/// drop below it; then, above the force-clean ratio, the oldest whatever groups still need,
/// until usage would drop below that. Below the force-clean ratio, files the replica hold
/// covers stay, as long as they total at most its cap (past it, the oldest go).
pub(crate) fn choose(
    segments: &[Arc<MappedSegment>],
    pressure: &Pressure,
) -> Result<Choice, StoreError> {
    let mut choice = Choice::default();
    let mut held = Vec::new();
    let candidates = &segments[..segments.len().saturating_sub(1)];
    let mut used = pressure.used;
    for segment in candidates {
        let age_ms = pressure.now_ms.saturating_sub(modified_ms(segment)?);
        let read_by_all = pressure
            .needed_from
            .is_none_or(|needed| segment.end() <= needed);
        let reason = if age_ms >= pressure.reserved_ms {
            DeleteReason::Expired
        } else if pressure.above(used, pressure.clean_ratio) && read_by_all {
            DeleteReason::DiskClean
        } else if pressure.above(used, pressure.force_clean_ratio) {
            DeleteReason::DiskForceClean
        } else {
            break;
        };
        let needed_by_replicas = pressure
            .hold
            .is_some_and(|hold| segment.end() > hold.from.0);
        if needed_by_replicas {
            // A full disk is worse than a replica that must rebuild.
            if pressure.above(used, pressure.force_clean_ratio) {
                choice.past_forced += 1;
            } else {
                // Every later file holds later bytes: the hold covers them too. Counted as
                // gone, so the hold keeps exactly what retention would have deleted.
                used = used.saturating_sub(allocated_bytes(segment));
                held.push((Arc::clone(segment), reason));
                continue;
            }
        }
        used = used.saturating_sub(allocated_bytes(segment));
        choice.delete.push((Arc::clone(segment), reason));
    }
    let cap = pressure.hold.map_or(u64::MAX, |hold| hold.cap_bytes);
    let mut held_bytes: u64 = held.iter().map(|(s, _)| s.len()).sum();
    let mut held = held.into_iter();
    while held_bytes > cap {
        let (segment, reason) = held.next().expect("held bytes come from held files");
        held_bytes -= segment.len();
        choice.past_cap += 1;
        choice.delete.push((segment, reason));
    }
    choice.held_bytes = held_bytes;
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT: u64 = 1 << 20;

    /// Four fully written 1 MiB segments, just modified.
    fn segments(dir: &std::path::Path) -> Vec<Arc<MappedSegment>> {
        (0..4)
            .map(|i| {
                let segment = MappedSegment::create(dir, i * SEGMENT, SEGMENT).unwrap();
                std::fs::write(segment.path(), vec![1u8; SEGMENT as usize]).unwrap();
                segment
            })
            .collect()
    }

    fn pressure(used_mib: u64, needed_from: Option<u64>) -> Pressure {
        let now_ms = std::time::SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        Pressure {
            now_ms,
            reserved_ms: 3_600_000,
            used: used_mib << 20,
            total: 10 << 20,
            clean_ratio: 0.5,
            force_clean_ratio: 0.8,
            needed_from,
            hold: None,
        }
    }

    fn reasons(choice: &Choice) -> Vec<DeleteReason> {
        choice.delete.iter().map(|(_, reason)| *reason).collect()
    }

    #[test]
    fn below_the_clean_ratio_nothing_unexpired_goes() {
        let dir = tempfile::tempdir().unwrap();
        let chosen = choose(&segments(dir.path()), &pressure(5, None)).unwrap();
        assert!(chosen.delete.is_empty());
    }

    #[test]
    fn above_the_clean_ratio_only_files_every_group_has_read_go_until_below() {
        let dir = tempfile::tempdir().unwrap();
        let segments = segments(dir.path());
        // 7 MiB of 10 used: two files bring it to 5, not above 0.5; the third is needed.
        let chosen = choose(&segments, &pressure(7, Some(3 * SEGMENT))).unwrap();
        assert_eq!(reasons(&chosen), [DeleteReason::DiskClean; 2]);
        // A group still reading the first file protects it and everything after.
        let chosen = choose(&segments, &pressure(7, Some(SEGMENT / 2))).unwrap();
        assert!(chosen.delete.is_empty());
    }

    #[test]
    fn above_the_force_clean_ratio_unread_files_go_too_but_never_the_active_one() {
        let dir = tempfile::tempdir().unwrap();
        let segments = segments(dir.path());
        let chosen = choose(&segments, &pressure(10, Some(0))).unwrap();
        assert_eq!(reasons(&chosen), [DeleteReason::DiskForceClean; 2]);
        let chosen = choose(&segments, &pressure(40, Some(0))).unwrap();
        assert_eq!(chosen.delete.len(), 3, "the active file stays");
    }

    #[test]
    fn expired_files_go_whatever_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let segments = segments(dir.path());
        let mut expired = pressure(1, Some(0));
        expired.now_ms += 2 * expired.reserved_ms;
        let chosen = choose(&segments, &expired).unwrap();
        assert_eq!(reasons(&chosen), [DeleteReason::Expired; 3]);
    }

    fn expired_holding(from: u64, cap_bytes: u64) -> Pressure {
        let mut expired = pressure(1, None);
        expired.now_ms += 2 * expired.reserved_ms;
        expired.hold = Some(ReplicaHold {
            from: CommitLogOffset(from),
            cap_bytes,
        });
        expired
    }

    #[test]
    fn the_replica_hold_keeps_what_in_sync_replicas_need_up_to_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let segments = segments(dir.path());
        // A replica holds up to the middle of the second file: the first may go.
        let choice = choose(&segments, &expired_holding(SEGMENT + 10, u64::MAX)).unwrap();
        assert_eq!(reasons(&choice), [DeleteReason::Expired]);
        assert_eq!((choice.held_bytes, choice.past_cap), (2 * SEGMENT, 0));
        // A cap of one file: the older held file goes anyway, and is counted.
        let choice = choose(&segments, &expired_holding(SEGMENT + 10, SEGMENT)).unwrap();
        assert_eq!(reasons(&choice), [DeleteReason::Expired; 2]);
        assert_eq!((choice.held_bytes, choice.past_cap), (SEGMENT, 1));
        assert_eq!(choice.delete[1].0.base(), SEGMENT);
        // No hold: everything but the active file.
        let mut free = expired_holding(0, 0);
        free.hold = None;
        assert_eq!(choose(&segments, &free).unwrap().delete.len(), 3);
    }

    #[test]
    fn the_force_clean_ratio_deletes_what_the_hold_wanted_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let segments = segments(dir.path());
        let mut full = pressure(10, Some(0));
        full.hold = Some(ReplicaHold {
            from: CommitLogOffset(0),
            cap_bytes: u64::MAX,
        });
        let choice = choose(&segments, &full).unwrap();
        assert_eq!(reasons(&choice), [DeleteReason::DiskForceClean; 2]);
        assert_eq!((choice.past_forced, choice.held_bytes), (2, 0));
        // Below the force-clean ratio, the clean ratio yields to the hold.
        let mut pressed = pressure(7, Some(3 * SEGMENT));
        pressed.hold = full.hold;
        let choice = choose(&segments, &pressed).unwrap();
        assert!(choice.delete.is_empty());
        assert_eq!(
            choice.held_bytes,
            2 * SEGMENT,
            "what the clean ratio would delete"
        );
    }
}
