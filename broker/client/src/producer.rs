//! The producer: sync, async, oneway and batch sends, round-robin or key-hash queue
//! selection, and retry on another queue (preferably another broker) when a send fails.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use quiver_protocol::body::{HeartbeatData, ProducerData};
use quiver_protocol::header::{
    SendMessageRequestHeader, SendMessageResponseHeader, UnregisterClientRequestHeader,
};
use quiver_protocol::message as wire;
use quiver_protocol::offset::QueueOffset;
use quiver_protocol::{code, ExtFields, HeaderError, RemotingCommand};

use crate::client::{ClientConfig, ClientCore, TopicRoute};
use crate::error::{ClientError, Result};
use crate::message::{encoded_properties, new_unique_id, now_ms, Message};
use crate::ops::response_header;
use crate::remoting::{expect_success, response_error};
use crate::MessageQueue;

/// The topic whose route brokers offer for topics they will auto-create.
pub const AUTO_CREATE_TOPIC_KEY: &str = "TBW102";

#[derive(Clone, Debug)]
pub struct ProducerConfig {
    pub client: ClientConfig,
    pub group: String,
    /// Deadline of one send attempt.
    pub send_timeout: Duration,
    /// Extra attempts (on another queue) after a failed send.
    pub retries: u32,
    /// Body plus properties; larger messages are refused before they are sent.
    pub max_message_size_bytes: usize,
    /// Queues per topic when the broker auto-creates a topic on first send.
    pub default_topic_queue_nums: u32,
    /// How often the producer announces its group to the brokers it knows (from its first
    /// send on), as RocketMQ's clients do: the broker checks transactions back over it.
    pub heartbeat_interval: Duration,
}

impl ProducerConfig {
    pub fn new(servers: &str) -> Self {
        Self {
            client: ClientConfig::new(servers),
            group: "DEFAULT_PRODUCER".to_owned(),
            send_timeout: Duration::from_secs(3),
            retries: 2,
            max_message_size_bytes: 4 * 1024 * 1024,
            default_topic_queue_nums: 8,
            heartbeat_interval: Duration::from_secs(30),
        }
    }
}

/// How a send picks its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueSelector<'a> {
    /// Round-robin over writable queues, avoiding the broker that just failed.
    RoundRobin,
    /// Same key, same queue (RocketMQ's `SelectMessageQueueByHash`): keeps per-key order.
    KeyHash(&'a str),
    /// An explicit queue id (on the first broker that has it).
    QueueId(u32),
}

/// The broker's storage outcome for an accepted message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendStatus {
    Ok,
    FlushDiskTimeout,
    FlushSlaveTimeout,
    SlaveNotAvailable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendResult {
    pub status: SendStatus,
    /// The producer-side unique id (UNIQ_KEY); for a batch, the ids joined by commas.
    pub msg_id: String,
    /// The broker-side id (store host + commit log offset).
    pub offset_msg_id: String,
    pub queue: MessageQueue,
    pub queue_offset: QueueOffset,
}

struct ProducerInner {
    core: Arc<ClientCore>,
    config: ProducerConfig,
    round_robin: AtomicUsize,
    heartbeats_started: AtomicBool,
    stopped: AtomicBool,
}

/// Cheap to clone; clones share connections and routes.
#[derive(Clone)]
pub struct Producer {
    inner: Arc<ProducerInner>,
}

impl Producer {
    pub fn new(config: ProducerConfig) -> Self {
        let core = ClientCore::new(config.client.clone());
        Self::with_core(config, core)
    }

    /// A producer over `core` (one that hands broker requests to a listener).
    pub(crate) fn with_core(config: ProducerConfig, core: Arc<ClientCore>) -> Self {
        Self {
            inner: Arc::new(ProducerInner {
                core,
                config,
                round_robin: AtomicUsize::new(rand::random::<u16>() as usize),
                heartbeats_started: AtomicBool::new(false),
                stopped: AtomicBool::new(false),
            }),
        }
    }

    pub(crate) fn core(&self) -> &Arc<ClientCore> {
        &self.inner.core
    }

