//! The message index (RocketMQ's IndexFile): every record's unique key (UNIQ_KEY) and keys
//! (KEYS, split on spaces), by topic, so a message is found by key within a time range.
//! Entries are written at put time under the write lock, like ConsumeQueue units, and
//! re-indexed from the CommitLog by recovery past the checkpoint.
//!
//! ```text
//! index/<20-digit CommitLog offset>   the write position when the file started: its entries
//!                                     index records at or after it
//! little-endian (slots are read and written as atomics)
//! header   64 bytes: magic u32 "QIDX" | version u32 | slot_count u32 | entry_capacity u32 | zeros
//! slots    slot_count x u32: 1 + the newest entry of the slot, 0 for none
//! entries  entry_capacity x 32 bytes:
//!          key_hash u64 | physical_offset u64 | store_timestamp_ms i64
//!          | prev u32 (1 + the slot's previous entry, 0 for none) | crc32 u32 of the 28 bytes before
//! ```
//!
//! A slot's chain runs newest first and stays inside one file. Slots change only when entries
//! are published (after their records), with release stores, so a reader that loads a slot
//! sees the entries it reaches; entries are written once and never rewritten while served.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::StoreError;
use crate::mapped_file::{
    data_ranges, parse_segment_name, sync_dir, write_with_zeros_at, zero_fill_ahead, MappedSegment,
};
use crate::record::RecordHeader;

const MAGIC: u32 = 0x5149_4458;
const VERSION: u32 = 1;
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 4;
pub(crate) const ENTRY_BYTES: u64 = 32;
/// Staged entries up to this many are searched for a slot's newest one; beyond, a map is kept.
const STAGED_SCANNED: usize = 32;
/// The entries of the active file are zero-filled this far ahead (`zero_fill_ahead`).
const ENTRY_FILL_STEP_BYTES: u64 = 64 * 1024;

/// The property holding a record's space-separated keys.
const KEYS_PROPERTY: &str = quiver_protocol::message::PROPERTY_KEYS;
/// The property holding the producer's unique message id.
const UNIQUE_KEY_PROPERTY: &str = quiver_protocol::message::PROPERTY_UNIQ_KEY;

/// FNV-1a 64 of `topic`, a NUL (never in a topic) and `key`. Written to disk, so it must never
/// change: spelled out here (not a library hasher) and pinned by a test.
pub(crate) fn key_hash(topic: &str, key: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    topic
        .bytes()
        .chain([0])
        .chain(key.bytes())
        .fold(OFFSET_BASIS, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(PRIME)
        })
}

/// The keys a record is indexed under: its unique key, then each of its keys.
pub(crate) fn index_keys<'p>(properties: &'p str) -> impl Iterator<Item = &'p str> + Clone + 'p {
    let unique = crate::record::property(properties, UNIQUE_KEY_PROPERTY);
    let keys = crate::record::property(properties, KEYS_PROPERTY).unwrap_or("");
    unique
        .into_iter()
        .chain(keys.split(' '))
        .filter(|key| !key.is_empty())
}

/// Which property a key query matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyMatch {
    /// One of the KEYS or the UNIQ_KEY (RocketMQ keeps both in one index).
    AnyKey,
    /// The UNIQ_KEY only (a query by message id).
    UniqueKey,
}

impl KeyMatch {
    /// Whether a record with `properties` carries `key`.
    pub(crate) fn matches(self, properties: &str, key: &str) -> bool {
        let unique = crate::record::property(properties, UNIQUE_KEY_PROPERTY) == Some(key);
        let in_keys = || {
            crate::record::property(properties, KEYS_PROPERTY)
                .is_some_and(|keys| keys.split(' ').any(|k| k == key))
        };
        unique || (self == KeyMatch::AnyKey && in_keys())
    }
}

/// One index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    key_hash: u64,
    physical_offset: u64,
    store_timestamp_ms: i64,
    /// 1 + the previous entry of the same slot; 0 ends the chain.
    prev: u32,
}

