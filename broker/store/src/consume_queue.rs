//! A ConsumeQueue: the index of one (topic, queueId), 20-byte units in segment files.
//!
//! ```text
//! unit (big-endian): [commitlog_offset i64][size i32][tags_code i64]
//! files: consumequeue/<topic>/<queueId>/<byte offset of first unit, 20 digits>
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::error::StoreError;
use crate::mapped_file::{
    data_ranges, find_segment, load_segments, sync_dir, zero_fill_ahead, MappedSegment, SegmentList,
};

pub(crate) const UNIT_BYTES: u64 = 20;
/// A queue's tail is zero-filled this far ahead (`zero_fill_ahead`): 3,276 units.
const QUEUE_FILL_STEP_BYTES: u64 = 64 * 1024;

/// One index entry: where a message's record lives and its tags hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unit {
    pub physical_offset: u64,
    pub size: u32,
    pub tags_code: i64,
}

impl Unit {
    fn encode(&self) -> [u8; UNIT_BYTES as usize] {
        let mut out = [0u8; UNIT_BYTES as usize];
        out[..8].copy_from_slice(&(self.physical_offset as i64).to_be_bytes());
        out[8..12].copy_from_slice(&(self.size as i32).to_be_bytes());
        out[12..].copy_from_slice(&self.tags_code.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Unit {
        Unit {
            physical_offset: i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes")) as u64,
            size: i32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")) as u32,
            tags_code: i64::from_be_bytes(bytes[12..20].try_into().expect("8 bytes")),
        }
    }

    /// Never written (a zero unit: every real record has a size).
    pub(crate) fn is_empty(&self) -> bool {
        self.size == 0
    }
}

/// The parts of a queue's files that hold data (absolute queue bytes), so recovery reads
/// units there only: on tmpfs, reading a hole through the mapping allocates a page, and on
/// a full disk that is a SIGBUS. A unit in a hole was never written.
struct WrittenUnits(Vec<(u64, u64)>);

impl WrittenUnits {
    fn of(segments: &SegmentList) -> WrittenUnits {
        WrittenUnits(
            segments
                .iter()
                .flat_map(|s| {
                    data_ranges(s.path(), 0, s.len())
                        .into_iter()
                        .map(|(start, end)| (s.base() + start, s.base() + end))
                })
                .collect(),
        )
    }

    /// The unit at `index`, or an empty one where the files hold no data.
    fn unit(&self, queue: &ConsumeQueue, segments: &SegmentList, index: u64) -> Unit {
        let (start, end) = (index * UNIT_BYTES, (index + 1) * UNIT_BYTES);
        let never_written = Unit {
            physical_offset: 0,
            size: 0,
            tags_code: 0,
        };
        if !self.0.iter().any(|(s, e)| *s <= start && end <= *e) {
            return never_written;
        }
        queue.unit(segments, index).unwrap_or(never_written)
    }
}

pub(crate) struct ConsumeQueue {
    topic: String,
    queue_id: u32,
    dir: PathBuf,
    file_bytes: u64,
    segments: RwLock<SegmentList>,
    min_offset: AtomicU64,
    /// Units written and published; readers never look at or beyond it.
    max_offset: AtomicU64,
    flushed_units: AtomicU64,
    /// Held by a flush from reading `flushed_units` to raising it, and by truncation while
    /// it lowers it, so a flush that began before a truncation cannot claim units written
    /// after it.
    flush_lock: Mutex<()>,
}

/// The writer's cached tail file of one queue, so a put needs no lock to find it.
#[derive(Default)]
pub(crate) struct QueueTail {
    segment: Option<Arc<MappedSegment>>,
    /// Queue bytes below this, in `segment`, are in the page cache (units or our zeros).
    filled_to: u64,
}

impl ConsumeQueue {
    pub(crate) fn queue_dir(root: &Path, topic: &str, queue_id: u32) -> PathBuf {
        root.join(topic).join(queue_id.to_string())
    }

    /// Opens (loading any files) or creates the queue's directory, fsyncing new entries.
    pub(crate) fn open(
        root: &Path,
        topic: &str,
        queue_id: u32,
        units_per_file: u64,
    ) -> Result<ConsumeQueue, StoreError> {
        let dir = Self::queue_dir(root, topic, queue_id);
        let existed = dir.exists();
        let segments = load_segments(&dir)?;
        if let Some(bad) = segments
            .iter()
            .find(|s| s.base() % UNIT_BYTES != 0 || s.len() % UNIT_BYTES != 0 || s.len() == 0)
        {
            // A unit must never straddle a file end: refuse rather than misread.
            return Err(StoreError::BadQueueFile {
                path: bad.path().to_path_buf(),
                len: bad.len(),
            });
        }
        if !existed {
            // The queue's directories must survive a crash once units are flushed into them.
            sync_dir(&root.join(topic))?;
            sync_dir(root)?;
        }
        let first_unit = segments.first().map_or(0, |s| s.base() / UNIT_BYTES);
        Ok(ConsumeQueue {
            topic: topic.to_owned(),
            queue_id,
            dir,
            file_bytes: units_per_file * UNIT_BYTES,
            segments: RwLock::new(Arc::new(segments)),
            min_offset: AtomicU64::new(first_unit),
            max_offset: AtomicU64::new(first_unit),
            flushed_units: AtomicU64::new(first_unit),
            flush_lock: Mutex::new(()),
        })
    }

    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    pub(crate) fn queue_id(&self) -> u32 {
        self.queue_id
    }

    pub(crate) fn min_offset(&self) -> u64 {
        self.min_offset.load(Ordering::Acquire)
    }

    pub(crate) fn max_offset(&self) -> u64 {
        self.max_offset.load(Ordering::Acquire)
    }

    pub(crate) fn snapshot(&self) -> SegmentList {
        Arc::clone(&self.segments.read())
    }

    /// The unit at `index` from a snapshot; the caller keeps `index` below the max offset.
    pub(crate) fn unit(&self, segments: &SegmentList, index: u64) -> Option<Unit> {
        let byte = index * UNIT_BYTES;
        let segment = find_segment(segments, byte)?;
        // SAFETY: published (below max_offset) units are never rewritten while served.
        Some(Unit::decode(unsafe {
            segment.slice(byte - segment.base(), UNIT_BYTES as usize)
        }))
    }

    /// Whether `prepare` for unit `index` would have to look for its file, or create it.
    pub(crate) fn needs_file(&self, tail: &QueueTail, index: u64) -> bool {
        !tail
            .segment
            .as_ref()
            .is_some_and(|s| s.contains(index * UNIT_BYTES))
    }

    /// Makes sure a file for unit `index` exists and is cached in `tail` (writer only).
    pub(crate) fn prepare(&self, tail: &mut QueueTail, index: u64) -> Result<(), StoreError> {
        let byte = index * UNIT_BYTES;
        if !tail.segment.as_ref().is_some_and(|s| s.contains(byte)) {
            self.find_or_create_tail(tail, byte)?;
        }
        if byte + UNIT_BYTES > tail.filled_to {
            self.zero_extend(tail, byte + UNIT_BYTES)?;
        }
        Ok(())
    }

    /// Points `tail` at the file holding queue byte `byte`, creating files up to it.
    fn find_or_create_tail(&self, tail: &mut QueueTail, byte: u64) -> Result<(), StoreError> {
        // Not rounded up to the page: past the last unit the page may have no blocks (file
        // systems with blocks smaller than a page), and a full disk must fail the zero fill,
        // not fault the unit's copy through the mapping.
        tail.filled_to = byte;
        if let Some(segment) = find_segment(&self.snapshot(), byte) {
            tail.segment = Some(Arc::clone(segment));
            return Ok(());
        }
        let mut segments = self.segments.write();
        let mut next: Vec<_> = segments.iter().cloned().collect();
        // Files stay contiguous: after a recovered hole, the files in between are created empty.
        let mut base = match next.last() {
            None => byte - byte % self.file_bytes,
            Some(last) if last.end() <= byte => last.end(),
            Some(_) => {
                let first = &next[0];
                return Err(StoreError::SegmentGap {
                    path: first.path().to_path_buf(),
                    expected: byte,
                    found: first.base(),
                });
            }
        };
        loop {
            next.push(MappedSegment::create(&self.dir, base, self.file_bytes)?);
            if base + self.file_bytes > byte {
                break;
            }
            base += self.file_bytes;
        }
        tail.segment = next.last().cloned();
        *segments = Arc::new(next);
        Ok(())
    }

    /// Zero-fills the tail file past `end` (`zero_fill_ahead`): a fault on the sparse file
    /// would zero the whole read-around window, megabytes per queue.
    fn zero_extend(&self, tail: &mut QueueTail, end: u64) -> Result<(), StoreError> {
        let segment = tail.segment.as_ref().expect("tail found above");
        let file = segment.open_for_writes()?;
        tail.filled_to = zero_fill_ahead(
            &file,
            segment.base(),
            segment.end(),
            tail.filled_to,
            end,
            QUEUE_FILL_STEP_BYTES,
        )
        .map_err(|e| StoreError::io("write consume queue", segment.path(), e))?;
        Ok(())
    }

    /// Writes unit `index` into the prepared tail (writer only, before publishing).
    pub(crate) fn write(&self, tail: &QueueTail, index: u64, unit: Unit) {
        let segment = tail.segment.as_ref().expect("prepare() before write()");
        let at = index * UNIT_BYTES - segment.base();
        // SAFETY: at or beyond max_offset, so unpublished; only the writer touches it.
        unsafe {
            segment.write_with(at, UNIT_BYTES as usize, |dst| {
                dst.copy_from_slice(&unit.encode())
            })
        };
    }

    /// Publishes units below `max`.
    pub(crate) fn publish(&self, max: u64) {
        self.max_offset.store(max, Ordering::Release);
    }

    /// Msyncs the units written since the last flush.
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        let _flushing = self.flush_lock.lock();
        let max = self.max_offset();
        let from = self.flushed_units.load(Ordering::Acquire);
        if from >= max {
            return Ok(());
        }
        let (start, end) = (from * UNIT_BYTES, max * UNIT_BYTES);
        for segment in self.snapshot().iter() {
            let (s, e) = (start.max(segment.base()), end.min(segment.end()));
            if s < e {
                segment
                    .flush_range(s - segment.base(), e - s)
                    .map_err(|err| StoreError::io("flush consume queue", segment.path(), err))?;
            }
        }
        self.flushed_units.store(max, Ordering::Release);
        Ok(())
    }

    /// Recovery: finds the written units, drops (zeroes and flushes) those pointing past
    /// `log_end`, and skips those below `log_min`. Returns the number of units dropped.
    pub(crate) fn recover(&self, log_min: u64, log_end: u64) -> Result<u64, StoreError> {
        let segments = self.snapshot();
        let Some(last) = segments.last() else {
            return Ok(0);
        };
        let first_unit = segments[0].base() / UNIT_BYTES;
        let mut max = last.base() / UNIT_BYTES;
        let last_end = last.end() / UNIT_BYTES;
        let written = WrittenUnits::of(&segments);
        let unit = |index| written.unit(self, &segments, index);
        if segments.len() == 1 {
            // A queue that started inside its file (a rebuilt replica's, or one whose
            // earlier records were gone when it was first written): its units follow empty
            // ones.
            let first_written = (max..last_end).find(|index| !unit(*index).is_empty());
            max = first_written.unwrap_or(max);
        }
        while max < last_end && !unit(max).is_empty() {
            max += 1;
        }
        let mut dropped = 0;
        let written_end = max;
        while max > first_unit {
            let unit = unit(max - 1);
            if !unit.is_empty()
                && unit.physical_offset.saturating_add(u64::from(unit.size)) <= log_end
            {
                break;
            }
            max -= 1;
            if !unit.is_empty() {
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.clear_units(&segments, max, written_end)?;
        }
        let mut min = first_unit;
        while min < max && {
            let u = unit(min);
            u.is_empty() || u.physical_offset < log_min
        } {
            min += 1;
        }
        self.min_offset.store(min, Ordering::Release);
        self.max_offset.store(max, Ordering::Release);
        self.flushed_units.store(max, Ordering::Release);
        Ok(dropped)
    }

    /// Recovery and truncation: zeroes units `[from, to)` on disk with pwrite (a full disk
    /// fails cleanly there) and flushes them, so dropped units do not come back after
    /// another crash.
    fn clear_units(&self, segments: &SegmentList, from: u64, to: u64) -> Result<(), StoreError> {
        let (start, end) = (from * UNIT_BYTES, to * UNIT_BYTES);
        for segment in segments.iter() {
            let (s, e) = (start.max(segment.base()), end.min(segment.end()));
            if s < e {
                segment.zero_range(s - segment.base(), e - s)?;
                segment
                    .flush_range(0, segment.len())
                    .map_err(|err| StoreError::io("flush consume queue", segment.path(), err))?;
            }
        }
        Ok(())
    }

    /// Truncation of the log to `log_end` at runtime (writer only): drops the units below
    /// `next` (the writer's next offset; units at or above the published max are pending or
    /// staged) whose records reach past `log_end`: the max offset moves back first, so no
    /// reader looks at them, then they are zeroed on disk and flushed as in recovery.
    /// Returns the new next offset.
    pub(crate) fn truncate_past(&self, log_end: u64, next: u64) -> Result<u64, StoreError> {
        let segments = self.snapshot();
        let min = self.min_offset();
        let mut kept = next;
        while kept > min {
            match self.unit(&segments, kept - 1) {
                Some(u) if !u.is_empty() && u.physical_offset + u64::from(u.size) <= log_end => {
                    break
                }
                _ => kept -= 1,
            }
        }
        if kept == next {
            return Ok(next);
        }
        self.max_offset.fetch_min(kept, Ordering::AcqRel);
        {
            let _flushing = self.flush_lock.lock();
            self.flushed_units.fetch_min(kept, Ordering::AcqRel);
        }
        self.clear_units(&segments, kept, next)?;
        Ok(kept)
    }

    /// Recovery: an empty queue whose first message has queue offset `offset`.
    pub(crate) fn start_at(&self, offset: u64) {
        self.min_offset.store(offset, Ordering::Release);
        self.max_offset.store(offset, Ordering::Release);
        self.flushed_units.store(offset, Ordering::Release);
    }

    /// Retention: moves the min offset past units whose records are gone and deletes files
    /// wholly below it (never the last). Returns the files deleted.
    pub(crate) fn advance_min(&self, log_min: u64) -> Result<usize, StoreError> {
        let segments = self.snapshot();
        let max = self.max_offset();
        let (mut low, mut high) = (self.min_offset(), max);
        while low < high {
            let mid = low + (high - low) / 2;
            match self.unit(&segments, mid) {
                Some(u) if u.physical_offset < log_min => low = mid + 1,
                _ => high = mid,
            }
        }
        self.min_offset.store(low, Ordering::Release);
        let doomed: Vec<_> = segments
            .iter()
            .take(segments.len().saturating_sub(1))
            .filter(|s| s.end() / UNIT_BYTES <= low)
            .cloned()
            .collect();
        if doomed.is_empty() {
            return Ok(0);
        }
        {
            let mut guard = self.segments.write();
            let kept: Vec<_> = guard
                .iter()
                .filter(|s| {
                    s.end() / UNIT_BYTES > low || Arc::ptr_eq(s, guard.last().expect("non-empty"))
                })
                .cloned()
                .collect();
            *guard = Arc::new(kept);
        }
        for segment in &doomed {
            segment.delete()?;
        }
        Ok(doomed.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(n: u64) -> Unit {
        Unit {
            physical_offset: n * 100,
            size: 100,
            tags_code: n as i64 - 3,
        }
    }

    fn fill(queue: &ConsumeQueue, count: u64) {
        let mut tail = QueueTail::default();
        for n in 0..count {
            queue.prepare(&mut tail, n).unwrap();
            queue.write(&tail, n, unit(n));
            queue.publish(n + 1);
        }
    }

    #[test]
    fn units_round_trip_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let queue = ConsumeQueue::open(dir.path(), "T", 2, 4).unwrap();
        fill(&queue, 10);
        let files = std::fs::read_dir(dir.path().join("T").join("2"))
            .unwrap()
            .count();
        assert_eq!(files, 3, "4 units per file");
        let segments = queue.snapshot();
        for n in 0..10 {
            assert_eq!(queue.unit(&segments, n), Some(unit(n)));
        }
        queue.flush().unwrap();
        let reopened = ConsumeQueue::open(dir.path(), "T", 2, 4).unwrap();
        assert_eq!(reopened.recover(0, 10 * 100).unwrap(), 0);
        assert_eq!((reopened.min_offset(), reopened.max_offset()), (0, 10));
    }

    #[test]
    fn recover_drops_units_past_the_log_end_and_skips_deleted_ones() {
        let dir = tempfile::tempdir().unwrap();
        let queue = ConsumeQueue::open(dir.path(), "T", 0, 4).unwrap();
        fill(&queue, 10);
        // The log now ends inside record 7 and starts at record 2.
        let reopened = ConsumeQueue::open(dir.path(), "T", 0, 4).unwrap();
        assert_eq!(reopened.recover(200, 750).unwrap(), 3);
        assert_eq!((reopened.min_offset(), reopened.max_offset()), (2, 7));
        let again = ConsumeQueue::open(dir.path(), "T", 0, 4).unwrap();
        assert_eq!(
            again.recover(200, 10_000).unwrap(),
            0,
            "dropped units stay dropped"
        );
        assert_eq!(again.max_offset(), 7);
    }

    #[test]
    fn advance_min_deletes_whole_files_below_it() {
        let dir = tempfile::tempdir().unwrap();
        let queue = ConsumeQueue::open(dir.path(), "T", 0, 4).unwrap();
        fill(&queue, 10);
        assert_eq!(
            queue.advance_min(850).unwrap(),
            2,
            "files of units 0-3 and 4-7"
        );
        assert_eq!(queue.min_offset(), 9);
        assert_eq!(queue.snapshot().len(), 1);
        assert_eq!(queue.advance_min(5_000).unwrap(), 0, "never the last file");
        assert_eq!(queue.min_offset(), 10);
    }

    #[test]
    fn a_queue_that_starts_inside_its_file_recovers_from_its_first_unit() {
        let dir = tempfile::tempdir().unwrap();
        let queue = ConsumeQueue::open(dir.path(), "T", 0, 8).unwrap();
        queue.start_at(5);
        let mut tail = QueueTail::default();
        for n in 5..7 {
            queue.prepare(&mut tail, n).unwrap();
            queue.write(&tail, n, unit(n));
            queue.publish(n + 1);
        }
        queue.flush().unwrap();
        let reopened = ConsumeQueue::open(dir.path(), "T", 0, 8).unwrap();
        assert_eq!(reopened.recover(500, 10_000).unwrap(), 0);
        assert_eq!((reopened.min_offset(), reopened.max_offset()), (5, 7));
        let segments = reopened.snapshot();
        assert_eq!(reopened.unit(&segments, 6), Some(unit(6)));
    }
}