    pub(crate) fn config(&self) -> &ProducerConfig {
        &self.inner.config
    }

    pub fn client_id(&self) -> &str {
        self.inner.core.client_id()
    }

    /// Sends and waits for the broker's answer.
    pub async fn send(&self, message: Message) -> Result<SendResult> {
        self.send_with(message, QueueSelector::RoundRobin).await
    }

    pub async fn send_with(
        &self,
        message: Message,
        selector: QueueSelector<'_>,
    ) -> Result<SendResult> {
        self.send_flagged(message, selector, 0).await
    }

    /// Sends one message with `sys_flag` in its header (a half message's PREPARED type).
    pub(crate) async fn send_flagged(
        &self,
        message: Message,
        selector: QueueSelector<'_>,
        sys_flag: i32,
    ) -> Result<SendResult> {
        let (message, unique_id) = prepare(message, &self.inner.config)?;
        let body = message.body.clone();
        let result = self
            .inner
            .send_with_retries(&message.topic, selector, |queue| {
                single_request(&message, queue, sys_flag, &self.inner.config)
                    .with_body(body.clone())
            })
            .await?;
        self.start_heartbeats().await;
        Ok(SendResult {
            msg_id: unique_id,
            ..result
        })
    }

    /// After the first send (the brokers are known then): one heartbeat now, then one per
    /// `heartbeat_interval` while the producer lives.
    async fn start_heartbeats(&self) {
        // A plain load on the hot path: sends of many tasks do not write one shared line.
        if self.inner.heartbeats_started.load(Ordering::Acquire)
            || self.inner.heartbeats_started.swap(true, Ordering::AcqRel)
        {
            return;
        }
        self.inner.send_heartbeats().await;
        let producer: Weak<ProducerInner> = Arc::downgrade(&self.inner);
        let mut tick = tokio::time::interval(self.inner.config.heartbeat_interval);
        tokio::spawn(async move {
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(inner) = producer.upgrade() else {
                    return;
                };
                if inner.stopped.load(Ordering::Acquire) {
                    return;
                }
                inner.send_heartbeats().await;
            }
        });
    }

    /// Sends in the background and hands the outcome to `callback`.
    pub fn send_async<F>(&self, message: Message, callback: F)
    where
        F: FnOnce(Result<SendResult>) + Send + 'static,
    {
        let producer = self.clone();
        tokio::spawn(async move { callback(producer.send(message).await) });
    }

    /// Fire and forget: no answer, no retry.
    pub async fn send_oneway(&self, message: Message) -> Result<()> {
        let (message, _) = prepare(message, &self.inner.config)?;
        let route = self.inner.route_for_send(&message.topic).await?;
        let queue = self.inner.select(&route, QueueSelector::RoundRobin, None)?;
        let addr = self.inner.core.broker_addr(&queue.broker_name)?;
        let request =
            single_request(&message, &queue, 0, &self.inner.config).with_body(message.body.clone());
        self.inner.core.invoke_oneway(&addr, request).await?;
        self.start_heartbeats().await;
        Ok(())
    }

    /// Sends messages of one topic as one request (stored together on one queue).
    pub async fn send_batch(&self, messages: Vec<Message>) -> Result<SendResult> {
        let Some(topic) = messages.first().map(|m| m.topic.clone()) else {
            return Err(ClientError::InvalidArgument {
                what: "batch",
                reason: "no messages".into(),
            });
        };
        if let Some(other) = messages.iter().find(|m| m.topic != topic) {
            return Err(ClientError::InvalidArgument {
                what: "batch",
                reason: format!(
                    "all messages must share one topic, found {topic} and {}",
                    other.topic
                ),
            });
        }
        let mut ids = Vec::with_capacity(messages.len());
        let mut batch = Vec::with_capacity(messages.len());
        for message in messages {
            let (message, unique_id) = prepare(message, &self.inner.config)?;
            ids.push(unique_id);
            batch.push(wire::BatchMessage {
                flag: message.flag,
                body: message.body.clone(),
                properties: encoded_properties(&message.properties),
            });
        }
        // Properties over 32767 bytes do not fit the batch format's i16 length prefix.
        let body = wire::try_encode_batch(&batch).map_err(|source| ClientError::BatchEncode {
            topic: topic.clone(),
            source,
        })?;
        if body.len() > self.inner.config.max_message_size_bytes {
            return Err(ClientError::MessageTooLarge {
                size_bytes: body.len(),
                max_bytes: self.inner.config.max_message_size_bytes,
            });
        }
        let config = &self.inner.config;
        let result = self
            .inner
            .send_with_retries(&topic, QueueSelector::RoundRobin, |queue| {
                let header = send_header(&topic, queue, 0, String::new(), true, config);
                RemotingCommand::request(code::request::SEND_BATCH_MESSAGE, header.to_v2_ext())
                    .with_body(body.clone())
            })
            .await?;
        self.start_heartbeats().await;
        Ok(SendResult {
            msg_id: ids.join(","),
            ..result
        })
    }

    /// The queues a producer may write for `topic`.
    pub async fn queues(&self, topic: &str) -> Result<Vec<MessageQueue>> {
        Ok(self.inner.route_for_send(topic).await?.write_queues.clone())
    }

    /// Leaves the producer group on every broker and closes the connections.
    pub async fn shutdown(&self) {
        self.inner.stopped.store(true, Ordering::Release);
        if self.inner.heartbeats_started.load(Ordering::Acquire) {
            self.inner.unregister().await;
        }
        self.inner.core.shutdown().await;
    }
}