impl Entry {
    fn encode(&self) -> [u8; ENTRY_BYTES as usize] {
        let mut out = [0u8; ENTRY_BYTES as usize];
        out[..8].copy_from_slice(&self.key_hash.to_le_bytes());
        out[8..16].copy_from_slice(&self.physical_offset.to_le_bytes());
        out[16..24].copy_from_slice(&self.store_timestamp_ms.to_le_bytes());
        out[24..28].copy_from_slice(&self.prev.to_le_bytes());
        let crc = crc32fast::hash(&out[..28]);
        out[28..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// `None` when the checksum fails: never written (zeros), or torn by a crash.
    fn decode(bytes: &[u8]) -> Option<Entry> {
        let field = |at: usize| -> [u8; 8] { bytes[at..at + 8].try_into().expect("8 bytes") };
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        (crc32fast::hash(&bytes[..28]) == word(28)).then(|| Entry {
            key_hash: u64::from_le_bytes(field(0)),
            physical_offset: u64::from_le_bytes(field(8)),
            store_timestamp_ms: i64::from_le_bytes(field(16)),
            prev: word(24),
        })
    }
}

/// The geometry of one index file (read from its header; new files take the config's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub slots: u32,
    pub capacity: u32,
}

impl Layout {
    fn slot_at(&self, slot: u32) -> u64 {
        HEADER_BYTES + SLOT_BYTES * u64::from(slot)
    }

    fn entries_start(&self) -> u64 {
        self.slot_at(self.slots)
    }

    fn entry_at(&self, entry: u32) -> u64 {
        self.entries_start() + ENTRY_BYTES * u64::from(entry)
    }

    pub(crate) fn file_bytes(&self) -> u64 {
        self.entry_at(self.capacity)
    }

    fn slot_of(&self, key_hash: u64) -> u32 {
        ((key_hash ^ (key_hash >> 32)) % u64::from(self.slots)) as u32
    }

    fn header(&self) -> [u8; HEADER_BYTES as usize] {
        let mut out = [0u8; HEADER_BYTES as usize];
        out[..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&VERSION.to_le_bytes());
        out[8..12].copy_from_slice(&self.slots.to_le_bytes());
        out[12..16].copy_from_slice(&self.capacity.to_le_bytes());
        out
    }

    fn from_header(bytes: &[u8]) -> Option<Layout> {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let layout = Layout {
            slots: word(8),
            capacity: word(12),
        };
        (word(0) == MAGIC && word(4) == VERSION && layout.slots > 0 && layout.capacity > 0)
            .then_some(layout)
    }
}

/// One index file; `base()` is the CommitLog offset in its name.
pub(crate) struct IndexFile {
    segment: Arc<MappedSegment>,
    layout: Layout,
    /// Entries published: their slots point at them.
    count: AtomicU32,
    /// Entries (and the slots pointing at them) known on disk.
    flushed: AtomicU32,
    /// Held by a flush from reading `flushed` to raising it, and by truncation while it
    /// lowers it (see `ConsumeQueue`'s).
    flush_lock: parking_lot::Mutex<()>,
    /// The header and the zeroed slots are on disk (false for a file created since the last
    /// housekeeping).
    header_durable: AtomicBool,
    first_timestamp_ms: AtomicI64,
    last_timestamp_ms: AtomicI64,
    last_physical_offset: AtomicU64,
}

impl IndexFile {
    fn new(segment: Arc<MappedSegment>, layout: Layout, header_durable: bool) -> IndexFile {
        IndexFile {
            segment,
            layout,
            count: AtomicU32::new(0),
            flushed: AtomicU32::new(0),
            flush_lock: parking_lot::Mutex::new(()),
            header_durable: AtomicBool::new(header_durable),
            first_timestamp_ms: AtomicI64::new(i64::MAX),
            last_timestamp_ms: AtomicI64::new(i64::MIN),
            last_physical_offset: AtomicU64::new(0),
        }
    }

    pub(crate) fn base(&self) -> u64 {
        self.segment.base()
    }

    pub(crate) fn path(&self) -> &Path {
        self.segment.path()
    }

    fn count(&self) -> u32 {
        self.count.load(Ordering::Acquire)
    }

    fn slot(&self, slot: u32) -> &AtomicU32 {
        // SAFETY: slots are only ever accessed through these atomics, 4-byte aligned (the
        // mapping is page aligned, the header 64 bytes) and backed by zeros written at creation.
        unsafe { self.segment.atomic_u32(self.layout.slot_at(slot)) }
    }

    fn slot_head(&self, slot: u32) -> u32 {
        u32::from_le(self.slot(slot).load(Ordering::Acquire))
    }

