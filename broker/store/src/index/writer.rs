//! The writer's side of the index: entries prepared and staged with their records under the
//! store's write lock, published after them, unstaged or truncated with them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::recover::mend_tail;
use super::{
    index_keys, key_hash, Entry, IndexFile, Layout, MessageIndex, ENTRY_BYTES,
    ENTRY_FILL_STEP_BYTES, HEADER_BYTES, STAGED_SCANNED,
};
use crate::error::StoreError;
use crate::mapped_file::{write_with_zeros_at, zero_fill_ahead, MappedSegment};
use crate::record::RecordHeader;

/// An entry written but not yet published.
struct Staged {
    file: Arc<IndexFile>,
    entry: u32,
    slot: u32,
    value: Entry,
}

/// The writer's side of the index, owned under the store's write lock.
pub(crate) struct IndexWriter {
    /// The layout of files created from now on.
    layout: Layout,
    active: Option<Arc<IndexFile>>,
    /// Entries of `active` written, staged ones included.
    pub(super) next_entry: u32,
    /// Bytes of `active` below this hold entries or zeros we wrote.
    filled_to: u64,
    staged: Vec<Staged>,
    /// The newest staged entry of each (file, slot): the `prev` of the next one there.
    staged_heads: HashMap<(u64, u32), u32>,
}

impl IndexWriter {
    /// A writer with no file yet; new files get `layout`.
    pub(super) fn new(layout: Layout) -> IndexWriter {
        IndexWriter {
            layout,
            active: None,
            next_entry: 0,
            filled_to: 0,
            staged: Vec::new(),
            staged_heads: HashMap::new(),
        }
    }

    /// Goes on writing `last`, the newest file, after its entries.
    pub(super) fn resume(&mut self, last: &Arc<IndexFile>) {
        self.next_entry = last.count();
        self.filled_to = last.layout.entry_at(last.count());
        self.set_active(Some(Arc::clone(last)));
    }

    /// Writes into `file` from now on: its slots are kept in memory, and the previous file's
    /// go once written back.
    fn set_active(&mut self, file: Option<Arc<IndexFile>>) {
        if let Some(previous) = &self.active {
            if !file.as_ref().is_some_and(|f| Arc::ptr_eq(f, previous)) {
                previous.retired.store(true, Ordering::Release);
            }
        }
        if let Some(file) = &file {
            file.keep_slots_in_memory();
        }
        self.active = file;
    }

    /// The most entries one record gets: the keys beyond are not indexed.
    pub(crate) fn max_entries_per_record(&self) -> u32 {
        self.layout.capacity
    }

    /// Whether `prepare` for `entries` entries would start a new file.
    pub(crate) fn needs_file(&self, entries: u32) -> bool {
        entries > 0 && !self.fits(entries)
    }

    fn fits(&self, entries: u32) -> bool {
        self.active.as_ref().is_some_and(|file| {
            u64::from(self.next_entry) + u64::from(entries) <= u64::from(file.layout.capacity)
        })
    }

    /// Makes room for `entries` entries of the next record, appended at or after
    /// `write_pos`: a new file (named `write_pos`) when they do not fit, zeros written ahead
    /// with pwrite (a full disk fails here, never as a fault on an unbacked page of the
    /// mapping).
    pub(crate) fn prepare(
        &mut self,
        index: &MessageIndex,
        write_pos: u64,
        entries: u32,
    ) -> Result<(), StoreError> {
        if entries == 0 {
            return Ok(());
        }
        if !self.fits(entries) {
            self.roll(index, write_pos)?;
        }
        let file = self.active.as_ref().expect("rolled above");
        let end = file.layout.entry_at(self.next_entry + entries);
        if end > self.filled_to {
            let writes = file.segment.open_for_writes()?;
            self.filled_to = zero_fill_ahead(
                &writes,
                0,
                file.layout.file_bytes(),
                self.filled_to,
                end,
                ENTRY_FILL_STEP_BYTES,
            )
            .map_err(|e| StoreError::io("write index", file.path(), e))?;
        }
        Ok(())
    }