/// Validates the message and stamps its unique id.
fn prepare(mut message: Message, config: &ProducerConfig) -> Result<(Message, String)> {
    if message.topic.is_empty() {
        return Err(ClientError::InvalidArgument {
            what: "topic",
            reason: "must not be empty".into(),
        });
    }
    let unique_id = match message.properties.get(wire::PROPERTY_UNIQ_KEY) {
        Some(id) => id.clone(),
        None => {
            let id = new_unique_id();
            message
                .properties
                .insert(wire::PROPERTY_UNIQ_KEY.to_owned(), id.clone());
            id
        }
    };
    let size_bytes = message.wire_size_bytes();
    if size_bytes > config.max_message_size_bytes {
        return Err(ClientError::MessageTooLarge {
            size_bytes,
            max_bytes: config.max_message_size_bytes,
        });
    }
    Ok((message, unique_id))
}

fn send_header(
    topic: &str,
    queue: &MessageQueue,
    flag: i32,
    properties: String,
    batch: bool,
    config: &ProducerConfig,
) -> SendMessageRequestHeader {
    SendMessageRequestHeader {
        producer_group: config.group.clone(),
        topic: topic.to_owned(),
        default_topic: AUTO_CREATE_TOPIC_KEY.to_owned(),
        default_topic_queue_nums: i32::try_from(config.default_topic_queue_nums)
            .unwrap_or(i32::MAX),
        queue_id: i32::try_from(queue.queue_id).unwrap_or(i32::MAX),
        sys_flag: 0,
        born_timestamp: now_ms(),
        flag,
        properties: Some(properties),
        reconsume_times: Some(0),
        unit_mode: Some(false),
        batch: Some(batch),
        max_reconsume_times: None,
    }
}

fn single_request(
    message: &Message,
    queue: &MessageQueue,
    sys_flag: i32,
    config: &ProducerConfig,
) -> RemotingCommand {
    let properties = encoded_properties(&message.properties);
    let mut header = send_header(
        &message.topic,
        queue,
        message.flag,
        properties,
        false,
        config,
    );
    header.sys_flag = sys_flag;
    RemotingCommand::request(code::request::SEND_MESSAGE_V2, header.to_v2_ext())
}

/// Java's `String.hashCode`, so a key lands on the queue a Java producer would pick.
fn java_hash(key: &str) -> i64 {
    quiver_protocol::record::tags_code(key)
}

