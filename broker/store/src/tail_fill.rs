//! The CommitLog tail's fill-ahead: a background thread keeps the tail's pages zero-filled
//! ahead of the writer, so the writer does not meet fresh pages itself.
//!
//! The first write into fresh page-cache pages is the slow part (about 2.5 ms per MiB on the
//! VMs we measure on), and a writer that did it inline stalled everyone behind the store's
//! write lock for that long. How the thread fills depends on the flush mode (`FillPlan`):
//!
//! - **Sync** (`FillPlan::FOR_FSYNC`): zeros a little ahead in 16 KiB writes, then written
//!   back, so a group commit's fsync writes only the records' pages (see
//!   `TailWrites::Written`). The thread has the kernel load each chunk's pages first
//!   (readahead of a hole: zeros, no I/O), then writes the zeros into them, which keeps the
//!   allocation out of the file's write lock (`i_rwsem`) that the writers' record pwrites
//!   queue on. 16 writers of 1 KiB, alternating runs: 52-60k msgs/s and put p99 0.8-1.3 ms,
//!   against 39-41k and 3.1-3.9 ms when the zeros' pwrite allocated the pages (docs/ARCHITECTURE.md, measured).
//! - **Async** (`FillPlan::FOR_MAPPING`): zeros in aligned 1 MiB writes, up to 2 MiB ahead of
//!   the lone records the writer copies through the mapping (see `TailWrites::Mapped`), which
//!   then never take the file's write lock and never wait. Inline, the writer met the end of
//!   its 64 KiB of zeros once per ~55 records of 1 KiB and spent 150-400 us filling the next;
//!   that was the slowest send of the fixed-rate end-to-end run (docs/ARCHITECTURE.md, measured). The 1 MiB
//!   writes also leave those records in 1 MiB folios (batches' are 256 KiB: commit_log.rs).
//!
//! The writer never waits for the filler, except when its next write would overlap a chunk
//! being written at that moment. When the filler falls behind, a Sync writer's records land
//! in unfilled blocks (the fsync allocates them, as in a sparse file) and an Async writer
//! fills 64 KiB itself, as before the thread.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::mapped_file::{
    load_pages, page_size, start_writeback, step_boundary, MappedSegment, ZEROS,
};

/// How the filler fills: how far ahead, in what writes, and for whom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FillPlan {
    /// Zero-filled bytes kept past the writer's end, once the writer comes within half.
    pub(crate) ahead: u64,
    /// Each zeros' write ends at a multiple of this in the segment file.
    pub(crate) chunk: u64,
    /// Load each chunk's pages before writing its zeros, and start their writeback: for
    /// fsyncs that should find the blocks written (Sync mode).
    pub(crate) for_fsync: bool,
}

impl FillPlan {
    /// Sync mode: zeros go out in writes this small because each holds the file's write lock
    /// (`i_rwsem`), which the writer's pwrite of a record then waits for.
    pub(crate) const FOR_FSYNC: FillPlan = FillPlan {
        ahead: 1024 * 1024,
        chunk: 16 * 1024,
        for_fsync: true,
    };
    /// Async mode: records copied through the mapping take no file lock, so the writes can be
    /// large, and the page cache keeps each as one 1 MiB folio.
    pub(crate) const FOR_MAPPING: FillPlan = FillPlan {
        ahead: 2 * 1024 * 1024,
        chunk: 1024 * 1024,
        for_fsync: false,
    };
}

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
    /// The last chunk failed (a full disk): logged once per run of failures.
    failing: bool,
    stopped: bool,
}

struct Shared {
    plan: FillPlan,
    state: Mutex<State>,
    /// Wakes the filler: more is wanted, a new tail, or stop.
    work: Condvar,
    /// Wakes a writer waiting for the chunk in `filling`.
    chunk_done: Condvar,
}

