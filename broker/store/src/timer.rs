//! Timed delivery's files (learned from Apache's TimerMessageStore): an append-only timer
//! log of fixed-size records, a memory-mapped wheel of per-second slots each holding the
//! newest record of its second (records chain to the previous one of their slot), and a
//! two-slot checkpoint. A start reads the checkpoint and the timer log's pending records (to
//! check them and rebuild the wheel's heads): no CommitLog scan, and pending timers cost disk,
//! not anonymous memory. Nothing here needs an fsync to stay consistent: each record carries
//! its timer-queue offset, so a log that lost its tail resumes after its last whole record.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::error::StoreError;

const RECORD_SIZE: u64 = 40;
const RECORD_MAGIC: u32 = 0x7449_4d52;
const SLOT_SIZE: u64 = 8;
const CHECKPOINT_SLOT: u64 = 64;
const CHECKPOINT_BODY: usize = 48;
/// Records read per pread when scanning the log forward.
const SCAN_CHUNK: u64 = 4096;

/// One pending timer: when it is due and where its message waits in the CommitLog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerRecord {
    pub deliver_ms: i64,
    pub commit_log_offset: u64,
    /// Where the message is in the timer topic's queue.
    pub queue_offset: u64,
    pub size: u32,
}

/// How far the timer service got; a record of the log is identified by its index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerProgress {
    /// The timer topic's queue offset enqueued up to (exclusive).
    pub queue_offset: u64,
    /// Timer log records durable with this checkpoint.
    pub log_len: u64,
    /// Every record ordered at or before (fired_ms, fired_index) has fired.
    pub fired_ms: i64,
    pub fired_index: u64,
    /// Every record below this index has fired.
    pub low_water: u64,
}

impl TimerProgress {
    /// Whether the record at `index` due at `deliver_ms` has fired.
    pub fn has_fired(&self, deliver_ms: i64, index: u64) -> bool {
        (deliver_ms, index) <= (self.fired_ms, self.fired_index)
    }
}

/// The timer log, wheel and checkpoint under one directory.
pub struct TimerStore {
    dir: PathBuf,
    log: File,
    log_len: u64,
    wheel: MmapMut,
    slots: u64,
    checkpoint: File,
    checkpoint_seq: u64,
    progress: TimerProgress,
    pending_on_open: u64,
}

fn second_of(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

fn encode_record(record: &TimerRecord, prev: u64) -> [u8; RECORD_SIZE as usize] {
    let mut bytes = [0u8; RECORD_SIZE as usize];
    bytes[0..8].copy_from_slice(&record.deliver_ms.to_le_bytes());
    bytes[8..16].copy_from_slice(&record.commit_log_offset.to_le_bytes());
    bytes[16..24].copy_from_slice(&record.queue_offset.to_le_bytes());
    bytes[PREV_AT..PREV_AT + 8].copy_from_slice(&prev.to_le_bytes());
    bytes[32..36].copy_from_slice(&record.size.to_le_bytes());
    bytes[36..40].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    bytes
}

/// Where a record keeps its link (the previous record of its slot's index + 1, 0 for none).
const PREV_AT: usize = 24;

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// A record and its link; `None` for bytes that are not a whole record (a lost page).
fn decode_record(bytes: &[u8]) -> Option<(TimerRecord, u64)> {
    let magic = u32::from_le_bytes(bytes[36..40].try_into().expect("4 bytes"));
    (magic == RECORD_MAGIC).then(|| {
        let record = TimerRecord {
            deliver_ms: u64_at(bytes, 0) as i64,
            commit_log_offset: u64_at(bytes, 8),
            queue_offset: u64_at(bytes, 16),
            size: u32::from_le_bytes(bytes[32..36].try_into().expect("4 bytes")),
        };
        (record, u64_at(bytes, PREV_AT))
    })
}

fn open_rw(path: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| StoreError::io("open", path, e))
}

