//! The confirm fence of `publish_on_confirm`: units of records the group has not confirmed
//! yet are written but not visible; `raise` and `release` make them visible in log order.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::consume_queue::ConsumeQueue;

/// A queue whose visible end the fence moves.
pub(crate) trait Fenced {
    /// Makes the units below `max` visible.
    fn publish(&self, max: u64);
}

impl Fenced for ConsumeQueue {
    fn publish(&self, max: u64) {
        ConsumeQueue::publish(self, max)
    }
}

/// A unit written but not yet visible: its queue's max offset moves to `max` once the
/// confirmed offset reaches `end`, its record's end.
pub(crate) struct PendingUnit<Q = ConsumeQueue> {
    pub queue: Arc<Q>,
    pub max: u64,
    pub start: u64,
    pub end: u64,
}

struct FenceState<Q> {
    /// Records below this are confirmed (acknowledged by the group): their units are visible.
    confirmed: u64,
    /// Units of unconfirmed records, in log order.
    pending: VecDeque<PendingUnit<Q>>,
}

/// The read fence. Disabled (no `publish_on_confirm`), it only records the confirmed
/// offset. Its lock is taken after the store's write lock when both are.
pub(crate) struct ConfirmFence<Q = ConsumeQueue> {
    enabled: bool,
    state: Mutex<FenceState<Q>>,
}

impl<Q: Fenced> ConfirmFence<Q> {
    /// A fence with everything below `confirmed` confirmed and nothing pending.
    pub(crate) fn new(enabled: bool, confirmed: u64) -> Self {
        ConfirmFence {
            enabled,
            state: Mutex::new(FenceState {
                confirmed,
                pending: VecDeque::new(),
            }),
        }
    }

    /// Whether units wait for confirmation (`publish_on_confirm`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Records below this are confirmed.
    pub(crate) fn confirmed(&self) -> u64 {
        self.state.lock().confirmed
    }

    /// Raises the confirmed offset to `offset` (lower values are ignored).
    pub(crate) fn raise(&self, offset: u64) {
        let mut state = self.state.lock();
        state.confirmed = state.confirmed.max(offset);
    }

    /// Whether the record at `offset`, `len` bytes, may be read by clients: enabled, only
    /// once it is confirmed.
    pub(crate) fn readable(&self, offset: u64, len: usize) -> bool {
        !self.enabled || offset + len as u64 <= self.state.lock().confirmed
    }

    /// The end of `queue`'s units that wait for confirmation, if it has any.
    pub(crate) fn pending_end(&self, queue: &Arc<Q>) -> Option<u64> {
        if !self.enabled {
            return None;
        }
        self.state
            .lock()
            .pending
            .iter()
            .rev()
            .find(|unit| Arc::ptr_eq(&unit.queue, queue))
            .map(|unit| unit.max)
    }

    /// Whether `queue` has units written up to at least `offset` that wait for confirmation.
    pub(crate) fn written_unconfirmed(&self, queue: &Arc<Q>, offset: u64) -> bool {
        self.pending_end(queue).is_some_and(|end| offset <= end)
    }

    /// Where queue flushes cover every unit below `log_end` from: pending units are not
    /// flushed (flushes stop at the published max), so a checkpoint claims queues only up to
    /// the first of them (recovery re-dispatches the rest).
    pub(crate) fn durable_to(&self, log_end: u64) -> u64 {
        if !self.enabled {
            return log_end;
        }
        self.state
            .lock()
            .pending
            .front()
            .map_or(log_end, |p| p.start.min(log_end))
    }

    /// The confirmed offset a checkpoint records (enabled only), at most `cap`.
    pub(crate) fn checkpointed(&self, cap: u64) -> Option<u64> {
        self.enabled.then(|| self.state.lock().confirmed.min(cap))
    }

    /// At open: the records from `confirmed` on were not known confirmed when the store
    /// stopped. `held` (their units, in log order) are hidden again (each queue shows only
    /// the units before its first such record) and wait, as a new append's would.
    pub(crate) fn hold(&self, confirmed: u64, held: Vec<PendingUnit<Q>>) {
        let mut state = self.state.lock();
        state.confirmed = confirmed;
        let mut hidden: Vec<&Arc<Q>> = Vec::new();
        for unit in &held {
            if !hidden.iter().any(|q| Arc::ptr_eq(q, &unit.queue)) {
                unit.queue.publish(unit.max - 1);
                hidden.push(&unit.queue);
            }
        }
        state.pending.extend(held);
    }

    /// Queues the units of records just appended, in log order, under one lock.
    pub(crate) fn pend(&self, units: impl Iterator<Item = PendingUnit<Q>>) {
        self.state.lock().pending.extend(units);
    }