    fn set_slot_head(&self, slot: u32, head: u32) {
        self.slot(slot).store(head.to_le(), Ordering::Release);
    }

    /// The entry at `entry`; the caller reached it from a slot (or is recovery).
    fn entry(&self, entry: u32) -> Option<Entry> {
        if entry >= self.layout.capacity {
            return None;
        }
        // SAFETY: entries are written once, before any slot points at them, and never
        // rewritten while served (recovery rewrites before the store serves anything).
        Entry::decode(unsafe {
            self.segment
                .slice(self.layout.entry_at(entry), ENTRY_BYTES as usize)
        })
    }

    /// Records published entries in the file's summary: `count` of them now, the last one
    /// `newest`, the oldest store time among them `oldest_ms` (writer and recovery only).
    fn note_published(&self, count: u32, oldest_ms: i64, newest: &Entry) {
        self.first_timestamp_ms
            .fetch_min(oldest_ms, Ordering::AcqRel);
        self.last_timestamp_ms
            .fetch_max(newest.store_timestamp_ms, Ordering::AcqRel);
        self.last_physical_offset
            .store(newest.physical_offset, Ordering::Release);
        self.count.store(count, Ordering::Release);
    }

    /// Whether the file may hold entries stored within `[begin_ms, end_ms]`.
    fn overlaps(&self, begin_ms: i64, end_ms: i64) -> bool {
        self.count() > 0
            && self.first_timestamp_ms.load(Ordering::Acquire) <= end_ms
            && self.last_timestamp_ms.load(Ordering::Acquire) >= begin_ms
    }

    /// Msyncs the header and slots of a new file, then entries published since the last
    /// flush with the slots that point at them.
    fn flush(&self) -> Result<(), StoreError> {
        let flush = |at: u64, len: u64| {
            self.segment
                .flush_range(at, len)
                .map_err(|e| StoreError::io("flush index", self.path(), e))
        };
        let layout = &self.layout;
        let _flushing = self.flush_lock.lock();
        let (from, to) = (self.flushed.load(Ordering::Acquire), self.count());
        let header_durable = self.header_durable.load(Ordering::Acquire);
        if from < to {
            flush(
                layout.entry_at(from),
                layout.entry_at(to) - layout.entry_at(from),
            )?;
        }
        if from < to || !header_durable {
            flush(0, layout.entries_start())?;
        }
        self.header_durable.store(true, Ordering::Release);
        self.flushed.store(to, Ordering::Release);
        Ok(())
    }
}

/// What the index can tell about how current it is (QUERY_MESSAGE's response header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexProgress {
    /// Store time of the newest indexed message; 0 when nothing is indexed.
    pub last_timestamp_ms: i64,
    /// CommitLog offset of the newest indexed message; 0 when nothing is indexed.
    pub last_physical_offset: u64,
}

/// The index files, as readers see them (oldest first).
pub(crate) struct MessageIndex {
    dir: PathBuf,
    files: RwLock<Arc<Vec<Arc<IndexFile>>>>,
}

impl MessageIndex {
    fn snapshot(&self) -> Arc<Vec<Arc<IndexFile>>> {
        Arc::clone(&self.files.read())
    }

    /// Calls `visit` with the CommitLog offset of every entry for `key_hash` stored within
    /// `[begin_ms, end_ms]`, newest first, until it returns `false`.
    pub(crate) fn lookup(
        &self,
        key_hash: u64,
        begin_ms: i64,
        end_ms: i64,
        mut visit: impl FnMut(u64) -> bool,
    ) {
        for file in self.snapshot().iter().rev() {
            if !file.overlaps(begin_ms, end_ms) {
                continue;
            }
            let mut next = file.slot_head(file.layout.slot_of(key_hash));
            while next > 0 {
                let Some(entry) = file.entry(next - 1) else {
                    break;
                };
                // Chains run newest first: the rest is older still.
                if entry.store_timestamp_ms < begin_ms {
                    break;
                }
                let wanted = entry.key_hash == key_hash && entry.store_timestamp_ms <= end_ms;
                if wanted && !visit(entry.physical_offset) {
                    return;
                }
                // A damaged link could loop: chains only ever point back.
                if entry.prev >= next {
                    break;
                }
                next = entry.prev;
            }
        }
    }

