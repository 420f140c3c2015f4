//! Opening the index at start: files past the recovery point dropped, damaged ones too, the
//! last file's entries cut at the recovery point and its slots mended.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use super::{IndexFile, IndexWriter, Layout, MessageIndex, ENTRY_BYTES, HEADER_BYTES};
use crate::error::StoreError;
use crate::mapped_file::{data_ranges, list_dir, parse_segment_name, sync_dir, MappedSegment};

/// What index recovery found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IndexRecovery {
    /// Files deleted: they started past the recovery point, or were damaged.
    pub dropped_files: usize,
    /// Slots of the active file that pointed past its entries and were mended.
    pub repaired_slots: u64,
}

/// Opens the index under `dir`: files starting at or after `valid_below` are deleted
/// (recovery re-indexes from there), the entries of the last one past it are zeroed and its
/// slots mended. `layout` is the one new files get.
pub(crate) fn recover(
    dir: &Path,
    layout: Layout,
    valid_below: u64,
) -> Result<(MessageIndex, IndexWriter, IndexRecovery), StoreError> {
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create directory", dir, e))?;
    let mut found = list_files(dir)?;
    let mut report = IndexRecovery::default();
    let keep = found.partition_point(|(base, _)| *base < valid_below);
    for (_, path) in found.drain(keep..) {
        std::fs::remove_file(&path).map_err(|e| StoreError::io("delete index", &path, e))?;
        report.dropped_files += 1;
    }
    if report.dropped_files > 0 {
        // Deleted names must stay deleted after a crash.
        sync_dir(dir)?;
    }
    let mut files = Vec::with_capacity(found.len());
    for (base, path) in &found {
        match open_file(path, *base, valid_below) {
            Ok(file) => files.push(Arc::new(file)),
            // Damage outside the store's own writes: better the keys it held lost than no store.
            Err(error @ StoreError::BadIndexFile { .. }) => {
                tracing::warn!(error = %crate::error::chain(&error), "deleting a damaged index file; the keys it held are not found any more");
                std::fs::remove_file(path).map_err(|e| StoreError::io("delete index", path, e))?;
                sync_dir(dir)?;
                report.dropped_files += 1;
            }
            Err(error) => return Err(error),
        }
    }
    let mut writer = IndexWriter::new(layout);
    if let Some(last) = files.last() {
        report.repaired_slots = mend_tail(last)?;
        writer.resume(last);
    }
    let index = MessageIndex {
        dir: dir.to_path_buf(),
        files: RwLock::new(Arc::new(files)),
    };
    Ok((index, writer, report))
}

/// The index files in `dir`, sorted by the CommitLog offset in their names.
pub(super) fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    for path in list_dir(dir)? {
        match parse_segment_name(&path) {
            Some(base) => found.push((base, path)),
            None => {
                tracing::warn!(path = %path.display(), "ignoring a file that is not an index file")
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Maps an index file and finds its entries: those that are whole and index records below
/// `valid_below` (the recovery point) form a prefix of the file.
pub(super) fn open_file(path: &Path, base: u64, valid_below: u64) -> Result<IndexFile, StoreError> {
    let bad = |reason: &str| StoreError::BadIndexFile {
        path: path.to_path_buf(),
        reason: reason.to_owned(),
    };
    let len = std::fs::metadata(path)
        .map_err(|e| StoreError::io("stat index", path, e))?
        .len();
    if len < HEADER_BYTES {
        // A crash between creating and sizing it.
        return Err(bad("shorter than its header"));
    }
    let segment = MappedSegment::open(path, base)?;
    let written = data_ranges(path, 0, segment.len());
    let holds_data = |at: u64, len: u64| written.iter().any(|(s, e)| *s <= at && at + len <= *e);
    if !holds_data(0, HEADER_BYTES) {
        return Err(bad("no header"));
    }
    // SAFETY: recovery has the file to itself; the header holds data.
    let layout = Layout::from_header(unsafe { segment.slice(0, HEADER_BYTES as usize) })
        .ok_or_else(|| bad("bad header"))?;
    if segment.len() != layout.file_bytes() {
        return Err(bad("its length does not match its header"));
    }
    let file = IndexFile::new(segment, layout, true);
    let valid = |entry: u32| {
        holds_data(layout.entry_at(entry), ENTRY_BYTES)
            && file
                .entry(entry)
                .is_some_and(|e| e.physical_offset < valid_below)
    };
    let (mut low, mut high) = (0u32, layout.capacity);
    while low < high {
        let mid = low + (high - low) / 2;
        if valid(mid) {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    if low > 0 {
        // Store times follow the log (the writer's clock): the first and last entries bound them.
        // The search only moves past entries it found valid.
        let last = file.entry(low - 1).expect("valid above");
        let first = file.entry(0).unwrap_or(last);
        file.note_published(
            low,
            first.store_timestamp_ms.min(last.store_timestamp_ms),
            &last,
        );
    }
    file.flushed.store(low, Ordering::Release);
    Ok(file)
}

/// The last file after a crash: zeroes entries past its count (so they never count again)
/// and mends slots that point past it, to the newest entry below the count of the slot.
/// Returns the slots mended.
pub(super) fn mend_tail(file: &IndexFile) -> Result<u64, StoreError> {
    let (layout, count) = (file.layout, file.count());
    let zeroed = file.segment.clear_from(layout.entry_at(count))?;
    let broken: Vec<u32> = (0..layout.slots)
        .filter(|slot| file.slot_head(*slot) > count)
        .collect();
    if zeroed == 0 && broken.is_empty() {
        return Ok(0);
    }
    if file.segment.is_read_only() {
        return Err(StoreError::BadIndexFile {
            path: file.path().to_path_buf(),
            reason: "its slots need mending after a crash, on a read-only file system".into(),
        });
    }
    let mut heads: HashMap<u32, u32> = broken.iter().map(|slot| (*slot, 0)).collect();
    let mut unresolved = heads.len();
    let mut entry = count;
    while unresolved > 0 && entry > 0 {
        entry -= 1;
        // Below the count every entry was on disk at the checkpoint; skip one damaged since.
        let Some(found) = file.entry(entry) else {
            continue;
        };
        if let Some(head) = heads.get_mut(&layout.slot_of(found.key_hash)) {
            if *head == 0 {
                *head = entry + 1;
                unresolved -= 1;
            }
        }
    }
    for (slot, head) in &heads {
        file.set_slot_head(*slot, *head);
    }
    // Mended slots and zeroed entries must reach the disk before anything relies on them
    // (slots the writer keeps in memory first reach the mapping).
    file.write_back_slots();
    file.segment
        .flush_range(0, file.segment.len())
        .map_err(|e| StoreError::io("flush index", file.path(), e))?;
    Ok(heads.len() as u64)
}