    /// Publishes the pending units the confirmed offset covers, in order; returns each queue
    /// that grew with its new max offset, for the dispatch hook.
    pub(crate) fn release(&self) -> Vec<(Arc<Q>, u64)> {
        let mut grown: Vec<(Arc<Q>, u64)> = Vec::new();
        let mut state = self.state.lock();
        let confirmed = state.confirmed;
        while state.pending.front().is_some_and(|p| p.end <= confirmed) {
            let unit = state.pending.pop_front().expect("checked above");
            unit.queue.publish(unit.max);
            match grown.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &unit.queue)) {
                Some((_, max)) => *max = unit.max,
                None => grown.push((unit.queue, unit.max)),
            }
        }
        grown
    }

    /// Drops the pending units of records from `offset` on and lowers the confirmed offset
    /// to it (a truncation).
    pub(crate) fn truncate(&self, offset: u64) {
        let mut state = self.state.lock();
        let kept = state.pending.partition_point(|p| p.start < offset);
        state.pending.truncate(kept);
        state.confirmed = state.confirmed.min(offset);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A queue that remembers its visible end.
    #[derive(Default)]
    struct Queue(AtomicU64);

    impl Fenced for Queue {
        fn publish(&self, max: u64) {
            self.0.store(max, Ordering::Relaxed);
        }
    }

    impl Queue {
        fn visible(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    fn unit(queue: &Arc<Queue>, max: u64, start: u64, end: u64) -> PendingUnit<Queue> {
        PendingUnit {
            queue: Arc::clone(queue),
            max,
            start,
            end,
        }
    }

    #[test]
    fn units_become_visible_in_log_order_as_the_confirmed_offset_rises() {
        let fence = ConfirmFence::new(true, 0);
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        fence.pend(
            [
                unit(&a, 1, 0, 100),
                unit(&b, 1, 100, 200),
                unit(&a, 2, 200, 300),
            ]
            .into_iter(),
        );
        assert_eq!(fence.pending_end(&a), Some(2));
        assert!(fence.written_unconfirmed(&a, 2));
        assert!(!fence.written_unconfirmed(&a, 3));
        assert_eq!(fence.durable_to(1_000), 0);
        assert!(!fence.readable(0, 100));

        fence.raise(150);
        let grown = fence.release();
        assert_eq!(grown.len(), 1);
        assert!(Arc::ptr_eq(&grown[0].0, &a) && grown[0].1 == 1);
        assert_eq!((a.visible(), b.visible()), (1, 0));
        assert!(fence.readable(0, 100) && !fence.readable(100, 100));
        assert_eq!(fence.durable_to(1_000), 100);

        fence.raise(10); // lower values are ignored
        assert_eq!(fence.confirmed(), 150);
        fence.raise(300);
        let grown = fence.release();
        // In log order: b's unit came first.
        assert!(Arc::ptr_eq(&grown[0].0, &b) && Arc::ptr_eq(&grown[1].0, &a));
        assert_eq!(
            grown.iter().map(|(_, max)| *max).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!((a.visible(), b.visible()), (2, 1));
        assert_eq!(fence.pending_end(&a), None);
        assert_eq!(fence.durable_to(1_000), 1_000);
        assert_eq!(fence.checkpointed(250), Some(250));
    }

    #[test]
    fn hold_hides_each_queue_from_its_first_unconfirmed_unit() {
        let fence = ConfirmFence::new(true, 500);
        let (a, b) = (Arc::new(Queue::default()), Arc::new(Queue::default()));
        a.publish(9);
        b.publish(4);
        fence.hold(
            100,
            vec![
                unit(&a, 7, 100, 200),
                unit(&a, 8, 200, 300),
                unit(&b, 4, 300, 400),
            ],
        );
        assert_eq!((a.visible(), b.visible()), (6, 3));
        assert_eq!(fence.confirmed(), 100);
        fence.raise(250);
        fence.release();
        assert_eq!((a.visible(), b.visible()), (7, 3));
    }

    #[test]
    fn truncation_drops_pending_units_from_the_offset_and_lowers_the_confirmed_offset() {
        let fence = ConfirmFence::new(true, 0);
        let a = Arc::new(Queue::default());
        fence.pend([unit(&a, 1, 0, 100), unit(&a, 2, 100, 200)].into_iter());
        fence.raise(50);
        fence.truncate(100);
        assert_eq!(fence.pending_end(&a), Some(1));
        fence.truncate(20);
        assert_eq!(fence.confirmed(), 20);
        fence.truncate(0);
        assert_eq!(fence.pending_end(&a), None);
    }

    #[test]
    fn a_disabled_fence_only_records_the_confirmed_offset() {
        let fence: ConfirmFence<Queue> = ConfirmFence::new(false, 100);
        let a = Arc::new(Queue::default());
        assert!(fence.readable(1_000, 1_000));
        assert_eq!(fence.pending_end(&a), None);
        assert_eq!(fence.durable_to(700), 700);
        assert_eq!(fence.checkpointed(50), None);
        fence.raise(300);
        assert_eq!(fence.confirmed(), 300);
    }
}
