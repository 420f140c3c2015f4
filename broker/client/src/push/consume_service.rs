//! The consume service (RocketMQ's `ConsumeMessageConcurrentlyService` and
//! `ConsumeMessageOrderlyService`): runs the listener, sends failed messages back (or retries
//! them in place in orderly mode), and moves and commits the group's offsets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use quiver_protocol::offset::QueueOffset;
use tokio::sync::watch;

use crate::error::Result;
use crate::message::ReceivedMessage;
use crate::offset_store::{OffsetTable, UpdateMode};
use crate::ops::SendBackTarget;
use crate::process_queue::{CommitPoint, ProcessQueue};
use crate::MessageQueue;

use super::queue_state::QueueState;
use super::{ConsumeMode, ConsumeOutcome, Inner};

/// Takes pulled messages in flight; returns those not already there (a re-pulled offset is
/// neither counted nor consumed twice).
fn take_in_fresh(
    pq: &mut ProcessQueue<ReceivedMessage>,
    messages: Vec<ReceivedMessage>,
) -> Vec<ReceivedMessage> {
    let mut fresh = Vec::with_capacity(messages.len());
    for message in messages {
        if pq.put_messages([(message.queue_offset, message.size_bytes, message.clone())]) == 1 {
            fresh.push(message);
        }
    }
    fresh
}

/// A concurrent batch after its listener call and send-backs.
#[derive(Debug, PartialEq, Eq)]
struct Settled {
    /// Consumed or sent back: the broker redelivers a sent-back message through %RETRY%group.
    consumed: Vec<QueueOffset>,
    /// Send-back failed: consumed again locally, one more attempt counted.
    again: Vec<ReceivedMessage>,
}

fn settle_batch(batch: &[ReceivedMessage], send_back_failed: &[QueueOffset]) -> Settled {
    let mut settled = Settled {
        consumed: Vec::with_capacity(batch.len()),
        again: Vec::new(),
    };
    for message in batch {
        if send_back_failed.contains(&message.queue_offset) {
            let mut retry = message.clone();
            retry.reconsume_times += 1;
            settled.again.push(retry);
        } else {
            settled.consumed.push(message.queue_offset);
        }
    }
    settled
}

/// Concurrent mode: forgets the consumed messages and moves the local offset to the smallest
/// one still in flight, unless the queue was taken away; returns the local offset after that.
fn record_consumed(
    pq: &mut ProcessQueue<ReceivedMessage>,
    offsets: &OffsetTable<MessageQueue>,
    queue: &MessageQueue,
    consumed: &[QueueOffset],
) -> Option<QueueOffset> {
    match pq.remove_messages(consumed) {
        CommitPoint::Advance(offset) if !pq.is_dropped() => {
            Some(offsets.update(queue, offset, UpdateMode::IncreaseOnly))
        }
        _ => None,
    }
}

/// What orderly mode does after a listener call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OrderlyVerdict {
    Commit,
    /// Out of local attempts: park the batch in the DLQ, then commit past it (as RocketMQ does).
    ParkInDeadLetter,
    /// Put the batch back, one more attempt counted, and consume it again after a pause.
    RetryInPlace,
}

fn orderly_verdict(
    outcome: ConsumeOutcome,
    batch: &[ReceivedMessage],
    max_reconsume_times: i32,
) -> OrderlyVerdict {
    let exhausted = batch
        .iter()
        .all(|m| m.reconsume_times + 1 >= max_reconsume_times);
    match outcome {
        ConsumeOutcome::Success => OrderlyVerdict::Commit,
        ConsumeOutcome::Retry if exhausted && !batch.is_empty() => OrderlyVerdict::ParkInDeadLetter,
        ConsumeOutcome::Retry => OrderlyVerdict::RetryInPlace,
    }
}

/// Orderly mode, after a batch: a done (committed or parked) batch is forgotten and the
/// offset moves past it; otherwise it goes back to be consumed first, one more attempt counted.
fn finish_orderly_batch(pq: &mut ProcessQueue<ReceivedMessage>, done: bool) -> Option<QueueOffset> {
    if !done {
        pq.return_taken_with(|m| m.reconsume_times += 1);
        return None;
    }
    match pq.commit_taken() {
        CommitPoint::Advance(offset) => Some(offset),
        CommitPoint::Unchanged => None,
    }
}