    pub(crate) fn progress(&self) -> IndexProgress {
        let files = self.snapshot();
        files
            .iter()
            .rev()
            .find(|file| file.count() > 0)
            .map_or_else(IndexProgress::default, |file| IndexProgress {
                last_timestamp_ms: file.last_timestamp_ms.load(Ordering::Acquire),
                last_physical_offset: file.last_physical_offset.load(Ordering::Acquire),
            })
    }

    /// Msyncs what was published since the last flush.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        for file in self.snapshot().iter() {
            file.flush()?;
        }
        Ok(())
    }

    /// Retention: deletes the oldest files whose every entry points below `log_min`, never
    /// the last (the writer's). Returns how many went.
    pub(crate) fn delete_below(&self, log_min: u64) -> Result<usize, StoreError> {
        let doomed: Vec<Arc<IndexFile>> = {
            let mut files = self.files.write();
            let keep_from = files[..files.len().saturating_sub(1)]
                .iter()
                .take_while(|file| {
                    // Entries follow the log: the last published one points highest.
                    file.count() == 0 || file.last_physical_offset.load(Ordering::Acquire) < log_min
                })
                .count();
            if keep_from == 0 {
                return Ok(0);
            }
            let doomed = files[..keep_from].to_vec();
            *files = Arc::new(files[keep_from..].to_vec());
            doomed
        };
        for file in &doomed {
            file.segment.delete()?;
            tracing::info!(path = %file.path().display(), "deleted index file");
        }
        // Deleted names must stay deleted after a crash.
        sync_dir(&self.dir)?;
        Ok(doomed.len())
    }

    /// Drops the files named past `log_end` (started for records never written), deleting
    /// them (a failure is logged: such a file holds no entry); returns the last one left.
    fn remove_past(&self, log_end: u64) -> Option<Arc<IndexFile>> {
        let (doomed, last) = {
            let mut files = self.files.write();
            let keep = files.partition_point(|file| file.base() <= log_end);
            let doomed = files[keep..].to_vec();
            *files = Arc::new(files[..keep].to_vec());
            (doomed, files.last().cloned())
        };
        for file in doomed {
            if let Err(error) = file.segment.delete().and_then(|()| sync_dir(&self.dir)) {
                tracing::error!(error = %crate::error::chain(&error), "cannot delete an index file started for records never written");
            }
        }
        last
    }
}

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
    next_entry: u32,
    /// Bytes of `active` below this hold entries or zeros we wrote.
    filled_to: u64,
    staged: Vec<Staged>,
    /// The newest staged entry of each (file, slot): the `prev` of the next one there.
    staged_heads: HashMap<(u64, u32), u32>,
}

