//! The pull loop of one assigned queue (RocketMQ's `PullMessageService` and the pull callback
//! of `DefaultMQPushConsumerImpl`): flow control, the long-polling pull, and what each pull
//! status means for the next offset and the local commit offset.

use std::sync::Arc;

use quiver_protocol::offset::QueueOffset;
use tokio::sync::watch;

use crate::error::Result;
use crate::message::ReceivedMessage;
use crate::offset_store::UpdateMode;
use crate::ops::{PullResult, PullSpec, PullStatus};
use crate::subscription::Subscription;

use super::queue_state::QueueState;
use super::{Inner, PushConsumerConfig};

/// Flow control of one queue.
#[derive(Clone, Copy, Debug)]
struct FlowLimits {
    max_messages: usize,
    max_bytes: u64,
    pull_batch_size: u32,
}

impl FlowLimits {
    fn of(config: &PushConsumerConfig) -> Self {
        Self {
            max_messages: config.max_in_flight_messages_per_queue,
            max_bytes: config.max_in_flight_bytes_per_queue,
            pull_batch_size: config.pull_batch_size,
        }
    }

    /// Whether a queue holding this much in flight may pull again.
    fn has_room(&self, messages: usize, bytes: u64) -> bool {
        messages < self.max_messages && bytes < self.max_bytes
    }

    /// Messages to ask for: never more than the room left, so the message limit is a hard cap.
    fn pull_size(&self, messages: usize) -> u32 {
        let room = self.max_messages.saturating_sub(messages);
        self.pull_batch_size
            .min(u32::try_from(room).unwrap_or(u32::MAX))
            .max(1)
    }
}

/// The offset piggy-backed on a pull: none until something was consumed past offset 0.
fn piggyback_commit(local: Option<QueueOffset>) -> Option<QueueOffset> {
    local.filter(|o| o.0 > 0)
}

/// What the loop does with a pull's answer.
#[derive(Debug, PartialEq, Eq)]
enum PullStep {
    /// Hand the messages to the consume service and pull next from `next`.
    Consume {
        messages: Vec<ReceivedMessage>,
        next: QueueOffset,
    },
    /// Nothing to consume; pull next from `next`. `commit` is set when nothing is in flight:
    /// then everything before `next` is consumed (or filtered out).
    Idle {
        next: QueueOffset,
        commit: Option<QueueOffset>,
    },
    /// The offset was out of the queue's range: overwrite the local offset with `next`,
    /// commit it at once and pull from there.
    Relocate { next: QueueOffset },
}

/// The step for a pull made at `requested` while `in_flight` messages were unconsumed.
fn next_step(result: PullResult, requested: QueueOffset, in_flight: usize) -> PullStep {
    match result.status {
        PullStatus::Found(messages) => PullStep::Consume {
            messages,
            next: result.next_begin_offset,
        },
        PullStatus::NoNewMessage | PullStatus::NoMatchedMessage => {
            let next = result.next_begin_offset.max(requested);
            PullStep::Idle {
                next,
                commit: (in_flight == 0).then_some(next),
            }
        }
        PullStatus::OffsetIllegal => PullStep::Relocate {
            next: result.next_begin_offset,
        },
    }
}

impl Inner {
    /// Waits until the queue has room again; false when the queue was stopped.
    async fn wait_for_room(&self, state: &QueueState, stop: &mut watch::Receiver<bool>) -> bool {
        let limits = FlowLimits::of(&self.config);
        loop {
            let freed = state.space_freed.notified();
            {
                let pq = state.process_queue.lock();
                if pq.is_dropped() {
                    return false;
                }
                if limits.has_room(pq.message_count(), pq.bytes_in_flight()) {
                    return true;
                }
            }
            tokio::select! {
                _ = freed => {}
                _ = stop.changed() => return false,
            }
        }
    }

    /// One long-polling pull at `offset`, carrying the local commit offset.
    async fn pull_at(
        &self,
        state: &QueueState,
        subscription: &Subscription,
        offset: QueueOffset,
    ) -> Result<PullResult> {
        let in_flight = state.process_queue.lock().message_count();
        let spec = PullSpec {
            group: self.group(),
            queue: &state.queue,
            offset,
            max_messages: FlowLimits::of(&self.config).pull_size(in_flight),
            subscription,
            commit_offset: piggyback_commit(self.offsets.read(&state.queue)),
            suspend: Some(self.config.long_poll),
            epoch: state.pulled_epoch(),
        };
        let pulled = self.core.pull(&spec).await?;
        state.set_pulled_epoch(pulled.epoch);
        Ok(pulled)
    }

