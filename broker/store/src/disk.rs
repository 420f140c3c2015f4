//! The write gate: whether the store takes writes, and why not. A full disk, a failed fsync,
//! a read-only file system or a deleted data directory close it; reads never depend on it.
//!
//! The disk watcher (`run_disk_watcher`) reads the data file system every
//! `disk_check_interval_ms`, closes the gate above `disk_high_water_ratio` and reopens it
//! once usage drops. Write paths close it themselves on ENOSPC, EROFS or EIO, so the next
//! send is refused before any byte is copied instead of failing half-way. The writer also
//! reads the disk itself, synchronously, where disk use grows in steps (a new CommitLog
//! segment, ConsumeQueue file or index file), and refuses above the mark: between two such
//! readings the store only fills files it already has, however late the watcher's next
//! reading comes (`Shared::ensure_room`). Readings and their verdicts are applied under
//! the gate's lock (`WriteGate::apply_reading`), so an older one never undoes a newer one.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::tally::Tally;

/// Why the store refuses writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusalReason {
    /// The data file system is above `disk_high_water_ratio`.
    DiskHighWater,
    /// A write met ENOSPC (or EDQUOT) below the high-water mark.
    NoSpace,
    /// A CommitLog flush failed: what it covered may be lost, so nothing more is accepted
    /// until a restart recovers from what is really on disk.
    FsyncFailed,
    /// A write failed with EIO.
    IoError,
    /// The data file system is mounted read-only.
    ReadOnlyFs,
    /// The data directory was deleted or replaced under the running store.
    DataDirGone,
    /// Not the store's own refusal: the broker is a replica of a group (or the group has
    /// no master), so only the master's replicated bytes are written.
    NotMaster,
}

impl RefusalReason {
    /// Every reason the store's own gate gives, for metrics that list each one
    /// (`NotMaster` is the broker's, never the gate's).
    pub const ALL: [RefusalReason; 6] = [
        RefusalReason::DiskHighWater,
        RefusalReason::NoSpace,
        RefusalReason::FsyncFailed,
        RefusalReason::IoError,
        RefusalReason::ReadOnlyFs,
        RefusalReason::DataDirGone,
    ];

    /// The metric label and runtime-info value.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::DiskHighWater => "disk-high-water",
            RefusalReason::NoSpace => "no-space",
            RefusalReason::FsyncFailed => "fsync-failed",
            RefusalReason::IoError => "io-error",
            RefusalReason::ReadOnlyFs => "read-only-fs",
            RefusalReason::DataDirGone => "data-dir-gone",
            RefusalReason::NotMaster => "not-master",
        }
    }

    /// Only a restart clears it: the store can no longer trust its files.
    pub fn needs_restart(self) -> bool {
        matches!(
            self,
            RefusalReason::FsyncFailed | RefusalReason::IoError | RefusalReason::DataDirGone
        )
    }

    /// The reason an I/O error on a write path stands for, if it closes the gate.
    pub(crate) fn of_io_error(error: &std::io::Error) -> Option<RefusalReason> {
        match error.raw_os_error()? {
            libc::ENOSPC | libc::EDQUOT => Some(RefusalReason::NoSpace),
            libc::EROFS => Some(RefusalReason::ReadOnlyFs),
            libc::EIO => Some(RefusalReason::IoError),
            _ => None,
        }
    }
}

/// Writes are refused: the reason and a sentence naming the disk.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct WriteRefusal {
    pub reason: RefusalReason,
    pub message: String,
}

/// The data file system as last read, and the gate.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskStatus {
    pub data_dir: PathBuf,
    pub used_bytes: u64,
    pub total_bytes: u64,
    /// Bytes an unprivileged writer may still use (statvfs `f_bavail`).
    pub available_bytes: u64,
    pub used_ratio: f64,
    pub high_water_ratio: f64,
    pub refusal: Option<WriteRefusal>,
}