impl IndexWriter {
    /// The most entries one record gets: the keys beyond are not indexed.
    pub(crate) fn max_entries_per_record(&self) -> u32 {
        self.layout.capacity
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
        let fits = self.active.as_ref().is_some_and(|file| {
            u64::from(self.next_entry) + u64::from(entries) <= u64::from(file.layout.capacity)
        });
        if !fits {
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
        self.active = Some(file);
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
            self.active = index.remove_past(log_end);
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
        self.active = index.remove_past(log_end);
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
    let mut writer = IndexWriter {
        layout,
        active: None,
        next_entry: 0,
        filled_to: 0,
        staged: Vec::new(),
        staged_heads: HashMap::new(),
    };
    if let Some(last) = files.last() {
        report.repaired_slots = mend_tail(last)?;
        writer.next_entry = last.count();
        writer.filled_to = last.layout.entry_at(last.count());
        writer.active = Some(Arc::clone(last));
    }
    let index = MessageIndex {
        dir: dir.to_path_buf(),
        files: RwLock::new(Arc::new(files)),
    };
    Ok((index, writer, report))
}

/// The index files in `dir`, sorted by the CommitLog offset in their names.
fn list_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StoreError::io("list directory", dir, e))? {
        let path = entry
            .map_err(|e| StoreError::io("list directory", dir, e))?
            .path();
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
fn open_file(path: &Path, base: u64, valid_below: u64) -> Result<IndexFile, StoreError> {
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
fn mend_tail(file: &IndexFile) -> Result<u64, StoreError> {
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
    // Mended slots and zeroed entries must reach the disk before anything relies on them.
    file.segment
        .flush_range(0, file.segment.len())
        .map_err(|e| StoreError::io("flush index", file.path(), e))?;
    Ok(heads.len() as u64)
}

/// The layout files created from now on get.
pub(crate) fn layout(slots: u32, capacity: u32) -> Layout {
    Layout { slots, capacity }
}

/// The CommitLog offsets in the names of the index files on disk (tests).
#[cfg(test)]
fn file_names(dir: &Path) -> Vec<u64> {
    list_files(dir)
        .unwrap()
        .into_iter()
        .map(|(base, _)| base)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: Layout = Layout {
        slots: 4,
        capacity: 8,
    };

    #[test]
    fn key_hash_is_pinned() {
        // On disk: a change here would orphan every index written before.
        assert_eq!(key_hash("", ""), 0xaf63_bd4c_8601_b7df);
        assert_ne!(key_hash("T", "k"), key_hash("Tk", ""));
        assert_ne!(key_hash("T", "k1"), key_hash("T", "k2"));
    }

    #[test]
    fn entries_round_trip_and_torn_ones_fail_their_checksum() {
        let entry = Entry {
            key_hash: 0x0102_0304_0506_0708,
            physical_offset: 1 << 40,
            store_timestamp_ms: 1_700_000_000_123,
            prev: 7,
        };
        let mut bytes = entry.encode();
        assert_eq!(Entry::decode(&bytes), Some(entry));
        bytes[10] ^= 1;
        assert_eq!(Entry::decode(&bytes), None);
        assert_eq!(Entry::decode(&[0u8; 32]), None, "zeros are no entry");
    }

    #[test]
    fn index_keys_are_the_unique_key_then_each_key() {
        let properties = "KEYS\u{1}a  b\u{2}UNIQ_KEY\u{1}U1\u{2}TAGS\u{1}t\u{2}";
        assert_eq!(index_keys(properties).collect::<Vec<_>>(), ["U1", "a", "b"]);
        assert_eq!(index_keys("TAGS\u{1}t\u{2}").count(), 0);
        assert!(KeyMatch::AnyKey.matches(properties, "b"));
        assert!(KeyMatch::AnyKey.matches(properties, "U1"));
        assert!(!KeyMatch::UniqueKey.matches(properties, "b"));
        assert!(KeyMatch::UniqueKey.matches(properties, "U1"));
        assert!(!KeyMatch::AnyKey.matches(properties, "a b"));
    }

    fn put(writer: &mut IndexWriter, index: &MessageIndex, key: &str, at: u64, ts: i64) {
        writer.prepare(index, at, 1).unwrap();
        writer.stage("T", key, at, ts);
        writer.publish();
    }

    fn found(index: &MessageIndex, key: &str, begin: i64, end: i64) -> Vec<u64> {
        let mut offsets = Vec::new();
        index.lookup(key_hash("T", key), begin, end, |at| {
            offsets.push(at);
            true
        });
        offsets
    }

    #[test]
    fn chains_collide_roll_over_files_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
        for n in 0..20u64 {
            put(
                &mut writer,
                &index,
                &format!("k{}", n % 5),
                n * 100,
                n as i64,
            );
        }
        assert_eq!(file_names(dir.path()), [0, 800, 1600], "8 entries per file");
        // Four slots for five keys: chains collide; only k2's entries come back.
        assert_eq!(found(&index, "k2", 0, 100), [1700, 1200, 700, 200]);
        assert_eq!(found(&index, "k2", 5, 12), [1200, 700]);
        index.flush().unwrap();
        drop((index, writer));
        let (index, writer, report) = recover(dir.path(), SMALL, u64::MAX).unwrap();
        assert_eq!(report, IndexRecovery::default());
        assert_eq!(writer.next_entry, 4);
        assert_eq!(found(&index, "k2", 0, 100), [1700, 1200, 700, 200]);
        assert_eq!(
            index.progress(),
            IndexProgress {
                last_timestamp_ms: 19,
                last_physical_offset: 1900
            }
        );
    }

    #[test]
    fn recovery_drops_entries_past_the_recovery_point_and_mends_slots() {
        let dir = tempfile::tempdir().unwrap();
        let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
        for n in 0..12u64 {
            put(
                &mut writer,
                &index,
                &format!("k{}", n % 3),
                n * 100,
                n as i64,
            );
        }
        drop((index, writer));
        // Recovery keeps records below 1050: entries 0-10; the file at 800 holds 8-10.
        let (index, mut writer, report) = recover(dir.path(), SMALL, 1050).unwrap();
        assert_eq!(report.dropped_files, 0);
        assert!(report.repaired_slots > 0, "{report:?}");
        assert_eq!(writer.next_entry, 3);
        assert_eq!(found(&index, "k2", 0, 100), [800, 500, 200]);
        assert_eq!(found(&index, "k1", 0, 100), [1000, 700, 400, 100]);
        // Re-indexing goes on from the mended chains.
        put(&mut writer, &index, "k2", 1100, 11);
        assert_eq!(found(&index, "k2", 0, 100), [1100, 800, 500, 200]);
        drop((index, writer));
        // A recovery point before a file's start deletes the file.
        let (index, _, report) = recover(dir.path(), SMALL, 700).unwrap();
        assert_eq!(report.dropped_files, 1);
        assert_eq!(found(&index, "k1", 0, 100), [400, 100]);
    }

    #[test]
    fn a_damaged_file_is_dropped_and_the_others_still_answer() {
        let dir = tempfile::tempdir().unwrap();
        let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
        for n in 0..12u64 {
            put(&mut writer, &index, "k", n * 100, n as i64);
        }
        drop((index, writer));
        std::fs::write(dir.path().join(format!("{:020}", 0)), b"not an index").unwrap();
        let (index, _, report) = recover(dir.path(), SMALL, u64::MAX).unwrap();
        assert_eq!(report.dropped_files, 1);
        assert_eq!(found(&index, "k", 0, 100), [1100, 1000, 900, 800]);
    }

    #[test]
    fn retention_keeps_files_that_index_live_records_and_the_last_one() {
        let dir = tempfile::tempdir().unwrap();
        let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
        for n in 0..20u64 {
            put(&mut writer, &index, "k", n * 100, n as i64);
        }
        assert_eq!(
            index.delete_below(700).unwrap(),
            0,
            "entry 7 (700) still lives"
        );
        assert_eq!(index.delete_below(701).unwrap(), 1);
        assert_eq!(index.delete_below(u64::MAX).unwrap(), 1, "never the last");
        assert_eq!(file_names(dir.path()), [1600]);
        assert_eq!(found(&index, "k", 0, 100), [1900, 1800, 1700, 1600]);
    }

    #[test]
    fn unstaged_entries_are_never_published() {
        let dir = tempfile::tempdir().unwrap();
        let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
        put(&mut writer, &index, "k", 0, 0);
        writer.prepare(&index, 100, 2).unwrap();
        writer.stage("T", "k", 100, 1);
        writer.stage("T", "k", 200, 2);
        writer.unstage_from(&index, 200);
        writer.publish();
        writer.prepare(&index, 200, 1).unwrap();
        writer.stage("T", "other", 200, 3);
        writer.publish();
        assert_eq!(found(&index, "k", 0, 100), [100, 0]);
        assert_eq!(found(&index, "other", 0, 100), [200]);
    }

    #[test]
    fn a_file_started_for_records_never_written_goes_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
        for n in 0..6u64 {
            put(&mut writer, &index, "k", n * 100, n as i64);
        }
        // A batch: one entry fits in file 0, the next record's two start file 700.
        writer.prepare(&index, 600, 1).unwrap();
        writer.stage("T", "k", 600, 6);
        writer.prepare(&index, 700, 2).unwrap();
        writer.stage("T", "k", 700, 7);
        writer.stage("T", "j", 700, 7);
        assert_eq!(file_names(dir.path()), [0, 700]);
        // Its write failed: the log goes back to 600.
        writer.unstage_from(&index, 600);
        writer.publish();
        assert_eq!(file_names(dir.path()), [0]);
        assert!(found(&index, "k", 0, 100).starts_with(&[500]));
        // The records written there instead go to file 0 again.
        put(&mut writer, &index, "k", 600, 6);
        put(&mut writer, &index, "k", 700, 7);
        put(&mut writer, &index, "k", 800, 8);
        assert_eq!(file_names(dir.path()), [0, 800]);
        assert_eq!(
            found(&index, "k", 0, 100),
            [800, 700, 600, 500, 400, 300, 200, 100, 0]
        );
    }
}
