//! The CommitLog: fixed-size segment files holding every record, in append order.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

use crate::error::StoreError;
use crate::mapped_file::{find_segment, segment_name, MappedSegment, SegmentList};
use crate::position::CommitLogOffset;
use crate::prefault::Prefaulter;
use crate::record::{self, BLANK_FILLER_BYTES};
use crate::warm::{self, Warmer};

pub(crate) struct CommitLog {
    dir: PathBuf,
    segment_size_bytes: u64,
    segments: RwLock<SegmentList>,
    /// Bytes below this are complete, dispatched records (or blank filler).
    committed: AtomicU64,
    /// Prepares zero-filled segments ahead of rolls (`FlushMode::Sync` + `warm-segments`).
    warmer: Option<Warmer>,
    /// Populates pages ahead of the writer (`prefault-window-bytes` > 0).
    prefaulter: Option<Prefaulter>,
    prefault_window_bytes: u64,
}

/// The writer's side of the CommitLog, owned under the store's write lock.
pub(crate) struct LogWriter {
    tail: Arc<MappedSegment>,
    write_pos: u64,
    /// Whether the segment after `tail` was asked for: once the writer is half-way through,
    /// so a preparation never competes with the fsyncs right after open or a roll.
    next_requested: bool,
    /// The CommitLog offset up to which prefaulting was asked for.
    prefault_requested_to: u64,
}

impl LogWriter {
    pub(crate) fn write_pos(&self) -> u64 {
        self.write_pos
    }
}

impl CommitLog {
    pub(crate) fn new(
        dir: &Path,
        segment_size_bytes: u64,
        segments: Vec<Arc<MappedSegment>>,
        warm_segments: bool,
        prefault_window_bytes: u64,
    ) -> Self {
        CommitLog {
            dir: dir.to_path_buf(),
            segment_size_bytes,
            segments: RwLock::new(Arc::new(segments)),
            committed: AtomicU64::new(0),
            warmer: warm_segments.then(|| Warmer::new(dir, segment_size_bytes)),
            prefaulter: (prefault_window_bytes > 0).then(Prefaulter::new),
            prefault_window_bytes,
        }
    }

    /// Stops and joins the warming and prefault threads, if any. Idempotent.
    pub(crate) fn stop_background(&self) {
        if let Some(warmer) = &self.warmer {
            warmer.stop();
        }
        if let Some(prefaulter) = &self.prefaulter {
            prefaulter.stop();
        }
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
            Some(last) if last.end() == write_pos => self.roll(write_pos)?,
            // A fresh log, or one whose files were all removed, starts a segment right here,
            // warm from the start when warming is on.
            None => {
                if let Some(warmer) = &self.warmer {
                    warmer.prepare_now(write_pos);
                }
                self.roll(write_pos)?
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
            tail,
            write_pos,
            next_requested: false,
            prefault_requested_to: write_pos,
        };
        self.warm_next_when_half_full(&mut writer);
        self.prefault_ahead(&mut writer);
        Ok(writer)
    }

    /// Keeps the prefault thread about a window ahead of the writer in the tail segment,
    /// asking again each time the writer moved a step of a window's eighth.
    fn prefault_ahead(&self, writer: &mut LogWriter) {
        let Some(prefaulter) = &self.prefaulter else {
            return;
        };
        let tail_end = writer.tail.end();
        let want = (writer.write_pos + self.prefault_window_bytes).min(tail_end);
        let asked = writer.prefault_requested_to.max(writer.write_pos);
        let step = (self.prefault_window_bytes / 8).max(1);
        if want > asked && (want - asked >= step || want == tail_end) {
            let base = writer.tail.base();
            prefaulter.request(&writer.tail, writer.write_pos - base, want - base);
            writer.prefault_requested_to = want;
        }
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
    /// is ready, else a new sparse file.
    fn roll(&self, base: u64) -> Result<Arc<MappedSegment>, StoreError> {
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
        Ok(segment)
    }

    /// Appends a record of `size` bytes written by `encode` into the mapped tail; returns its
    /// offset. Pads the tail with a blank filler and rolls when the record does not fit.
    pub(crate) fn append<E>(
        &self,
        writer: &mut LogWriter,
        size: usize,
        encode: impl FnOnce(&mut [u8], CommitLogOffset) -> Result<(), E>,
    ) -> Result<CommitLogOffset, E>
    where
        E: From<StoreError>,
    {
        let mut at = writer.write_pos - writer.tail.base();
        let remaining = writer.tail.len() - at;
        if (size + BLANK_FILLER_BYTES) as u64 > remaining {
            // SAFETY: beyond the published end; only the writer touches it.
            let filler = unsafe { writer.tail.slice_mut(at, BLANK_FILLER_BYTES) };
            record::encode_blank(filler, remaining as u32);
            let next_base = writer.tail.end();
            writer.tail = self.roll(next_base)?;
            writer.write_pos = next_base;
            writer.next_requested = false;
            at = 0;
        }
        let offset = CommitLogOffset(writer.write_pos);
        // SAFETY: beyond the published end; only the writer touches it.
        let dst = unsafe { writer.tail.slice_mut(at, size) };
        encode(dst, offset)?;
        writer.write_pos += size as u64;
        self.warm_next_when_half_full(writer);
        self.prefault_ahead(writer);
        Ok(offset)
    }

    /// A zero-copy view of the `size` bytes at `offset`, if they are published.
    pub(crate) fn view(&self, segments: &SegmentList, offset: u64, size: usize) -> Option<Bytes> {
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
        let head = unsafe { segment.slice(at, BLANK_FILLER_BYTES) };
        // A unit damaged on disk could point anywhere: serve only a record that starts here.
        let starts_record = head[..4] == (size as u32).to_be_bytes()
            && head[4..8] == record::MESSAGE_MAGIC.to_be_bytes();
        starts_record.then(|| segment.bytes(at, size))
    }

    /// The published record starting at `offset`, sized by its TOTALSIZE field.
    pub(crate) fn record_at(&self, offset: u64) -> Result<Bytes, StoreError> {
        let segments = self.snapshot();
        let committed = self.committed();
        let min = segments.first().map_or(0, |s| s.base());
        let out_of_range = || StoreError::OffsetOutOfRange {
            offset: CommitLogOffset(offset),
            min: CommitLogOffset(min),
            max: CommitLogOffset(committed),
        };
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    const LEN: u64 = 256 * 1024;

    /// Bytes the file system allocated for the first segment of a fresh log.
    fn first_segment_allocated(warm_segments: bool) -> (u64, u64) {
        let dir = tempfile::tempdir().unwrap();
        let log = CommitLog::new(dir.path(), LEN, Vec::new(), warm_segments, 0);
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

    #[test]
    fn fresh_log_without_warming_starts_sparse() {
        let (allocated, len) = first_segment_allocated(false);
        assert_eq!(len, LEN);
        assert!(allocated < len, "{allocated} of {len} bytes allocated");
    }
}
