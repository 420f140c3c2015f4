//! The CommitLog: fixed-size segment files holding every record, in append order.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::config::FlushMode;
use crate::error::StoreError;
use crate::mapped_file::{
    fill_end, find_segment, page_size, segment_name, sync_dir, write_with_zeros_at,
    zero_fill_ahead, MappedSegment, SegmentList,
};
use crate::record::{self, BLANK_FILLER_BYTES};
use crate::tail_fill::{FillPlan, TailFiller};
use crate::warm::{self, Warmer};
use crate::CommitLogOffset;

/// Whether a get returns a record, judged on its stored bytes.
pub type RecordFilter<'a> = &'a dyn Fn(&[u8]) -> bool;

pub(crate) struct CommitLog {
    dir: PathBuf,
    segment_size_bytes: u64,
    segments: RwLock<SegmentList>,
    /// Bytes below this are complete, dispatched records (or blank filler).
    committed: AtomicU64,
    /// Prepares zero-filled segments ahead of rolls (`FlushMode::Sync` + `warm-segments`).
    warmer: Option<Warmer>,
    /// Keeps the tail zero-filled ahead of the writer in the background (`tail_fill`).
    filler: TailFiller,
    tail_writes: TailWrites,
}

/// How records reach the tail segment; the flush mode decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TailWrites {
    /// Async: a lone small record is copied through the mapping, into pages a background
    /// thread zero-fills ahead (`tail_fill`; the writer fills 64 KiB itself when the thread
    /// is behind); batches and records of a page or more are written with pwrite.
    Mapped,
    /// Sync: every record is written with pwrite, into blocks zero-filled and written back
    /// ahead by a background thread (`tail_fill`), so a group commit's fsync writes only the
    /// records' pages. A page dirtied through the mapping is written back whole, its large
    /// folio (up to megabytes) with it, and a block allocated since the last fsync makes the
    /// fsync write the inode too: each doubled the fsync time measured here (docs/ARCHITECTURE.md, measured).
    Written,
}

impl TailWrites {
    pub(crate) fn for_mode(mode: FlushMode) -> Self {
        match mode {
            FlushMode::Async => TailWrites::Mapped,
            FlushMode::Sync => TailWrites::Written,
        }
    }

    fn fill_plan(self) -> FillPlan {
        match self {
            TailWrites::Mapped => FillPlan::FOR_MAPPING,
            TailWrites::Written => FillPlan::FOR_FSYNC,
        }
    }
}

/// A batch writes its staged records out every this many bytes, so the pwrite copies from
/// cache-warm memory (the records stay unpublished until the whole batch is written).
const STAGED_WRITE_BYTES: usize = 256 * 1024;

/// Async mode's writer zero-fills this far ahead of a lone record copied through the mapping
/// when the fill-ahead thread has not got there yet: a short stall.
const MAPPED_FILL_STEP_BYTES: u64 = 64 * 1024;
/// ...and to a multiple of this, at least this far ahead, in the same pwritev as a staged
/// write (a batch, a record of a page or more). The page cache sizes the folios a write
/// creates by its length, so those records sit in 256 KiB folios, which reads through the
/// mapping fault in far less often than 64 KiB ones (catch-up consume about 40% faster).
/// Not 1 MiB: on a VM that reports free memory to its host, order-8 folios come from cold
/// blocks once recently freed ones run out, and writes fell to a third (docs/ARCHITECTURE.md, measured).
const STAGED_FILL_STEP_BYTES: u64 = 256 * 1024;

/// Staged bytes above this are shrunk back after a flush, so one huge batch does not pin
/// its buffer for the store's lifetime.
const STAGING_KEPT_BYTES: usize = 8 * 1024 * 1024;

