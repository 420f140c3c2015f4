//! The push consumer's settings and their defaults (RocketMQ 4.x's `DefaultMQPushConsumer`).

use std::time::Duration;

use crate::client::ClientConfig;
use crate::error::{ClientError, Result};
use crate::pull_from_where::ConsumeFromWhere;
use crate::subscription::MessageSelector;

use super::ConsumeMode;

#[derive(Clone, Debug)]
pub struct PushConsumerConfig {
    pub client: ClientConfig,
    pub group: String,
    /// (topic, tag or SQL92 selector) pairs; `%RETRY%group` is added automatically.
    pub subscriptions: Vec<(String, MessageSelector)>,
    pub consume_from: ConsumeFromWhere,
    pub mode: ConsumeMode,
    /// Messages handed to the listener at once.
    pub consume_batch_size: usize,
    /// Messages asked for per pull.
    pub pull_batch_size: u32,
    /// Flow control: a queue never holds more in-flight messages than this...
    pub max_in_flight_messages_per_queue: usize,
    /// ...and stops pulling once it holds this many in-flight bytes.
    pub max_in_flight_bytes_per_queue: u64,
    /// Deliveries before the broker moves a message to `%DLQ%group`.
    pub max_reconsume_times: i32,
    /// Listener calls running at once (concurrent mode).
    pub consume_concurrency: usize,
    /// How long the broker holds a pull that finds nothing.
    pub long_poll: Duration,
    pub heartbeat_interval: Duration,
    pub rebalance_interval: Duration,
    pub persist_interval: Duration,
    /// Pause before a failed batch is consumed again locally (send-back failed, or orderly).
    pub retry_pause: Duration,
    /// Delay level of redeliveries (1 = 1 s, 2 = 5 s, ...); None lets the broker pick
    /// 3 + reconsumeTimes, as RocketMQ does.
    pub retry_delay_level: Option<u32>,
}

impl PushConsumerConfig {
    pub fn new(servers: &str, group: impl Into<String>) -> Self {
        Self {
            client: ClientConfig::new(servers),
            group: group.into(),
            subscriptions: Vec::new(),
            consume_from: ConsumeFromWhere::LastOffset,
            mode: ConsumeMode::Concurrent,
            consume_batch_size: 1,
            pull_batch_size: 32,
            max_in_flight_messages_per_queue: 1000,
            max_in_flight_bytes_per_queue: 100 * 1024 * 1024,
            max_reconsume_times: 16,
            consume_concurrency: 20,
            long_poll: Duration::from_secs(15),
            heartbeat_interval: Duration::from_secs(10),
            rebalance_interval: Duration::from_secs(20),
            persist_interval: Duration::from_secs(5),
            retry_pause: Duration::from_secs(1),
            retry_delay_level: None,
        }
    }

    pub fn subscribe(
        mut self,
        topic: impl Into<String>,
        expression: impl Into<MessageSelector>,
    ) -> Self {
        self.subscriptions.push((topic.into(), expression.into()));
        self
    }

    pub fn consume_from(mut self, from: ConsumeFromWhere) -> Self {
        self.consume_from = from;
        self
    }

    pub fn mode(mut self, mode: ConsumeMode) -> Self {
        self.mode = mode;
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        let invalid = |what, reason: &str| {
            Err(ClientError::InvalidArgument {
                what,
                reason: reason.to_owned(),
            })
        };
        if self.group.is_empty() {
            return invalid("group", "must not be empty");
        }
        if self.subscriptions.is_empty() {
            return invalid("subscriptions", "subscribe to at least one topic");
        }
        if self.consume_batch_size == 0
            || self.pull_batch_size == 0
            || self.consume_concurrency == 0
            || self.max_in_flight_messages_per_queue == 0
        {
            return invalid(
                "batch sizes",
                "consume_batch_size, pull_batch_size, consume_concurrency and max_in_flight_messages_per_queue must be > 0",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_field(config: &PushConsumerConfig) -> Option<&'static str> {
        match config.validate() {
            Err(ClientError::InvalidArgument { what, .. }) => Some(what),
            Err(other) => panic!("unexpected error {other}"),
            Ok(()) => None,
        }
    }

    #[test]
    fn a_subscribed_group_with_defaults_is_valid() {
        let config = PushConsumerConfig::new("127.0.0.1:10911", "g").subscribe("T", "*");
        assert_eq!(refused_field(&config), None);
    }

    #[test]
    fn empty_group_no_subscription_and_zero_sizes_are_refused() {
        let valid = PushConsumerConfig::new("127.0.0.1:10911", "g").subscribe("T", "*");
        let no_group = PushConsumerConfig::new("127.0.0.1:10911", "").subscribe("T", "*");
        assert_eq!(refused_field(&no_group), Some("group"));
        let no_topic = PushConsumerConfig::new("127.0.0.1:10911", "g");
        assert_eq!(refused_field(&no_topic), Some("subscriptions"));
        let zeroed: [fn(&mut PushConsumerConfig); 4] = [
            |c| c.consume_batch_size = 0,
            |c| c.pull_batch_size = 0,
            |c| c.consume_concurrency = 0,
            |c| c.max_in_flight_messages_per_queue = 0,
        ];
        for zero in zeroed {
            let mut config = valid.clone();
            zero(&mut config);
            assert_eq!(refused_field(&config), Some("batch sizes"));
        }
    }
}
