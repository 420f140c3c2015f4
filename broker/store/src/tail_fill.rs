//! Sync mode's fill-ahead: a background thread keeps the CommitLog tail zero-filled and
//! written back ahead of the writer, so a group commit's fsync writes only the records' pages
//! (see `TailWrites::Written`).
//!
//! The first write into fresh page-cache pages is the slow part (about 2.5 ms per MiB on the
//! VMs we measure on). Done inline, under the store's write lock, it stalled every Sync writer
//! behind it for that long once per MiB of records. This thread also keeps it out of the
//! file's write lock (`i_rwsem`), which every pwrite holds throughout and the writers' record
//! pwrites queue on: it has the kernel load each chunk's pages first (readahead of a hole:
//! zeros, no I/O), then writes the zeros into them. 16 writers of 1 KiB, alternating runs:
//! 52-60k msgs/s and put p99 0.8-1.3 ms, against 39-41k and 3.1-3.9 ms when the zeros' pwrite
//! allocated the pages (BENCHMARKS.md). The writer never waits for the filler, except when its
//! next record would overlap a chunk being written at that moment; when the filler falls
//! behind, records land in unfilled blocks and the fsync allocates them, as in a sparse file.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::mapped_file::{load_pages, page_size, start_writeback, MappedSegment, ZEROS};

/// The filler keeps this much zero-filled past the writer's end, once the writer comes
/// within half of it.
pub(crate) const FILL_AHEAD_BYTES: u64 = 1024 * 1024;
/// Zeros go out in writes this small: each holds the file's write lock (`i_rwsem`), which
/// the writer's pwrite of a record then waits for.
const FILL_WRITE_BYTES: u64 = 16 * 1024;
/// Writeback is started every this many filled bytes, and when the filler catches up.
const WRITEBACK_BYTES: u64 = 256 * 1024;

/// The tail segment being filled, with the filler's own descriptor for pwrite.
struct Target {
    segment: Arc<MappedSegment>,
    file: Arc<File>,
}

struct State {
    target: Option<Target>,
    /// Zeros are written (or records are) below this, from where the filling started.
    filled_to: u64,
    /// The filler fills up to here.
    wanted_to: u64,
    /// The end of what the writer wrote or is writing: the filler never starts below it.
    writer_end: u64,
    /// The chunk being written now (absolute CommitLog offsets), outside the lock.
    filling: Option<Range<u64>>,
    /// Filled bytes whose writeback has not been started yet begin here.
    written_back_to: u64,
    stopped: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the filler: more is wanted, a new tail, or stop.
    work: Condvar,
    /// Wakes a writer waiting for the chunk in `filling`.
    chunk_done: Condvar,
}

