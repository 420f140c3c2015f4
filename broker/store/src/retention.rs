//! Retention: delete whole CommitLog files that are too old, or, under disk pressure, the
//! oldest ones no group still needs (any, past the force-clean ratio); never the active
//! file. ConsumeQueue min offsets follow.

use std::path::PathBuf;
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
/// until usage would drop below that.
pub(crate) fn choose(
    segments: &[Arc<MappedSegment>],
    pressure: &Pressure,
) -> Result<Vec<(Arc<MappedSegment>, DeleteReason)>, StoreError> {
    let mut chosen = Vec::new();
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
        used = used.saturating_sub(allocated_bytes(segment));
        chosen.push((Arc::clone(segment), reason));
    }
    Ok(chosen)
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
        }
    }

    fn reasons(chosen: &[(Arc<MappedSegment>, DeleteReason)]) -> Vec<DeleteReason> {
        chosen.iter().map(|(_, reason)| *reason).collect()
    }

    #[test]
    fn below_the_clean_ratio_nothing_unexpired_goes() {
        let dir = tempfile::tempdir().unwrap();
        let chosen = choose(&segments(dir.path()), &pressure(5, None)).unwrap();
        assert!(chosen.is_empty());
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
        assert!(chosen.is_empty());
    }

    #[test]
    fn above_the_force_clean_ratio_unread_files_go_too_but_never_the_active_one() {
        let dir = tempfile::tempdir().unwrap();
        let segments = segments(dir.path());
        let chosen = choose(&segments, &pressure(10, Some(0))).unwrap();
        assert_eq!(reasons(&chosen), [DeleteReason::DiskForceClean; 2]);
        let chosen = choose(&segments, &pressure(40, Some(0))).unwrap();
        assert_eq!(chosen.len(), 3, "the active file stays");
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
}