/// The writer's side of the CommitLog, owned under the store's write lock.
///
/// The records of a batch, records of a page or more, and every record in Sync mode are
/// encoded into `staged` and written with pwrite by `write_staged`: a first write through the
/// mapping would fault and have the kernel zero (and read around) each new page first,
/// several times slower on the VMs we measure on (docs/ARCHITECTURE.md, measured). In Async mode a lone small
/// record is copied through the mapping, into pages zero-filled ahead (`zero_fill_ahead`).
pub(crate) struct LogWriter {
    tail: Arc<MappedSegment>,
    /// The tail segment's file, for pwrite.
    tail_file: File,
    /// End of the records appended, staged ones included.
    write_pos: u64,
    /// Encoded records not yet in the file; they start at `write_pos - staged.len()`.
    staged: Vec<u8>,
    /// Pages of the tail below this hold records or zeros we wrote: in the page cache.
    filled_to: u64,
    /// Whether the segment after `tail` was asked for: once the writer is half-way through,
    /// so a preparation never competes with the fsyncs right after open or a roll.
    next_requested: bool,
    /// Times an Async writer zero-filled pages itself because the thread was behind.
    inline_fills: u64,
}

impl LogWriter {
    pub(crate) fn write_pos(&self) -> u64 {
        self.write_pos
    }

    /// Bytes left in the tail segment after the write position.
    pub(crate) fn tail_remaining(&self) -> u64 {
        self.tail.end() - self.write_pos
    }

    /// Whether a record of `size` bytes fits the tail segment; if not, appending it rolls.
    pub(crate) fn fits(&self, size: usize) -> bool {
        (size + BLANK_FILLER_BYTES) as u64 <= self.tail_remaining()
    }

    fn staged_from(&self) -> u64 {
        self.write_pos - self.staged.len() as u64
    }
}

impl CommitLog {
    pub(crate) fn new(
        dir: &Path,
        segment_size_bytes: u64,
        segments: Vec<Arc<MappedSegment>>,
        warm_segments: bool,
        tail_writes: TailWrites,
    ) -> Self {
        CommitLog {
            dir: dir.to_path_buf(),
            segment_size_bytes,
            segments: RwLock::new(Arc::new(segments)),
            committed: AtomicU64::new(0),
            warmer: warm_segments.then(|| Warmer::new(dir, segment_size_bytes)),
            filler: TailFiller::new(tail_writes.fill_plan()),
            tail_writes,
        }
    }