impl TimerStore {
    /// Opens (or creates) the files under `dir` with a wheel of `slots` seconds: the log is
    /// cut to the checkpoint (or before its first record that is not whole) and the wheel's
    /// heads are rebuilt from the records not known fired.
    pub fn open(dir: &Path, slots: u64) -> Result<TimerStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create dir", dir, e))?;
        let checkpoint = open_rw(&dir.join("timercheck"))?;
        let (checkpoint_seq, mut progress) = read_checkpoint(&checkpoint);
        let log_path = dir.join("timerlog");
        let log = open_rw(&log_path)?;
        let on_disk = log
            .metadata()
            .map_err(|e| StoreError::io("stat", &log_path, e))?
            .len()
            / RECORD_SIZE;
        let claimed = progress.log_len;
        progress.low_water = progress.low_water.min(claimed.min(on_disk));
        let (wheel, fresh) = open_wheel(&dir.join("timerwheel"), slots)?;
        let mut store = TimerStore {
            dir: dir.to_path_buf(),
            log,
            log_len: claimed.min(on_disk),
            wheel,
            slots,
            checkpoint,
            checkpoint_seq,
            progress,
            pending_on_open: 0,
        };
        store.pending_on_open = store.rebuild_wheel(fresh)?;
        if store.log_len < claimed {
            // Records the checkpoint counted were lost: enqueue again after the last whole one.
            if let Some(last) = store.log_len.checked_sub(1) {
                progress.queue_offset = store.record(last)?.queue_offset + 1;
            }
            tracing::warn!(
                kept = store.log_len,
                claimed,
                "timer log shorter than its checkpoint; re-enqueueing the rest"
            );
        }
        progress.log_len = store.log_len;
        store
            .log
            .set_len(store.log_len * RECORD_SIZE)
            .map_err(|e| StoreError::io("truncate", &log_path, e))?;
        store.progress = progress;
        if fresh {
            let wheel_path = dir.join("timerwheel");
            std::fs::rename(rebuilt_path(&wheel_path), &wheel_path)
                .map_err(|e| StoreError::io("rename", &wheel_path, e))?;
        }
        Ok(store)
    }

    /// Records not fired when the store opened.
    pub fn pending_on_open(&self) -> u64 {
        self.pending_on_open
    }

    /// The last checkpoint written (or loaded).
    pub fn progress(&self) -> TimerProgress {
        self.progress
    }

    /// Records in the log.
    pub fn len(&self) -> u64 {
        self.log_len
    }

    pub fn is_empty(&self) -> bool {
        self.log_len == 0
    }

    fn slot_of(&self, second: i64) -> usize {
        (second.rem_euclid(self.slots as i64) as u64 * SLOT_SIZE) as usize
    }

    fn head(&self, second: i64) -> u64 {
        u64_at(&self.wheel, self.slot_of(second))
    }

    fn set_head(&mut self, second: i64, link: u64) {
        let at = self.slot_of(second);
        self.wheel[at..at + 8].copy_from_slice(&link.to_le_bytes());
    }

    /// Appends records (one write), linking each into its second's slot; returns the index
    /// of the first.
    pub fn append(&mut self, records: &[TimerRecord]) -> Result<u64, StoreError> {
        let first = self.log_len;
        let mut bytes = Vec::with_capacity(records.len() * RECORD_SIZE as usize);
        for (i, record) in records.iter().enumerate() {
            let second = second_of(record.deliver_ms);
            bytes.extend_from_slice(&encode_record(record, self.head(second)));
            // Heads are rebuilt on open: their order against the log write does not matter.
            self.set_head(second, first + i as u64 + 1);
        }
        self.log
            .write_all_at(&bytes, first * RECORD_SIZE)
            .map_err(|e| StoreError::io("write", self.dir.join("timerlog"), e))?;
        self.log_len += records.len() as u64;
        Ok(first)
    }

    /// The record at `index`.
    pub fn record(&self, index: u64) -> Result<TimerRecord, StoreError> {
        Ok(self.read_linked(index)?.0)
    }

    fn read_linked(&self, index: u64) -> Result<(TimerRecord, u64), StoreError> {
        let mut bytes = [0u8; RECORD_SIZE as usize];
        self.log
            .read_exact_at(&mut bytes, index * RECORD_SIZE)
            .map_err(|e| StoreError::io("read", self.dir.join("timerlog"), e))?;
        decode_record(&bytes).ok_or_else(|| {
            StoreError::io(
                "decode",
                self.dir.join("timerlog"),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("timer record {index} is corrupt"),
                ),
            )
        })
    }

    /// The records not fired yet of `second`'s slot due by the end of `second` (older laps
    /// of the ring included), newest first, with their indexes.
    pub fn due_in_slot(
        &self,
        second: i64,
        fired: &TimerProgress,
    ) -> Result<Vec<(u64, TimerRecord)>, StoreError> {
        let mut found = Vec::new();
        let mut link = self.head(second);
        // Below the low water mark everything fired: the walk stops there.
        while link > fired.low_water && link <= self.log_len {
            let index = link - 1;
            let (record, prev) = self.read_linked(index)?;
            if second_of(record.deliver_ms) <= second && !fired.has_fired(record.deliver_ms, index)
            {
                found.push((index, record));
            }
            link = prev;
        }
        Ok(found)
    }

    /// Moves `low_water` past fired records; returns the CommitLog offset of the oldest
    /// record still pending, if any.
    pub fn advance_low_water(
        &self,
        progress: &mut TimerProgress,
    ) -> Result<Option<u64>, StoreError> {
        while progress.low_water < self.log_len {
            let record = self.record(progress.low_water)?;
            if !progress.has_fired(record.deliver_ms, progress.low_water) {
                return Ok(Some(record.commit_log_offset));
            }
            progress.low_water += 1;
        }
        Ok(None)
    }

    /// Starts the log over once every record fired and it holds at least `min_len`, so it
    /// does not grow for ever; true if it did. The checkpoint goes first: a crash between the
    /// two leaves a log longer than its checkpoint, cut on open.
    pub fn reset_if_drained(
        &mut self,
        progress: &mut TimerProgress,
        min_len: u64,
    ) -> Result<bool, StoreError> {
        if progress.low_water < self.log_len || self.log_len < min_len {
            return Ok(false);
        }
        progress.log_len = 0;
        progress.low_water = 0;
        // Indexes start again at 0: the fired time alone marks what fired.
        progress.fired_index = u64::MAX;
        self.log_len = 0;
        self.checkpoint(*progress, false)?;
        self.wheel.fill(0);
        self.log
            .set_len(0)
            .map_err(|e| StoreError::io("truncate", self.dir.join("timerlog"), e))?;
        Ok(true)
    }

    /// Writes the checkpoint; with `sync`, the log and wheel are made durable first. Without
    /// it the page cache carries it over a kill -9, and after a power loss `open` cuts the log
    /// at its first lost record and resumes the queue after the last whole one.
    pub fn checkpoint(
        &mut self,
        mut progress: TimerProgress,
        sync: bool,
    ) -> Result<(), StoreError> {
        progress.log_len = progress.log_len.min(self.log_len);
        if sync {
            self.log
                .sync_data()
                .map_err(|e| StoreError::io("fsync", self.dir.join("timerlog"), e))?;
            self.wheel
                .flush()
                .map_err(|e| StoreError::io("msync", self.dir.join("timerwheel"), e))?;
        }
        self.checkpoint_seq += 1;
        let bytes = encode_checkpoint(self.checkpoint_seq, &progress);
        let at = (self.checkpoint_seq % 2) * CHECKPOINT_SLOT;
        self.checkpoint
            .write_all_at(&bytes, at)
            .map_err(|e| StoreError::io("write", self.dir.join("timercheck"), e))?;
        if sync {
            self.checkpoint
                .sync_data()
                .map_err(|e| StoreError::io("fsync", self.dir.join("timercheck"), e))?;
        }
        self.progress = progress;
        Ok(())
    }

    /// Sets every slot's head to its newest record from the low water mark on (a new wheel
    /// also relinks each record to its new predecessor), cutting the log before its first
    /// record that is not whole; returns the records not fired.
    fn rebuild_wheel(&mut self, relink: bool) -> Result<u64, StoreError> {
        self.wheel.fill(0);
        let mut pending = 0;
        let mut index = self.progress.low_water;
        while index < self.log_len {
            let count = SCAN_CHUNK.min(self.log_len - index);
            let mut bytes = vec![0u8; (count * RECORD_SIZE) as usize];
            self.log
                .read_exact_at(&mut bytes, index * RECORD_SIZE)
                .map_err(|e| StoreError::io("read", self.dir.join("timerlog"), e))?;
            let mut whole = 0;
            for chunk in bytes.chunks_exact_mut(RECORD_SIZE as usize) {
                let Some((record, _)) = decode_record(chunk) else {
                    break;
                };
                let second = second_of(record.deliver_ms);
                if relink {
                    chunk[PREV_AT..PREV_AT + 8].copy_from_slice(&self.head(second).to_le_bytes());
                }
                self.set_head(second, index + whole + 1);
                pending += u64::from(!self.progress.has_fired(record.deliver_ms, index + whole));
                whole += 1;
            }
            if relink {
                let kept = (whole * RECORD_SIZE) as usize;
                self.log
                    .write_all_at(&bytes[..kept], index * RECORD_SIZE)
                    .map_err(|e| StoreError::io("write", self.dir.join("timerlog"), e))?;
            }
            index += whole;
            if whole < count {
                self.log_len = index;
            }
        }
        if relink {
            self.log
                .sync_data()
                .map_err(|e| StoreError::io("fsync", self.dir.join("timerlog"), e))?;
            self.wheel
                .flush()
                .map_err(|e| StoreError::io("msync", self.dir.join("timerwheel"), e))?;
        }
        Ok(pending)
    }
}