/// Owns the fill-ahead thread of a Sync-mode CommitLog; stopped by `stop` or on drop.
pub(crate) struct TailFiller {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl TailFiller {
    pub(crate) fn new() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                target: None,
                filled_to: 0,
                wanted_to: 0,
                writer_end: 0,
                filling: None,
                written_back_to: 0,
                stopped: false,
            }),
            work: Condvar::new(),
            chunk_done: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("quiver-tail-fill".into())
            .spawn(move || run(&worker))
            .map_err(|error| {
                tracing::warn!(%error, "cannot start the CommitLog fill-ahead thread; fsyncs may be slower");
            })
            .ok();
        TailFiller {
            shared,
            thread: Mutex::new(thread),
        }
    }

    /// Fills `segment` from here on; its bytes below `filled_to` need no filling (records, or
    /// a prepared segment's zeros). Waits for a chunk in flight in the previous tail, so no
    /// chunk ever finishes for a tail that is no longer the target.
    pub(crate) fn retarget(&self, segment: &Arc<MappedSegment>, filled_to: u64) {
        let file = segment
            .open_for_writes()
            .map_err(|error| {
                tracing::warn!(%error, "cannot open the CommitLog tail to fill it ahead; fsyncs may be slower");
            })
            .ok();
        let mut state = self.shared.state.lock();
        while state.filling.is_some() {
            self.shared.chunk_done.wait(&mut state);
        }
        state.target = file.map(|file| Target {
            segment: Arc::clone(segment),
            file: Arc::new(file),
        });
        state.filled_to = filled_to;
        state.wanted_to = filled_to;
        state.writer_end = segment.base();
        state.written_back_to = filled_to;
    }

    /// Call before the writer writes `[from, to)` of the tail: waits if the filler is writing
    /// zeros there right now, keeps it above `to`, and asks for more zeros once `to` comes
    /// within half of `FILL_AHEAD_BYTES` of the wanted end.
    pub(crate) fn before_write(&self, from: u64, to: u64) {
        let mut state = self.shared.state.lock();
        while state
            .filling
            .as_ref()
            .is_some_and(|chunk| chunk.start < to && from < chunk.end)
        {
            self.shared.chunk_done.wait(&mut state);
        }
        state.writer_end = state.writer_end.max(to);
        let Some(limit) = state.target.as_ref().map(|t| t.segment.end()) else {
            return;
        };
        if to + FILL_AHEAD_BYTES / 2 > state.wanted_to && state.wanted_to < limit {
            state.wanted_to = (to + FILL_AHEAD_BYTES).min(limit);
            self.shared.work.notify_one();
        }
    }

    /// Stops and joins the thread; idempotent. A chunk in flight is finished first.
    pub(crate) fn stop(&self) {
        self.shared.state.lock().stopped = true;
        self.shared.work.notify_one();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TailFiller {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One chunk to write outside the lock.
struct Chunk {
    segment: Arc<MappedSegment>,
    file: Arc<File>,
    range: Range<u64>,
    /// Start writeback of `[written_back_to, range.end)` after the write.
    writeback_from: Option<u64>,
}

/// Waits for the next chunk to fill; `None` once stopped.
fn next_chunk(shared: &Shared) -> Option<Chunk> {
    let mut state = shared.state.lock();
    loop {
        if state.stopped {
            return None;
        }
        let start = state
            .filled_to
            .max(state.writer_end.next_multiple_of(page_size()));
        if let Some(target) = state.target.as_ref().filter(|_| start < state.wanted_to) {
            let end = (start + FILL_WRITE_BYTES).min(state.wanted_to);
            let caught_up = end == state.wanted_to;
            let writeback_from = (caught_up || end - state.written_back_to >= WRITEBACK_BYTES)
                .then_some(state.written_back_to);
            let chunk = Chunk {
                segment: Arc::clone(&target.segment),
                file: Arc::clone(&target.file),
                range: start..end,
                writeback_from,
            };
            state.filling = Some(start..end);
            return Some(chunk);
        }
        shared.work.wait(&mut state);
    }
}

fn run(shared: &Shared) {
    while let Some(chunk) = next_chunk(shared) {
        let base = chunk.segment.base();
        let Range { start, end } = chunk.range;
        // Fresh pages are slow to allocate here; doing it first keeps the zeros' pwrite short,
        // and with it the writers' pwrites that wait for the same file lock.
        load_pages(&chunk.file, start - base, end - start);
        let written = chunk
            .file
            .write_all_at(&ZEROS[..(end - start) as usize], start - base)
            .and_then(|()| match chunk.writeback_from {
                Some(from) => start_writeback(&chunk.file, from - base, end - from),
                None => Ok(()),
            });
        let mut state = shared.state.lock();
        state.filling = None;
        match written {
            Ok(()) => {
                state.filled_to = end;
                if chunk.writeback_from.is_some() {
                    state.written_back_to = end;
                }
            }
            Err(error) => {
                tracing::warn!(%error, path = %chunk.segment.path().display(),
                    "could not fill CommitLog blocks ahead; fsyncs may be slower");
                // Give up on this stretch: its records allocate their blocks at the fsync.
                state.filled_to = state.wanted_to;
                state.written_back_to = state.wanted_to;
            }
        }
        drop(state);
        shared.chunk_done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 4 * 1024 * 1024;

    /// Waits (10 s at most) for the filler to fill up to `at_least`; what it reached.
    fn wait_filled(filler: &TailFiller, at_least: u64) -> u64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut state = filler.shared.state.lock();
        while state.filled_to < at_least
            && !filler
                .shared
                .chunk_done
                .wait_until(&mut state, deadline)
                .timed_out()
        {}
        state.filled_to
    }

    /// Records written as fast as possible while the filler races ahead: none is overwritten
    /// by zeros, and the bytes past the last one are zeros the filler wrote.
    #[test]
    fn filling_ahead_never_overwrites_records() {
        let dir = tempfile::tempdir().unwrap();
        let segment = MappedSegment::create(dir.path(), 0, LEN).unwrap();
        let file = segment.open_for_writes().unwrap();
        let filler = TailFiller::new();
        filler.retarget(&segment, 0);
        let mut end = 0u64;
        let mut n = 0u8;
        // Odd sizes, so records and chunks meet inside pages.
        while end + 3000 < LEN - FILL_AHEAD_BYTES {
            let size = 700 + u64::from(n) * 7 % 2300;
            filler.before_write(end, end + size);
            file.write_all_at(&vec![n | 1; size as usize], end).unwrap();
            end += size;
            n = n.wrapping_add(1);
        }
        let wanted = end + FILL_AHEAD_BYTES / 2;
        let filled_to = wait_filled(&filler, wanted);
        filler.stop();
        assert!(
            filled_to >= wanted,
            "filled to {filled_to}, records end at {end}"
        );
        let bytes = std::fs::read(segment.path()).unwrap();
        let (mut at, mut n) = (0u64, 0u8);
        while at < end {
            let size = 700 + u64::from(n) * 7 % 2300;
            let record = &bytes[at as usize..(at + size) as usize];
            assert!(record.iter().all(|b| *b == n | 1), "record at {at} damaged");
            at += size;
            n = n.wrapping_add(1);
        }
        assert!(bytes[end as usize..].iter().all(|b| *b == 0));
        let allocated =
            std::os::unix::fs::MetadataExt::blocks(&segment.path().metadata().unwrap()) * 512;
        assert!(
            allocated >= filled_to,
            "{allocated} bytes allocated, filled to {filled_to}"
        );
    }

    /// After a roll the filler works on the new tail only.
    #[test]
    fn retarget_moves_the_filling_to_the_new_tail() {
        let dir = tempfile::tempdir().unwrap();
        let first = MappedSegment::create(dir.path(), 0, LEN).unwrap();
        let second = MappedSegment::create(dir.path(), LEN, LEN).unwrap();
        let filler = TailFiller::new();
        filler.retarget(&first, 0);
        filler.before_write(0, 100);
        filler.retarget(&second, LEN);
        filler.before_write(LEN, LEN + 100);
        wait_filled(&filler, LEN + 100 + FILL_AHEAD_BYTES);
        filler.stop();
        let allocated = |s: &MappedSegment| {
            std::os::unix::fs::MetadataExt::blocks(&s.path().metadata().unwrap()) * 512
        };
        assert!(allocated(&second) >= FILL_AHEAD_BYTES - page_size());
        assert!(allocated(&first) <= FILL_AHEAD_BYTES + page_size());
        let filled_to = filler.shared.state.lock().filled_to;
        assert_eq!(filled_to, LEN + 100 + FILL_AHEAD_BYTES);
    }
}
