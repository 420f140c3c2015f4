//! Parked pulls, woken by the store's dispatch hook: no polling loop. A parked pull can leave
//! an [`AnswerNow`] so the dispatching thread answers it itself, sparing the hand-off to the
//! pull's task (on two cores, each hand-off can wait behind other work).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::oneshot;

/// Why a parked pull stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A message was dispatched to the queue at this time.
    Dispatched(Instant),
    /// The dispatching thread answered the pull (its [`AnswerNow`]): the task answers nothing.
    Answered,
    /// The registry was shut down (broker stopping).
    Shutdown,
}

/// Who answers a parked pull: its task, or the [`AnswerNow`] at a dispatch. Taken once.
#[derive(Debug, Default)]
pub struct Claim(AtomicBool);

impl Claim {
    /// True for the first caller only: it, and nobody else, answers the pull.
    pub fn take(&self) -> bool {
        !self.0.swap(true, Ordering::AcqRel)
    }
}

/// Run by the dispatch hook with the dispatch time: answers the pull there and then, taking
/// the [`Claim`] before it sends, and says whether it did; false wakes the pull's task.
pub type AnswerNow = Box<dyn FnOnce(Instant, &Claim) -> bool + Send>;

/// A parked pull's slot: resolves on dispatch or shutdown; dropping it frees the slot.
pub struct Parked {
    receiver: oneshot::Receiver<Wake>,
    claim: Arc<Claim>,
    registry: Arc<LongPollRegistry>,
    topic: String,
    queue_id: u32,
    connection: u64,
}

impl Parked {
    /// Takes the claim for the pull's task (it read something right after parking): false
    /// when a dispatch answered the pull first.
    pub fn claim_for_task(&self) -> bool {
        self.claim.take()
    }

