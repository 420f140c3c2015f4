//! Prefaulting the CommitLog ahead of the writer, like RocketMQ's warmed mapped files but in
//! the page cache only.
//!
//! The first write to each page of a fresh segment faults: the kernel allocates a page-cache
//! page and zeroes it, which profiles showed was most of the writer's time. A background
//! thread (`quiver-store-prefault`) asks the kernel to do that work for the next
//! `prefault-window-bytes` past the write position (`madvise(MADV_POPULATE_WRITE)`), so the
//! appends themselves only copy. Nothing is written to disk: the pages hold zeros, as the
//! sparse file already reads, and a flush writes only the range appends filled.

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::mapped_file::MappedSegment;

/// The thread populates at most this much per madvise call, so a newer request or a stop
/// is seen soon.
const CHUNK_BYTES: u64 = 1024 * 1024;

/// Populate `segment` from `from` (the write position when asked) up to `to`, positions
/// inside the segment.
struct Job {
    segment: Arc<MappedSegment>,
    from: u64,
    to: u64,
}

#[derive(Default)]
struct State {
    /// The newest request; it replaces an older one not yet taken.
    job: Option<Job>,
    stopped: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// Owns the prefault thread; stopping (or dropping) joins it.
pub(crate) struct Prefaulter {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Prefaulter {
    pub(crate) fn new() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("quiver-store-prefault".into())
            .spawn(move || worker.run())
            .map_err(|e| tracing::warn!(error = %e, "cannot start the prefault thread; appends will fault pages themselves"))
            .ok();
        Prefaulter {
            shared,
            thread: Mutex::new(thread),
        }
    }

    /// Asks for `[from, to)` of `segment` to be populated; returns at once.
    pub(crate) fn request(&self, segment: &Arc<MappedSegment>, from: u64, to: u64) {
        let mut state = self.shared.state.lock();
        if state.stopped {
            return;
        }
        state.job = Some(Job {
            segment: Arc::clone(segment),
            from,
            to,
        });
        self.shared.wake.notify_one();
    }

    /// Stops and joins the thread. Idempotent.
    pub(crate) fn stop(&self) {
        {
            let mut state = self.shared.state.lock();
            state.stopped = true;
            state.job = None;
            self.shared.wake.notify_one();
        }
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Prefaulter {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    /// The next request, or `None` once stopped.
    fn next_job(&self, wait: bool) -> Option<Option<Job>> {
        let mut state = self.state.lock();
        loop {
            if state.stopped {
                return None;
            }
            if let Some(job) = state.job.take() {
                return Some(Some(job));
            }
            if !wait {
                return Some(None);
            }
            self.wake.wait(&mut state);
        }
    }

    fn run(&self) {
        // How far the current segment is populated, so an extended request skips what is done.
        let mut done: Option<(Arc<MappedSegment>, u64)> = None;
        let Some(mut job) = self.next_job(true).flatten() else {
            return;
        };
        loop {
            let start = match &done {
                Some((segment, end)) if Arc::ptr_eq(segment, &job.segment) => (*end).max(job.from),
                _ => job.from,
            };
            let mut at = start;
            while at < job.to {
                let end = (at + CHUNK_BYTES).min(job.to);
                if let Err(error) = job.segment.populate_for_write(at, end) {
                    // An old kernel (before 5.14) or a full disk: appends fault pages themselves.
                    tracing::warn!(%error, path = %job.segment.path().display(), "prefaulting the commitlog failed; stopping it");
                    return;
                }
                at = end;
                done = Some((Arc::clone(&job.segment), at));
                match self.next_job(false) {
                    None => return,
                    Some(Some(newer)) => {
                        job = newer;
                        break;
                    }
                    Some(None) => {}
                }
            }
            if at >= job.to {
                match self.next_job(true) {
                    Some(Some(next)) => job = next,
                    _ => return,
                }
            }
        }
    }
}