impl Inner {
    /// Hands pulled messages to the listener; false when the queue was stopped meanwhile.
    pub(super) async fn consume_pulled(
        self: &Arc<Self>,
        state: &Arc<QueueState>,
        messages: Vec<ReceivedMessage>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        match self.config.mode {
            ConsumeMode::Concurrent => {
                self.dispatch_concurrently(state, messages);
                true
            }
            ConsumeMode::Orderly => {
                state.process_queue.lock().put_messages(
                    messages
                        .into_iter()
                        .map(|m| (m.queue_offset, m.size_bytes, m)),
                );
                self.consume_orderly(state, stop).await
            }
        }
    }

    fn dispatch_concurrently(
        self: &Arc<Self>,
        state: &Arc<QueueState>,
        messages: Vec<ReceivedMessage>,
    ) {
        let fresh = take_in_fresh(&mut state.process_queue.lock(), messages);
        for batch in fresh.chunks(self.config.consume_batch_size) {
            tokio::spawn(self.clone().consume_batch(state.clone(), batch.to_vec()));
        }
    }

    async fn call_listener(&self, batch: Arc<[ReceivedMessage]>) -> ConsumeOutcome {
        let listener = self.listener.clone();
        match tokio::task::spawn_blocking(move || listener(&batch)).await {
            Ok(outcome) => outcome,
            Err(join_error) => {
                // A panicking listener counts as a failed batch, as an exception does in Java.
                tracing::error!(%join_error, "listener panicked");
                ConsumeOutcome::Retry
            }
        }
    }

