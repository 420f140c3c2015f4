//! Flushing the CommitLog: group commit for `FlushMode::Sync`, interval / dirty pages for
//! `FlushMode::Async`, plus periodic ConsumeQueue flushes and checkpoints.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::config::FlushMode;
use crate::error::StoreError;
use crate::position::CommitLogOffset;

const PAGE_BYTES: u64 = 4096;
const FAILED_FLUSH_BACKOFF: Duration = Duration::from_millis(100);
/// Async mode flushes any dirty bytes at least this many intervals apart.
const THOROUGH_FLUSH_INTERVALS: u32 = 20;

struct FlushState {
    /// Highest CommitLog end a Sync writer waits for.
    requested: u64,
    /// CommitLog bytes below this are durable.
    flushed: u64,
    /// The last failed flush: the end it tried, and why.
    failure: Option<(u64, Arc<std::io::Error>)>,
    stopping: bool,
}

/// Shared between writers (who wait) and the flusher thread (who fsyncs for all of them).
pub(crate) struct FlushControl {
    state: Mutex<FlushState>,
    /// Wakes the flusher: a writer waits, or the store stops.
    work: Condvar,
    /// Wakes writers: a flush finished.
    done: Condvar,
    /// Wakes the housekeeper: the store stops.
    stopped: Condvar,
}

impl FlushControl {
    pub(crate) fn new(flushed: u64) -> Self {
        FlushControl {
            state: Mutex::new(FlushState {
                requested: flushed,
                flushed,
                failure: None,
                stopping: false,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            stopped: Condvar::new(),
        }
    }

    pub(crate) fn flushed(&self) -> u64 {
        self.state.lock().flushed
    }

    /// Blocks until CommitLog bytes below `end` are durable; one fsync serves every waiter.
    pub(crate) fn wait_durable(&self, end: u64) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        if state.flushed >= end {
            return Ok(());
        }
        if state.requested < end {
            state.requested = end;
            self.work.notify_one();
        }
        loop {
            if state.flushed >= end {
                return Ok(());
            }
            if let Some((attempted, source)) = &state.failure {
                if *attempted >= end {
                    return Err(StoreError::FlushFailed {
                        offset: CommitLogOffset(end),
                        source: Arc::clone(source),
                    });
                }
            }
            if state.stopping {
                return Err(StoreError::ShutDown);
            }
            self.done.wait(&mut state);
        }
    }

    /// Records the outcome of flushing up to `end` and wakes the writers.
    pub(crate) fn complete(
        &self,
        end: u64,
        outcome: std::io::Result<()>,
    ) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        let result = match outcome {
            Ok(()) => {
                state.flushed = state.flushed.max(end);
                state.failure = None;
                Ok(())
            }
            Err(error) => {
                tracing::error!(%error, end, "commitlog flush failed");
                let source = Arc::new(error);
                state.failure = Some((end, Arc::clone(&source)));
                Err(StoreError::FlushFailed {
                    offset: CommitLogOffset(end),
                    source,
                })
            }
        };
        self.done.notify_all();
        result
    }

    /// Waits for the next reason to flush; `false` once the store stops.
    pub(crate) fn wait_for_work(&self, mode: FlushMode, deadline: Instant) -> bool {
        let mut state = self.state.lock();
        match mode {
            FlushMode::Sync => {
                while !state.stopping && state.requested <= state.flushed {
                    if self.work.wait_until(&mut state, deadline).timed_out() {
                        break;
                    }
                }
            }
            FlushMode::Async => {
                if !state.stopping {
                    self.work.wait_until(&mut state, deadline);
                }
            }
        }
        !state.stopping
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stopping = true;
        self.work.notify_all();
        self.done.notify_all();
        self.stopped.notify_all();
    }

    /// Sleeps up to `interval`; `false` once the store stops.
    fn wait_while_running(&self, interval: Duration) -> bool {
        let mut state = self.state.lock();
        if !state.stopping {
            self.stopped.wait_for(&mut state, interval);
        }
        !state.stopping
    }
}

/// What the flusher needs from the store.
pub(crate) trait FlushTarget {
    fn commit_log_committed(&self) -> u64;
    fn flush_commit_log(&self, from: u64, to: u64) -> std::io::Result<()>;
    /// Flushes the ConsumeQueues and writes a (dirty) checkpoint.
    fn housekeeping(&self) -> Result<(), StoreError>;
}

/// The flusher thread's loop: runs until `control.stop()`.
pub(crate) fn run_flusher(
    control: &FlushControl,
    target: &dyn FlushTarget,
    mode: FlushMode,
    interval: Duration,
    least_bytes: u64,
) {
    let mut last_log_flush = Instant::now();
    loop {
        if !control.wait_for_work(mode, Instant::now() + interval) {
            return;
        }
        let committed = target.commit_log_committed();
        let flushed = control.flushed();
        let dirty = committed.saturating_sub(flushed);
        let due = match mode {
            FlushMode::Sync => dirty > 0,
            FlushMode::Async => {
                dirty >= least_bytes.max(1)
                    || (dirty > 0
                        && last_log_flush.elapsed() >= interval * THOROUGH_FLUSH_INTERVALS)
            }
        };
        if due {
            let outcome = target.flush_commit_log(flushed, committed);
            if control.complete(committed, outcome).is_err() {
                // Reported to the waiting writers; back off before retrying a failing disk.
                std::thread::sleep(interval.min(FAILED_FLUSH_BACKOFF));
            }
            last_log_flush = Instant::now();
        }
    }
}

/// The housekeeper thread's loop: every `interval`, flush the ConsumeQueues and checkpoint.
/// Its own thread, so Sync writers never wait behind checkpoint fsyncs.
pub(crate) fn run_housekeeper(
    control: &FlushControl,
    target: &dyn FlushTarget,
    interval: Duration,
) {
    while control.wait_while_running(interval) {
        if let Err(error) = target.housekeeping() {
            tracing::error!(error = %error, "consume queue flush or checkpoint failed");
        }
    }
}

pub(crate) fn least_bytes(least_pages: u64) -> u64 {
    least_pages.saturating_mul(PAGE_BYTES)
}
