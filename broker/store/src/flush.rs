//! Flushing the CommitLog: group commit for `FlushMode::Sync`, interval / dirty pages for
//! `FlushMode::Async`, plus periodic ConsumeQueue flushes and checkpoints.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::config::FlushMode;
use crate::error::StoreError;
use crate::CommitLogOffset;

const PAGE_BYTES: u64 = 4096;
const FAILED_FLUSH_BACKOFF: Duration = Duration::from_millis(100);
/// Async mode flushes any dirty bytes at least this many intervals apart.
const THOROUGH_FLUSH_INTERVALS: u32 = 20;
/// Sync mode waits at most as long as the last flush took for the writers it served to come
/// back (a round trip to a client included), so one fsync covers them all again, like MySQL's
/// binlog group commit delay. A lone writer never waits: it is all the last flush served.
/// Never longer than this, whatever a slow disk did last time.
const MAX_GATHER: Duration = Duration::from_millis(2);

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
    /// Sync writers that started waiting since the flusher last took the count.
    arrivals: AtomicU64,
    /// How many writers the last flush served: the flusher gathers this many before the next.
    gather_target: AtomicU64,
    /// The flusher sleeps until some writer waits.
    flusher_idle: AtomicBool,
    /// Set by `stop`; the flusher looks at it before and while it parks.
    stop_requested: AtomicBool,
    /// Only its address is used: the flusher parks there (`park_flusher`), so waking it takes
    /// no mutex and a writer never spins on a lock the flusher has just re-taken.
    flusher_park_key: u8,
    /// Bumped after every flush outcome and at stop; blocked writers park on its address and
    /// are all woken at once (`wake_writers`), not one after another through a mutex.
    round: AtomicU64,
    /// Wakes the housekeeper: the store stops.
    stopped: Condvar,
    /// Tells non-blocking waiters (see `request`) to look at `durable_status` again.
    flushed_hook: RwLock<Option<FlushedHook>>,
    /// Bumped (under `state`) when the log is truncated and `flushed` moves back: a flush
    /// that read the committed end before must not raise `flushed` past the new bytes.
    rewinds: AtomicU64,
}

/// Parks the calling thread on `key` (an address inside a `FlushControl`) while
/// `keep_waiting` holds; it is checked again under the park queue's lock, so a waker that
/// changes what it reads and then unparks `key` is never missed.
fn park_on(
    key: usize,
    keep_waiting: impl Fn() -> bool,
    deadline: Option<Instant>,
) -> parking_lot_core::ParkResult {
    // SAFETY: the key is an address of a live `FlushControl`, used for nothing else; the
    // callbacks neither park nor panic.
    unsafe {
        parking_lot_core::park(
            key,
            keep_waiting,
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            deadline,
        )
    }
}

/// Called on the flusher thread after each flush and at stop; must not block.
pub type FlushedHook = Arc<dyn Fn() + Send + Sync>;

impl FlushControl {
    pub(crate) fn new(flushed: u64) -> Self {
        FlushControl {
            state: Mutex::new(FlushState {
                failure: None,
                stopping: false,
            }),
            flushed: AtomicU64::new(flushed),
            requested: AtomicU64::new(flushed),
            arrivals: AtomicU64::new(0),
            gather_target: AtomicU64::new(0),
            flusher_idle: AtomicBool::new(false),
            stop_requested: AtomicBool::new(false),
            flusher_park_key: 0,
            round: AtomicU64::new(0),
            stopped: Condvar::new(),
            flushed_hook: RwLock::new(None),
            rewinds: AtomicU64::new(0),
        }
    }

    /// Taken before reading the committed end a flush covers; passed to `complete`.
    pub(crate) fn rewinds(&self) -> u64 {
        self.rewinds.load(Ordering::Acquire)
    }

    /// The log was truncated to `to`: bytes from there are no longer durable (new ones will
    /// be written there), and a flush in progress cannot claim them.
    pub(crate) fn rewind(&self, to: u64) {
        let _state = self.state.lock();
        self.rewinds.fetch_add(1, Ordering::AcqRel);
        self.flushed.fetch_min(to, Ordering::AcqRel);
        self.requested.fetch_min(to, Ordering::AcqRel);
    }

    pub(crate) fn flushed(&self) -> u64 {
        self.flushed.load(Ordering::Acquire)
    }

    /// Registers a writer waiting for `end` with group commit and wakes the flusher when it
    /// should start; `true` when `end` is already durable (nothing to wait for).
    pub(crate) fn request(&self, end: u64) -> bool {
        if self.flushed() >= end {
            return true;
        }
        // Wake the flusher once per round: when it idles, or when it has gathered enough.
        let arrived = self.arrivals.fetch_add(1, Ordering::SeqCst) + 1;
        self.requested.fetch_max(end, Ordering::SeqCst);
        if self.flusher_idle.load(Ordering::SeqCst)
            || arrived >= self.gather_target.load(Ordering::SeqCst)
        {
            self.wake_flusher();
        }
        false
    }

