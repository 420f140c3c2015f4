//! The push consumer (clustering mode): heartbeats, rebalance, one pull loop per assigned
//! queue, concurrent or orderly consumption, send-back of failures, offset commits.
//!
//! - `rebalance`: which queues this member owns; starts and stops their pull loops.
//! - `pull_loop`: per queue, flow control, the pull, and what each pull status means.
//! - `consume_service`: listener calls, send-back of failures, offset commits.
//! - `membership`: heartbeats, leaving the group, the broker's requests to the client.
//!
//! Each decision is a pure function with unit tests beside it; the broker I/O stays around it.

mod config;
mod consume_service;
mod membership;
mod pull_loop;
mod queue_state;
mod rebalance;
mod running_info;
#[cfg(test)]
mod test_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use quiver_protocol::offset::QueueOffset;
use tokio::sync::{mpsc, watch, Notify, Semaphore, SemaphorePermit};
use tokio::task::JoinHandle;

use crate::client::ClientCore;
use crate::error::{ClientError, Result};
use crate::message::ReceivedMessage;
use crate::offset_store::OffsetTable;
use crate::pull_from_where::RETRY_TOPIC_PREFIX;
use crate::subscription::Subscription;
use crate::MessageQueue;

pub use config::PushConsumerConfig;
use queue_state::QueueState;

/// What the listener says about a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsumeOutcome {
    Success,
    /// Concurrent mode: send the batch back for redelivery later. Orderly mode: retry the
    /// batch on this queue after a pause, keeping the order.
    Retry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsumeMode {
    #[default]
    Concurrent,
    /// One batch at a time per queue, in queue order, holding the broker's queue lock.
    Orderly,
}

/// Consumes a batch; runs on a blocking thread, so it may do blocking work.
pub type Listener = Arc<dyn Fn(&[ReceivedMessage]) -> ConsumeOutcome + Send + Sync>;

struct Inner {
    core: Arc<ClientCore>,
    config: PushConsumerConfig,
    listener: Listener,
    subscriptions: Vec<Subscription>,
    offsets: OffsetTable<MessageQueue>,
    assignments: Mutex<BTreeMap<MessageQueue, Arc<QueueState>>>,
    /// Serialises rebalance, reset and shutdown, which all change the assignment.
    assignment_change: tokio::sync::Mutex<()>,
    rebalance_wanted: Notify,
    consume_permits: Arc<Semaphore>,
    shut_down: AtomicBool,
}

pub struct PushConsumer {
    inner: Arc<Inner>,
    background: Vec<JoinHandle<()>>,
    stop_background: watch::Sender<bool>,
}

/// The configured subscriptions plus the group's retry topic, through which failed messages
/// come back.
fn subscriptions_with_retry(config: &PushConsumerConfig) -> Result<Vec<Subscription>> {
    let mut subscriptions: Vec<Subscription> = config
        .subscriptions
        .iter()
        .map(|(topic, selector)| Subscription::with_selector(topic.clone(), selector))
        .collect::<Result<_>>()?;
    subscriptions.push(Subscription::new(
        format!("{RETRY_TOPIC_PREFIX}{}", config.group),
        "*",
    ));
    Ok(subscriptions)
}

impl PushConsumer {
    /// Starts heartbeats, rebalancing and pulling; returns once the first rebalance ran.
    pub async fn start(config: PushConsumerConfig, listener: Listener) -> Result<Self> {
        config.validate()?;
        let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
        let core = ClientCore::with_inbound(config.client.clone(), inbound_tx);
        let inner = Arc::new(Inner {
            core,
            consume_permits: Arc::new(Semaphore::new(config.consume_concurrency)),
            subscriptions: subscriptions_with_retry(&config)?,
            config,
            listener,
            offsets: OffsetTable::new(),
            assignments: Mutex::new(BTreeMap::new()),
            assignment_change: tokio::sync::Mutex::new(()),
            rebalance_wanted: Notify::new(),
            shut_down: AtomicBool::new(false),
        });
        for subscription in &inner.subscriptions {
            match inner.core.fetch_route(&subscription.topic).await {
                Ok(_) => {}
                // The retry topic appears once the broker sees the group; the timer picks it up.
                Err(ClientError::TopicNotFound { .. })
                    if subscription.topic.starts_with(RETRY_TOPIC_PREFIX) => {}
                Err(error) => return Err(error),
            }
        }
        inner.send_heartbeats().await?;
        inner.rebalance().await;

        let (stop_background, stop_rx) = watch::channel(false);
        let background = vec![
            tokio::spawn(inner.clone().run_inbound(inbound_rx, stop_rx.clone())),
            tokio::spawn(inner.clone().run_timers(stop_rx)),
        ];
        Ok(Self {
            inner,
            background,
            stop_background,
        })
    }

    pub fn client_id(&self) -> &str {
        self.inner.core.client_id()
    }

    /// The queues this member currently consumes.
    pub fn assigned_queues(&self) -> Vec<MessageQueue> {
        self.inner.assignments.lock().keys().cloned().collect()
    }