/// The wheel file mapped; true when it was (re)created and must be rebuilt.
/// The wheel file mapped; a wheel of another size is replaced by a fresh one, mapped at
/// `<path>.new` and renamed once rebuilt (true), so a crash mid-rebuild rebuilds again.
fn open_wheel(path: &Path, slots: u64) -> Result<(MmapMut, bool), StoreError> {
    let want = slots * SLOT_SIZE;
    let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let fresh = len != want;
    let mapped_path = if fresh {
        rebuilt_path(path)
    } else {
        path.to_path_buf()
    };
    let file = open_rw(&mapped_path)?;
    if fresh {
        file.set_len(0)
            .map_err(|e| StoreError::io("truncate", &mapped_path, e))?;
        file.set_len(want)
            .map_err(|e| StoreError::io("extend", &mapped_path, e))?;
    }
    // SAFETY: the wheel file is private to this broker's data directory and never resized
    // while mapped.
    let map =
        unsafe { MmapMut::map_mut(&file) }.map_err(|e| StoreError::io("mmap", &mapped_path, e))?;
    Ok((map, fresh))
}

fn rebuilt_path(path: &Path) -> PathBuf {
    path.with_extension("new")
}

fn encode_checkpoint(seq: u64, progress: &TimerProgress) -> [u8; CHECKPOINT_SLOT as usize] {
    let mut bytes = [0u8; CHECKPOINT_SLOT as usize];
    let fields = [
        seq,
        progress.queue_offset,
        progress.log_len,
        progress.fired_ms as u64,
        progress.fired_index,
        progress.low_water,
    ];
    for (i, field) in fields.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&field.to_le_bytes());
    }
    let crc = crc32fast::hash(&bytes[..CHECKPOINT_BODY]);
    bytes[CHECKPOINT_BODY..CHECKPOINT_BODY + 4].copy_from_slice(&crc.to_le_bytes());
    bytes
}