    pub(super) async fn pull_loop(self: Arc<Self>, state: Arc<QueueState>, start: QueueOffset) {
        let mut stop = state.stop.subscribe();
        let Some(subscription) = self
            .subscriptions
            .iter()
            .find(|s| s.topic == state.queue.topic)
            .cloned()
        else {
            return;
        };
        let mut next = start;
        loop {
            if *stop.borrow() || !self.wait_for_room(&state, &mut stop).await {
                return;
            }
            let pulled = tokio::select! {
                pulled = self.pull_at(&state, &subscription, next) => pulled,
                _ = stop.changed() => return,
            };
            let result = match pulled {
                Ok(result) => result,
                Err(error) => {
                    tracing::debug!(queue = %state.queue, %error, "pull failed; backing off");
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.retry_pause) => continue,
                        _ = stop.changed() => return,
                    }
                }
            };
            let in_flight = state.process_queue.lock().message_count();
            let step = next_step(result, next, in_flight);
            match self.follow(&state, step, next, &mut stop).await {
                Some(after) => next = after,
                None => return,
            }
        }
    }

    /// Acts on a pull made at `pulled_at`; returns where to pull next, None once stopped.
    async fn follow(
        self: &Arc<Self>,
        state: &Arc<QueueState>,
        step: PullStep,
        pulled_at: QueueOffset,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<QueueOffset> {
        match step {
            PullStep::Consume { messages, next } => self
                .consume_pulled(state, messages, stop)
                .await
                .then_some(next),
            PullStep::Idle { next, commit } => {
                if let Some(offset) = commit {
                    self.offsets
                        .update(&state.queue, offset, UpdateMode::IncreaseOnly);
                }
                Some(next)
            }
            PullStep::Relocate { next } => {
                tracing::warn!(queue = %state.queue, from = %pulled_at, to = %next, "offset out of range; moving");
                self.offsets
                    .update(&state.queue, next, UpdateMode::Overwrite);
                if let Err(error) = self.persist_offset(&state.queue).await {
                    tracing::warn!(queue = %state.queue, %error, "could not commit the corrected offset");
                }
                Some(next)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push::test_support::messages;

    const LIMITS: FlowLimits = FlowLimits {
        max_messages: 100,
        max_bytes: 10_000,
        pull_batch_size: 32,
    };

    fn answer(status: PullStatus, next_begin: u64) -> PullResult {
        PullResult {
            status,
            next_begin_offset: QueueOffset(next_begin),
            min_offset: QueueOffset(0),
            max_offset: QueueOffset(500),
            epoch: None,
        }
    }

    #[test]
    fn pulling_stops_at_either_in_flight_limit() {
        assert!(LIMITS.has_room(0, 0));
        assert!(LIMITS.has_room(99, 9_999));
        assert!(!LIMITS.has_room(100, 0));
        assert!(!LIMITS.has_room(0, 10_000));
        assert!(!LIMITS.has_room(150, 20_000));
    }

    #[test]
    fn a_pull_never_asks_for_more_than_the_room_left() {
        assert_eq!(LIMITS.pull_size(0), 32);
        assert_eq!(LIMITS.pull_size(68), 32);
        assert_eq!(LIMITS.pull_size(90), 10);
        assert_eq!(LIMITS.pull_size(99), 1);
        // Only reached when the byte limit let it through: still a valid request.
        assert_eq!(LIMITS.pull_size(100), 1);
    }

    #[test]
    fn the_defaults_pull_32_at_a_time_up_to_1000_messages() {
        let config = PushConsumerConfig::new("127.0.0.1:10911", "g");
        let limits = FlowLimits::of(&config);
        assert_eq!(limits.pull_size(0), 32);
        assert_eq!(limits.pull_size(990), 10);
        assert!(limits.has_room(999, 100 * 1024 * 1024 - 1));
        assert!(!limits.has_room(999, 100 * 1024 * 1024));
    }

    #[test]
    fn nothing_consumed_yet_means_no_piggy_backed_commit() {
        assert_eq!(piggyback_commit(None), None);
        assert_eq!(piggyback_commit(Some(QueueOffset(0))), None);
        assert_eq!(piggyback_commit(Some(QueueOffset(7))), Some(QueueOffset(7)));
    }

    #[test]
    fn found_messages_are_consumed_and_the_next_pull_starts_after_them() {
        let step = next_step(
            answer(PullStatus::Found(messages(10..13)), 13),
            QueueOffset(10),
            5,
        );
        assert_eq!(
            step,
            PullStep::Consume {
                messages: messages(10..13),
                next: QueueOffset(13)
            }
        );
    }

    #[test]
    fn an_empty_pull_commits_its_offset_only_when_nothing_is_in_flight() {
        for status in [PullStatus::NoNewMessage, PullStatus::NoMatchedMessage] {
            assert_eq!(
                next_step(answer(status.clone(), 40), QueueOffset(20), 0),
                PullStep::Idle {
                    next: QueueOffset(40),
                    commit: Some(QueueOffset(40))
                }
            );
            // Messages before 20 are still being consumed: committing 40 would skip them.
            assert_eq!(
                next_step(answer(status, 40), QueueOffset(20), 3),
                PullStep::Idle {
                    next: QueueOffset(40),
                    commit: None
                }
            );
        }
    }

    #[test]
    fn an_empty_pull_never_moves_the_next_offset_back() {
        assert_eq!(
            next_step(answer(PullStatus::NoNewMessage, 15), QueueOffset(20), 0),
            PullStep::Idle {
                next: QueueOffset(20),
                commit: Some(QueueOffset(20))
            }
        );
    }

    #[test]
    fn an_illegal_offset_relocates_to_the_brokers_offset_even_backwards() {
        assert_eq!(
            next_step(answer(PullStatus::OffsetIllegal, 3), QueueOffset(900), 0),
            PullStep::Relocate {
                next: QueueOffset(3)
            }
        );
        assert_eq!(
            next_step(answer(PullStatus::OffsetIllegal, 120), QueueOffset(0), 2),
            PullStep::Relocate {
                next: QueueOffset(120)
            }
        );
    }
}
