//! The narrow slice of broker administration the operator needs (lag, drain, groups).
//!
//! Two implementations exist: the remoting one in [`crate::remoting_admin`] and the in-memory
//! fake the controller tests use.

use futures::future::BoxFuture;
use std::fmt;

/// A broker's remoting address, `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BrokerAddr(pub String);

impl fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A position in a consume queue (count of messages before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueOffset(pub u64);

/// One queue of a group's consume stats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConsumeStats {
    /// Topic of the queue.
    pub topic: String,
    /// Name of the broker holding the queue.
    pub broker_name: String,
    /// Queue id within the topic on that broker.
    pub queue_id: i32,
    /// Next offset the broker will write (the queue's max offset).
    pub broker_offset: QueueOffset,
    /// Committed offset of the group; `None` when the group never committed on this queue.
    pub consumer_offset: Option<QueueOffset>,
    /// Store time (ms since epoch) of the first unconsumed message, when there is one.
    pub oldest_unconsumed_store_ms: Option<i64>,
}

/// A group's consume stats on one broker (RocketMQ GET_CONSUME_STATS).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumeStats {
    /// Per-queue offsets.
    pub queues: Vec<QueueConsumeStats>,
}

/// One queue of a topic's stats (RocketMQ GET_TOPIC_STATS_INFO).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueTopicStats {
    /// Name of the broker holding the queue.
    pub broker_name: String,
    /// Queue id.
    pub queue_id: i32,
    /// Smallest offset still stored.
    pub min_offset: QueueOffset,
    /// Next offset to be written.
    pub max_offset: QueueOffset,
    /// Store time of the last message, ms since epoch; `None` for an empty queue.
    pub last_update_ms: Option<i64>,
}

/// A topic's stats on one broker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicStats {
    /// Per-queue offsets.
    pub queues: Vec<QueueTopicStats>,
}

/// Broker permission as RocketMQ encodes it in routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BrokerPermission {
    /// Reads only (4): producers route elsewhere, consumers drain it.
    ReadOnly,
    /// Reads and writes (6).
    ReadWrite,
}

impl BrokerPermission {
    /// The RocketMQ `brokerPermission` value.
    pub fn wire_value(self) -> i32 {
        match self {
            BrokerPermission::ReadOnly => 4,
            BrokerPermission::ReadWrite => 6,
        }
    }
}

/// Subscription group settings (RocketMQ SubscriptionGroupConfig, the fields we manage).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionGroup {
    /// Group name.
    pub group: String,
    /// Whether the broker serves pulls for the group.
    pub consume_enable: bool,
    /// A member without a committed offset starts at the queue's min offset (first offset).
    pub consume_from_min_enable: bool,
    /// Queues of the group's retry topic.
    pub retry_queue_nums: i32,
    /// Retries before dead-lettering.
    pub max_reconsume_times: i32,
}

/// A topic to create on a broker (RocketMQ UPDATE_AND_CREATE_TOPIC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicConfig {
    /// Topic name.
    pub name: String,
    /// Read and write queues.
    pub queues: i32,
}

/// Where an offset reset moves a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetTarget {
    /// Each queue's min offset.
    Earliest,
    /// Each queue's max offset.
    Latest,
    /// The first message stored at or after this time (ms since epoch).
    Timestamp(i64),
}

/// Failures talking to a broker.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The broker could not be reached or the connection broke.
    #[error("broker {addr} unreachable")]
    Unreachable {
        addr: BrokerAddr,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The broker answered with an error code.
    #[error("broker {addr} rejected {request}: code {code}: {remark}")]
    Rejected {
        addr: BrokerAddr,
        request: &'static str,
        code: i32,
        remark: String,
    },
    /// The broker's answer could not be decoded.
    #[error("broker {addr} sent an undecodable {request} response")]
    Malformed {
        addr: BrokerAddr,
        request: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Administration calls against one broker at a time.
pub trait BrokerAdmin: Send + Sync {
    /// Per-queue offsets of `group` on `addr` (all topics the group has offsets or subscriptions for).
    fn consume_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<ConsumeStats, AdminError>>;
    /// Per-queue offsets of `topic` on `addr`.
    fn topic_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<TopicStats, AdminError>>;
    /// Client ids of the group's live members connected to `addr`; empty when none is online.
    fn members<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>>;
    /// Groups known to the broker (subscription group configs).
    fn groups<'a>(&'a self, addr: &'a BrokerAddr)
        -> BoxFuture<'a, Result<Vec<String>, AdminError>>;
    /// Makes the broker read-only or read-write in the routes it serves.
    fn set_permission<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        permission: BrokerPermission,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Creates or updates a topic.
    fn create_topic<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a TopicConfig,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Creates or updates a subscription group.
    fn upsert_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a SubscriptionGroup,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Moves the committed offsets of `group` on `topic`.
    fn reset_offsets<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
        topic: &'a str,
        target: ResetTarget,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
    /// Deletes a group and its committed offsets.
    fn delete_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<(), AdminError>>;
}