fn decode_checkpoint(bytes: &[u8]) -> Option<(u64, TimerProgress)> {
    let crc = u32::from_le_bytes(
        bytes[CHECKPOINT_BODY..CHECKPOINT_BODY + 4]
            .try_into()
            .ok()?,
    );
    if crc != crc32fast::hash(&bytes[..CHECKPOINT_BODY]) || u64_at(bytes, 0) == 0 {
        return None;
    }
    let progress = TimerProgress {
        queue_offset: u64_at(bytes, 8),
        log_len: u64_at(bytes, 16),
        fired_ms: u64_at(bytes, 24) as i64,
        fired_index: u64_at(bytes, 32),
        low_water: u64_at(bytes, 40),
    };
    Some((u64_at(bytes, 0), progress))
}

/// The newest valid of the two checkpoint slots (a torn write leaves the other).
fn read_checkpoint(file: &File) -> (u64, TimerProgress) {
    let mut bytes = [0u8; 2 * CHECKPOINT_SLOT as usize];
    let read = file.read_at(&mut bytes, 0).unwrap_or(0);
    bytes[read..].fill(0);
    bytes
        .chunks_exact(CHECKPOINT_SLOT as usize)
        .filter_map(decode_checkpoint)
        .max_by_key(|(seq, _)| *seq)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(deliver_ms: i64, offset: u64) -> TimerRecord {
        TimerRecord {
            deliver_ms,
            commit_log_offset: offset,
            queue_offset: offset * 10,
            size: 100,
        }
    }

    /// Bytes at `at` of a file, as a crash or a lost page leaves them.
    fn overwrite(path: &Path, at: u64, bytes: &[u8]) {
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(bytes, at).unwrap();
    }

    fn offsets(found: &[(u64, TimerRecord)]) -> Vec<u64> {
        found.iter().map(|(_, r)| r.commit_log_offset).collect()
    }

    #[test]
    fn slots_chain_their_records_and_skip_fired_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TimerStore::open(dir.path(), 60).unwrap();
        store
            .append(&[timer(10_100, 1), timer(11_000, 2), timer(10_900, 3)])
            .unwrap();
        store.append(&[timer(70_500, 4)]).unwrap(); // next lap, same slot as second 10
        let none = TimerProgress::default();
        assert_eq!(offsets(&store.due_in_slot(10, &none).unwrap()), vec![3, 1]);
        assert_eq!(
            offsets(&store.due_in_slot(70, &none).unwrap()),
            vec![4, 3, 1]
        );
        let fired = TimerProgress {
            fired_ms: 10_100,
            fired_index: 0,
            ..TimerProgress::default()
        };
        assert_eq!(offsets(&store.due_in_slot(10, &fired).unwrap()), vec![3]);
    }

    #[test]
    fn reopen_truncates_past_the_checkpoint_and_rebuilds_heads() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = TimerStore::open(dir.path(), 60).unwrap();
            store.append(&[timer(5_000, 1), timer(6_000, 2)]).unwrap();
            let progress = TimerProgress {
                queue_offset: 2,
                log_len: store.len(),
                ..TimerProgress::default()
            };
            store.checkpoint(progress, true).unwrap();
            // Not checkpointed: lost on restart, as if killed here.
            store.append(&[timer(5_500, 3), timer(7_000, 4)]).unwrap();
        }
        let store = TimerStore::open(dir.path(), 60).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(store.progress().queue_offset, 2);
        let none = TimerProgress::default();
        assert_eq!(offsets(&store.due_in_slot(5, &none).unwrap()), vec![1]);
        assert!(store.due_in_slot(7, &none).unwrap().is_empty());
        let length = std::fs::metadata(dir.path().join("timerlog"))
            .unwrap()
            .len();
        assert_eq!(length, 2 * RECORD_SIZE);
    }

    #[test]
    fn a_log_that_lost_its_tail_resumes_after_its_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = TimerStore::open(dir.path(), 60).unwrap();
            store
                .append(&[
                    timer(5_000, 1),
                    timer(6_000, 2),
                    timer(5_100, 3),
                    timer(7_000, 4),
                ])
                .unwrap();
            let progress = TimerProgress {
                queue_offset: 41,
                log_len: 4,
                ..TimerProgress::default()
            };
            store.checkpoint(progress, false).unwrap();
        }
        // The page holding the last two records never reached the disk.
        let lost = [0u8; 2 * RECORD_SIZE as usize];
        overwrite(&dir.path().join("timerlog"), 2 * RECORD_SIZE, &lost);
        let store = TimerStore::open(dir.path(), 60).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(store.pending_on_open(), 2);
        assert_eq!(
            store.progress().queue_offset,
            21,
            "after record 2's queue offset 20"
        );
        let none = TimerProgress::default();
        assert_eq!(offsets(&store.due_in_slot(5, &none).unwrap()), vec![1]);
        assert!(store.due_in_slot(7, &none).unwrap().is_empty());
    }

    #[test]
    fn a_resized_wheel_is_rebuilt_from_pending_records() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = TimerStore::open(dir.path(), 60).unwrap();
            store.append(&[timer(5_000, 1), timer(65_000, 2)]).unwrap();
            let progress = TimerProgress {
                log_len: 2,
                ..TimerProgress::default()
            };
            store.checkpoint(progress, true).unwrap();
        }
        let store = TimerStore::open(dir.path(), 120).unwrap();
        let none = TimerProgress::default();
        assert_eq!(offsets(&store.due_in_slot(5, &none).unwrap()), vec![1]);
        assert_eq!(offsets(&store.due_in_slot(65, &none).unwrap()), vec![2]);
    }

    #[test]
    fn checkpoint_keeps_the_newest_valid_slot() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = TimerStore::open(dir.path(), 10).unwrap();
            for fired_ms in [1, 2, 3] {
                let progress = TimerProgress {
                    fired_ms,
                    ..TimerProgress::default()
                };
                store.checkpoint(progress, false).unwrap();
            }
        }
        // Tear the newest slot (seq 3 lives in slot 1).
        overwrite(
            &dir.path().join("timercheck"),
            CHECKPOINT_SLOT + 8,
            &[0xff; 8],
        );
        let store = TimerStore::open(dir.path(), 10).unwrap();
        assert_eq!(store.progress().fired_ms, 2);
    }

    #[test]
    fn a_drained_log_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TimerStore::open(dir.path(), 60).unwrap();
        store.append(&[timer(1_000, 1), timer(2_000, 2)]).unwrap();
        let mut progress = TimerProgress {
            queue_offset: 2,
            log_len: 2,
            fired_ms: 1_500,
            fired_index: u64::MAX,
            low_water: 0,
        };
        store.advance_low_water(&mut progress).unwrap();
        assert!(
            !store.reset_if_drained(&mut progress, 1).unwrap(),
            "one pending"
        );
        progress.fired_ms = 2_000;
        assert_eq!(store.advance_low_water(&mut progress).unwrap(), None);
        assert!(store.reset_if_drained(&mut progress, 1).unwrap());
        assert!(store.is_empty());
        assert!(store
            .due_in_slot(2, &TimerProgress::default())
            .unwrap()
            .is_empty());
        store.append(&[timer(3_000, 3)]).unwrap();
        drop(store);
        let store = TimerStore::open(dir.path(), 60).unwrap();
        assert_eq!(store.progress().queue_offset, 2);
        assert_eq!(
            store.len(),
            0,
            "the append after the reset was never checkpointed"
        );
    }

    #[test]
    fn low_water_stops_at_the_oldest_pending_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = TimerStore::open(dir.path(), 60).unwrap();
        store
            .append(&[timer(1_000, 10), timer(9_000, 20), timer(2_000, 30)])
            .unwrap();
        let mut progress = TimerProgress {
            fired_ms: 2_000,
            fired_index: u64::MAX,
            ..TimerProgress::default()
        };
        assert_eq!(store.advance_low_water(&mut progress).unwrap(), Some(20));
        assert_eq!(progress.low_water, 1);
    }
}
