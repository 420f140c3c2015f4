//! Rebalance (RocketMQ's `RebalanceImpl`): which queues this member owns, and starting or
//! stopping their pull loops when that changes; in orderly mode, the broker's queue locks.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use quiver_protocol::offset::QueueOffset;
use quiver_protocol::{code, RemotingCommand};

use crate::allocate::allocate_averagely;
use crate::client::TopicRoute;
use crate::error::{ClientError, Result};
use crate::offset_store::UpdateMode;
use crate::pull_from_where::{compute_pull_from_where, StartPosition};
use crate::MessageQueue;

use super::queue_state::{QueueState, LOCK_TRUSTED_FOR};
use super::{ConsumeMode, Inner};

/// What a rebalance changes for one topic.
#[derive(Debug, PartialEq, Eq)]
struct RebalancePlan<Q> {
    /// Assigned now but no longer ours: stop, commit, forget (in assignment order).
    removed: Vec<Q>,
    /// Ours now but not yet assigned: start (in allocation order).
    added: Vec<Q>,
}

/// Allocates `read_queues` averagely among `members` and compares with what `client_id`
/// consumes now (`current`, the queues of this topic only).
fn plan_rebalance<Q: Clone + Ord>(
    read_queues: &[Q],
    members: &[String],
    client_id: &str,
    current: &[Q],
) -> RebalancePlan<Q> {
    let wanted = allocate_averagely(read_queues, members, client_id);
    RebalancePlan {
        removed: current
            .iter()
            .filter(|q| !wanted.contains(q))
            .cloned()
            .collect(),
        added: wanted
            .into_iter()
            .filter(|q| !current.contains(q))
            .collect(),
    }
}

/// Queues grouped by the address of their broker; queues of unknown brokers are left out.
fn group_by_broker(
    queues: &[MessageQueue],
    addr_of: impl Fn(&str) -> Option<String>,
) -> BTreeMap<String, Vec<MessageQueue>> {
    let mut grouped: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
    for queue in queues {
        if let Some(addr) = addr_of(&queue.broker_name) {
            grouped.entry(addr).or_default().push(queue.clone());
        }
    }
    grouped
}

/// A reset offset travels as i64; a negative one means the queue's start.
fn reset_target(offset: i64) -> QueueOffset {
    QueueOffset(u64::try_from(offset).unwrap_or(0))
}

impl Inner {
    pub(super) async fn rebalance(self: &Arc<Self>) {
        if self.shut_down.load(Ordering::Acquire) {
            return;
        }
        let _guard = self.assignment_change.lock().await;
        for subscription in &self.subscriptions {
            if let Err(error) = self.rebalance_topic(&subscription.topic).await {
                tracing::debug!(topic = %subscription.topic, %error, "rebalance skipped this topic");
            }
        }
        if self.config.mode == ConsumeMode::Orderly {
            // Keep the locks alive (the broker expires them after 60 s).
            let held: Vec<MessageQueue> = self.assignments.lock().keys().cloned().collect();
            for queue in self.lock(&held).await {
                if let Some(state) = self.assignments.lock().get(&queue) {
                    state.lock_granted();
                }
            }
        }
    }