/// One statvfs reading.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Usage {
    pub used: u64,
    pub total: u64,
    pub available: u64,
    pub read_only: bool,
}

impl Usage {
    pub(crate) fn ratio(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.used as f64 / self.total as f64
        }
    }
}

/// statvfs of the file system holding `path`.
pub(crate) fn read_usage(path: &Path) -> std::io::Result<Usage> {
    let stats = rustix::fs::statvfs(path)?;
    let fragment = stats.f_frsize;
    let total = stats.f_blocks * fragment;
    let free = stats.f_bfree * fragment;
    Ok(Usage {
        used: total.saturating_sub(free),
        total,
        available: stats.f_bavail * fragment,
        read_only: stats.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY),
    })
}

/// Device and inode of a directory: a deleted and re-created data directory differs.
pub(crate) fn dir_identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

/// Bytes that must be free before writes refused for `NoSpace` resume: 5% of the disk,
/// between 1 MiB and 64 MiB, so one freed block does not reopen the gate for one send.
pub(crate) fn resume_free_bytes(total: u64) -> u64 {
    (total / 20).clamp(1 << 20, 64 << 20)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The sentence a refused sender reads.
pub(crate) fn describe(
    reason: RefusalReason,
    data_dir: &Path,
    usage: &Usage,
    high_water: f64,
    detail: &str,
) -> String {
    let dir = data_dir.display();
    let used = format!(
        "{:.1}% used, {} free of {}",
        usage.ratio() * 100.0,
        mib(usage.available),
        mib(usage.total)
    );
    match reason {
        RefusalReason::DiskHighWater => format!(
            "disk full: the file system of {dir} is {used}, above the high-water mark of {:.1}%; \
             sends are refused until space is freed (reads keep working)",
            high_water * 100.0
        ),
        RefusalReason::NoSpace => format!(
            "disk full: no space left on the file system of {dir} ({used}){detail}; sends are \
             refused until space is freed (reads keep working)"
        ),
        RefusalReason::FsyncFailed => format!(
            "the disk of {dir} failed a flush{detail}; writes are refused until the broker is \
             restarted and recovers what is really on disk"
        ),
        RefusalReason::IoError => format!(
            "the disk of {dir} failed a write with an I/O error{detail}; writes are refused until \
             the broker is restarted"
        ),
        RefusalReason::ReadOnlyFs => format!(
            "the file system of {dir} is read-only{detail}; sends are refused until it is \
             writable again (reads keep working)"
        ),
        RefusalReason::DataDirGone => format!(
            "the data directory {dir} was deleted or replaced while the broker ran{detail}; \
             writes are refused until the broker is restarted"
        ),
        RefusalReason::NotMaster => format!(
            "this broker is not its group's master{detail}; send to the master (reads keep working)"
        ),
    }
}

/// The sentence for a store opened on a read-only file system: only a restart helps, since
/// its files are mapped read-only.
pub(crate) fn describe_opened_read_only(data_dir: &Path) -> String {
    format!(
        "the file system of {} was read-only when the broker started; sends are refused until \
         the broker is restarted on a writable one (reads keep working)",
        data_dir.display()
    )
}

/// The gate writers check before each append, and the last disk reading.
pub(crate) struct WriteGate {
    refusing: AtomicBool,
    refusal: Mutex<Option<WriteRefusal>>,
    used: AtomicU64,
    total: AtomicU64,
    available: AtomicU64,
    /// Writes refused since open, by reason.
    refused: Tally<RefusalReason, { RefusalReason::ALL.len() }>,
}

impl WriteGate {
    pub(crate) fn new(usage: Usage) -> WriteGate {
        let gate = WriteGate {
            refusing: AtomicBool::new(false),
            refusal: Mutex::new(None),
            used: AtomicU64::new(0),
            total: AtomicU64::new(0),
            available: AtomicU64::new(0),
            refused: Tally::new(&RefusalReason::ALL),
        };
        gate.record_usage(&usage);
        gate
    }

    fn record_usage(&self, usage: &Usage) {
        self.used.store(usage.used, Ordering::Relaxed);
        self.total.store(usage.total, Ordering::Relaxed);
        self.available.store(usage.available, Ordering::Relaxed);
    }

    pub(crate) fn usage(&self) -> Usage {
        Usage {
            used: self.used.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            available: self.available.load(Ordering::Relaxed),
            read_only: false,
        }
    }

    /// `Err` with the refusal while the gate is closed; counts the refused write.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if !self.refusing.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.refusal.lock().clone() {
            Some(refusal) => Err(self.refuse(refusal)),
            None => Ok(()),
        }
    }

    /// Counts a refused write and gives the error its writer sees.
    pub(crate) fn refuse(&self, refusal: WriteRefusal) -> StoreError {
        self.refused.add(refusal.reason);
        StoreError::WritesRefused(refusal)
    }

    /// Writes refused since open, per reason.
    pub(crate) fn refused_counts(&self) -> Vec<(RefusalReason, u64)> {
        self.refused.read()
    }

    pub(crate) fn refusal(&self) -> Option<WriteRefusal> {
        self.refusal.lock().clone()
    }

    /// Closes the gate (a refusal that needs a restart is never replaced); logs changes.
    pub(crate) fn close(&self, refusal: WriteRefusal) {
        self.close_held(&mut self.refusal.lock(), refusal);
    }

    /// Reads the disk with `read` and applies `decide`'s verdict on the reading and the
    /// refusal held, all under the gate's lock: no other change of the gate falls between a
    /// reading and its verdict, so an older reading never undoes a newer one (the watcher's,
    /// below the mark, reopening a gate that a writer's check above it had just closed).
    /// Returns the refusal held afterwards.
    pub(crate) fn apply_reading(
        &self,
        read: impl FnOnce() -> std::io::Result<Usage>,
        decide: impl FnOnce(&Usage, Option<RefusalReason>) -> Verdict,
    ) -> std::io::Result<Option<WriteRefusal>> {
        let mut current = self.refusal.lock();
        let usage = read()?;
        self.record_usage(&usage);
        match decide(&usage, current.as_ref().map(|r| r.reason)) {
            Verdict::Refuse(refusal) => self.close_held(&mut current, refusal),
            Verdict::Accept => self.open_held(&mut current),
            Verdict::Keep => {}
        }
        Ok(current.clone())
    }

    fn close_held(&self, current: &mut Option<WriteRefusal>, refusal: WriteRefusal) {
        if current.as_ref().is_some_and(|c| c.reason.needs_restart()) {
            return;
        }
        if current.as_ref().map(|c| c.reason) != Some(refusal.reason) {
            tracing::warn!(
                reason = refusal.reason.as_str(),
                "writes refused: {}",
                refusal.message
            );
        }
        *current = Some(refusal);
        self.refusing.store(true, Ordering::Release);
    }

    /// Reopens the gate unless its refusal needs a restart.
    fn open_held(&self, current: &mut Option<WriteRefusal>) {
        if let Some(refusal) = current.as_ref().filter(|r| !r.reason.needs_restart()) {
            tracing::info!(
                was = refusal.reason.as_str(),
                "writes accepted again: the disk has room"
            );
            *current = None;
            self.refusing.store(false, Ordering::Release);
        }
    }
}

