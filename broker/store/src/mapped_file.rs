//! One memory-mapped, pre-sized file: a CommitLog or ConsumeQueue segment.
//!
//! Concurrency contract: a region is written once (by the single writer, under the store's
//! write lock) before it is published; readers only view published regions. Regions are
//! only rewritten by recovery, before the store serves anything.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use memmap2::{MmapOptions, MmapRaw};

use crate::error::StoreError;
use crate::warm;

/// Length of a segment file name: the base offset zero-padded to 20 digits.
pub(crate) const SEGMENT_NAME_DIGITS: usize = 20;

pub(crate) fn segment_name(base: u64) -> String {
    format!("{base:020}")
}

/// Parses a 20-digit segment name; `None` for anything else in the directory.
/// The suffix of a segment file being created and sized, before it takes its name.
const CREATING_SUFFIX: &str = ".creating";

fn is_creating(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str()?.strip_suffix(CREATING_SUFFIX))
        .is_some_and(|name| parse_segment_name(Path::new(name)).is_some())
}

pub(crate) fn parse_segment_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    if name.len() != SEGMENT_NAME_DIGITS || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// The largest step `zero_fill_ahead` takes, and so the length of `ZEROS`.
pub(crate) const MAX_FILL_STEP_BYTES: u64 = 1024 * 1024;
/// Zeros to write from, up to `MAX_FILL_STEP_BYTES` at a time (allocated, not in the binary).
pub(crate) static ZEROS: std::sync::LazyLock<Box<[u8]>> =
    std::sync::LazyLock::new(|| vec![0; MAX_FILL_STEP_BYTES as usize].into_boxed_slice());

/// The first multiple of `step` in the segment file (first byte at `base`) at or after `at`.
pub(crate) fn step_boundary(base: u64, at: u64, step: u64) -> u64 {
    base + (at - base).next_multiple_of(step)
}

/// Where filling from `filled_to` past `end` in `step`s stops: at least `step` ahead, at a
/// multiple of `step` in the segment file (first byte at `base`), never past `limit`.
pub(crate) fn fill_end(base: u64, limit: u64, filled_to: u64, end: u64, step: u64) -> u64 {
    debug_assert!(step > 0 && step <= MAX_FILL_STEP_BYTES);
    step_boundary(base, end.max(filled_to + step), step)
        .min(limit)
        .max(filled_to)
}

/// Writes zeros with plain writes into the segment file `file` (first byte at `base`, last
/// before `limit`) from `filled_to` to `fill_end`; returns the new `filled_to`. Ahead of a
/// writer that then writes through the mapping, this puts the pages in the page cache without
/// the page fault that would zero them (and, with a large `read_ahead_kb`, megabytes around
/// them) first. Every write but the first covers one aligned `step`, which the page cache
/// keeps as one folio of that size when memory allows, and a read through the mapping faults
/// in a folio at a time. Positions are the segment's own (CommitLog or queue bytes).
pub(crate) fn zero_fill_ahead(
    file: &File,
    base: u64,
    limit: u64,
    filled_to: u64,
    end: u64,
    step: u64,
) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let to = fill_end(base, limit, filled_to, end, step);
    let mut at = filled_to;
    while at < to {
        let next = step_boundary(base, at + 1, step).min(to);
        file.write_all_at(&ZEROS[..(next - at) as usize], at - base)?;
        at = next;
    }
    Ok(to)
}

/// Writes `data` at file offset `at`, followed by `zeros` zero bytes, with one `pwritev`: the
/// page cache sizes the folios it creates by the length of the write, so records and the zeros
/// after them land in folios as large as the whole, and no byte is copied twice.
pub(crate) fn write_with_zeros_at(
    file: &File,
    data: &[u8],
    at: u64,
    zeros: u64,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    if zeros == 0 {
        return file.write_all_at(data, at);
    }
    let mut parts = vec![data];
    let mut left = zeros;
    while left > 0 {
        let n = left.min(MAX_FILL_STEP_BYTES);
        parts.push(&ZEROS[..n as usize]);
        left -= n;
    }
    let slices: Vec<std::io::IoSlice<'_>> = parts
        .iter()
        .map(|part| std::io::IoSlice::new(part))
        .collect();
    let mut done = match rustix::io::pwritev(file, &slices, at) {
        Ok(written) => written as u64,
        Err(rustix::io::Errno::INTR) => 0,
        Err(errno) => return Err(errno.into()),
    };
    // A short write (a signal, a full disk) finishes part by part, or reports why not.
    let mut part_at = at;
    for part in parts {
        let len = part.len() as u64;
        if done < len {
            file.write_all_at(&part[done as usize..], part_at + done)?;
        }
        done = done.saturating_sub(len);
        part_at += len;
    }
    Ok(())
}

