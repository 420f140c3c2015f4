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
//!
//! The file being written keeps its slots in memory ([`HotSlots`]) and writes the changed
//! ones into the mapping at housekeeping, before the msync: a publish lands on a random slot,
//! and storing it through the mapping took a write fault on a page housekeeping had just
//! cleaned (and waited for that page's write-back to finish), on the send path. Crash safety
//! is unchanged: a checkpoint's index offset is taken before the flush that writes back every
//! slot published below it, so after a crash recovery keeps only entries whose slots reached
//! the file, and re-indexes the rest from the CommitLog as before (slots pointing past the
//! kept entries are mended).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::error::StoreError;
use crate::mapped_file::{sync_dir, MappedSegment};

mod recover;
#[cfg(test)]
mod tests;
mod writer;

pub(crate) use recover::recover;
pub(crate) use writer::IndexWriter;

const MAGIC: u32 = 0x5149_4458;
const VERSION: u32 = 1;
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 4;
pub(crate) const ENTRY_BYTES: u64 = 32;
/// Staged entries up to this many are searched for a slot's newest one; beyond, a map is kept.
const STAGED_SCANNED: usize = 32;
/// Slots per dirty bit of [`HotSlots`]: one page of the mapping's slots.
const SLOTS_PER_DIRTY_BIT: u32 = 1024;
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
    /// The slots, while this file is written (see the module's notes); `None`: the mapping's
    /// are current. Read-locked for each slot access; written only to install or drop it.
    hot: RwLock<Option<HotSlots>>,
    /// The writer moved on to a newer file: the hot slots go once written back.
    retired: AtomicBool,
}

/// A file's slots held in memory, and which groups of them changed since written back.
struct HotSlots {
    heads: Box<[AtomicU32]>,
    dirty: Box<[AtomicU64]>,
}

impl HotSlots {
    fn new(heads: Box<[AtomicU32]>) -> HotSlots {
        let groups = heads.len().div_ceil(SLOTS_PER_DIRTY_BIT as usize);
        HotSlots {
            heads,
            dirty: (0..groups.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn set(&self, slot: u32, head: u32) {
        self.heads[slot as usize].store(head, Ordering::Release);
        // After the store: a write-back that clears the bit before it copies sees the head.
        let group = slot / SLOTS_PER_DIRTY_BIT;
        self.dirty[(group / 64) as usize].fetch_or(1 << (group % 64), Ordering::Release);
    }

    /// The groups changed since the last call, each cleared before it is handed out.
    fn take_dirty(&self) -> Vec<u32> {
        let mut groups = Vec::new();
        for (word_at, word) in self.dirty.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                groups.push(word_at as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        groups
    }
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
            hot: RwLock::new(None),
            retired: AtomicBool::new(false),
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
        if let Some(hot) = self.hot.read().as_ref() {
            return hot.heads[slot as usize].load(Ordering::Acquire);
        }
        u32::from_le(self.slot(slot).load(Ordering::Acquire))
    }

    fn set_slot_head(&self, slot: u32, head: u32) {
        match self.hot.read().as_ref() {
            Some(hot) => hot.set(slot, head),
            None => self.slot(slot).store(head.to_le(), Ordering::Release),
        }
    }

    /// From now on the slots live in memory (copied from the mapping) until written back
    /// after the writer moved on ([`IndexFile::write_back_slots`]). The writer's only.
    fn keep_slots_in_memory(&self) {
        let mut hot = self.hot.write();
        if hot.is_none() {
            let heads = (0..self.layout.slots)
                .map(|slot| AtomicU32::new(u32::from_le(self.slot(slot).load(Ordering::Acquire))))
                .collect();
            *hot = Some(HotSlots::new(heads));
        }
        self.retired.store(false, Ordering::Release);
    }

    /// Writes the slots changed in memory into the mapping; once the writer has moved on,
    /// the memory goes too. Returns whether any slot was written.
    fn write_back_slots(&self) -> bool {
        let copy = |hot: &HotSlots| {
            let groups = hot.take_dirty();
            for &group in &groups {
                let first = group * SLOTS_PER_DIRTY_BIT;
                let end = (first + SLOTS_PER_DIRTY_BIT).min(self.layout.slots);
                for slot in first..end {
                    let head = hot.heads[slot as usize].load(Ordering::Acquire);
                    self.slot(slot).store(head.to_le(), Ordering::Release);
                }
            }
            !groups.is_empty()
        };
        let wrote = self.hot.read().as_ref().is_some_and(copy);
        if !self.retired.load(Ordering::Acquire) {
            return wrote;
        }
        // Under the write lock no publish can land in memory after the last copy.
        let mut hot = self.hot.write();
        let wrote_last = hot.as_ref().is_some_and(copy);
        *hot = None;
        wrote || wrote_last
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
    /// flush with the slots that point at them (written back from memory first).
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
        // After reading the count: every entry below it has its slot in what is written back.
        let wrote_slots = self.write_back_slots();
        if from < to {
            flush(
                layout.entry_at(from),
                layout.entry_at(to) - layout.entry_at(from),
            )?;
        }
        if from < to || wrote_slots || !header_durable {
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

/// The layout files created from now on get.
pub(crate) fn layout(slots: u32, capacity: u32) -> Layout {
    Layout { slots, capacity }
}
