//! The timer service's thread: enqueues the timer topic's queue into the store's timer log
//! and wheel, loads each second's slot into a small heap when the second starts, and
//! re-stores due messages to their real queue (see `crate::timer`).
//!
//! In a replication group every member enqueues (a replica from its confirmed log) and only
//! the master fires: after each batch it records the batch's timer-queue offsets in the
//! state log (`timerFired`), and the others mark those records of their own timer log fired,
//! in order. A new master thus fires only what the old one had not recorded: at most the
//! batch in flight at a failover is delivered again, and nothing is skipped.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use quiver_protocol::message as msg;
use quiver_store::record::{decode, property};
use quiver_store::{
    CommitLogOffset, GetStatus, QueueOffset, StoreError, TimerProgress, TimerRecord, TimerStore,
};
use tokio::sync::watch;

use crate::broker::Broker;
use crate::error::{chain, BrokerError, FailureLog};
use crate::service::produce::{ensure_topic, store_message};
use crate::state_log::{self, StateRecord, STATE_QUEUE, STATE_TOPIC};
use crate::timer::{TIMER_QUEUE, TIMER_REQUEST_PROPERTIES, TIMER_TOPIC};

const RETRY_WAIT: Duration = Duration::from_millis(100);
const ENQUEUE_BATCH: u32 = 1024;
/// Enqueue batches per round, so a backlog does not hold up firing.
const ENQUEUE_ROUNDS: usize = 8;
const FIRE_BATCH: usize = 256;
/// Seconds of margin the wheel has beyond the longest delay.
const WHEEL_MARGIN_SECS: u64 = 3_600;
/// A timer log with every record fired starts over once this long (40 B a record).
const RESET_AT_RECORDS: u64 = 1 << 16;
/// How often the fired time is checkpointed while nothing fires.
const IDLE_CHECKPOINT_MS: i64 = 1_000;

/// A loaded timer, ordered by deliver time then log index (the order timers fire in).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    deliver_ms: i64,
    index: u64,
    commit_log_offset: u64,
    /// Where the message is in the timer topic's queue: the same on every member.
    queue_offset: u64,
}

/// What becomes of the earliest loaded timer once it is due.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// This member's own mark passed it.
    AlreadyFired,
    /// The master recorded it fired (`timerFired`): marked, not re-stored.
    FiredElsewhere,
    Fire,
    /// A replica waits for the master's mark.
    Wait,
}

fn step(
    due: &Due,
    progress: &TimerProgress,
    fired_elsewhere: &BTreeSet<u64>,
    master: bool,
) -> Step {
    if progress.has_fired(due.deliver_ms, due.index) {
        Step::AlreadyFired
    } else if fired_elsewhere.contains(&due.queue_offset) {
        Step::FiredElsewhere
    } else if master {
        Step::Fire
    } else {
        Step::Wait
    }
}

/// The timer thread's state.
struct Service<'a> {
    broker: &'a Broker,
    store: TimerStore,
    progress: TimerProgress,
    /// Timers of the seconds loaded so far, not fired yet.
    heap: BinaryHeap<Reverse<Due>>,
    /// The newest second whose slot is in `heap`.
    loaded_second: i64,
    last_checkpoint_ms: i64,
    /// Timer-queue offsets the state log records fired, not matched with a record of this
    /// member's timer log yet.
    fired_elsewhere: BTreeSet<u64>,
    /// The state log offset the `timerFired` records are read from next; None before the
    /// first round.
    state_position: Option<u64>,
}

/// Runs the timer service on a thread of its own until `stop` flips.
pub async fn run(broker: Arc<Broker>, stop: watch::Receiver<bool>) {
    let wake = broker.timers().wake.clone();
    let mut stopping = stop.clone();
    let wake_at_stop = tokio::spawn(async move {
        // A dropped sender is a stop too.
        let _ = stopping.wait_for(|stop| *stop).await;
        wake.wake();
    });
    let worker = tokio::task::spawn_blocking(move || {
        let slots = broker.config().timer_max_delay_ms / 1000 + WHEEL_MARGIN_SECS;
        let dir = broker.config().data_dir.join("timer");
        match TimerStore::open(&dir, slots) {
            Ok(store) => Service::new(&broker, store).run(&stop),
            Err(error) => {
                tracing::error!(error = %quiver_store::error_chain(&error), "cannot open the timer store; timed messages are not delivered")
            }
        }
    });
    if let Err(error) = worker.await {
        tracing::error!(error = %chain(&BrokerError::Blocking(error)), "timer service failed");
    }
    wake_at_stop.abort();
}