    /// Whether `end` is durable: `None` while a flush may still cover it.
    pub(crate) fn durable_status(&self, end: u64) -> Option<Result<(), StoreError>> {
        // The common answer needs no lock: every waiter asks at once after a flush.
        if self.flushed() >= end {
            return Some(Ok(()));
        }
        self.status_locked(&self.state.lock(), end)
    }

    fn status_locked(&self, state: &FlushState, end: u64) -> Option<Result<(), StoreError>> {
        if self.flushed() >= end {
            return Some(Ok(()));
        }
        // After a failed flush nothing past `flushed` is ever called durable: the kernel may
        // have dropped the failed pages, so a later flush "succeeding" proves nothing.
        if let Some((_, source)) = &state.failure {
            return Some(Err(StoreError::FlushFailed {
                offset: CommitLogOffset(end),
                source: Arc::clone(source),
            }));
        }
        state.stopping.then_some(Err(StoreError::ShutDown))
    }

    /// Blocks until CommitLog bytes below `end` are durable; one fsync serves every waiter.
    pub(crate) fn wait_durable(&self, end: u64) -> Result<(), StoreError> {
        if self.request(end) {
            return Ok(());
        }
        loop {
            let round = self.round.load(Ordering::SeqCst);
            if let Some(status) = self.durable_status(end) {
                return status;
            }
            park_on(
                self.round_key(),
                || self.round.load(Ordering::SeqCst) == round,
                None,
            );
        }
    }

    fn round_key(&self) -> usize {
        std::ptr::from_ref(&self.round) as usize
    }

    /// Starts a new round and wakes every blocked writer to look at it.
    fn wake_writers(&self) {
        self.round.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the key is this control's own address, as `wait_durable` parks on.
        unsafe {
            parking_lot_core::unpark_all(self.round_key(), parking_lot_core::DEFAULT_UNPARK_TOKEN);
        }
    }

    /// Sets what runs after every flush outcome and at stop (after blocked writers are woken).
    pub(crate) fn set_flushed_hook(&self, hook: FlushedHook) {
        *self.flushed_hook.write() = Some(hook);
    }

    fn run_flushed_hook(&self) {
        if let Some(hook) = self.flushed_hook.read().as_ref() {
            hook();
        }
    }

    /// Records the outcome of flushing up to `end` and wakes the writers.
    /// `rewinds` is what `rewinds()` said before the committed end was read: after a
    /// truncation since, `end` may cover bytes that were not flushed.
    pub(crate) fn complete(
        &self,
        rewinds: u64,
        end: u64,
        outcome: std::io::Result<()>,
    ) -> Result<(), StoreError> {
        let mut state = self.state.lock();
        let result = match outcome {
            Ok(()) if state.failure.is_none() => {
                if rewinds == self.rewinds.load(Ordering::Acquire) {
                    self.flushed.fetch_max(end, Ordering::AcqRel);
                }
                Ok(())
            }
            Ok(()) => {
                let (_, source) = state.failure.as_ref().expect("checked above");
                Err(StoreError::FlushFailed {
                    offset: CommitLogOffset(end),
                    source: Arc::clone(source),
                })
            }
            Err(error) => {
                tracing::error!(%error, end, "commitlog flush failed; nothing more is acknowledged until a restart");
                let source = Arc::new(error);
                state.failure = Some((end, Arc::clone(&source)));
                Err(StoreError::FlushFailed {
                    offset: CommitLogOffset(end),
                    source,
                })
            }
        };
        drop(state);
        self.wake_writers();
        self.run_flushed_hook();
        result
    }

    /// The error of the first failed CommitLog flush, if one failed: it stays until restart.
    pub(crate) fn failure(&self) -> Option<Arc<std::io::Error>> {
        self.state
            .lock()
            .failure
            .as_ref()
            .map(|(_, source)| Arc::clone(source))
    }

    /// Takes the count of writers that arrived since the last call: the ones a flush starting
    /// now covers. Call before reading the committed end.
    pub(crate) fn take_arrivals(&self) -> u64 {
        self.arrivals.swap(0, Ordering::AcqRel)
    }

