//! The pull consumer for tools: the caller chooses queues and offsets, commits explicitly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use quiver_protocol::offset::QueueOffset;

use crate::client::{ClientConfig, ClientCore};
use crate::error::Result;
use crate::ops::{PullResult, PullSpec};
use crate::subscription::Subscription;
use crate::MessageQueue;

pub struct PullConsumer {
    core: Arc<ClientCore>,
    group: String,
    /// Each queue's epoch at its last pull, sent with the next one.
    epochs: Mutex<HashMap<MessageQueue, u64>>,
}

impl PullConsumer {
    pub fn new(config: ClientConfig, group: impl Into<String>) -> Self {
        Self {
            core: ClientCore::new(config),
            group: group.into(),
            epochs: Mutex::new(HashMap::new()),
        }
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// The readable queues of `topic`, sorted.
    pub async fn queues(&self, topic: &str) -> Result<Vec<MessageQueue>> {
        Ok(self.core.fetch_route(topic).await?.read_queues.clone())
    }

    /// Pulls from `offset`; with `long_poll` the broker waits that long for new messages.
    pub async fn pull(
        &self,
        queue: &MessageQueue,
        offset: QueueOffset,
        max_messages: u32,
        subscription: &Subscription,
        long_poll: Option<Duration>,
    ) -> Result<PullResult> {
        self.core.route(&queue.topic).await?;
        let spec = PullSpec {
            group: &self.group,
            queue,
            offset,
            max_messages,
            subscription,
            commit_offset: None,
            suspend: long_poll,
            epoch: self.epochs.lock().get(queue).copied(),
        };
        let pulled = self.core.pull(&spec).await?;
        if let Some(epoch) = pulled.epoch {
            self.epochs.lock().insert(queue.clone(), epoch);
        }
        Ok(pulled)
    }

    pub async fn committed_offset(&self, queue: &MessageQueue) -> Result<Option<QueueOffset>> {
        self.core.route(&queue.topic).await?;
        self.core.query_consumer_offset(&self.group, queue).await
    }

    /// Commits and waits for the broker's acknowledgement.
    pub async fn commit(&self, queue: &MessageQueue, offset: QueueOffset) -> Result<()> {
        self.core.route(&queue.topic).await?;
        self.core
            .update_consumer_offset(&self.group, queue, offset, true)
            .await
    }

    pub async fn max_offset(&self, queue: &MessageQueue) -> Result<QueueOffset> {
        self.core.route(&queue.topic).await?;
        self.core.max_offset(queue).await
    }

    pub async fn min_offset(&self, queue: &MessageQueue) -> Result<QueueOffset> {
        self.core.route(&queue.topic).await?;
        self.core.min_offset(queue).await
    }

    pub async fn search_offset(
        &self,
        queue: &MessageQueue,
        timestamp_ms: i64,
    ) -> Result<QueueOffset> {
        self.core.route(&queue.topic).await?;
        self.core.search_offset(queue, timestamp_ms).await
    }

    pub async fn shutdown(&self) {
        self.core.shutdown().await;
    }
}