    /// The offset this member would commit for `queue` now.
    pub fn local_offset(&self, queue: &MessageQueue) -> Option<QueueOffset> {
        self.inner.offsets.read(queue)
    }

    /// In-flight (pulled, not yet consumed) messages and bytes of an assigned queue.
    pub fn in_flight(&self, queue: &MessageQueue) -> Option<(usize, u64)> {
        let state = self.inner.assignments.lock().get(queue).cloned()?;
        let pq = state.process_queue.lock();
        Some((pq.message_count(), pq.bytes_in_flight()))
    }

    /// Asks for a rebalance now (also happens on the timer and on broker notification).
    pub fn request_rebalance(&self) {
        self.inner.rebalance_wanted.notify_one();
    }

    /// Clean stop: waits for running listener calls, commits every offset, leaves the group.
    pub async fn shutdown(mut self) -> Result<()> {
        self.inner.shut_down.store(true, Ordering::Release);
        self.stop_background.send_replace(true);
        for task in self.background.drain(..) {
            let _ = task.await;
        }
        let _guard = self.inner.assignment_change.lock().await;
        let states: Vec<Arc<QueueState>> =
            self.inner.assignments.lock().values().cloned().collect();
        for state in &states {
            state.stop_pulling().await;
        }
        // Held to the end: no listener call starts while the offsets are committed.
        let _all_permits = self.inner.wait_for_listener_calls().await;
        for state in &states {
            state.process_queue.lock().mark_dropped();
        }
        let mut first_error = None;
        for state in &states {
            if let Err(error) = self.inner.persist_offset(&state.queue).await {
                first_error.get_or_insert(error);
            }
        }
        if self.inner.config.mode == ConsumeMode::Orderly {
            self.inner
                .unlock(&states.iter().map(|s| s.queue.clone()).collect::<Vec<_>>())
                .await;
        }
        self.inner.assignments.lock().clear();
        self.inner.unregister().await;
        self.inner.core.shutdown().await;
        first_error.map_or(Ok(()), Err)
    }

    /// Stops at once without committing or unregistering, as a crashed process would.
    pub async fn abort(mut self) {
        self.inner.shut_down.store(true, Ordering::Release);
        for task in self.background.drain(..) {
            task.abort();
        }
        let states: Vec<Arc<QueueState>> =
            self.inner.assignments.lock().values().cloned().collect();
        for state in states {
            state.process_queue.lock().mark_dropped();
            if let Some(task) = state.task.lock().take() {
                task.abort();
            }
        }
        self.inner.core.shutdown().await;
    }
}

impl Drop for PushConsumer {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
        for state in self.inner.assignments.lock().values() {
            state.process_queue.lock().mark_dropped();
            state.stop.send_replace(true);
        }
    }
}

impl Inner {
    fn group(&self) -> &str {
        &self.config.group
    }

    /// Heartbeats, rebalances, offset persistence and route refresh on their timers.
    async fn run_timers(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut heartbeat = tokio::time::interval(self.config.heartbeat_interval);
        let mut rebalance = tokio::time::interval(self.config.rebalance_interval);
        let mut persist = tokio::time::interval(self.config.persist_interval);
        // The first tick of each is immediate; start() already did all three.
        heartbeat.tick().await;
        rebalance.tick().await;
        persist.tick().await;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = heartbeat.tick() => {
                    self.core.refresh_routes().await;
                    if let Err(error) = self.send_heartbeats().await {
                        tracing::warn!(%error, "heartbeat round failed");
                    }
                }
                _ = rebalance.tick() => self.rebalance().await,
                _ = self.rebalance_wanted.notified() => self.rebalance().await,
                _ = persist.tick() => self.persist_all().await,
            }
        }
    }

    /// Takes every consume permit, which means no listener call is still running; gives up
    /// (None) after 30 s.
    async fn wait_for_listener_calls(&self) -> Option<SemaphorePermit<'_>> {
        let all = u32::try_from(self.config.consume_concurrency).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(
            Duration::from_secs(30),
            self.consume_permits.acquire_many(all),
        )
        .await;
        match drained {
            Ok(permits) => permits.ok(),
            Err(_elapsed) => {
                tracing::warn!(group = %self.config.group, "listener calls still running after 30 s; committing what is done");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_groups_retry_topic_is_subscribed_after_the_configured_topics() {
        let config = PushConsumerConfig::new("127.0.0.1:10911", "billing")
            .subscribe("orders", "TagA || TagB")
            .subscribe("refunds", "*");
        let topics: Vec<(String, String)> = subscriptions_with_retry(&config)
            .expect("tag expressions")
            .iter()
            .map(|s| (s.topic.clone(), s.expression().to_owned()))
            .collect();
        assert_eq!(
            topics,
            [
                ("orders", "TagA || TagB"),
                ("refunds", "*"),
                ("%RETRY%billing", "*")
            ]
            .map(|(t, e)| (t.to_owned(), e.to_owned()))
        );
    }
}