/// What one reading of the disk does to the gate.
pub(crate) enum Verdict {
    /// Close it with this refusal.
    Refuse(WriteRefusal),
    /// Open it (unless its refusal needs a restart).
    Accept,
    /// Leave it as it is.
    Keep,
}

/// What the watcher decides from one reading: the refusal to hold, or none.
pub(crate) fn judge(
    usage: &Usage,
    current: Option<RefusalReason>,
    high_water: f64,
) -> Option<RefusalReason> {
    if let Some(reason) = current.filter(|r| r.needs_restart()) {
        return Some(reason);
    }
    if usage.read_only {
        return Some(RefusalReason::ReadOnlyFs);
    }
    if usage.ratio() > high_water {
        return Some(RefusalReason::DiskHighWater);
    }
    // Met ENOSPC below the mark (reserved blocks, quotas, another writer): wait for room.
    if current == Some(RefusalReason::NoSpace) && usage.available < resume_free_bytes(usage.total) {
        return Some(RefusalReason::NoSpace);
    }
    // A write met EROFS, but statvfs no longer says read-only: remounted read-write.
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(used_pct: u64, read_only: bool) -> Usage {
        let total = 100 << 20;
        Usage {
            used: total * used_pct / 100,
            total,
            available: total - total * used_pct / 100,
            read_only,
        }
    }

    #[test]
    fn judge_refuses_above_high_water_and_reopens_below() {
        assert_eq!(
            judge(&usage(91, false), None, 0.9),
            Some(RefusalReason::DiskHighWater)
        );
        assert_eq!(
            judge(&usage(89, false), Some(RefusalReason::DiskHighWater), 0.9),
            None
        );
        assert_eq!(judge(&usage(90, false), None, 0.9), None);
    }

    #[test]
    fn judge_holds_no_space_until_enough_is_free() {
        let reason = Some(RefusalReason::NoSpace);
        assert_eq!(judge(&usage(97, false), reason, 1.0), reason);
        assert_eq!(judge(&usage(90, false), reason, 1.0), None);
    }

    #[test]
    fn judge_never_lifts_a_refusal_that_needs_a_restart() {
        for reason in [RefusalReason::FsyncFailed, RefusalReason::DataDirGone] {
            assert_eq!(judge(&usage(10, false), Some(reason), 0.9), Some(reason));
        }
        assert_eq!(
            judge(&usage(10, true), None, 0.9),
            Some(RefusalReason::ReadOnlyFs)
        );
        assert_eq!(
            judge(&usage(10, false), Some(RefusalReason::ReadOnlyFs), 0.9),
            None
        );
    }

    #[test]
    fn gate_counts_refusals_and_keeps_restart_reasons() {
        let gate = WriteGate::new(usage(10, false));
        gate.check().unwrap();
        let refusal = |reason| WriteRefusal {
            reason,
            message: format!("{reason:?}"),
        };
        gate.close(refusal(RefusalReason::NoSpace));
        assert!(
            matches!(gate.check(), Err(StoreError::WritesRefused(r)) if r.reason == RefusalReason::NoSpace)
        );
        gate.close(refusal(RefusalReason::FsyncFailed));
        gate.close(refusal(RefusalReason::DiskHighWater));
        let held = gate
            .apply_reading(|| Ok(usage(10, false)), |_, _| Verdict::Accept)
            .unwrap();
        assert_eq!(
            held.map(|r| r.reason),
            Some(RefusalReason::FsyncFailed),
            "an fsync failure needs a restart"
        );
        assert_eq!(gate.refusal().unwrap().reason, RefusalReason::FsyncFailed);
        let counts = gate.refused_counts();
        assert!(counts.contains(&(RefusalReason::NoSpace, 1)));
    }

    #[test]
    fn io_errors_map_to_reasons() {
        let of = |code| RefusalReason::of_io_error(&std::io::Error::from_raw_os_error(code));
        assert_eq!(of(libc::ENOSPC), Some(RefusalReason::NoSpace));
        assert_eq!(of(libc::EROFS), Some(RefusalReason::ReadOnlyFs));
        assert_eq!(of(libc::EIO), Some(RefusalReason::IoError));
        assert_eq!(of(libc::EINVAL), None);
    }

    #[test]
    fn the_refusal_names_the_disk_and_its_usage() {
        let text = describe(
            RefusalReason::DiskHighWater,
            Path::new("/data/store"),
            &usage(95, false),
            0.9,
            "",
        );
        assert!(
            text.contains("/data/store") && text.contains("95.0% used"),
            "{text}"
        );
        assert!(text.contains("90.0%"), "{text}");
    }
}