/// Starts writing back `len` bytes of `file` at `at` without waiting (sync_file_range), so
/// the blocks are allocated and on disk before a later fsync needs them.
#[cfg(target_os = "linux")]
pub(crate) fn start_writeback(file: &File, at: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(at), Ok(len)) = (i64::try_from(at), i64::try_from(len)) else {
        return Ok(());
    };
    // SAFETY: a valid descriptor; the call only reads its arguments.
    let rc =
        unsafe { libc::sync_file_range(file.as_raw_fd(), at, len, libc::SYNC_FILE_RANGE_WRITE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Elsewhere the next fsync writes the blocks back.
#[cfg(not(target_os = "linux"))]
pub(crate) fn start_writeback(_file: &File, _at: u64, _len: u64) -> std::io::Result<()> {
    Ok(())
}

/// Has the kernel bring `len` bytes of `file` at `at` into the page cache (readahead; a hole
/// reads as zeros without I/O), so a later pwrite there only copies. The pages are allocated
/// and first touched here, outside the file's write lock (`i_rwsem`), which a pwrite holds
/// throughout; best effort: on failure the pwrite allocates them itself.
#[cfg(target_os = "linux")]
pub(crate) fn load_pages(file: &File, at: u64, len: u64) {
    // Best effort: on failure the pwrite allocates the pages itself.
    let _ = rustix::fs::fadvise(
        file,
        at,
        std::num::NonZeroU64::new(len),
        rustix::fs::Advice::WillNeed,
    );
}

/// Elsewhere the pwrite allocates the pages.
#[cfg(not(target_os = "linux"))]
pub(crate) fn load_pages(_file: &File, _at: u64, _len: u64) {}

/// The parts of `[from, len)` of the file at `path` that may hold data (SEEK_DATA /
/// SEEK_HOLE); all of it when the file system cannot tell.
#[cfg(target_os = "linux")]
pub(crate) fn data_ranges(path: &Path, from: u64, len: u64) -> Vec<(u64, u64)> {
    use rustix::fs::{seek, SeekFrom};
    let everything = vec![(from, len)];
    let Ok(file) = File::open(path) else {
        return everything;
    };
    let mut ranges = Vec::new();
    let mut at = from;
    while at < len {
        let data = match seek(&file, SeekFrom::Data(at)) {
            Ok(data) => data,
            // ENXIO: nothing but holes from `at` on.
            Err(rustix::io::Errno::NXIO) => return ranges,
            Err(_) => return everything,
        };
        let Ok(hole) = seek(&file, SeekFrom::Hole(data)) else {
            return everything;
        };
        if data >= len {
            break;
        }
        ranges.push((data.max(from), hole.min(len)));
        at = hole;
    }
    ranges
}

/// Elsewhere every byte may hold data.
#[cfg(not(target_os = "linux"))]
pub(crate) fn data_ranges(_path: &Path, from: u64, len: u64) -> Vec<(u64, u64)> {
    vec![(from, len)]
}

/// The kernel's page size (4 KiB on x86-64, up to 64 KiB elsewhere).
pub(crate) fn page_size() -> u64 {
    static PAGE_SIZE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE_SIZE.get_or_init(|| rustix::param::page_size().max(1) as u64)
}

/// Zeroes `len` bytes of `file` at `at`: by punching a hole when `whole_pages` (no space
/// needed), else (or where holes are not supported) by writing zeros.
fn zero_on_disk(file: &File, at: u64, len: u64, whole_pages: bool) -> std::io::Result<()> {
    use rustix::fs::FallocateFlags;
    use std::os::unix::fs::FileExt;
    if whole_pages && len % page_size() == 0 {
        let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        match rustix::fs::fallocate(file, mode, at, len) {
            Ok(()) => return Ok(()),
            // Holes not supported here: write the zeros.
            Err(rustix::io::Errno::OPNOTSUPP) => {}
            Err(errno) => return Err(errno.into()),
        }
    }
    let mut done = 0;
    while done < len {
        let n = (len - done).min(MAX_FILL_STEP_BYTES);
        file.write_all_at(&ZEROS[..n as usize], at + done)?;
        done += n;
    }
    Ok(())
}

/// Fsyncs a directory so a created, renamed or deleted entry survives a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("fsync directory", dir, e))
}

pub(crate) struct MappedSegment {
    path: PathBuf,
    base: u64,
    len: u64,
    map: MmapRaw,
    /// Mapped read-only: the file system was read-only when it was opened.
    read_only: bool,
}

impl MappedSegment {
    /// Creates a zero-filled (sparse) file of `len` bytes and maps it.
    pub(crate) fn create(dir: &Path, base: u64, len: u64) -> Result<Arc<Self>, StoreError> {
        let path = dir.join(segment_name(base));
        // Sized under a temporary name, then renamed: a crash in between leaves no empty
        // segment for recovery to refuse, only a temporary file it removes.
        let creating = dir.join(format!("{}{CREATING_SUFFIX}", segment_name(base)));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&creating)
            .map_err(|e| StoreError::io("create segment", &creating, e))?;
        file.set_len(len)
            .map_err(|e| StoreError::io("size segment", &creating, e))?;
        if path.exists() {
            return Err(StoreError::io(
                "create segment",
                &path,
                std::io::ErrorKind::AlreadyExists.into(),
            ));
        }
        std::fs::rename(&creating, &path).map_err(|e| StoreError::io("name segment", &path, e))?;
        // The new name must survive a crash, or recovery would miss the file.
        sync_dir(dir)?;
        Self::map(path, file, base, len)
    }

    /// Maps an existing segment file with its current length; read-only on a read-only file
    /// system (the store then refuses writes until it is restarted on a writable one).
    pub(crate) fn open(path: &Path, base: u64) -> Result<Arc<Self>, StoreError> {
        let (file, read_only) = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => (file, false),
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => (
                File::open(path).map_err(|e| StoreError::io("open segment", path, e))?,
                true,
            ),
            Err(e) => return Err(StoreError::io("open segment", path, e)),
        };
        let len = file
            .metadata()
            .map_err(|e| StoreError::io("stat segment", path, e))?
            .len();
        let map = if read_only {
            MmapOptions::new()
                .len(len as usize)
                .map_raw_read_only(&file)
        } else {
            MmapOptions::new().len(len as usize).map_raw(&file)
        };
        Self::mapped(path.to_path_buf(), map, base, len, read_only)
    }

    fn map(path: PathBuf, file: File, base: u64, len: u64) -> Result<Arc<Self>, StoreError> {
        let map = MmapOptions::new().len(len as usize).map_raw(&file);
        Self::mapped(path, map, base, len, false)
    }

    fn mapped(
        path: PathBuf,
        map: std::io::Result<MmapRaw>,
        base: u64,
        len: u64,
        read_only: bool,
    ) -> Result<Arc<Self>, StoreError> {
        let map = map.map_err(|e| StoreError::io("mmap segment", &path, e))?;
        Ok(Arc::new(MappedSegment {
            path,
            base,
            len,
            map,
            read_only,
        }))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The segment's file opened for plain writes (pwrite beside the mapping). For a segment
    /// mapped read-only, the file opened for reading: any write to it fails with an error.
    pub(crate) fn open_for_writes(&self) -> Result<File, StoreError> {
        let opened = if self.read_only {
            File::open(&self.path)
        } else {
            OpenOptions::new().write(true).open(&self.path)
        };
        opened.map_err(|e| StoreError::io("open segment", &self.path, e))
    }

    /// Offset of the first byte (CommitLog bytes, or ConsumeQueue bytes).
    pub(crate) fn base(&self) -> u64 {
        self.base
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn end(&self) -> u64 {
        self.base + self.len
    }

    pub(crate) fn contains(&self, offset: u64) -> bool {
        offset >= self.base && offset < self.end()
    }

    /// A view of `len` bytes at file position `at`.
    ///
    /// # Safety
    /// No one may write the region while the returned slice lives (it must be published
    /// and not under recovery).
    pub(crate) unsafe fn slice(&self, at: u64, len: usize) -> &[u8] {
        assert!(at + len as u64 <= self.len, "segment read past its end");
        // SAFETY: in bounds of the live mapping; no concurrent writer per the caller.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(at as usize), len) }
    }

    /// Lends `write` the `len` bytes at file position `at`, writable, for the call only: the
    /// mutable view never outlives it, so no `&mut [u8]` escapes a shared segment.
    ///
    /// # Safety
    /// The caller is the only one accessing the region (not yet published, or recovery).
    pub(crate) unsafe fn write_with<R>(
        &self,
        at: u64,
        len: usize,
        write: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        assert!(at + len as u64 <= self.len, "segment write past its end");
        assert!(!self.read_only, "write into a segment mapped read-only");
        // SAFETY: in bounds of the live mapping; exclusive per the caller, for this call.
        let region =
            unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(at as usize), len) };
        write(region)
    }

    /// The 4 bytes at `at` as an atomic, for values read and written concurrently (the
    /// index's hash slots).
    ///
    /// # Safety
    /// Every access to those bytes while the mapping is shared goes through this atomic, the
    /// page is backed (written with pwrite, so a store cannot fault on a full disk), and no
    /// store is made through a read-only mapping.
    pub(crate) unsafe fn atomic_u32(&self, at: u64) -> &std::sync::atomic::AtomicU32 {
        assert!(
            at % 4 == 0 && at + 4 <= self.len,
            "misplaced atomic in a segment"
        );
        // SAFETY: in bounds of the live mapping and 4-byte aligned (the mapping is page
        // aligned); only accessed atomically per the caller.
        unsafe {
            std::sync::atomic::AtomicU32::from_ptr(
                self.map.as_mut_ptr().add(at as usize).cast::<u32>(),
            )
        }
    }

    /// Mapped read-only (the file system was read-only at open): nothing may be stored.
    pub(crate) fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// A zero-copy `Bytes` over a published region; it keeps the mapping alive.
    pub(crate) fn bytes(self: &Arc<Self>, at: u64, len: usize) -> Bytes {
        assert!(at + len as u64 <= self.len, "segment view past its end");
        Bytes::from_owner(SegmentView {
            segment: Arc::clone(self),
            at,
            len,
        })
    }

    /// Writes back `len` bytes at `at` and waits for the device (msync MS_SYNC).
    pub(crate) fn flush_range(&self, at: u64, len: u64) -> std::io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.map.flush_range(at as usize, len as usize)
    }

    /// Zeroes `[from, len)` on disk, looking only at pages that hold data so sparse files stay
    /// sparse (reading holes would fill the page cache with up to a segment of zeros). Whole
    /// pages are punched out, which needs no free space; a partial page is overwritten with
    /// pwrite, which fails with an error on a full disk where a write through the mapping
    /// would fault. Returns the bytes of the pages that held data.
    pub(crate) fn clear_from(&self, from: u64) -> Result<u64, StoreError> {
        let page = page_size();
        let mut file = None;
        let mut cleared = 0;
        for (start, end) in data_ranges(&self.path, from, self.len) {
            let mut at = start;
            while at < end {
                let chunk_end = ((at / page + 1) * page).min(end);
                // SAFETY: only read; recovery has the file to itself.
                let chunk = unsafe { self.slice(at, (chunk_end - at) as usize) };
                if chunk.iter().any(|b| *b != 0) {
                    let file = match &mut file {
                        Some(file) => file,
                        None => file.insert(self.open_for_writes()?),
                    };
                    zero_on_disk(file, at, chunk_end - at, at % page == 0)
                        .map_err(|e| StoreError::io("truncate segment", &self.path, e))?;
                    cleared += chunk_end - at;
                }
                at = chunk_end;
            }
        }
        Ok(cleared)
    }

    /// Zeroes `len` bytes at `at` on disk with pwrite (never through the mapping).
    pub(crate) fn zero_range(&self, at: u64, len: u64) -> Result<(), StoreError> {
        let file = self.open_for_writes()?;
        zero_on_disk(&file, at, len, false)
            .map_err(|e| StoreError::io("truncate segment", &self.path, e))
    }

    /// Removes the file; live views keep their pages until dropped.
    pub(crate) fn delete(&self) -> Result<(), StoreError> {
        match std::fs::remove_file(&self.path) {
            // Already gone (its topic was deleted) is the state we want.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            outcome => outcome.map_err(|e| StoreError::io("delete segment", &self.path, e)),
        }
    }
}