    /// Starts a new file named `base`: header and zeroed slots written with pwrite.
    fn roll(&mut self, index: &MessageIndex, base: u64) -> Result<(), StoreError> {
        let layout = self.layout;
        let segment = MappedSegment::create(&index.dir, base, layout.file_bytes())?;
        let writes = segment.open_for_writes()?;
        let slot_bytes = layout.entries_start() - HEADER_BYTES;
        if let Err(error) = write_with_zeros_at(&writes, &layout.header(), 0, slot_bytes) {
            let failed = StoreError::io("write index", segment.path(), error);
            // A file without its zeroed slots must not stay around to be mapped.
            segment.delete()?;
            return Err(failed);
        }
        let file = Arc::new(IndexFile::new(segment, layout, false));
        {
            let mut files = index.files.write();
            let mut next = files.to_vec();
            next.push(Arc::clone(&file));
            *files = Arc::new(next);
        }
        self.filled_to = layout.entries_start();
        self.next_entry = 0;
        self.set_active(Some(file));
        Ok(())
    }

    /// Writes an entry for `key` of the record at `physical_offset` into the prepared room,
    /// unpublished.
    pub(crate) fn stage(
        &mut self,
        topic: &str,
        key: &str,
        physical_offset: u64,
        store_timestamp_ms: i64,
    ) {
        let file = Arc::clone(self.active.as_ref().expect("prepare() before stage()"));
        let key_hash = key_hash(topic, key);
        let slot = file.layout.slot_of(key_hash);
        let prev = self
            .staged_head(file.base(), slot)
            .unwrap_or_else(|| file.slot_head(slot));
        let value = Entry {
            key_hash,
            physical_offset,
            store_timestamp_ms,
            prev,
        };
        let entry = self.next_entry;
        // SAFETY: at or beyond the published entries and unreachable from any slot; only the
        // writer touches it.
        unsafe {
            file.segment
                .write_with(file.layout.entry_at(entry), ENTRY_BYTES as usize, |dst| {
                    dst.copy_from_slice(&value.encode())
                })
        };
        if self.staged.len() == STAGED_SCANNED {
            let heads = self
                .staged
                .iter()
                .map(|s| ((s.file.base(), s.slot), s.entry + 1));
            self.staged_heads.extend(heads);
        }
        if self.staged.len() >= STAGED_SCANNED {
            self.staged_heads.insert((file.base(), slot), entry + 1);
        }
        self.staged.push(Staged {
            file,
            entry,
            slot,
            value,
        });
        self.next_entry += 1;
    }

    /// 1 + the newest staged entry of the slot: a scan for a put's few entries, a map for
    /// a batch's many.
    fn staged_head(&self, file_base: u64, slot: u32) -> Option<u32> {
        if self.staged.len() < STAGED_SCANNED {
            return self
                .staged
                .iter()
                .rev()
                .find(|s| s.slot == slot && s.file.base() == file_base)
                .map(|s| s.entry + 1);
        }
        self.staged_heads.get(&(file_base, slot)).copied()
    }