impl<'a> Service<'a> {
    fn new(broker: &'a Broker, store: TimerStore) -> Service<'a> {
        let now = crate::now_ms();
        let mut progress = store.progress();
        if progress == TimerProgress::default() {
            // A new timer store: nothing fired, nothing is older than now.
            progress.fired_ms = now;
            progress.fired_index = u64::MAX;
        }
        // After a long stop, walking the ring once still finds every slot.
        let first = (progress.fired_ms.div_euclid(1000) - 1).max(now / 1000 - store_slots(broker));
        broker
            .timers()
            .pending
            .store(store.pending_on_open(), Ordering::Relaxed);
        // Retention keeps the messages of pending timers from the start.
        let lowest = store.advance_low_water(&mut progress).ok().flatten();
        broker
            .timers()
            .lowest_pending
            .store(lowest.unwrap_or(u64::MAX), Ordering::Release);
        Service {
            broker,
            store,
            progress,
            heap: BinaryHeap::new(),
            loaded_second: first,
            last_checkpoint_ms: now,
            fired_elsewhere: BTreeSet::new(),
            state_position: None,
        }
    }

    fn run(mut self, stop: &watch::Receiver<bool>) {
        tracing::info!(
            queue_offset = self.progress.queue_offset,
            timer_log = self.store.len(),
            fired_ms = self.progress.fired_ms,
            "timer service started"
        );
        // A full disk refuses every round: due timers wait in place until there is room.
        let mut failures = FailureLog::default();
        while !*stop.borrow() {
            // Only the master fires timers; a replica follows its marks.
            let master = self.broker.takes_writes();
            if !master && self.broker.replication().is_none() {
                self.broker.timers().wake.wait(RETRY_WAIT);
                continue;
            }
            let round = self.round(master);
            let wait = match &round {
                // A failing store (full disk) is retried at a calm pace, not in a busy loop.
                // A replica follows the master's marks at that pace too.
                Err(_) => RETRY_WAIT,
                Ok(true) if !master => RETRY_WAIT,
                Ok(true) => self.until_due(),
                Ok(false) => Duration::ZERO,
            };
            failures.record(
                "timed delivery",
                round.err().map(|e| quiver_store::error_chain(&e)),
            );
            self.publish();
            self.broker.timers().wake.wait(wait);
        }
        if let Err(error) = self.store.checkpoint(self.progress, true) {
            tracing::warn!(error = %quiver_store::error_chain(&error), "timer checkpoint at stop failed");
        }
    }

    /// One round: the master's marks read (in a group), then enqueue and fire. True when the
    /// timer queue is enqueued to its end.
    fn round(&mut self, master: bool) -> Result<bool, StoreError> {
        let in_group = self.broker.replication().is_some();
        if in_group {
            let from = match self.state_position {
                Some(position) => position,
                None => self.first_mark_position(),
            };
            let (fired, next) = state_log::timers_fired_since(self.broker.store(), from)?;
            self.fired_elsewhere.extend(fired);
            self.state_position = Some(next);
        }
        let caught_up = self.enqueue()?;
        self.fire(master)?;
        if in_group && master && self.broker.takes_writes() {
            // What the state log gained since it was read is this master's own marks.
            let store = self.broker.store();
            self.state_position = Some(store.written_max_offset(STATE_TOPIC, STATE_QUEUE).0);
        }
        Ok(caught_up)
    }

    /// Where the state log's `timerFired` records start to concern this member's timers: the
    /// master records a fire after the fired message, so no record before the message of
    /// its oldest pending timer (or, with none, of its first message not enqueued) does.
    fn first_mark_position(&self) -> u64 {
        let store = self.broker.store();
        let next = self
            .progress
            .queue_offset
            .max(store.min_offset(TIMER_TOPIC, TIMER_QUEUE).0);
        let from = self
            .broker
            .timers()
            .lowest_pending()
            .or_else(|| store.physical_offset_at(TIMER_TOPIC, TIMER_QUEUE, QueueOffset(next)))
            .unwrap_or_else(|| store.log_end());
        store.queue_offset_at(STATE_TOPIC, STATE_QUEUE, from).0
    }

    /// Until the next loaded timer is due or the next second's slot is to be loaded; a new
    /// message in the timer queue wakes the thread earlier.
    fn until_due(&self) -> Duration {
        let next_second = (self.loaded_second + 1).saturating_mul(1000);
        let next = self
            .heap
            .peek()
            .map_or(next_second, |due| due.0.deliver_ms.min(next_second));
        Duration::from_millis(u64::try_from(next.saturating_sub(crate::now_ms())).unwrap_or(0))
    }

    /// Appends newly parked messages to the timer log and checkpoints the queue offset; those
    /// of a second already loaded go to the heap as well. False while a backlog is left.
    fn enqueue(&mut self) -> Result<bool, StoreError> {
        let store = self.broker.store();
        for _ in 0..ENQUEUE_ROUNDS {
            let next = self
                .progress
                .queue_offset
                .max(store.min_offset(TIMER_TOPIC, TIMER_QUEUE).0);
            if next >= store.max_offset(TIMER_TOPIC, TIMER_QUEUE).0 {
                return Ok(true);
            }
            let got = store.get(
                TIMER_TOPIC,
                TIMER_QUEUE,
                QueueOffset(next),
                ENQUEUE_BATCH,
                64 * 1024 * 1024,
                &|_| true,
            )?;
            if got.status != GetStatus::Found {
                self.progress.queue_offset = got.next_begin_offset.0.max(next);
                continue;
            }
            let records = self.timer_records(&got.messages);
            let first = self.store.append(&records)?;
            for (i, record) in records.iter().enumerate() {
                if record.deliver_ms.div_euclid(1000) <= self.loaded_second {
                    self.heap.push(Reverse(Due {
                        deliver_ms: record.deliver_ms,
                        index: first + i as u64,
                        commit_log_offset: record.commit_log_offset,
                        queue_offset: record.queue_offset,
                    }));
                }
            }
            self.progress.queue_offset = got.next_begin_offset.0;
            self.progress.log_len = self.store.len();
            // No fsync here (it would hold up firing): a lost tail is re-enqueued on open.
            self.store.checkpoint(self.progress, false)?;
            let pending = &self.broker.timers().pending;
            pending.fetch_add(records.len() as u64, Ordering::Relaxed);
        }
        Ok(false)
    }

    /// The timer records of parked messages; a deliver time already passed by the fired
    /// mark is moved just after it, so the mark stays "everything before it fired".
    fn timer_records(&self, messages: &[bytes::Bytes]) -> Vec<TimerRecord> {
        let floor = self.progress.fired_ms.saturating_add(1);
        messages
            .iter()
            .filter_map(|raw| match decode(raw) {
                Ok((record, _)) => {
                    let deliver = property(&record.properties, msg::PROPERTY_TIMER_OUT_MS)
                        .and_then(|v| v.parse::<i64>().ok())
                        .unwrap_or(floor);
                    Some(TimerRecord {
                        deliver_ms: deliver.max(floor),
                        commit_log_offset: record.physical_offset.0,
                        queue_offset: record.queue_offset.0,
                        size: u32::try_from(raw.len()).unwrap_or(u32::MAX),
                    })
                }
                Err(error) => {
                    tracing::error!(%error, "undecodable timer message skipped");
                    None
                }
            })
            .collect()
    }

    /// Loads each second that has started and fires what is due, oldest first (a replica
    /// marks what the master recorded fired).
    fn fire(&mut self, master: bool) -> Result<(), StoreError> {
        let now = crate::now_ms();
        let now_second = now.div_euclid(1000);
        while self.loaded_second < now_second {
            let second = self.loaded_second + 1;
            for (index, record) in self.store.due_in_slot(second, &self.progress)? {
                self.heap.push(Reverse(Due {
                    deliver_ms: record.deliver_ms,
                    index,
                    commit_log_offset: record.commit_log_offset,
                    queue_offset: record.queue_offset,
                }));
            }
            self.loaded_second = second;
            if second < now_second {
                self.fire_until(second * 1000 + 999, master)?;
            }
        }
        self.fire_until(now, master)
    }

    /// Fires every loaded timer due by `until` in batches, checkpointing after each, then
    /// marks everything up to `until` fired once nothing due by then is left.
    fn fire_until(&mut self, until: i64, master: bool) -> Result<(), StoreError> {
        let mut moved = false;
        loop {
            let batch = self.due_batch(until, master, &mut moved);
            if batch.is_empty() {
                break;
            }
            if let Err(error) = self.fire_batch(&batch) {
                self.heap.extend(batch.into_iter().map(Reverse));
                return Err(error);
            }
            moved = true;
        }
        let nothing_due = self.heap.peek().is_none_or(|due| due.0.deliver_ms > until);
        if nothing_due && (until, u64::MAX) > (self.progress.fired_ms, self.progress.fired_index) {
            self.progress.fired_ms = until;
            self.progress.fired_index = u64::MAX;
        }
        let now = crate::now_ms();
        if moved || now - self.last_checkpoint_ms >= IDLE_CHECKPOINT_MS {
            self.checkpoint(now)?;
        }
        Ok(())
    }

    /// The next timers to fire, due by `until`, in order; those fired already on the way
    /// (here or by the master) are taken off the heap and marked, in order, and set `moved`.
    fn due_batch(&mut self, until: i64, master: bool, moved: &mut bool) -> Vec<Due> {
        let mut batch = Vec::with_capacity(FIRE_BATCH);
        while batch.len() < FIRE_BATCH {
            let Some(Reverse(due)) = self.heap.peek().copied() else {
                break;
            };
            if due.deliver_ms > until {
                break;
            }
            match step(&due, &self.progress, &self.fired_elsewhere, master) {
                Step::AlreadyFired => {
                    self.heap.pop();
                }
                // The mark moves past it only once what comes before it fired.
                Step::FiredElsewhere if batch.is_empty() => {
                    self.heap.pop();
                    self.fired_elsewhere.remove(&due.queue_offset);
                    self.mark_fired(due, 1);
                    *moved = true;
                }
                Step::Fire => {
                    self.heap.pop();
                    batch.push(due);
                }
                Step::FiredElsewhere | Step::Wait => break,
            }
        }
        batch
    }

    /// Moves the fired mark to `last` and takes `count` off the pending timers.
    fn mark_fired(&mut self, last: Due, count: usize) {
        self.progress.fired_ms = last.deliver_ms;
        self.progress.fired_index = last.index;
        let _ =
            self.broker
                .timers()
                .pending
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                    Some(p.saturating_sub(count as u64))
                });
    }

    /// Re-stores one batch to the real queues and records it fired at once (a kill -9 keeps
    /// the page cache, so the checkpoint outlives the process even unsynced).
    fn fire_batch(&mut self, batch: &[Due]) -> Result<(), StoreError> {
        let store = self.broker.store();
        let mut targets = Vec::with_capacity(batch.len());
        let mut latest_out = 0;
        for due in batch {
            let record = match store.read_record(CommitLogOffset(due.commit_log_offset)) {
                Ok(record) => record,
                Err(error) => {
                    tracing::error!(error = %quiver_store::error_chain(&error), offset = due.commit_log_offset, "timer message unreadable; dropped");
                    continue;
                }
            };
            if let Some(out) = property(&record.properties, msg::PROPERTY_TIMER_OUT_MS)
                .and_then(|v| v.parse::<i64>().ok())
            {
                latest_out = latest_out.max(out);
            }
            match crate::schedule::released(&record, &TIMER_REQUEST_PROPERTIES) {
                Some(target) => targets.push(target),
                None => tracing::warn!(
                    offset = due.commit_log_offset,
                    "timer message without REAL_TOPIC dropped"
                ),
            }
        }
        for topic in targets
            .iter()
            .map(|t| t.topic.clone())
            .collect::<std::collections::BTreeSet<_>>()
        {
            ensure_topic(self.broker, &topic);
        }
        if !targets.is_empty() {
            store_message(self.broker, &targets)?;
        }
        self.record_fired(batch);
        self.mark_fired(batch[batch.len() - 1], batch.len());
        self.checkpoint(crate::now_ms())?;
        let timers = self.broker.timers();
        timers
            .fired_total
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        if latest_out > 0 {
            timers
                .last_lateness_ms
                .store(crate::now_ms() - latest_out, Ordering::Relaxed);
        }
        Ok(())
    }

    /// In a group, records the batch fired in the state log, after its re-stored messages:
    /// a new master holding the record holds them. Not recorded (no longer master), the
    /// batch is fired again by the new master.
    fn record_fired(&self, batch: &[Due]) {
        if self.broker.replication().is_none() {
            return;
        }
        let record = StateRecord::TimerFired {
            queue_offsets: batch.iter().map(|due| due.queue_offset).collect(),
        };
        if let Err(error) = state_log::append(self.broker, &record) {
            tracing::warn!(error = %quiver_store::error_chain(&error), "fired timers not recorded for the replicas");
        }
    }

    /// Drops the marks of records this member's log counts fired already (read again at a
    /// start, or this member's own).
    fn forget_matched_marks(&mut self) -> Result<(), StoreError> {
        let below = if self.progress.low_water < self.store.len() {
            self.store.record(self.progress.low_water)?.queue_offset
        } else {
            self.progress.queue_offset
        };
        self.fired_elsewhere = self.fired_elsewhere.split_off(&below);
        Ok(())
    }

    fn checkpoint(&mut self, now: i64) -> Result<(), StoreError> {
        let lowest = self.store.advance_low_water(&mut self.progress)?;
        if lowest.is_none()
            && self
                .store
                .reset_if_drained(&mut self.progress, RESET_AT_RECORDS)?
        {
            tracing::debug!("timer log drained: started over");
        }
        self.broker
            .timers()
            .lowest_pending
            .store(lowest.unwrap_or(u64::MAX), Ordering::Release);
        self.store.checkpoint(self.progress, false)?;
        self.last_checkpoint_ms = now;
        self.forget_matched_marks()
    }

    fn publish(&self) {
        self.broker
            .timers()
            .enqueued_offset
            .store(self.progress.queue_offset, Ordering::Release);
    }
}