/// Owner of a zero-copy `Bytes`: a published region of a mapped segment.
struct SegmentView {
    segment: Arc<MappedSegment>,
    at: u64,
    len: usize,
}

impl AsRef<[u8]> for SegmentView {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: only published regions are viewed, and they are never rewritten while served.
        unsafe { self.segment.slice(self.at, self.len) }
    }
}

/// Sorted, contiguous segments; replaced whole (copy on write) so readers take a snapshot.
pub(crate) type SegmentList = Arc<Vec<Arc<MappedSegment>>>;

/// The segment holding `offset`, by binary search.
pub(crate) fn find_segment(
    segments: &[Arc<MappedSegment>],
    offset: u64,
) -> Option<&Arc<MappedSegment>> {
    let idx = segments.partition_point(|s| s.base() <= offset);
    let segment = segments.get(idx.checked_sub(1)?)?;
    segment.contains(offset).then_some(segment)
}

/// The paths of the entries of `dir`.
pub(crate) fn list_dir(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    std::fs::read_dir(dir)
        .and_then(|entries| entries.map(|entry| entry.map(|e| e.path())).collect())
        .map_err(|e| StoreError::io("list directory", dir, e))
}

/// Maps every segment file in `dir` (created if missing), sorted, checking they are contiguous.
pub(crate) fn load_segments(dir: &Path) -> Result<Vec<Arc<MappedSegment>>, StoreError> {
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create directory", dir, e))?;
    let mut found = Vec::new();
    for path in list_dir(dir)? {
        match parse_segment_name(&path) {
            Some(base) => found.push((base, path)),
            // A prepared next CommitLog segment: the writer adopts or removes it.
            None if warm::parse_warm_name(&path).is_some() => {}
            // A preparation or a creation cut short by a crash or a shutdown.
            None if warm::is_warm_tmp(&path) || is_creating(&path) => {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot remove a partial prepared segment");
                }
            }
            None if path.is_file() => {
                tracing::warn!(path = %path.display(), "ignoring a file that is not a segment");
            }
            None => {}
        }
    }
    found.sort();
    let mut segments: Vec<Arc<MappedSegment>> = Vec::with_capacity(found.len());
    for (base, path) in found {
        if let Some(previous) = segments.last() {
            if previous.end() != base {
                return Err(StoreError::SegmentGap {
                    path,
                    expected: previous.end(),
                    found: base,
                });
            }
        }
        segments.push(MappedSegment::open(&path, base)?);
    }
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    const LEN: u64 = 8 * 1024 * 1024;

    #[test]
    fn a_creation_cut_short_leaves_no_segment_and_is_cleared_on_load() {
        let dir = tempfile::tempdir().unwrap();
        let first = MappedSegment::create(dir.path(), 0, 4096).unwrap();
        assert_eq!(first.len(), 4096);
        // As a kill between creating the next file and sizing it would leave it.
        let cut_short = dir
            .path()
            .join(format!("{}{CREATING_SUFFIX}", segment_name(4096)));
        std::fs::File::create(&cut_short).unwrap();
        let loaded = load_segments(dir.path()).unwrap();
        assert_eq!(loaded.iter().map(|s| s.base()).collect::<Vec<_>>(), [0]);
        assert!(!cut_short.exists(), "the temporary file is removed");
        assert!(
            MappedSegment::create(dir.path(), 0, 4096).is_err(),
            "never replaces one"
        );
        let next = MappedSegment::create(dir.path(), 4096, 4096).unwrap();
        assert_eq!(next.len(), 4096);
    }

    fn allocated(segment: &MappedSegment) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&segment.path().metadata().unwrap()) * 512
    }

    /// An 8 MiB sparse segment with non-zero bytes at `writes`.
    fn segment_with(dir: &Path, writes: &[(u64, &[u8])]) -> Arc<MappedSegment> {
        let segment = MappedSegment::create(dir, 0, LEN).unwrap();
        let file = OpenOptions::new().write(true).open(segment.path()).unwrap();
        for (at, bytes) in writes {
            file.write_all_at(bytes, *at).unwrap();
        }
        segment
    }

    #[test]
    fn fill_end_is_a_step_boundary_at_least_a_step_ahead_within_the_segment() {
        const STEP: u64 = 1 << 20;
        let base = 3 * LEN;
        // From a boundary: one step; from inside a step: on to the boundary a step further.
        assert_eq!(
            fill_end(base, base + LEN, base, base + 10, STEP),
            base + STEP
        );
        assert_eq!(
            fill_end(base, base + LEN, base + 4096, base + 5000, STEP),
            base + 2 * STEP
        );
        // An end past a step ahead: the boundary after it.
        assert_eq!(
            fill_end(base, base + LEN, base, base + 3 * STEP + 1, STEP),
            base + 4 * STEP
        );
        // Never past the segment, never below what is filled.
        let limit = base + LEN;
        assert_eq!(
            fill_end(base, limit, limit - 4096, limit - 100, STEP),
            limit
        );
        assert_eq!(fill_end(base, limit, limit, limit, STEP), limit);
    }

    #[test]
    fn zero_fill_ahead_writes_zeros_from_filled_to_only() {
        let dir = tempfile::tempdir().unwrap();
        let base = LEN;
        let segment = MappedSegment::create(dir.path(), base, LEN).unwrap();
        let file = segment.open_for_writes().unwrap();
        file.write_all_at(&[7; 1000], 0).unwrap();
        file.write_all_at(&[3; 100], 1 << 20).unwrap();
        file.write_all_at(&[9; 8192], 3 << 20).unwrap();
        let to =
            zero_fill_ahead(&file, base, base + LEN, base + 4096, base + 5000, 1 << 20).unwrap();
        assert_eq!(to, base + (2 << 20));
        let bytes = std::fs::read(segment.path()).unwrap();
        assert!(
            bytes[..1000].iter().all(|b| *b == 7),
            "records below filled_to kept"
        );
        // Past the fill, earlier bytes stay: the fill stops where it says.
        assert!(bytes[3 << 20..(3 << 20) + 8192].iter().all(|b| *b == 9));
    }

    #[test]
    fn write_with_zeros_at_writes_the_data_then_exactly_the_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let segment = MappedSegment::create(dir.path(), 0, LEN).unwrap();
        let file = segment.open_for_writes().unwrap();
        file.write_all_at(&[5; 4 << 20], 0).unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|n| (n % 251) as u8 + 1).collect();
        // More zeros than one `ZEROS` slice holds: the write spans several of them.
        let zeros = MAX_FILL_STEP_BYTES + 12_345;
        write_with_zeros_at(&file, &data, 1000, zeros).unwrap();
        let bytes = std::fs::read(segment.path()).unwrap();
        let end = 1000 + data.len();
        assert!(bytes[..1000].iter().all(|b| *b == 5));
        assert_eq!(&bytes[1000..end], data.as_slice());
        let zeros_end = end + zeros as usize;
        assert!(bytes[end..zeros_end].iter().all(|b| *b == 0));
        assert!(bytes[zeros_end..4 << 20].iter().all(|b| *b == 5));
    }

    #[test]
    fn data_ranges_cover_every_written_byte_and_skip_holes() {
        let dir = tempfile::tempdir().unwrap();
        let writes: [(u64, &[u8]); 3] = [(10, b"head"), (5 << 20, b"middle"), (LEN - 3, b"end")];
        let segment = segment_with(dir.path(), &writes);
        let ranges = data_ranges(segment.path(), 0, LEN);
        for (at, bytes) in writes {
            let last = at + bytes.len() as u64 - 1;
            assert!(
                ranges.iter().any(|(s, e)| *s <= at && last < *e),
                "bytes at {at} outside {ranges:?}"
            );
        }
        let covered: u64 = ranges.iter().map(|(s, e)| e - s).sum();
        assert!(covered < LEN / 2, "holes not skipped: {ranges:?}");
        // From past the last data: nothing left to scan.
        assert!(data_ranges(segment.path(), LEN, LEN).is_empty());
    }

    #[test]
    fn clear_from_clears_data_after_a_hole_and_keeps_what_is_before() {
        let dir = tempfile::tempdir().unwrap();
        let writes: [(u64, &[u8]); 3] = [(0, b"kept"), (100, b"stale"), (6 << 20, b"far")];
        let segment = segment_with(dir.path(), &writes);
        let allocated_before = allocated(&segment);
        let zeroed = segment.clear_from(50).unwrap();
        assert!(zeroed >= 8, "{zeroed} bytes zeroed");
        // The far page was punched out, not overwritten: it holds no blocks any more.
        assert!(allocated(&segment) < allocated_before, "no blocks freed");
        // SAFETY: as above.
        let bytes = unsafe { segment.slice(0, LEN as usize) };
        assert_eq!(&bytes[..4], b"kept");
        assert!(bytes[50..].iter().all(|b| *b == 0));
    }
}
