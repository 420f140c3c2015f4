//! Retention: delete whole CommitLog files that are too old, or the oldest when the disk is
//! above its high-water mark; never the active file. ConsumeQueue min offsets follow.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use crate::error::StoreError;
use crate::mapped_file::MappedSegment;
use crate::position::CommitLogOffset;

/// Why a file was deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeleteReason {
    /// Last modified more than `file_reserved_hours` ago.
    Expired,
    /// The disk was above `disk_high_water_ratio`.
    DiskHighWater,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RetentionReport {
    pub deleted_segments: Vec<(PathBuf, DeleteReason)>,
    pub deleted_queue_files: usize,
    /// The CommitLog's first readable offset afterwards.
    pub min_physical_offset: CommitLogOffset,
    /// Used / total bytes of the data directory's file system, before deleting.
    pub disk_used_ratio: f64,
}

/// Used and total bytes of the file system holding `path`.
pub(crate) fn disk_usage(path: &Path) -> Result<(u64, u64), StoreError> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| {
        StoreError::io(
            "statvfs",
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
        )
    })?;
    // SAFETY: statvfs only writes into the zeroed struct we pass it.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is a valid NUL-terminated string and stats a valid out pointer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stats) };
    if rc != 0 {
        return Err(StoreError::io(
            "statvfs",
            path,
            std::io::Error::last_os_error(),
        ));
    }
    let fragment = stats.f_frsize as u64;
    let total = stats.f_blocks as u64 * fragment;
    let free = stats.f_bfree as u64 * fragment;
    Ok((total.saturating_sub(free), total))
}

fn modified_ms(segment: &MappedSegment) -> Result<i64, StoreError> {
    let modified = std::fs::metadata(segment.path())
        .and_then(|m| m.modified())
        .map_err(|e| StoreError::io("stat segment", segment.path(), e))?;
    Ok(modified
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64))
}

/// Picks the oldest files to delete: expired ones, then one more if the disk is too full.
pub(crate) fn choose(
    segments: &[Arc<MappedSegment>],
    now_ms: i64,
    reserved_ms: i64,
    disk_over_high_water: bool,
) -> Result<Vec<(Arc<MappedSegment>, DeleteReason)>, StoreError> {
    let mut chosen = Vec::new();
    // The last file is the active one.
    let candidates = &segments[..segments.len().saturating_sub(1)];
    for segment in candidates {
        if now_ms.saturating_sub(modified_ms(segment)?) < reserved_ms {
            break;
        }
        chosen.push((Arc::clone(segment), DeleteReason::Expired));
    }
    if disk_over_high_water {
        if let Some(next) = candidates.get(chosen.len()) {
            chosen.push((Arc::clone(next), DeleteReason::DiskHighWater));
        }
    }
    Ok(chosen)
}