fn store_slots(broker: &Broker) -> i64 {
    i64::try_from(broker.config().timer_max_delay_ms / 1000 + WHEEL_MARGIN_SECS).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(deliver_ms: i64, index: u64, queue_offset: u64) -> Due {
        Due {
            deliver_ms,
            index,
            commit_log_offset: 0,
            queue_offset,
        }
    }

    #[test]
    fn a_master_fires_what_no_mark_covers_and_a_replica_waits_for_the_masters_mark() {
        let progress = TimerProgress {
            fired_ms: 1_000,
            fired_index: 4,
            ..TimerProgress::default()
        };
        let marked = BTreeSet::from([7]);
        let at = |due: Due, master| step(&due, &progress, &marked, master);
        assert_eq!(at(due(1_000, 4, 9), true), Step::AlreadyFired);
        assert_eq!(at(due(900, 8, 7), false), Step::AlreadyFired);
        // The mark is by timer-queue offset: this member's own index does not matter.
        assert_eq!(at(due(1_000, 5, 7), true), Step::FiredElsewhere);
        assert_eq!(at(due(2_000, 1, 7), false), Step::FiredElsewhere);
        assert_eq!(at(due(1_000, 5, 8), true), Step::Fire);
        assert_eq!(at(due(1_000, 5, 8), false), Step::Wait);
    }

    #[test]
    fn timers_fire_in_deliver_time_then_log_order() {
        let mut heap = BinaryHeap::from([
            Reverse(due(2_000, 0, 0)),
            Reverse(due(1_000, 2, 2)),
            Reverse(due(1_000, 1, 1)),
        ]);
        let order: Vec<u64> = std::iter::from_fn(|| heap.pop().map(|d| d.0.queue_offset)).collect();
        assert_eq!(order, [1, 2, 0]);
    }
}