    /// Stops and joins the warming and fill-ahead threads, if any. Idempotent.
    pub(crate) fn stop_background(&self) {
        if let Some(warmer) = &self.warmer {
            warmer.stop();
        }
        self.filler.stop();
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn snapshot(&self) -> SegmentList {
        Arc::clone(&self.segments.read())
    }

    /// Drops `doomed` from the list, under the lock so a concurrent roll is kept.
    pub(crate) fn remove_segments(&self, doomed: &[Arc<MappedSegment>]) {
        let mut segments = self.segments.write();
        let kept: Vec<_> = segments
            .iter()
            .filter(|s| !doomed.iter().any(|d| Arc::ptr_eq(d, s)))
            .cloned()
            .collect();
        *segments = Arc::new(kept);
    }

    /// Makes `[.., end)` visible to readers and the flusher.
    pub(crate) fn publish(&self, end: u64) {
        self.committed.store(end, Ordering::Release);
    }

    pub(crate) fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// First readable offset: the base of the oldest segment.
    pub(crate) fn min_offset(&self) -> u64 {
        self.segments.read().first().map_or(0, |s| s.base())
    }

    /// Starts writing at `write_pos` (recovered end), creating the tail segment if needed.
    pub(crate) fn writer(&self, write_pos: u64) -> Result<LogWriter, StoreError> {
        let existing = self.snapshot();
        let tail = match existing.last() {
            Some(last) if last.contains(write_pos) => Arc::clone(last),
            // A full last segment: the first append rolls, so opening needs no new file (a
            // full disk opens read-only instead of failing).
            Some(last) if last.end() == write_pos => Arc::clone(last),
            // A fresh log, or one whose files were all removed, starts a segment right here,
            // warm from the start when warming is on.
            None => {
                if let Some(warmer) = &self.warmer {
                    warmer.prepare_now(write_pos);
                }
                self.roll(write_pos)?.0
            }
            Some(last) => {
                return Err(StoreError::SegmentGap {
                    path: last.path().to_path_buf(),
                    expected: last.end(),
                    found: write_pos,
                })
            }
        };
        // Only the next segment's preparation is worth keeping.
        let next = self.warmer.as_ref().map(|_| tail.end());
        warm::remove_stale(&self.dir, next, self.segment_size_bytes);
        self.publish(write_pos);
        let mut writer = LogWriter {
            tail_file: tail.open_for_writes()?,
            tail,
            write_pos,
            staged: Vec::new(),
            // Not rounded up to the page: on file systems with blocks smaller than a page,
            // the rest of the page may have no blocks, and a copy through the mapping there
            // would meet a full disk as SIGBUS instead of an error.
            filled_to: write_pos,
            next_requested: false,
            inline_fills: 0,
        };
        self.filler.retarget(&writer.tail, writer.filled_to);
        self.warm_next_when_half_full(&mut writer);
        Ok(writer)
    }

    /// Starts preparing the segment after the tail in the background (returns at once) once
    /// the writer is past half of the tail.
    fn warm_next_when_half_full(&self, writer: &mut LogWriter) {
        let Some(warmer) = &self.warmer else {
            return;
        };
        if !writer.next_requested && writer.write_pos - writer.tail.base() >= writer.tail.len() / 2
        {
            warmer.request(writer.tail.end());
            writer.next_requested = true;
        }
    }

    /// Adds the segment at `base`: a prepared (zero-filled, fsynced) `.warm` file when one
    /// is ready (`true`), else a new sparse file.
    fn roll(&self, base: u64) -> Result<(Arc<MappedSegment>, bool), StoreError> {
        let prepared = match &self.warmer {
            Some(warmer) => warmer.take(base)?,
            None => false,
        };
        let segment = if prepared {
            MappedSegment::open(&self.dir.join(segment_name(base)), base)?
        } else {
            MappedSegment::create(&self.dir, base, self.segment_size_bytes)?
        };
        let mut segments = self.segments.write();
        let mut next = Vec::with_capacity(segments.len() + 1);
        next.extend(segments.iter().cloned());
        next.push(Arc::clone(&segment));
        *segments = Arc::new(next);
        Ok((segment, prepared))
    }

    /// Appends a record of `size` bytes written by `encode`; returns its offset. Pads the
    /// tail with a blank filler and rolls when the record does not fit. A record of a batch
    /// (`in_batch`) or of a page or more is staged: call `write_staged` before publishing it.
    pub(crate) fn append<E>(
        &self,
        writer: &mut LogWriter,
        size: usize,
        in_batch: bool,
        encode: impl FnOnce(&mut [u8], CommitLogOffset) -> Result<(), E>,
    ) -> Result<CommitLogOffset, E>
    where
        E: From<StoreError>,
    {
        if !writer.fits(size) {
            self.close_tail(writer)?;
        }
        let offset = CommitLogOffset(writer.write_pos);
        let at = writer.write_pos - writer.tail.base();
        let end = writer.write_pos + size as u64;
        let direct = self.tail_writes == TailWrites::Mapped
            && writer.staged.is_empty()
            && !in_batch
            && (size as u64) < page_size();
        if direct {
            self.fill_before_copy(writer, end)?;
            // SAFETY: beyond the published end; only the writer touches it.
            unsafe { writer.tail.write_with(at, size, |dst| encode(dst, offset)) }?;
        } else {
            let start = writer.staged.len();
            writer.staged.resize(start + size, 0);
            if let Err(error) = encode(&mut writer.staged[start..], offset) {
                writer.staged.truncate(start);
                return Err(error);
            }
        }
        writer.write_pos += size as u64;
        if writer.staged.len() >= STAGED_WRITE_BYTES {
            self.write_staged(writer)?;
        }
        self.warm_next_when_half_full(writer);
        Ok(offset)
    }

    /// Closes the tail segment: writes what is staged, pads the rest with a blank filler
    /// (none when the records filled it exactly) and rolls to the next segment, where the
    /// writer then stands. Shared by `append` (a record that does not fit) and replication
    /// (a replica mirrors the master's filler).
    pub(crate) fn close_tail(&self, writer: &mut LogWriter) -> Result<(), StoreError> {
        self.write_staged(writer)?;
        let at = writer.write_pos - writer.tail.base();
        let remaining = writer.tail.len() - at;
        if remaining > 0 {
            self.write_blank(writer, at, remaining)?;
        }
        let next_base = writer.tail.end();
        let (tail, prepared) = self.roll(next_base)?;
        writer.tail_file = tail.open_for_writes()?;
        writer.filled_to = if prepared { tail.end() } else { next_base };
        self.filler.retarget(&tail, writer.filled_to);
        writer.tail = tail;
        writer.write_pos = next_base;
        writer.next_requested = false;
        Ok(())
    }

    /// The size every segment file has (the same on a master and its replicas, or their
    /// blank fillers and rolls would differ).
    pub(crate) fn segment_size(&self) -> u64 {
        self.segment_size_bytes
    }

    /// The segments, the oldest offset and the published end, read in that order.
    fn published(&self) -> (SegmentList, u64, u64) {
        let segments = self.snapshot();
        let committed = self.committed();
        let min = segments.first().map_or(0, |s| s.base());
        (segments, min, committed)
    }

    /// Published bytes from the record boundary `from`, for a replica: whole records up to
    /// `max_bytes` (at least one), never past the end of `from`'s segment; at the blank
    /// filler that closes a segment, the filler alone (to the segment end). Returns the
    /// bytes and the offset after them; empty at the published end.
    pub(crate) fn read_chunk(
        &self,
        from: u64,
        max_bytes: usize,
    ) -> Result<(Bytes, u64), StoreError> {
        let (segments, min, committed) = self.published();
        let out_of_range = || out_of_range(from, min, committed);
        if from < min || from > committed {
            return Err(out_of_range());
        }
        if from == committed {
            return Ok((Bytes::new(), from));
        }
        let segment = find_segment(&segments, from).ok_or_else(out_of_range)?;
        let start = from - segment.base();
        let limit = committed.min(segment.end()) - segment.base();
        let not_a_record = |size: i64| StoreError::BadRecord {
            offset: CommitLogOffset(from),
            source: record::RecordError::BadSize { size },
        };
        let mut pos = start;
        while pos + BLANK_FILLER_BYTES as u64 <= limit {
            // SAFETY: below the published end, never rewritten while served.
            let bytes = unsafe { segment.slice(pos, BLANK_FILLER_BYTES) };
            let head = record::head(bytes).expect("a whole head");
            let size = head.size;
            if head.is_blank() {
                if pos > start {
                    break;
                }
                // The filler is published once the writer rolled past it.
                if i64::from(size) != (segment.len() - pos) as i64 || segment.end() > committed {
                    return Err(not_a_record(i64::from(size)));
                }
                return Ok((segment.bytes(pos, size as usize), segment.end()));
            }
            let size_ok =
                head.is_message() && size > BLANK_FILLER_BYTES as i32 && pos + size as u64 <= limit;
            if !size_ok {
                if pos == start {
                    return Err(not_a_record(i64::from(size)));
                }
                break;
            }
            if pos > start && (pos - start + size as u64) > max_bytes as u64 {
                break;
            }
            pos += size as u64;
        }
        if pos == start {
            return Err(not_a_record(0));
        }
        Ok((
            segment.bytes(start, (pos - start) as usize),
            segment.base() + pos,
        ))
    }

    /// Cuts the log back to `offset` (a record boundary at or below the writer's position,
    /// nothing staged): readers stop seeing bytes from there first, then the bytes are zeroed
    /// on disk (and flushed) and later segments deleted, and the writer restarts at `offset`.
    /// Returns the non-zero bytes zeroed and the segments deleted.
    pub(crate) fn truncate(
        &self,
        writer: &mut LogWriter,
        offset: u64,
    ) -> Result<(u64, usize), StoreError> {
        debug_assert!(writer.staged.is_empty(), "truncating with staged records");
        self.publish(offset.min(self.committed()));
        let segments = self.snapshot();
        let doomed: Vec<_> = segments
            .iter()
            .filter(|s| s.base() > offset)
            .cloned()
            .collect();
        let mut zeroed = 0;
        if let Some(segment) = segments.iter().find(|s| s.contains(offset)) {
            zeroed = segment.clear_from(offset - segment.base())?;
            // Zeroed bytes must reach the disk, or stale records could come back.
            segment
                .flush_range(0, segment.len())
                .map_err(|e| StoreError::io("flush commitlog", segment.path(), e))?;
        }
        if !doomed.is_empty() {
            self.remove_segments(&doomed);
            for segment in &doomed {
                segment.delete()?;
            }
            // Deleted names must stay deleted after a crash.
            sync_dir(&self.dir)?;
        }
        *writer = self.writer(offset)?;
        Ok((zeroed, doomed.len()))
    }

    /// Writes the blank filler that closes the tail (`remaining` bytes from `at`) with pwrite,
    /// so a full disk is an error here, never a fault on an unbacked page of the mapping.
    fn write_blank(&self, writer: &LogWriter, at: u64, remaining: u64) -> Result<(), StoreError> {
        let blank_end = writer.write_pos + BLANK_FILLER_BYTES as u64;
        self.filler
            .before_write(writer.write_pos, blank_end, writer.filled_to, false);
        let mut blank = [0u8; BLANK_FILLER_BYTES];
        record::encode_blank(&mut blank, remaining as u32);
        std::os::unix::fs::FileExt::write_all_at(&writer.tail_file, &blank, at)
            .map_err(|e| StoreError::io("write commitlog", writer.tail.path(), e))
    }

    /// Writes the staged records into the tail file (one pwrite). On failure nothing staged
    /// counts as appended: the write position goes back to the last record in the file.
    pub(crate) fn write_staged(&self, writer: &mut LogWriter) -> Result<(), StoreError> {
        if writer.staged.is_empty() {
            return Ok(());
        }
        let from = writer.staged_from();
        let at = from - writer.tail.base();
        assert!(
            at + writer.staged.len() as u64 <= writer.tail.len(),
            "staged records past the tail segment"
        );
        let end = writer.write_pos;
        // Sync asks for zeros ahead of every write; Async batches bring their own.
        let ask_ahead = self.tail_writes == TailWrites::Written;
        let filled = self
            .filler
            .before_write(from, end, writer.filled_to, ask_ahead);
        writer.filled_to = writer.filled_to.max(filled);
        // Async: a write that goes past the filled pages zero-fills on to a step boundary.
        let zeros_to = if self.tail_writes == TailWrites::Mapped && end > writer.filled_to {
            fill_end(
                writer.tail.base(),
                writer.tail.end(),
                writer.filled_to,
                end,
                STAGED_FILL_STEP_BYTES,
            )
        } else {
            end
        };
        let written = write_with_zeros_at(&writer.tail_file, &writer.staged, at, zeros_to - end)
            .map_err(|e| StoreError::io("write commitlog", writer.tail.path(), e));
        writer.staged.clear();
        if writer.staged.capacity() > STAGING_KEPT_BYTES {
            writer.staged.shrink_to(STAGING_KEPT_BYTES / 8);
        }
        match written {
            Ok(()) => {
                writer.filled_to = writer.filled_to.max(writer.write_pos).max(zeros_to);
                Ok(())
            }
            Err(error) => {
                writer.write_pos = from;
                Err(error)
            }
        }
    }

    /// Makes sure the pages of a lone record about to be copied through the mapping, up to
    /// `end`, are in the page cache: filled ahead by the thread, or else here.
    fn fill_before_copy(&self, writer: &mut LogWriter, end: u64) -> Result<(), StoreError> {
        let filled = self
            .filler
            .before_write(writer.write_pos, end, writer.filled_to, true);
        writer.filled_to = writer.filled_to.max(filled);
        if end > writer.filled_to {
            self.zero_extend(writer, end)?;
            writer.inline_fills += 1;
        }
        Ok(())
    }

    /// Zero-fills the tail past `end`, `MAPPED_FILL_STEP_BYTES` at a time (see
    /// `TailWrites::Mapped`).
    fn zero_extend(&self, writer: &mut LogWriter, end: u64) -> Result<(), StoreError> {
        let tail = &writer.tail;
        writer.filled_to = zero_fill_ahead(
            &writer.tail_file,
            tail.base(),
            tail.end(),
            writer.filled_to,
            end,
            MAPPED_FILL_STEP_BYTES,
        )
        .map_err(|e| StoreError::io("write commitlog", tail.path(), e))?;
        Ok(())
    }

    /// A zero-copy view of the `size` bytes at `offset`, if they are published.
    pub(crate) fn view(&self, segments: &SegmentList, offset: u64, size: usize) -> Option<Bytes> {
        self.view_if(segments, offset, size, None)
    }

    /// [`CommitLog::view`] of a record `accept` takes, judged on the mapped bytes before a
    /// view is made: a property filter skips records without allocating for them.
    pub(crate) fn view_if(
        &self,
        segments: &SegmentList,
        offset: u64,
        size: usize,
        accept: Option<RecordFilter<'_>>,
    ) -> Option<Bytes> {
        let end = offset.checked_add(size as u64)?;
        if end > self.committed() || size < BLANK_FILLER_BYTES {
            return None;
        }
        let segment = find_segment(segments, offset)?;
        let at = offset - segment.base();
        if at + size as u64 > segment.len() {
            return None;
        }
        // SAFETY: below the published end, never rewritten while served.
        let bytes = unsafe { segment.slice(at, size) };
        // A unit damaged on disk could point anywhere: serve only a record that starts here.
        let starts_record = record::head(bytes)
            .is_some_and(|head| head.is_message() && head.size as u32 == size as u32);
        (starts_record && accept.is_none_or(|accept| accept(bytes)))
            .then(|| segment.bytes(at, size))
    }

    /// The published record starting at `offset`, sized by its TOTALSIZE field.
    pub(crate) fn record_at(&self, offset: u64) -> Result<Bytes, StoreError> {
        let (segments, min, committed) = self.published();
        let out_of_range = || out_of_range(offset, min, committed);
        if offset < min || offset.saturating_add(4) > committed {
            return Err(out_of_range());
        }
        let segment = find_segment(&segments, offset).ok_or_else(out_of_range)?;
        let at = offset - segment.base();
        // SAFETY: below the published end, never rewritten while served.
        let size_field = unsafe { segment.slice(at, 4) };
        let size = i32::from_be_bytes(size_field.try_into().expect("4 bytes"));
        let size = usize::try_from(size)
            .ok()
            .filter(|s| offset + *s as u64 <= committed && at + *s as u64 <= segment.len())
            .ok_or(StoreError::BadRecord {
                offset: CommitLogOffset(offset),
                source: record::RecordError::BadSize { size: size as i64 },
            })?;
        Ok(segment.bytes(at, size))
    }

    /// Msyncs `[from, to)` across segments.
    pub(crate) fn flush_range(&self, from: u64, to: u64) -> std::io::Result<()> {
        if from >= to {
            return Ok(());
        }
        for segment in self.snapshot().iter() {
            let start = from.max(segment.base());
            let end = to.min(segment.end());
            if start < end {
                segment.flush_range(start - segment.base(), end - start)?;
            }
        }
        Ok(())
    }
}

impl Drop for CommitLog {
    fn drop(&mut self) {
        self.stop_background();
    }
}

/// The error for `offset` outside the readable `[min, max]`.
fn out_of_range(offset: u64, min: u64, max: u64) -> StoreError {
    StoreError::OffsetOutOfRange {
        offset: CommitLogOffset(offset),
        min: CommitLogOffset(min),
        max: CommitLogOffset(max),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::time::Duration;

    use super::*;

    const LEN: u64 = 256 * 1024;

    /// Bytes the file system allocated for the first segment of a fresh log.
    fn first_segment_allocated(warm_segments: bool) -> (u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let log = CommitLog::new(
            dir.path(),
            LEN,
            Vec::new(),
            warm_segments,
            TailWrites::Mapped,
        );
        let writer = log.writer(0).unwrap();
        assert_eq!(writer.write_pos(), 0);
        log.stop_background();
        let meta = std::fs::metadata(dir.path().join(segment_name(0))).unwrap();
        (meta.blocks() * 512, meta.len())
    }

    #[test]
    fn fresh_warm_log_starts_on_a_fully_allocated_segment() {
        let (allocated, len) = first_segment_allocated(true);
        assert_eq!(len, LEN);
        assert!(allocated >= len, "{allocated} of {len} bytes allocated");
    }

    /// Async lone records copied through the mapping, at a pace the fill-ahead thread keeps
    /// up with: the writer fills pages itself once, for the first record (nothing was asked
    /// of the thread before it), and every record reads back.
    #[test]
    fn async_lone_records_find_their_pages_filled_by_the_thread() {
        const SEGMENT: u64 = 8 * 1024 * 1024;
        const RECORD: usize = 1000;
        let dir = tempfile::tempdir().unwrap();
        let log = CommitLog::new(dir.path(), SEGMENT, Vec::new(), false, TailWrites::Mapped);
        let mut writer = log.writer(0).unwrap();
        let ahead = FillPlan::FOR_MAPPING.ahead;
        let mut n = 0u32;
        while writer.write_pos() + (RECORD as u64) < SEGMENT - ahead {
            let at = log
                .append(&mut writer, RECORD, false, |dst, _| {
                    dst.fill(n as u8 | 1);
                    Ok::<(), StoreError>(())
                })
                .unwrap();
            assert_eq!(at.0, u64::from(n) * RECORD as u64);
            n += 1;
            if n % 64 == 0 {
                let wanted = writer.write_pos() + ahead / 2;
                let filled = log.filler.wait_filled(wanted, Duration::from_secs(10));
                assert!(filled >= wanted, "filled to {filled}, wanted {wanted}");
            }
        }
        log.stop_background();
        assert_eq!(writer.inline_fills, 1, "fills by the writer itself");
        let bytes = std::fs::read(dir.path().join(segment_name(0))).unwrap();
        for (i, record) in bytes[..writer.write_pos() as usize]
            .chunks(RECORD)
            .enumerate()
        {
            assert!(
                record.iter().all(|b| *b == i as u8 | 1),
                "record {i} damaged"
            );
        }
        let meta = std::fs::metadata(dir.path().join(segment_name(0))).unwrap();
        assert!(meta.blocks() * 512 >= writer.write_pos() + ahead / 2);
    }

    #[test]
    fn fresh_log_without_warming_starts_sparse() {
        let (allocated, len) = first_segment_allocated(false);
        assert_eq!(len, LEN);
        assert!(allocated < len, "{allocated} of {len} bytes allocated");
    }
}
