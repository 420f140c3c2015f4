//! Flushing the CommitLog: group commit for `FlushMode::Sync`, interval / dirty pages for
//! `FlushMode::Async`, plus periodic ConsumeQueue flushes and checkpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// The last failed flush: the end it tried, and why.
    failure: Option<(u64, Arc<std::io::Error>)>,
    stopping: bool,
}

/// Shared between writers (who wait) and the flusher thread (who fsyncs for all of them).
pub(crate) struct FlushControl {
    state: Mutex<FlushState>,
    /// CommitLog bytes below this are durable; only raised under `state`.
    flushed: AtomicU64,
    /// Highest CommitLog end a Sync writer waits for.
    requested: AtomicU64,
    /// Set by `stop`; read by the flusher under `work_lock`.
    stop_requested: AtomicBool,
    /// The flusher's own lock, so its wake-up never queues behind writers woken on `state`.
    work_lock: Mutex<()>,
    /// Wakes the flusher (with `work_lock`): a writer waits, or the store stops.
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
                failure: None,
                stopping: false,
            }),
            flushed: AtomicU64::new(flushed),
            requested: AtomicU64::new(flushed),
            stop_requested: AtomicBool::new(false),
            work_lock: Mutex::new(()),
            work: Condvar::new(),
            done: Condvar::new(),
            stopped: Condvar::new(),
        }
    }

    pub(crate) fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Blocks until CommitLog bytes below `end` are durable; one fsync serves every waiter.
    pub(crate) fn wait_durable(&self, end: u64) -> Result<(), StoreError> {
        if self.flushed() >= end {
            return Ok(());
        }
        if self.requested.fetch_max(end, Ordering::AcqRel) < end {
            let _work = self.work_lock.lock();
            self.work.notify_one();
        }
        let mut state = self.state.lock();
        loop {
            if self.flushed() >= end {
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
                self.flushed.fetch_max(end, Ordering::AcqRel);
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
        let stopping = || self.stop_requested.load(Ordering::Acquire);
        let mut work = self.work_lock.lock();
        match mode {
            FlushMode::Sync => {
                while !stopping() && self.requested.load(Ordering::Acquire) <= self.flushed() {
                    if self.work.wait_until(&mut work, deadline).timed_out() {
                        break;
                    }
                }
            }
            FlushMode::Async => {
                if !stopping() {
                    self.work.wait_until(&mut work, deadline);
                }
            }
        }
        !stopping()
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stopping = true;
        self.stop_requested.store(true, Ordering::Release);
        {
            let _work = self.work_lock.lock();
            self.work.notify_all();
        }
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
