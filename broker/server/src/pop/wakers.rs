//! Long-polling receives, woken by the store's dispatch hook (a message reached a topic they
//! read), by an ack that empties an in-order queue, or by the revive loop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The receives watching one topic: (watch id, its notify).
type Watchers = Vec<(u64, Arc<Notify>)>;

/// Receives waiting, by topic they read.
#[derive(Default)]
pub struct Wakers {
    /// Receives watching now: the dispatch hook skips the lock while it is 0.
    watching: AtomicUsize,
    /// Receives parked (waiting for a wake-up), for the metrics.
    parked: AtomicUsize,
    by_topic: Mutex<HashMap<String, Watchers>>,
    next_id: AtomicUsize,
}

/// A receive's registration; dropping it unregisters.
pub struct Watch {
    wakers: Arc<Wakers>,
    id: u64,
    topics: Vec<String>,
    pub notify: Arc<Notify>,
}

impl Wakers {
    /// Registers for dispatches to `topics`; register before reading so none is missed (a
    /// wake-up before the wait leaves a permit).
    pub fn watch(self: &Arc<Self>, topics: Vec<String>) -> Watch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) as u64;
        let notify = Arc::new(Notify::new());
        let mut by_topic = self.by_topic.lock();
        for topic in &topics {
            by_topic
                .entry(topic.clone())
                .or_default()
                .push((id, notify.clone()));
        }
        self.watching.fetch_add(1, Ordering::AcqRel);
        Watch {
            wakers: self.clone(),
            id,
            topics,
            notify,
        }
    }

    /// Wakes the receives reading `topic`. Cheap when none waits (the dispatch hook's path).
    pub fn wake(&self, topic: &str) {
        if self.watching.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(watchers) = self.by_topic.lock().get(topic) {
            for (_, notify) in watchers {
                notify.notify_one();
            }
        }
    }

    pub fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }
}

/// Counts a receive as parked while it lives (a cancelled receive drops it too).
pub struct ParkedGuard<'a>(&'a Wakers);

impl Drop for ParkedGuard<'_> {
    fn drop(&mut self) {
        self.0.parked.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Watch {
    /// Counts the receive as parked until the guard drops.
    pub fn parked(&self) -> ParkedGuard<'_> {
        self.wakers.parked.fetch_add(1, Ordering::Relaxed);
        ParkedGuard(&self.wakers)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut by_topic = self.wakers.by_topic.lock();
        for topic in &self.topics {
            if let Some(watchers) = by_topic.get_mut(topic) {
                watchers.retain(|(id, _)| *id != self.id);
                if watchers.is_empty() {
                    by_topic.remove(topic);
                }
            }
        }
        self.wakers.watching.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_before_the_wait_is_kept_and_only_watched_topics_wake() {
        let wakers = Arc::new(Wakers::default());
        let watch = wakers.watch(vec!["a".into(), "b".into()]);
        wakers.wake("c");
        let quiet = tokio::time::timeout(Duration::from_millis(20), watch.notify.notified());
        assert!(quiet.await.is_err(), "topic c is not watched");
        wakers.wake("b");
        let woken = tokio::time::timeout(Duration::from_secs(5), watch.notify.notified());
        assert!(
            woken.await.is_ok(),
            "the permit left before waiting wakes it"
        );
        drop(watch);
        assert!(wakers.by_topic.lock().is_empty());
        assert_eq!(wakers.watching.load(Ordering::Relaxed), 0);
    }
}