    /// Takes back the staged entries of records at or after `log_end` (never written), and
    /// zeroes them: no file keeps an entry past its published ones. Files started past
    /// `log_end` go: the log's write position went back before their names.
    pub(crate) fn unstage_from(&mut self, index: &MessageIndex, log_end: u64) {
        let kept = self
            .staged
            .iter()
            .take_while(|s| s.value.physical_offset < log_end)
            .count();
        let resume = self
            .staged
            .get(kept)
            .map(|s| (Arc::clone(&s.file), s.entry));
        for dropped in self.staged.drain(kept..) {
            let at = dropped.file.layout.entry_at(dropped.entry);
            // SAFETY: staged, so unpublished and unreachable from any slot; only the writer
            // touches it (its page was written when it was staged).
            unsafe {
                dropped
                    .file
                    .segment
                    .write_with(at, ENTRY_BYTES as usize, |dst| dst.fill(0))
            };
        }
        if self
            .active
            .as_ref()
            .is_some_and(|file| file.base() > log_end)
        {
            let active = index.remove_past(log_end);
            self.set_active(active);
            let active = self.active.as_ref();
            // Entries kept in the file written again are published next: go on after them.
            let kept_in = |file: &Arc<IndexFile>| {
                self.staged
                    .iter()
                    .filter(|s| Arc::ptr_eq(&s.file, file))
                    .map(|s| s.entry + 1)
                    .max()
                    .unwrap_or_else(|| file.count())
            };
            self.next_entry = active.map_or(0, kept_in);
            self.filled_to = active.map_or(0, |file| file.layout.entry_at(self.next_entry));
        }
        if let Some((file, entry)) = resume {
            if self.active.as_ref().is_some_and(|a| Arc::ptr_eq(a, &file)) {
                self.next_entry = entry;
            }
        }
    }

    /// Publishes the staged entries: slots point at them, in order.
    pub(crate) fn publish(&mut self) {
        for staged in &self.staged {
            staged.file.set_slot_head(staged.slot, staged.entry + 1);
        }
        // The file summaries once per run of entries in one file, not per entry.
        for run in self.staged.chunk_by(|a, b| Arc::ptr_eq(&a.file, &b.file)) {
            let last = run.last().expect("chunks are never empty");
            let oldest = run
                .iter()
                .map(|s| s.value.store_timestamp_ms)
                .min()
                .expect("chunks are never empty");
            last.file
                .note_published(last.entry + 1, oldest, &last.value);
        }
        self.staged.clear();
        self.staged_heads.clear();
    }

    /// Truncation of the log to `log_end` at runtime (nothing staged): files started past it
    /// go, and the last one left keeps only entries of records below it, the rest zeroed and
    /// its slots mended as recovery mends them after a crash (`mend_tail`), so no lookup
    /// reaches an entry of a truncated record. Returns the entries dropped.
    pub(crate) fn truncate(
        &mut self,
        index: &MessageIndex,
        log_end: u64,
    ) -> Result<u64, StoreError> {
        debug_assert!(self.staged.is_empty(), "truncating with staged entries");
        let before: u64 = index.snapshot().iter().map(|f| u64::from(f.count())).sum();
        let active = index.remove_past(log_end);
        self.set_active(active);
        self.next_entry = 0;
        self.filled_to = 0;
        if let Some(file) = &self.active {
            let (mut low, mut high) = (0u32, file.count());
            while low < high {
                let mid = low + (high - low) / 2;
                if file.entry(mid).is_some_and(|e| e.physical_offset < log_end) {
                    low = mid + 1;
                } else {
                    high = mid;
                }
            }
            if low < file.count() {
                if let Some(last) = low.checked_sub(1).and_then(|n| file.entry(n)) {
                    file.last_physical_offset
                        .store(last.physical_offset, Ordering::Release);
                }
                let _flushing = file.flush_lock.lock();
                file.count.store(low, Ordering::Release);
                file.flushed.fetch_min(low, Ordering::AcqRel);
                mend_tail(file)?;
            }
            self.next_entry = file.count();
            self.filled_to = file.layout.entry_at(file.count());
        }
        let after: u64 = index.snapshot().iter().map(|f| u64::from(f.count())).sum();
        Ok(before.saturating_sub(after))
    }

    /// Recovery: indexes `record` (its room prepared, written and published at once).
    pub(crate) fn reindex(
        &mut self,
        index: &MessageIndex,
        record: &RecordHeader<'_>,
    ) -> Result<u64, StoreError> {
        let keys = index_keys(record.properties).take(self.max_entries_per_record() as usize);
        let count = keys.clone().count() as u32;
        let at = record.physical_offset.0;
        self.prepare(index, at, count)?;
        for key in keys {
            self.stage(record.topic, key, at, record.store_timestamp_ms);
        }
        self.publish();
        Ok(u64::from(count))
    }
}