    /// Waits for the next reason to flush; `false` once the store stops. In Sync mode, once a
    /// writer waits, it also waits up to `gather` for as many writers as the last flush served.
    pub(crate) fn wait_for_work(
        &self,
        mode: FlushMode,
        deadline: Instant,
        gather: Duration,
    ) -> bool {
        let stopping = || self.stop_requested.load(Ordering::SeqCst);
        match mode {
            FlushMode::Sync => {
                // Idle is raised before `requested` is read: a writer either sees it or is seen.
                self.flusher_idle.store(true, Ordering::SeqCst);
                let asked = self.park_flusher(
                    || stopping() || self.requested.load(Ordering::SeqCst) > self.flushed(),
                    deadline,
                );
                self.flusher_idle.store(false, Ordering::SeqCst);
                if asked {
                    let target = self.gather_target.load(Ordering::SeqCst);
                    self.park_flusher(
                        || stopping() || self.arrivals.load(Ordering::SeqCst) >= target,
                        Instant::now() + gather,
                    );
                }
            }
            FlushMode::Async => {
                self.park_flusher(stopping, deadline);
            }
        }
        !stopping()
    }

    fn flusher_key(&self) -> usize {
        std::ptr::from_ref(&self.flusher_park_key) as usize
    }

    /// Parks the flusher until `ready` holds (`true`) or `deadline` passes (`false`).
    /// Writers change what `ready` reads before `wake_flusher`, and `ready` is checked again
    /// under the park queue's lock, so no wake-up falls between the check and the sleep.
    fn park_flusher(&self, ready: impl Fn() -> bool, deadline: Instant) -> bool {
        loop {
            if ready() {
                return true;
            }
            if park_on(self.flusher_key(), || !ready(), Some(deadline))
                == parking_lot_core::ParkResult::TimedOut
            {
                return ready();
            }
        }
    }

    fn wake_flusher(&self) {
        // SAFETY: the key is this control's own address, as `park_flusher` parks on.
        unsafe {
            parking_lot_core::unpark_one(self.flusher_key(), |_| {
                parking_lot_core::DEFAULT_UNPARK_TOKEN
            });
        }
    }

    pub(crate) fn stop(&self) {
        self.state.lock().stopping = true;
        self.stop_requested.store(true, Ordering::SeqCst);
        self.wake_flusher();
        self.wake_writers();
        self.stopped.notify_all();
        self.run_flushed_hook();
    }

