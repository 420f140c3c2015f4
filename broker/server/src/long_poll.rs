//! Parked pulls, woken by the store's dispatch hook: no polling loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Why a parked pull stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A message was dispatched to the queue.
    Dispatched,
    /// The registry was shut down (broker stopping).
    Shutdown,
}

/// A parked pull's slot: resolves on dispatch or shutdown; dropping it frees the slot.
pub struct Parked {
    receiver: oneshot::Receiver<Wake>,
    registry: std::sync::Arc<LongPollRegistry>,
}

impl Parked {
    /// Waits for a wake-up or until the deadline; None on timeout.
    pub async fn wait(mut self, timeout: std::time::Duration) -> Option<Wake> {
        tokio::time::timeout(timeout, &mut self.receiver)
            .await
            .ok()
            .map(|result| result.unwrap_or(Wake::Shutdown))
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.registry.parked.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a pull could not be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkRefused {
    /// The bound on parked pulls is reached.
    Full,
    /// The broker is stopping.
    ShuttingDown,
}

/// Wake-up senders of parked pulls, by topic then queueId (looked up by &str: no allocation
/// on the dispatch path).
type Waiters = HashMap<String, HashMap<u32, Vec<oneshot::Sender<Wake>>>>;

/// Waiters per (topic, queueId).
pub struct LongPollRegistry {
    waiters: Mutex<Waiters>,
    parked: AtomicUsize,
    max_parked: usize,
    shut_down: std::sync::atomic::AtomicBool,
}

impl LongPollRegistry {
    pub fn new(max_parked: usize) -> std::sync::Arc<Self> {
        std::sync::Arc::new(LongPollRegistry {
            waiters: Mutex::new(HashMap::new()),
            parked: AtomicUsize::new(0),
            max_parked,
            shut_down: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Parks a pull on a queue. Register before re-checking the queue so no dispatch is missed.
    pub fn park(
        self: &std::sync::Arc<Self>,
        topic: &str,
        queue_id: u32,
    ) -> Result<Parked, ParkRefused> {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(ParkRefused::ShuttingDown);
        }
        let previous = self.parked.fetch_add(1, Ordering::AcqRel);
        if previous >= self.max_parked {
            self.parked.fetch_sub(1, Ordering::AcqRel);
            return Err(ParkRefused::Full);
        }
        let (sender, receiver) = oneshot::channel();
        let mut waiters = self.waiters.lock();
        let queue_waiters = waiters
            .entry(topic.to_string())
            .or_default()
            .entry(queue_id)
            .or_default();
        // Drop slots whose pull already gave up so a quiet queue's list stays short.
        queue_waiters.retain(|waiter| !waiter.is_closed());
        queue_waiters.push(sender);
        Ok(Parked {
            receiver,
            registry: self.clone(),
        })
    }

    /// The dispatch hook: wakes every pull parked on the queue. Cheap and never blocks.
    pub fn notify(&self, topic: &str, queue_id: u32) {
        let woken = {
            let mut waiters = self.waiters.lock();
            let Some(queues) = waiters.get_mut(topic) else {
                return;
            };
            let woken = queues.remove(&queue_id);
            if queues.is_empty() {
                waiters.remove(topic);
            }
            woken
        };
        for waiter in woken.into_iter().flatten() {
            let _ = waiter.send(Wake::Dispatched);
        }
    }

    /// Answers every parked pull now and refuses new ones.
    pub fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        let all: Vec<_> = self.waiters.lock().drain().collect();
        for (_, queues) in all {
            for waiter in queues.into_values().flatten() {
                let _ = waiter.send(Wake::Shutdown);
            }
        }
    }

    /// Pulls parked right now.
    pub fn parked_count(&self) -> usize {
        self.parked.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn dispatch_wakes_only_its_queue() {
        let registry = LongPollRegistry::new(8);
        let on_q0 = registry.park("T", 0).unwrap();
        let on_q1 = registry.park("T", 1).unwrap();
        registry.notify("T", 0);
        assert_eq!(
            on_q0.wait(Duration::from_secs(5)).await,
            Some(Wake::Dispatched)
        );
        assert_eq!(on_q1.wait(Duration::from_millis(20)).await, None);
        assert_eq!(registry.parked_count(), 0);
    }

    #[tokio::test]
    async fn bound_and_shutdown() {
        let registry = LongPollRegistry::new(1);
        let first = registry.park("T", 0).unwrap();
        assert_eq!(registry.park("T", 0).err(), Some(ParkRefused::Full));
        registry.shutdown();
        assert_eq!(
            first.wait(Duration::from_secs(5)).await,
            Some(Wake::Shutdown)
        );
        assert_eq!(registry.park("T", 0).err(), Some(ParkRefused::ShuttingDown));
    }
}