    /// Waits for a wake-up or until the deadline; None on timeout, when the task answers
    /// (unless the dispatch took the claim just then: `Answered`).
    pub async fn wait(mut self, timeout: std::time::Duration) -> Option<Wake> {
        match tokio::time::timeout(timeout, &mut self.receiver).await {
            Ok(woken) => Some(woken.unwrap_or(Wake::Shutdown)),
            Err(_) if self.claim.take() => None,
            Err(_) => Some(Wake::Answered),
        }
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        // A pull that ends without a dispatch leaves its waiter behind; its AnswerNow holds
        // the connection open, so it goes now rather than at the queue's next dispatch.
        self.registry
            .release(&self.topic, self.queue_id, &self.claim, self.connection);
        self.registry.parked.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a pull could not be parked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkRefused {
    /// The bound on parked pulls is reached.
    Full,
    /// The bound on parked pulls of one connection is reached.
    ConnectionFull,
    /// The broker is stopping.
    ShuttingDown,
}

/// One parked pull as the dispatch sees it.
struct Waiter {
    sender: oneshot::Sender<Wake>,
    answer_now: Option<AnswerNow>,
    claim: Arc<Claim>,
}

impl Waiter {
    /// Answers the pull here if it can, else wakes its task.
    fn wake(self, dispatched: Instant) {
        if self.sender.is_closed() {
            return;
        }
        if let Some(answer_now) = self.answer_now {
            if answer_now(dispatched, &self.claim) {
                let _ = self.sender.send(Wake::Answered);
                return;
            }
        }
        let _ = self.sender.send(Wake::Dispatched(dispatched));
    }
}

/// What the registry's one lock guards.
#[derive(Default)]
struct Parking {
    /// Parked pulls by topic then queueId (looked up by &str: no allocation on the dispatch
    /// path).
    waiters: HashMap<String, HashMap<u32, Vec<Waiter>>>,
    /// Pulls parked per connection id.
    per_connection: HashMap<u64, usize>,
}

/// Waiters per (topic, queueId).
pub struct LongPollRegistry {
    parking: Mutex<Parking>,
    parked: AtomicUsize,
    max_parked: usize,
    max_per_connection: usize,
    /// Parks refused: [the broker's bound, a connection's bound].
    refused: [AtomicU64; 2],
    shut_down: std::sync::atomic::AtomicBool,
}

impl LongPollRegistry {
    pub fn new(max_parked: usize, max_per_connection: usize) -> std::sync::Arc<Self> {
        std::sync::Arc::new(LongPollRegistry {
            parking: Mutex::default(),
            parked: AtomicUsize::new(0),
            max_parked,
            max_per_connection,
            refused: [AtomicU64::new(0), AtomicU64::new(0)],
            shut_down: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// (reason, parks refused so far): the broker's bound and a connection's.
    pub fn refused_counts(&self) -> [(&'static str, u64); 2] {
        let count = |i: usize| self.refused[i].load(Ordering::Relaxed);
        [
            ("max-parked-pulls", count(0)),
            ("max-parked-pulls-per-connection", count(1)),
        ]
    }

    /// Parks a pull on a queue. Register before re-checking the queue so no dispatch is missed.
    /// `answer_now`, if any, runs at the next dispatch to the queue.
    pub fn park(
        self: &Arc<Self>,
        topic: &str,
        queue_id: u32,
        connection: u64,
        answer_now: Option<AnswerNow>,
    ) -> Result<Parked, ParkRefused> {
        if self.shut_down.load(Ordering::Acquire) {
            return Err(ParkRefused::ShuttingDown);
        }
        let mut parking = self.parking.lock();
        let by_connection = parking.per_connection.entry(connection).or_default();
        if *by_connection >= self.max_per_connection {
            self.refused[1].fetch_add(1, Ordering::Relaxed);
            return Err(ParkRefused::ConnectionFull);
        }
        let previous = self.parked.fetch_add(1, Ordering::AcqRel);
        if previous >= self.max_parked {
            self.parked.fetch_sub(1, Ordering::AcqRel);
            if *by_connection == 0 {
                parking.per_connection.remove(&connection);
            }
            self.refused[0].fetch_add(1, Ordering::Relaxed);
            return Err(ParkRefused::Full);
        }
        *by_connection += 1;
        let (sender, receiver) = oneshot::channel();
        let claim = Arc::new(Claim::default());
        let queue_waiters = parking
            .waiters
            .entry(topic.to_string())
            .or_default()
            .entry(queue_id)
            .or_default();
        // Drop slots whose pull already gave up so a quiet queue's list stays short.
        queue_waiters.retain(|waiter| !waiter.sender.is_closed());
        queue_waiters.push(Waiter {
            sender,
            answer_now,
            claim: claim.clone(),
        });
        Ok(Parked {
            receiver,
            claim,
            registry: self.clone(),
            topic: topic.to_owned(),
            queue_id,
            connection,
        })
    }

    /// The dispatch hook: answers or wakes every pull parked on the queue. Never blocks: an
    /// answer is a read of mapped memory and a slot in the connection's queue.
    pub fn notify(&self, topic: &str, queue_id: u32) {
        let woken = {
            let waiters = &mut self.parking.lock().waiters;
            let Some(queues) = waiters.get_mut(topic) else {
                return;
            };
            let woken = queues.remove(&queue_id);
            if queues.is_empty() {
                waiters.remove(topic);
            }
            woken
        };
        let dispatched = Instant::now();
        for waiter in woken.into_iter().flatten() {
            waiter.wake(dispatched);
        }
    }

    /// A parked pull ended: removes its waiter holding `claim` if a dispatch has not taken
    /// it, and counts it off its connection.
    fn release(&self, topic: &str, queue_id: u32, claim: &Arc<Claim>, connection: u64) {
        let mut parking = self.parking.lock();
        if let Some(parked) = parking.per_connection.get_mut(&connection) {
            *parked -= 1;
            if *parked == 0 {
                parking.per_connection.remove(&connection);
            }
        }
        let waiters = &mut parking.waiters;
        let Some(queues) = waiters.get_mut(topic) else {
            return;
        };
        let Some(queue_waiters) = queues.get_mut(&queue_id) else {
            return;
        };
        queue_waiters.retain(|waiter| !Arc::ptr_eq(&waiter.claim, claim));
        if queue_waiters.is_empty() {
            queues.remove(&queue_id);
            if queues.is_empty() {
                waiters.remove(topic);
            }
        }
    }

    /// Answers every parked pull now and refuses new ones.
    pub fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        let all: Vec<_> = self.parking.lock().waiters.drain().collect();
        for (_, queues) in all {
            for waiter in queues.into_values().flatten() {
                let _ = waiter.sender.send(Wake::Shutdown);
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
        let registry = LongPollRegistry::new(8, 8);
        let on_q0 = registry.park("T", 0, 1, None).unwrap();
        let on_q1 = registry.park("T", 1, 1, None).unwrap();
        registry.notify("T", 0);
        assert!(matches!(
            on_q0.wait(Duration::from_secs(5)).await,
            Some(Wake::Dispatched(_))
        ));
        assert_eq!(on_q1.wait(Duration::from_millis(20)).await, None);
        assert_eq!(registry.parked_count(), 0);
        assert!(
            registry.parking.lock().waiters.is_empty(),
            "a timed-out pull leaves nothing behind"
        );
    }

    #[tokio::test]
    async fn bound_and_shutdown() {
        let registry = LongPollRegistry::new(1, 8);
        let first = registry.park("T", 0, 1, None).unwrap();
        assert_eq!(
            registry.park("T", 0, 1, None).err(),
            Some(ParkRefused::Full)
        );
        registry.shutdown();
        assert_eq!(
            first.wait(Duration::from_secs(5)).await,
            Some(Wake::Shutdown)
        );
        assert_eq!(
            registry.park("T", 0, 1, None).err(),
            Some(ParkRefused::ShuttingDown)
        );
    }

    #[tokio::test]
    async fn the_dispatch_answers_a_pull_that_left_an_answer_now() {
        let registry = LongPollRegistry::new(8, 8);
        let (answered_tx, answered_rx) = std::sync::mpsc::channel();
        let answer_now: AnswerNow = Box::new(move |dispatched, claim| {
            assert!(claim.take(), "nobody else answered");
            answered_tx.send(dispatched).unwrap();
            true
        });
        let parked = registry.park("T", 0, 1, Some(answer_now)).unwrap();
        registry.notify("T", 0);
        assert!(
            answered_rx.try_recv().is_ok(),
            "answered on the dispatching thread"
        );
        assert_eq!(
            parked.wait(Duration::from_secs(5)).await,
            Some(Wake::Answered)
        );
    }

    #[tokio::test]
    async fn a_declined_answer_wakes_the_task_which_then_answers() {
        let registry = LongPollRegistry::new(8, 8);
        let parked = registry
            .park("T", 0, 1, Some(Box::new(|_, _| false)))
            .unwrap();
        registry.notify("T", 0);
        assert!(matches!(
            parked.wait(Duration::from_secs(5)).await,
            Some(Wake::Dispatched(_))
        ));
    }

    #[tokio::test]
    async fn a_timed_out_pull_answers_itself_unless_the_dispatch_claimed_it_first() {
        let registry = LongPollRegistry::new(8, 8);
        let parked = registry.park("T", 0, 1, None).unwrap();
        let claim = parked.claim.clone();
        assert_eq!(parked.wait(Duration::from_millis(10)).await, None);
        assert!(!claim.take(), "the timed-out task holds the claim");

        let parked = registry.park("T", 1, 1, None).unwrap();
        assert!(parked.claim.take(), "a dispatch claims it mid-answer");
        assert_eq!(
            parked.wait(Duration::from_millis(10)).await,
            Some(Wake::Answered),
            "the task must not answer a second time"
        );
    }

    #[tokio::test]
    async fn one_connection_parks_at_most_its_bound_and_others_are_not_held_up() {
        let registry = LongPollRegistry::new(8, 2);
        let first = registry.park("T", 0, 1, None).unwrap();
        let _second = registry.park("T", 1, 1, None).unwrap();
        assert_eq!(
            registry.park("T", 2, 1, None).err(),
            Some(ParkRefused::ConnectionFull)
        );
        let _elsewhere = registry.park("T", 0, 2, None).unwrap();
        assert_eq!(
            registry.refused_counts()[1],
            ("max-parked-pulls-per-connection", 1)
        );
        drop(first);
        assert!(registry.park("T", 2, 1, None).is_ok(), "a slot came back");
    }
}