impl ProducerInner {
    /// Announces the producer group to every known broker; failures are logged (the next
    /// round tries again).
    async fn send_heartbeats(&self) {
        let heartbeat = HeartbeatData {
            client_id: self.core.client_id().to_owned(),
            producer_data_set: vec![ProducerData {
                group_name: self.config.group.clone(),
            }],
            consumer_data_set: Vec::new(),
        };
        let body = heartbeat.encode();
        for addr in self.core.known_brokers() {
            let request = RemotingCommand::request(code::request::HEART_BEAT, ExtFields::default())
                .with_body(body.clone());
            let answered = self
                .core
                .invoke(&addr, request)
                .await
                .and_then(|r| expect_success(&addr, code::request::HEART_BEAT, r));
            if let Err(error) = answered {
                tracing::warn!(%addr, %error, "producer heartbeat failed");
            }
        }
    }

    async fn unregister(&self) {
        for addr in self.core.known_brokers() {
            let header = UnregisterClientRequestHeader {
                client_id: self.core.client_id().to_owned(),
                producer_group: Some(self.config.group.clone()),
                consumer_group: None,
            };
            let request =
                RemotingCommand::request(code::request::UNREGISTER_CLIENT, header.to_ext());
            if let Err(error) = self.core.invoke(&addr, request).await {
                tracing::debug!(%addr, %error, "unregistering the producer failed");
            }
        }
    }

    /// The topic's route, or the auto-create route when the topic does not exist yet.
    async fn route_for_send(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        match self.core.route(topic).await {
            Ok(route) if !route.write_queues.is_empty() => Ok(route),
            Ok(_) | Err(ClientError::TopicNotFound { .. }) => {
                let fallback = self
                    .core
                    .route(AUTO_CREATE_TOPIC_KEY)
                    .await
                    .map_err(|error| match error {
                        ClientError::TopicNotFound { .. } => ClientError::TopicNotFound {
                            topic: topic.to_owned(),
                        },
                        other => other,
                    })?;
                let queue_nums = self.config.default_topic_queue_nums;
                let write_queues: Vec<MessageQueue> = fallback
                    .write_queues
                    .iter()
                    .filter(|q| q.queue_id < queue_nums)
                    .map(|q| MessageQueue::new(topic, &q.broker_name, q.queue_id))
                    .collect();
                if write_queues.is_empty() {
                    return Err(ClientError::TopicNotFound {
                        topic: topic.to_owned(),
                    });
                }
                Ok(Arc::new(TopicRoute {
                    topic: topic.to_owned(),
                    brokers: fallback.brokers.clone(),
                    read_queues: write_queues.clone(),
                    write_queues,
                }))
            }
            Err(error) => Err(error),
        }
    }

    fn select(
        &self,
        route: &TopicRoute,
        selector: QueueSelector<'_>,
        avoid_broker: Option<&str>,
    ) -> Result<MessageQueue> {
        let queues = &route.write_queues;
        if queues.is_empty() {
            return Err(ClientError::NoRoute {
                topic: route.topic.clone(),
                purpose: "sending",
            });
        }
        match selector {
            QueueSelector::KeyHash(key) => {
                let index = (java_hash(key).unsigned_abs() % queues.len() as u64) as usize;
                Ok(queues[index].clone())
            }
            QueueSelector::QueueId(queue_id) => queues
                .iter()
                .find(|q| q.queue_id == queue_id)
                .cloned()
                .ok_or_else(|| ClientError::InvalidArgument {
                    what: "queue id",
                    reason: format!("topic {} has no writable queue {queue_id}", route.topic),
                }),
            QueueSelector::RoundRobin => {
                for _ in 0..queues.len() {
                    let index = self.round_robin.fetch_add(1, Ordering::Relaxed) % queues.len();
                    if avoid_broker != Some(queues[index].broker_name.as_str()) {
                        return Ok(queues[index].clone());
                    }
                }
                let index = self.round_robin.fetch_add(1, Ordering::Relaxed) % queues.len();
                Ok(queues[index].clone())
            }
        }
    }