    /// Sleeps up to `interval`; `false` once the store stops.
    pub(crate) fn wait_while_running(&self, interval: Duration) -> bool {
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
    let mut gather = Duration::ZERO;
    loop {
        if !control.wait_for_work(mode, Instant::now() + interval, gather) {
            return;
        }
        let served = control.take_arrivals();
        let rewinds = control.rewinds();
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
            let started = Instant::now();
            let outcome = target.flush_commit_log(flushed, committed);
            gather = started.elapsed().min(MAX_GATHER);
            control.gather_target.store(served, Ordering::Release);
            if control.complete(rewinds, committed, outcome).is_err() {
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
    let mut last_failure = None;
    while control.wait_while_running(interval) {
        let outcome = target.housekeeping();
        let text = outcome.as_ref().err().map(|e| crate::error::chain(e));
        // A full disk fails every round the same way: say it when it starts and when it ends.
        if text != last_failure {
            match &text {
                Some(error) => tracing::error!(%error, "consume queue flush or checkpoint failed"),
                None => tracing::info!("consume queue flush and checkpoint work again"),
            }
            last_failure = text;
        }
    }
}

pub(crate) fn least_bytes(least_pages: u64) -> u64 {
    least_pages.saturating_mul(PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// A log whose "fsync" takes a fixed time and is counted.
    struct SlowDisk {
        committed: AtomicU64,
        flushes: AtomicU32,
        delay: Duration,
    }

    impl FlushTarget for SlowDisk {
        fn commit_log_committed(&self) -> u64 {
            self.committed.load(Ordering::Acquire)
        }
        fn flush_commit_log(&self, _from: u64, _to: u64) -> std::io::Result<()> {
            std::thread::sleep(self.delay);
            self.flushes.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn housekeeping(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// With an interval of an hour only wake-ups move the flusher: a lost one hangs a writer.
    #[test]
    fn every_wake_up_reaches_the_flusher() {
        const ROUNDS: u64 = 300;
        let control = Arc::new(FlushControl::new(0));
        let disk = Arc::new(SlowDisk {
            committed: AtomicU64::new(0),
            flushes: AtomicU32::new(0),
            delay: Duration::ZERO,
        });
        let flusher = {
            let (control, disk) = (control.clone(), disk.clone());
            std::thread::spawn(move || {
                run_flusher(
                    &control,
                    &*disk,
                    FlushMode::Sync,
                    Duration::from_secs(3600),
                    0,
                )
            })
        };
        let (done, finished) = std::sync::mpsc::channel();
        for writer in 0..2 {
            let (control, disk, done) = (control.clone(), disk.clone(), done.clone());
            std::thread::spawn(move || {
                for round in 0..ROUNDS {
                    let end = disk.committed.fetch_add(100, Ordering::AcqRel) + 100;
                    control.wait_durable(end).unwrap();
                    // One writer pauses now and then, so rounds of one and two both happen.
                    if writer == 0 && round % 7 == 0 {
                        std::thread::yield_now();
                    }
                }
                done.send(()).unwrap();
            });
        }
        for _ in 0..2 {
            finished
                .recv_timeout(Duration::from_secs(60))
                .expect("a writer waited out a wake-up that never came");
        }
        control.stop();
        let (stopped, joined) = std::sync::mpsc::channel();
        std::thread::spawn(move || stopped.send(flusher.join().is_ok()).unwrap());
        assert!(
            joined.recv_timeout(Duration::from_secs(60)).unwrap(),
            "the flusher panicked"
        );
        assert_eq!(control.flushed(), disk.committed.load(Ordering::Acquire));
    }

    #[test]
    fn one_flush_serves_many_waiting_writers() {
        const WRITERS: u64 = 8;
        const ROUNDS: u64 = 25;
        let control = FlushControl::new(0);
        let disk = SlowDisk {
            committed: AtomicU64::new(0),
            flushes: AtomicU32::new(0),
            delay: Duration::from_millis(2),
        };
        std::thread::scope(|scope| {
            let flusher = scope
                .spawn(|| run_flusher(&control, &disk, FlushMode::Sync, Duration::from_secs(1), 0));
            let writers: Vec<_> = (0..WRITERS)
                .map(|_| {
                    scope.spawn(|| {
                        for _ in 0..ROUNDS {
                            let end = disk.committed.fetch_add(100, Ordering::AcqRel) + 100;
                            control.wait_durable(end).unwrap();
                            assert!(control.flushed() >= end);
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.join().unwrap();
            }
            // A lone writer after the crowd is still served: gathering gives up in time.
            let end = disk.committed.fetch_add(100, Ordering::AcqRel) + 100;
            control.wait_durable(end).unwrap();
            control.stop();
            flusher.join().unwrap();
        });
        let flushes = u64::from(disk.flushes.load(Ordering::Relaxed));
        let waits = WRITERS * ROUNDS + 1;
        assert!(
            flushes * 2 <= waits,
            "{flushes} flushes for {waits} durable waits: group commit did not group"
        );
    }

    /// A disk whose first flush fails with EIO, as a real one does once it dropped pages;
    /// later flushes "succeed".
    struct DiskThatFailedOnce {
        committed: AtomicU64,
        flushes: AtomicU32,
    }

    impl FlushTarget for DiskThatFailedOnce {
        fn commit_log_committed(&self) -> u64 {
            self.committed.load(Ordering::Acquire)
        }
        fn flush_commit_log(&self, _from: u64, _to: u64) -> std::io::Result<()> {
            if self.flushes.fetch_add(1, Ordering::AcqRel) == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EIO));
            }
            Ok(())
        }
        fn housekeeping(&self) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// After a failed fsync nothing is acknowledged again, not even bytes a later flush
    /// "succeeded" for: the failed pages may be gone (PostgreSQL's fsyncgate).
    #[test]
    fn after_a_failed_flush_nothing_is_ever_called_durable() {
        let control = FlushControl::new(0);
        let disk = DiskThatFailedOnce {
            committed: AtomicU64::new(100),
            flushes: AtomicU32::new(0),
        };
        let (first, later) = std::thread::scope(|scope| {
            let flusher = scope.spawn(|| {
                run_flusher(
                    &control,
                    &disk,
                    FlushMode::Sync,
                    Duration::from_millis(5),
                    0,
                )
            });
            let first = control.wait_durable(100);
            // Let the flusher's retry "succeed" (bounded), then ask for more.
            let deadline = Instant::now() + Duration::from_secs(5);
            while disk.flushes.load(Ordering::Acquire) < 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            disk.committed.store(200, Ordering::Release);
            let later = control.wait_durable(200);
            control.stop();
            flusher.join().unwrap();
            (first, later)
        });
        assert!(
            matches!(first, Err(StoreError::FlushFailed { .. })),
            "{first:?}"
        );
        assert!(
            matches!(later, Err(StoreError::FlushFailed { .. })),
            "{later:?}"
        );
        assert!(
            disk.flushes.load(Ordering::Acquire) >= 2,
            "the flusher retried"
        );
        assert_eq!(
            control.flushed(),
            0,
            "the failed bytes never count as durable"
        );
        let error = control.failure().expect("the failure is kept");
        assert_eq!(error.raw_os_error(), Some(libc::EIO));
    }
}