    /// Boxed because a failed batch schedules itself again (a recursive future).
    fn consume_batch(
        self: Arc<Self>,
        state: Arc<QueueState>,
        batch: Vec<ReceivedMessage>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let Ok(_permit) = self.consume_permits.clone().acquire_owned().await else {
                return;
            };
            // Not started before the stop: leave it for the next owner of the queue.
            if state.is_dropped() || state.is_stopping() {
                return;
            }
            let batch: Arc<[ReceivedMessage]> = batch.into();
            let send_back_failed = match self.call_listener(batch.clone()).await {
                ConsumeOutcome::Success => Vec::new(),
                ConsumeOutcome::Retry => self.send_back_for_retry(&batch).await,
            };
            let Settled { consumed, again } = settle_batch(&batch, &send_back_failed);
            record_consumed(
                &mut state.process_queue.lock(),
                &self.offsets,
                &state.queue,
                &consumed,
            );
            state.space_freed.notify_waiters();
            if !again.is_empty() && !state.is_dropped() {
                let pause = self.config.retry_pause;
                let inner = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    inner.consume_batch(state, again).await;
                });
            }
        })
    }

    /// Sends each message to %RETRY%group; returns the offsets whose send-back failed.
    async fn send_back_for_retry(&self, batch: &[ReceivedMessage]) -> Vec<QueueOffset> {
        let target = SendBackTarget::Retry {
            delay_level: self.config.retry_delay_level,
        };
        let mut failed = Vec::new();
        for message in batch {
            let sent = self
                .core
                .send_back(
                    self.group(),
                    message,
                    target,
                    self.config.max_reconsume_times,
                )
                .await;
            if let Err(error) = sent {
                tracing::warn!(msg_id = %message.msg_id(), %error, "send-back failed; consuming again locally");
                failed.push(message.queue_offset);
            }
        }
        failed
    }

    /// Sends each message to %DLQ%group; true when all of them got there.
    async fn park_in_dead_letter(&self, batch: &[ReceivedMessage]) -> bool {
        let mut parked = true;
        for message in batch {
            let max = self.config.max_reconsume_times;
            if let Err(error) = self
                .core
                .send_back(self.group(), message, SendBackTarget::DeadLetter, max)
                .await
            {
                tracing::warn!(msg_id = %message.msg_id(), %error, "could not park an exhausted message");
                parked = false;
            }
        }
        parked
    }

    /// Consumes everything pulled for this queue in order; false when the queue was stopped.
    async fn consume_orderly(
        &self,
        state: &Arc<QueueState>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        loop {
            let batch: Vec<ReceivedMessage> = state
                .process_queue
                .lock()
                .take_messages(self.config.consume_batch_size)
                .into_iter()
                .map(|(_, m)| m)
                .collect();
            if batch.is_empty() {
                return true;
            }
            if state.is_dropped() || state.is_stopping() {
                state.process_queue.lock().return_taken();
                return false;
            }
            if !state.holds_lock() {
                // Another member may own the queue now: wait for the next lock renewal.
                state.process_queue.lock().return_taken();
                tokio::select! {
                    _ = tokio::time::sleep(self.config.retry_pause) => continue,
                    _ = stop.changed() => return false,
                }
            }
            let batch: Arc<[ReceivedMessage]> = batch.into();
            let outcome = {
                let _permit = self.consume_permits.acquire().await;
                self.call_listener(batch.clone()).await
            };
            let done = match orderly_verdict(outcome, &batch, self.config.max_reconsume_times) {
                OrderlyVerdict::Commit => true,
                OrderlyVerdict::ParkInDeadLetter => self.park_in_dead_letter(&batch).await,
                OrderlyVerdict::RetryInPlace => false,
            };
            let moved_to = finish_orderly_batch(&mut state.process_queue.lock(), done);
            if done {
                if let Some(offset) = moved_to {
                    self.offsets
                        .update(&state.queue, offset, UpdateMode::IncreaseOnly);
                }
                state.space_freed.notify_waiters();
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_pause) => {}
                _ = stop.changed() => return false,
            }
        }
    }

    /// The persist timer: commits every assigned queue's offset without waiting for answers.
    pub(super) async fn persist_all(&self) {
        let assigned: Vec<MessageQueue> = self.assignments.lock().keys().cloned().collect();
        for queue in assigned {
            if let Some(offset) = self.offsets.read(&queue) {
                if let Err(error) = self
                    .core
                    .update_consumer_offset(self.group(), &queue, offset, false)
                    .await
                {
                    tracing::debug!(%error, queue = %queue, "offset persist failed");
                }
            }
        }
    }

    /// Commits one queue's offset and waits for the broker's answer.
    pub(super) async fn persist_offset(&self, queue: &MessageQueue) -> Result<()> {
        match self.offsets.read(queue) {
            Some(offset) => {
                self.core
                    .update_consumer_offset(self.group(), queue, offset, true)
                    .await
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::test_support::{message, messages, queue};

    fn offsets(values: &[u64]) -> Vec<QueueOffset> {
        values.iter().map(|v| QueueOffset(*v)).collect()
    }

    fn in_flight(pulled: std::ops::Range<u64>) -> ProcessQueue<ReceivedMessage> {
        let mut pq = ProcessQueue::new();
        take_in_fresh(&mut pq, messages(pulled));
        pq
    }

    #[test]
    fn a_re_pulled_message_is_dispatched_once() {
        let mut pq = ProcessQueue::new();
        assert_eq!(take_in_fresh(&mut pq, messages(10..13)).len(), 3);
        let fresh = take_in_fresh(&mut pq, messages(12..15));
        assert_eq!(
            fresh.iter().map(|m| m.queue_offset).collect::<Vec<_>>(),
            offsets(&[13, 14])
        );
        assert_eq!((pq.message_count(), pq.bytes_in_flight()), (5, 500));
    }

    #[test]
    fn out_of_order_completions_commit_only_below_the_oldest_in_flight() {
        let mut pq = in_flight(10..14);
        let table = OffsetTable::new();
        let q = queue();
        // 11 and 13 finish first: 10 is still running, so nothing past it is committed.
        assert_eq!(
            record_consumed(&mut pq, &table, &q, &offsets(&[13])),
            Some(QueueOffset(10))
        );
        assert_eq!(
            record_consumed(&mut pq, &table, &q, &offsets(&[11])),
            Some(QueueOffset(10))
        );
        assert_eq!(
            record_consumed(&mut pq, &table, &q, &offsets(&[10])),
            Some(QueueOffset(12))
        );
        assert_eq!(
            record_consumed(&mut pq, &table, &q, &offsets(&[12])),
            Some(QueueOffset(14))
        );
        assert_eq!(table.read(&q), Some(QueueOffset(14)));
        assert_eq!(pq.message_count(), 0);
    }

    #[test]
    fn the_local_offset_never_moves_back() {
        let mut pq = in_flight(10..12);
        let table = OffsetTable::new();
        let q = queue();
        // Set ahead by an earlier empty pull.
        table.update(&q, QueueOffset(50), UpdateMode::IncreaseOnly);
        assert_eq!(
            record_consumed(&mut pq, &table, &q, &offsets(&[10])),
            Some(QueueOffset(50))
        );
    }

    #[test]
    fn a_taken_away_queue_no_longer_moves_its_offset() {
        let mut pq = in_flight(10..12);
        let table = OffsetTable::new();
        let q = queue();
        table.update(&q, QueueOffset(10), UpdateMode::Overwrite);
        pq.mark_dropped();
        assert_eq!(
            record_consumed(&mut pq, &table, &q, &offsets(&[10, 11])),
            None
        );
        assert_eq!(table.read(&q), Some(QueueOffset(10)));
        // The messages are still forgotten, so flow control frees their room.
        assert_eq!(pq.message_count(), 0);
    }

    #[test]
    fn a_successful_batch_is_consumed_entirely() {
        let settled = settle_batch(&messages(5..8), &[]);
        assert_eq!(settled.consumed, offsets(&[5, 6, 7]));
        assert!(settled.again.is_empty());
    }

    #[test]
    fn a_failed_send_back_is_consumed_again_locally_and_holds_the_offset() {
        let batch = messages(5..8);
        let settled = settle_batch(&batch, &offsets(&[6]));
        // 5 and 7 were sent back (consumed here); 6 could not be and comes back.
        assert_eq!(settled.consumed, offsets(&[5, 7]));
        assert_eq!(settled.again.len(), 1);
        assert_eq!(settled.again[0].queue_offset, QueueOffset(6));
        assert_eq!(settled.again[0].reconsume_times, 1);
        assert_eq!(settled.again[0].body, batch[1].body);

        let mut pq = in_flight(5..8);
        let table = OffsetTable::new();
        assert_eq!(
            record_consumed(&mut pq, &table, &queue(), &settled.consumed),
            Some(QueueOffset(6))
        );
        assert_eq!(pq.message_count(), 1);
    }

    #[test]
    fn orderly_success_commits_and_a_failure_retries_in_place() {
        let batch = messages(0..2);
        assert_eq!(
            orderly_verdict(ConsumeOutcome::Success, &batch, 16),
            OrderlyVerdict::Commit
        );
        assert_eq!(
            orderly_verdict(ConsumeOutcome::Retry, &batch, 16),
            OrderlyVerdict::RetryInPlace
        );
    }

    #[test]
    fn orderly_parks_a_batch_once_every_message_used_its_attempts() {
        let mut tired = message(0);
        tired.reconsume_times = 15;
        let mut fresh = message(1);
        fresh.reconsume_times = 3;
        // The 16th attempt of a max-16 group failed: to the DLQ.
        assert_eq!(
            orderly_verdict(ConsumeOutcome::Retry, std::slice::from_ref(&tired), 16),
            OrderlyVerdict::ParkInDeadLetter
        );
        // One message still has attempts left: the whole batch is retried.
        assert_eq!(
            orderly_verdict(ConsumeOutcome::Retry, &[tired.clone(), fresh], 16),
            OrderlyVerdict::RetryInPlace
        );
        // Success after many attempts is a plain commit.
        assert_eq!(
            orderly_verdict(ConsumeOutcome::Success, &[tired], 16),
            OrderlyVerdict::Commit
        );
    }

    #[test]
    fn an_orderly_retry_comes_back_first_with_one_more_attempt() {
        let mut pq = in_flight(20..23);
        assert_eq!(pq.take_messages(2).len(), 2);
        assert_eq!(finish_orderly_batch(&mut pq, false), None);
        let again = pq.take_messages(2);
        assert_eq!(
            again
                .iter()
                .map(|(o, m)| (o.0, m.reconsume_times))
                .collect::<Vec<_>>(),
            vec![(20, 1), (21, 1)]
        );
        assert_eq!(finish_orderly_batch(&mut pq, true), Some(QueueOffset(22)));
        assert_eq!((pq.message_count(), pq.bytes_in_flight()), (1, 100));
        // Nothing taken out: nothing to commit.
        assert_eq!(finish_orderly_batch(&mut pq, true), None);
        assert_eq!(pq.take_messages(5).len(), 1);
        assert_eq!(finish_orderly_batch(&mut pq, true), Some(QueueOffset(23)));
    }
}