    async fn send_with_retries(
        &self,
        topic: &str,
        selector: QueueSelector<'_>,
        build: impl Fn(&MessageQueue) -> RemotingCommand,
    ) -> Result<SendResult> {
        let mut failed_broker: Option<String> = None;
        let mut last_error = None;
        for attempt in 0..=self.config.retries {
            let route = self.route_for_send(topic).await?;
            let queue = self.select(&route, selector, failed_broker.as_deref())?;
            let addr = self.core.broker_addr(&queue.broker_name)?;
            let request = build(&queue);
            let request_code = request.code;
            let outcome = match self
                .core
                .remoting
                .invoke(&addr, request, self.config.send_timeout)
                .await
            {
                Ok(response) => {
                    interpret_send_response(&addr, request_code, topic, queue.clone(), response)
                }
                Err(error) => Err(error),
            };
            match outcome {
                Ok(result) => return Ok(result),
                Err(error) if !is_retriable(&error) => return Err(error),
                Err(error) => {
                    tracing::debug!(%topic, %addr, attempt, %error, "send failed; retrying on another queue");
                    failed_broker = Some(queue.broker_name.clone());
                    last_error = Some(error);
                    // The broker may be gone or the topic moved: look the route up again.
                    let _ = self.core.fetch_route(topic).await;
                }
            }
        }
        Err(last_error.unwrap_or(ClientError::NoRoute {
            topic: topic.to_owned(),
            purpose: "sending",
        }))
    }
}

fn is_retriable(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::Connect { .. }
            | ClientError::ConnectionClosed { .. }
            | ClientError::Io { .. }
            | ClientError::Timeout { .. }
            | ClientError::BrokerBusy { .. }
    ) || matches!(error, ClientError::Broker { code, .. }
        if *code == code::response::SYSTEM_ERROR || *code == code::response::SERVICE_NOT_AVAILABLE)
}

fn interpret_send_response(
    addr: &str,
    request_code: i32,
    topic: &str,
    queue: MessageQueue,
    response: RemotingCommand,
) -> Result<SendResult> {
    use code::response as r;
    let status = match response.code {
        r::SUCCESS => SendStatus::Ok,
        r::FLUSH_DISK_TIMEOUT => SendStatus::FlushDiskTimeout,
        r::FLUSH_SLAVE_TIMEOUT => SendStatus::FlushSlaveTimeout,
        r::SLAVE_NOT_AVAILABLE => SendStatus::SlaveNotAvailable,
        r::TOPIC_NOT_EXIST => {
            return Err(ClientError::TopicNotFound {
                topic: topic.to_owned(),
            })
        }
        _ => return Err(response_error(addr, request_code, &response)),
    };
    let header: SendMessageResponseHeader = response_header(addr, request_code, &response)?;
    let invalid = |field: &'static str, value: i64| ClientError::Header {
        addr: addr.to_owned(),
        request_code,
        source: HeaderError::Invalid {
            field,
            value: value.to_string(),
        },
    };
    let queue_id =
        u32::try_from(header.queue_id).map_err(|_| invalid("queueId", header.queue_id.into()))?;
    let queue_offset = u64::try_from(header.queue_offset)
        .map_err(|_| invalid("queueOffset", header.queue_offset))?;
    Ok(SendResult {
        status,
        msg_id: String::new(),
        offset_msg_id: header.msg_id,
        queue: MessageQueue::new(topic, &queue.broker_name, queue_id),
        queue_offset: QueueOffset(queue_offset),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_with_oversized_properties_is_a_typed_error_not_a_panic() {
        // Refused before any connection: nothing needs to listen on this port.
        let producer = Producer::new(ProducerConfig::new("127.0.0.1:9"));
        let oversized = Message::new("orders", "b").with_property("big", "x".repeat(40_000));
        let error = producer
            .send_batch(vec![Message::new("orders", "a"), oversized])
            .await
            .expect_err("properties over 32767 bytes cannot be batched");
        match error {
            ClientError::BatchEncode { topic, source } => {
                assert_eq!(topic, "orders");
                assert!(matches!(
                    source,
                    quiver_protocol::MessageError::FieldTooLong {
                        field: "properties",
                        ..
                    }
                ));
            }
            other => panic!("expected BatchEncode, got {other:?}"),
        }
    }
}