/// Owns the CommitLog's fill-ahead thread; stopped by `stop` or on drop.
pub(crate) struct TailFiller {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl TailFiller {
    pub(crate) fn new(plan: FillPlan) -> Self {
        let shared = Arc::new(Shared {
            plan,
            state: Mutex::new(State {
                target: None,
                filled_to: 0,
                wanted_to: 0,
                writer_end: 0,
                filling: None,
                written_back_to: 0,
                failing: false,
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
                tracing::warn!(%error, "cannot start the CommitLog fill-ahead thread; writes may be slower");
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
                tracing::warn!(%error, "cannot open the CommitLog tail to fill it ahead; writes may be slower");
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

    /// Call before the writer writes `[from, to)` of the tail, having filled the pages below
    /// `writer_filled` itself: waits if the filler is writing zeros there right now and keeps
    /// it above both. With `ask_ahead`, asks for zeros up to `FillPlan::ahead` past `to` once
    /// `to` comes within half of that of the wanted end. Returns the end of the filled pages.
    pub(crate) fn before_write(
        &self,
        from: u64,
        to: u64,
        writer_filled: u64,
        ask_ahead: bool,
    ) -> u64 {
        let mut state = self.shared.state.lock();
        while state
            .filling
            .as_ref()
            .is_some_and(|chunk| chunk.start < to && from < chunk.end)
        {
            self.shared.chunk_done.wait(&mut state);
        }
        state.writer_end = state.writer_end.max(to);
        let Some(target) = state.target.as_ref() else {
            return state.filled_to;
        };
        let (base, limit) = (target.segment.base(), target.segment.end());
        if writer_filled > state.filled_to && writer_filled <= limit {
            state.filled_to = writer_filled;
        }
        let ahead = self.shared.plan.ahead;
        if ask_ahead && to + ahead / 2 > state.wanted_to && state.wanted_to < limit {
            state.wanted_to = step_boundary(base, to + ahead, self.shared.plan.chunk).min(limit);
            self.shared.work.notify_one();
        }
        state.filled_to
    }

    /// Waits (`timeout` at most) for the filled pages to reach `at_least`; where they end.
    #[cfg(test)]
    pub(crate) fn wait_filled(&self, at_least: u64, timeout: std::time::Duration) -> u64 {
        let deadline = std::time::Instant::now() + timeout;
        let mut state = self.shared.state.lock();
        while state.filled_to < at_least
            && !self
                .shared
                .chunk_done
                .wait_until(&mut state, deadline)
                .timed_out()
        {}
        state.filled_to
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
    let plan = shared.plan;
    let mut state = shared.state.lock();
    loop {
        if state.stopped {
            return None;
        }
        let start = state
            .filled_to
            .max(state.writer_end.next_multiple_of(page_size()));
        if let Some(target) = state.target.as_ref().filter(|_| start < state.wanted_to) {
            let end =
                step_boundary(target.segment.base(), start + 1, plan.chunk).min(state.wanted_to);
            let caught_up = end == state.wanted_to;
            let writeback_from = (plan.for_fsync
                && (caught_up || end - state.written_back_to >= WRITEBACK_BYTES))
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
        if shared.plan.for_fsync {
            // Fresh pages are slow to allocate here; doing it first keeps the zeros' pwrite
            // short, and with it the writers' pwrites that wait for the same file lock.
            load_pages(&chunk.file, start - base, end - start);
        }
        let written = chunk
            .file
            .write_all_at(&ZEROS[..(end - start) as usize], start - base)
            .and_then(|()| match chunk.writeback_from {
                Some(from) => start_writeback(&chunk.file, from - base, end - from),
                None => Ok(()),
            });
        let written_ok = written.is_ok();
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
                if !state.failing {
                    tracing::warn!(%error, path = %chunk.segment.path().display(),
                        "could not fill CommitLog blocks ahead; the writer fills them itself");
                }
                state.failing = true;
                // Give up on what was asked, but never claim the pages: a copy through the
                // mapping into a page without blocks is a SIGBUS on a full disk. The writer
                // fills them itself with pwrite, which fails cleanly, or asks again.
                state.wanted_to = state.filled_to;
            }
        }
        if written_ok {
            state.failing = false;
        }
        drop(state);
        shared.chunk_done.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEN: u64 = 8 * 1024 * 1024;

    /// Waits (10 s at most) for the filler to fill up to `at_least`; what it reached.
    fn wait_filled(filler: &TailFiller, at_least: u64) -> u64 {
        filler.wait_filled(at_least, std::time::Duration::from_secs(10))
    }

    fn allocated(segment: &MappedSegment) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&segment.path().metadata().unwrap()) * 512
    }

    /// Odd sizes, so records and chunks meet inside pages.
    fn record_size(n: u8) -> u64 {
        700 + u64::from(n) * 7 % 2300
    }

    /// Records written as fast as possible while the filler races ahead, with pwrite (Sync)
    /// or through the mapping (Async): none is overwritten by zeros, and the bytes past the
    /// last one are zeros the filler wrote.
    fn filling_ahead_never_overwrites_records(plan: FillPlan) {
        let dir = tempfile::tempdir().unwrap();
        let segment = MappedSegment::create(dir.path(), 0, LEN).unwrap();
        let file = segment.open_for_writes().unwrap();
        let filler = TailFiller::new(plan);
        filler.retarget(&segment, 0);
        let (mut end, mut filled, mut n) = (0u64, 0u64, 0u8);
        while end + 3000 < LEN - plan.ahead {
            let size = record_size(n);
            filled = filled.max(filler.before_write(end, end + size, filled, true));
            if plan.for_fsync {
                file.write_all_at(&vec![n | 1; size as usize], end).unwrap();
            } else {
                // SAFETY: only this thread writes records, and the filler keeps off them.
                unsafe { segment.write_with(end, size as usize, |dst| dst.fill(n | 1)) };
            }
            end += size;
            n = n.wrapping_add(1);
        }
        let wanted = end + plan.ahead / 2;
        let filled_to = wait_filled(&filler, wanted);
        filler.stop();
        assert!(
            filled_to >= wanted,
            "filled to {filled_to}, records end at {end}"
        );
        let bytes = std::fs::read(segment.path()).unwrap();
        let (mut at, mut n) = (0u64, 0u8);
        while at < end {
            let size = record_size(n);
            let record = &bytes[at as usize..(at + size) as usize];
            assert!(record.iter().all(|b| *b == n | 1), "record at {at} damaged");
            at += size;
            n = n.wrapping_add(1);
        }
        assert!(bytes[end as usize..].iter().all(|b| *b == 0));
        assert!(
            allocated(&segment) >= filled_to,
            "{} bytes allocated, filled to {filled_to}",
            allocated(&segment)
        );
    }

    #[test]
    fn filling_ahead_of_pwrites_never_overwrites_records() {
        filling_ahead_never_overwrites_records(FillPlan::FOR_FSYNC);
    }

    #[test]
    fn filling_ahead_of_mapped_copies_never_overwrites_records() {
        filling_ahead_never_overwrites_records(FillPlan::FOR_MAPPING);
    }

    /// The filler writes zeros up to the wanted end in chunks that end on chunk boundaries,
    /// starting above what the writer said it filled itself, and only when asked.
    #[test]
    fn fills_on_request_from_above_the_writers_own_zeros() {
        let plan = FillPlan::FOR_MAPPING;
        let dir = tempfile::tempdir().unwrap();
        let segment = MappedSegment::create(dir.path(), 0, LEN).unwrap();
        let filler = TailFiller::new(plan);
        filler.retarget(&segment, 0);
        // A batch that zero-filled its own MiB: it asks the thread for nothing.
        assert_eq!(filler.before_write(0, 5000, plan.chunk, false), plan.chunk);
        assert_eq!(
            filler.shared.state.lock().wanted_to,
            0,
            "nothing asked of the thread"
        );
        assert_eq!(allocated(&segment), 0, "nothing written by the test itself");
        // A lone record asks: the thread fills from the writer's MiB on to 2 MiB past it.
        filler.before_write(5000, 6000, plan.chunk, true);
        let wanted = step_boundary(0, 6000 + plan.ahead, plan.chunk);
        assert_eq!(wait_filled(&filler, wanted), wanted);
        filler.stop();
        let data = crate::mapped_file::data_ranges(segment.path(), 0, LEN);
        assert_eq!(
            data,
            vec![(plan.chunk, wanted)],
            "only the thread's zeros are in the file"
        );
    }

    /// After a roll the filler works on the new tail only.
    #[test]
    fn retarget_moves_the_filling_to_the_new_tail() {
        let plan = FillPlan::FOR_FSYNC;
        let dir = tempfile::tempdir().unwrap();
        let first = MappedSegment::create(dir.path(), 0, LEN).unwrap();
        let second = MappedSegment::create(dir.path(), LEN, LEN).unwrap();
        let filler = TailFiller::new(plan);
        filler.retarget(&first, 0);
        filler.before_write(0, 100, 0, true);
        filler.retarget(&second, LEN);
        filler.before_write(LEN, LEN + 100, LEN, true);
        let wanted = LEN + 100 + plan.ahead;
        wait_filled(&filler, wanted);
        filler.stop();
        assert!(allocated(&second) >= plan.ahead - page_size());
        assert!(allocated(&first) <= plan.ahead + page_size());
        let filled_to = filler.shared.state.lock().filled_to;
        assert_eq!(filled_to, step_boundary(LEN, wanted, plan.chunk));
    }
}
