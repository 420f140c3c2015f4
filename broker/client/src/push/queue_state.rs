//! One assigned queue as the three parts of the push consumer share it: its in-flight
//! messages (consume service), its pull loop task (pull loop) and its broker lock (rebalance).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::message::ReceivedMessage;
use crate::process_queue::ProcessQueue;
use crate::MessageQueue;

/// How long a broker queue lock is trusted after it was granted (RocketMQ's 30 s).
pub(super) const LOCK_TRUSTED_FOR: Duration = Duration::from_secs(30);

/// One assigned queue: its in-flight messages and its pull loop.
pub(super) struct QueueState {
    pub(super) queue: MessageQueue,
    pub(super) process_queue: Mutex<ProcessQueue<ReceivedMessage>>,
    pub(super) stop: watch::Sender<bool>,
    pub(super) space_freed: Notify,
    pub(super) task: Mutex<Option<JoinHandle<()>>>,
    /// Orderly mode: the broker lock counts as held until then (renewed on every rebalance).
    pub(super) locked_until: Mutex<Option<Instant>>,
    /// A replicated group's epoch at the last pull (0: none yet), sent with the next one.
    pulled_epoch: AtomicU64,
}

impl QueueState {
    pub(super) fn new(queue: MessageQueue) -> Arc<Self> {
        Arc::new(Self {
            queue,
            process_queue: Mutex::new(ProcessQueue::new()),
            stop: watch::channel(false).0,
            space_freed: Notify::new(),
            task: Mutex::new(None),
            locked_until: Mutex::new(None),
            pulled_epoch: AtomicU64::new(0),
        })
    }

    pub(super) fn pulled_epoch(&self) -> Option<u64> {
        Some(self.pulled_epoch.load(Ordering::Acquire)).filter(|epoch| *epoch != 0)
    }

    pub(super) fn set_pulled_epoch(&self, epoch: Option<u64>) {
        if let Some(epoch) = epoch {
            self.pulled_epoch.store(epoch, Ordering::Release);
        }
    }

    pub(super) fn lock_granted(&self) {
        *self.locked_until.lock() = Some(Instant::now() + LOCK_TRUSTED_FOR);
    }

    pub(super) fn holds_lock(&self) -> bool {
        self.locked_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }

    pub(super) fn is_dropped(&self) -> bool {
        self.process_queue.lock().is_dropped()
    }

    pub(super) fn is_stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Stops the pull loop; in-flight results no longer move the offset.
    pub(super) async fn stop(&self) {
        self.process_queue.lock().mark_dropped();
        self.stop_pulling().await;
    }

    /// Shutdown: stops the pull loop and new listener calls; calls already running still
    /// commit their progress.
    pub(super) async fn stop_pulling(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().take();
        if let Some(task) = task {
            // The loop only awaits cancellable operations, so this ends promptly.
            let _ = task.await;
        }
    }
}
