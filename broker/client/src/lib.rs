//! quiver-client: a RocketMQ-4.x-compatible client for Quiver brokers.
//!
//! - [`Producer`]: sync, async, oneway and batch sends with retry on another queue.
//! - [`TransactionProducer`]: half messages, the local transaction, and the broker's checks.
//! - [`PushConsumer`]: clustering-mode consumer with rebalance, retry topics, orderly mode.
//! - [`PullConsumer`]: explicit offsets and long polling, for tools.
//! - [`Admin`]: topics, routes, cluster state, lag, offset resets, messages by key or id.
//!
//! Offset semantics follow RocketMQ 4.x's clients; the pure parts ([`allocate`], [`process_queue`],
//! [`pull_from_where`], [`offset_store`]) carry them and are unit-tested.

#![forbid(unsafe_code)]
#![doc = include_str!("../README.md")]

pub mod admin;
pub mod allocate;
pub mod client;
pub mod error;
pub mod message;
pub mod offset_store;
pub mod ops;
pub mod process_queue;
pub mod producer;
pub mod pull_consumer;
pub mod pull_from_where;
pub mod push;
pub mod remoting;
pub mod subscription;
pub mod transaction;

pub use admin::{Admin, BrokerState, BrokerStatus, KeyQuery, QueueLag, ResetTarget, TopicSpec};
pub use client::{ClientConfig, ClientCore, TopicRoute};
pub use error::{ClientError, Result};
pub use message::{Message, ReceivedMessage};
pub use ops::{PullResult, PullStatus, SendBackTarget};
pub use producer::{Producer, ProducerConfig, QueueSelector, SendResult, SendStatus};
pub use pull_consumer::PullConsumer;
pub use pull_from_where::ConsumeFromWhere;
pub use push::{ConsumeMode, ConsumeOutcome, Listener, PushConsumer, PushConsumerConfig};
pub use quiver_protocol::body::MessageQueue;
pub use quiver_protocol::offset::QueueOffset;
/// How the client connects with TLS: CA file (else the Mozilla roots), client certificate and
/// key, server name override.
pub use quiver_remoting::tls::TlsClientConfig as TlsConfig;
pub use subscription::{MessageSelector, Subscription};
pub use transaction::{
    LocalTransactionState, TransactionListener, TransactionProducer, TransactionSendResult,
};