    /// Every broker knows the group's members; asks them in turn until one answers.
    async fn group_members(&self, route: &TopicRoute) -> Result<Vec<String>> {
        let mut last_error = None;
        for addr in route.brokers.values() {
            match self.core.consumer_ids(addr, self.group()).await {
                Ok(ids) => return Ok(ids),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(ClientError::NoRoute {
            topic: route.topic.clone(),
            purpose: "rebalance",
        }))
    }

    async fn rebalance_topic(self: &Arc<Self>, topic: &str) -> Result<()> {
        let route = self.core.fetch_route(topic).await?;
        let members = self.group_members(&route).await?;
        let current: Vec<MessageQueue> = self
            .assignments
            .lock()
            .keys()
            .filter(|q| q.topic == topic)
            .cloned()
            .collect();
        let plan = plan_rebalance(
            &route.read_queues,
            &members,
            self.core.client_id(),
            &current,
        );
        for queue in &plan.removed {
            self.remove_queue(queue).await;
        }
        if plan.added.is_empty() {
            return Ok(());
        }
        tracing::info!(group = %self.group(), %topic, added = plan.added.len(), "rebalance assigned queues");
        let startable = match self.config.mode {
            ConsumeMode::Concurrent => plan.added,
            ConsumeMode::Orderly => self.lock(&plan.added).await,
        };
        for queue in startable {
            if let Err(error) = self.add_queue(queue.clone()).await {
                tracing::warn!(queue = %queue, %error, "could not start consuming a newly assigned queue");
            }
        }
        Ok(())
    }

    /// Taken away: stop pulling, commit its offset, forget it.
    async fn remove_queue(&self, queue: &MessageQueue) {
        let state = self.assignments.lock().remove(queue);
        if let Some(state) = state {
            state.stop().await;
        }
        if let Err(error) = self.persist_offset(queue).await {
            tracing::warn!(queue = %queue, %error, "could not commit the offset of a removed queue");
        }
        self.offsets.remove(queue);
        if self.config.mode == ConsumeMode::Orderly {
            self.unlock(std::slice::from_ref(queue)).await;
        }
    }

    async fn add_queue(self: &Arc<Self>, queue: MessageQueue) -> Result<()> {
        // A stale local offset from an earlier assignment must not win over the broker's.
        self.offsets.remove(&queue);
        let committed = self
            .core
            .query_consumer_offset(self.group(), &queue)
            .await?;
        let start = match compute_pull_from_where(committed, self.config.consume_from, &queue.topic)
        {
            StartPosition::At(offset) => offset,
            StartPosition::QueueMax => self.core.max_offset(&queue).await?,
            StartPosition::SearchTimestamp(ts) => self.core.search_offset(&queue, ts).await?,
        };
        // Orderly queues reach here only once the broker granted their lock.
        let locked_until =
            (self.config.mode == ConsumeMode::Orderly).then(|| Instant::now() + LOCK_TRUSTED_FOR);
        self.start_queue(queue, start, locked_until);
        Ok(())
    }

    fn start_queue(
        self: &Arc<Self>,
        queue: MessageQueue,
        start: QueueOffset,
        locked_until: Option<Instant>,
    ) {
        let state = QueueState::new(queue.clone());
        *state.locked_until.lock() = locked_until;
        let task = tokio::spawn(self.clone().pull_loop(state.clone(), start));
        *state.task.lock() = Some(task);
        self.assignments.lock().insert(queue, state);
    }

    /// RESET_CONSUMER_CLIENT_OFFSET: move assigned queues to the broker's offsets.
    pub(super) async fn reset_offsets(
        self: &Arc<Self>,
        addr: &str,
        command: &RemotingCommand,
    ) -> Result<()> {
        let body =
            quiver_protocol::body::ResetOffsetBody::decode(&command.body).map_err(|source| {
                ClientError::Body {
                    addr: addr.to_owned(),
                    request_code: code::request::RESET_CONSUMER_CLIENT_OFFSET,
                    source,
                }
            })?;
        let _guard = self.assignment_change.lock().await;
        for (queue, offset) in body.offset_table {
            let state = self.assignments.lock().remove(&queue);
            let Some(state) = state else { continue };
            state.stop().await;
            let locked_until = *state.locked_until.lock();
            let offset = reset_target(offset);
            self.offsets.update(&queue, offset, UpdateMode::Overwrite);
            self.persist_offset(&queue).await?;
            tracing::info!(queue = %queue, %offset, "offset reset by the broker");
            self.start_queue(queue, offset, locked_until);
        }
        Ok(())
    }

    /// Orderly mode: asks each broker for its queues' locks; returns the queues granted.
    async fn lock(&self, queues: &[MessageQueue]) -> Vec<MessageQueue> {
        let mut locked = Vec::new();
        for (addr, group) in self.by_broker(queues) {
            match self.core.lock_queues(&addr, self.group(), &group).await {
                Ok(ok) => locked.extend(ok),
                Err(error) => tracing::warn!(%addr, %error, "queue lock failed"),
            }
        }
        locked
    }

    pub(super) async fn unlock(&self, queues: &[MessageQueue]) {
        for (addr, group) in self.by_broker(queues) {
            if let Err(error) = self.core.unlock_queues(&addr, self.group(), &group).await {
                tracing::debug!(%addr, %error, "queue unlock failed");
            }
        }
    }

    fn by_broker(&self, queues: &[MessageQueue]) -> BTreeMap<String, Vec<MessageQueue>> {
        group_by_broker(queues, |broker_name| {
            self.core.broker_addr(broker_name).ok()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queues(ids: std::ops::Range<u32>) -> Vec<MessageQueue> {
        ids.map(|id| MessageQueue::new("T", "broker-a", id))
            .collect()
    }

    fn members(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn the_first_member_takes_every_queue() {
        let plan = plan_rebalance(&queues(0..4), &members(&["a"]), "a", &[]);
        assert_eq!(plan.added, queues(0..4));
        assert!(plan.removed.is_empty());
    }

    #[test]
    fn a_joining_member_takes_the_upper_half_from_the_first() {
        let group = members(&["b", "a"]);
        let first = plan_rebalance(&queues(0..4), &group, "a", &queues(0..4));
        assert_eq!(first.removed, queues(2..4));
        assert!(first.added.is_empty());
        let joiner = plan_rebalance(&queues(0..4), &group, "b", &[]);
        assert_eq!(joiner.added, queues(2..4));
        assert!(joiner.removed.is_empty());
    }

    #[test]
    fn the_remaining_member_takes_over_a_leavers_queues() {
        let plan = plan_rebalance(&queues(0..4), &members(&["a"]), "a", &queues(0..2));
        assert_eq!(plan.added, queues(2..4));
        assert!(plan.removed.is_empty());
    }

    #[test]
    fn an_unchanged_group_changes_nothing() {
        let group = members(&["a", "b", "c"]);
        let owned = allocate_averagely(&queues(0..8), &group, "b");
        let plan = plan_rebalance(&queues(0..8), &group, "b", &owned);
        assert_eq!(
            plan,
            RebalancePlan {
                removed: vec![],
                added: vec![]
            }
        );
    }

    #[test]
    fn a_member_not_yet_listed_gives_up_everything() {
        // Its heartbeat has not reached the broker yet: RocketMQ drops the queues too.
        let plan = plan_rebalance(&queues(0..3), &members(&["a"]), "z", &queues(1..3));
        assert_eq!(plan.removed, queues(1..3));
        assert!(plan.added.is_empty());
    }

    #[test]
    fn a_queue_gone_from_the_route_is_removed() {
        // The topic shrank from 4 read queues to 2.
        let plan = plan_rebalance(&queues(0..2), &members(&["a"]), "a", &queues(0..4));
        assert_eq!(plan.removed, queues(2..4));
        assert!(plan.added.is_empty());
    }

    #[test]
    fn lock_requests_go_to_each_queues_broker_and_skip_unknown_brokers() {
        let mixed = vec![
            MessageQueue::new("T", "broker-a", 0),
            MessageQueue::new("T", "broker-b", 0),
            MessageQueue::new("T", "broker-a", 1),
            MessageQueue::new("T", "gone", 0),
        ];
        let grouped = group_by_broker(&mixed, |name| match name {
            "broker-a" => Some("10.0.0.1:10911".to_owned()),
            "broker-b" => Some("10.0.0.2:10911".to_owned()),
            _ => None,
        });
        assert_eq!(grouped.len(), 2);
        assert_eq!(
            grouped["10.0.0.1:10911"],
            [
                MessageQueue::new("T", "broker-a", 0),
                MessageQueue::new("T", "broker-a", 1)
            ]
        );
        assert_eq!(
            grouped["10.0.0.2:10911"],
            [MessageQueue::new("T", "broker-b", 0)]
        );
    }

    #[test]
    fn a_negative_reset_offset_means_the_start_of_the_queue() {
        assert_eq!(reset_target(42), QueueOffset(42));
        assert_eq!(reset_target(-1), QueueOffset(0));
    }
}
