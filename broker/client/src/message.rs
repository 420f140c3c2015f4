//! Messages as users build them and as consumers receive them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use quiver_protocol::message as wire;
use quiver_protocol::offset::{CommitLogOffset, QueueOffset};
use quiver_protocol::record::Record;

use crate::pull_from_where::is_retry_topic;
use crate::MessageQueue;

/// RocketMQ joins several keys with a space in the KEYS property.
const KEY_SEPARATOR: char = ' ';

/// A message to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub body: Bytes,
    pub flag: i32,
    pub properties: BTreeMap<String, String>,
}

impl Message {
    pub fn new(topic: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            body: body.into(),
            flag: 0,
            properties: BTreeMap::new(),
        }
    }

    pub fn with_tags(mut self, tags: impl Into<String>) -> Self {
        self.properties
            .insert(wire::PROPERTY_TAGS.to_owned(), tags.into());
        self
    }

    /// Index keys (RocketMQ stores them space-separated in KEYS).
    pub fn with_keys<I, S>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let joined = keys
            .into_iter()
            .map(|k| k.as_ref().to_owned())
            .collect::<Vec<_>>()
            .join(" ");
        if !joined.is_empty() {
            self.properties
                .insert(wire::PROPERTY_KEYS.to_owned(), joined);
        }
        self
    }

    pub fn with_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Delivery delayed by RocketMQ delay level (1 = 1 s, 2 = 5 s, 3 = 10 s, ...).
    pub fn with_delay_level(mut self, level: u32) -> Self {
        self.properties
            .insert(wire::PROPERTY_DELAY.to_owned(), level.to_string());
        self
    }

    /// Delivered at `deliver_at_ms` (ms since the epoch; RocketMQ 5.x TIMER_DELIVER_MS).
    pub fn with_deliver_at_ms(mut self, deliver_at_ms: i64) -> Self {
        self.properties.insert(
            wire::PROPERTY_TIMER_DELIVER_MS.to_owned(),
            deliver_at_ms.to_string(),
        );
        self
    }

    /// Delivered `delay_ms` after the broker receives it (RocketMQ 5.x TIMER_DELAY_MS).
    pub fn with_delay_ms(mut self, delay_ms: u64) -> Self {
        self.properties.insert(
            wire::PROPERTY_TIMER_DELAY_MS.to_owned(),
            delay_ms.to_string(),
        );
        self
    }

    pub fn tags(&self) -> Option<&str> {
        self.properties.get(wire::PROPERTY_TAGS).map(String::as_str)
    }

    pub fn keys(&self) -> Vec<&str> {
        split_keys(self.properties.get(wire::PROPERTY_KEYS))
    }

    /// Bytes the broker counts against its message size limit.
    pub fn wire_size_bytes(&self) -> usize {
        self.body.len() + encoded_properties(&self.properties).len()
    }
}

fn split_keys(keys: Option<&String>) -> Vec<&str> {
    keys.map(|k| k.split(KEY_SEPARATOR).filter(|k| !k.is_empty()).collect())
        .unwrap_or_default()
}

/// RocketMQ's `k\x01v\x02` property string.
pub(crate) fn encoded_properties(properties: &BTreeMap<String, String>) -> String {
    quiver_protocol::record::encode_properties(
        properties.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
}

/// A unique client-side message id (RocketMQ's UNIQ_KEY): 32 hex characters made of a
/// per-process prefix, the time and a counter, so ids stay unique across processes.
pub fn new_unique_id() -> String {
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU16 = AtomicU16::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let random: u32 = rand::random();
        format!(
            "{:08X}{:04X}{:08X}",
            u32::from_be_bytes([127, 0, 0, 1]),
            std::process::id() as u16,
            random
        )
    });
    let millis = now_ms();
    let counter = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:08X}{counter:04X}", millis as u32)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A message as a consumer receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedMessage {
    /// The topic the producer sent to (the original topic for redelivered retry messages).
    pub topic: String,
    /// The queue it was pulled from (a `%RETRY%` queue for redeliveries).
    pub queue: MessageQueue,
    pub queue_offset: QueueOffset,
    pub commit_log_offset: CommitLogOffset,
    pub body: Bytes,
    pub flag: i32,
    pub sys_flag: i32,
    pub properties: BTreeMap<String, String>,
    pub reconsume_times: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_timestamp_ms: i64,
    pub store_host: SocketAddr,
    /// Encoded record size, counted by flow control.
    pub size_bytes: u64,
}

impl ReceivedMessage {
    pub fn from_record(record: Record, queue: MessageQueue, size_bytes: u64) -> Self {
        let properties = quiver_protocol::record::parse_properties(&record.properties);
        // Redeliveries come from %RETRY%group; users see the topic the producer chose.
        let topic = match properties.get(wire::PROPERTY_RETRY_TOPIC) {
            Some(original) if is_retry_topic(&record.topic) => original.clone(),
            _ => record.topic.clone(),
        };
        Self {
            topic,
            queue,
            queue_offset: record.queue_offset,
            commit_log_offset: record.physical_offset,
            body: record.body,
            flag: record.flag,
            sys_flag: record.sys_flag,
            properties,
            reconsume_times: record.reconsume_times,
            born_timestamp_ms: record.born_timestamp_ms,
            born_host: record.born_host,
            store_timestamp_ms: record.store_timestamp_ms,
            store_host: record.store_host,
            size_bytes,
        }
    }

    pub fn tags(&self) -> Option<&str> {
        self.properties.get(wire::PROPERTY_TAGS).map(String::as_str)
    }

    pub fn keys(&self) -> Vec<&str> {
        split_keys(self.properties.get(wire::PROPERTY_KEYS))
    }

    pub fn property(&self, key: &str) -> Option<&str> {
        self.properties.get(key).map(String::as_str)
    }

    /// The broker-side id (store host + commit log offset) used for send-back.
    pub fn offset_msg_id(&self) -> String {
        wire::offset_msg_id(self.store_host, self.commit_log_offset.0)
    }

    /// The producer's unique id when present, else the offset id.
    pub fn msg_id(&self) -> String {
        self.properties
            .get(wire::PROPERTY_UNIQ_KEY)
            .cloned()
            .unwrap_or_else(|| self.offset_msg_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_space_joined_and_split() {
        let message = Message::new("t", "b")
            .with_keys(["k1", "k2"])
            .with_tags("TagA");
        assert_eq!(message.keys(), vec!["k1", "k2"]);
        assert_eq!(message.tags(), Some("TagA"));
        assert_eq!(
            message.properties.get("KEYS").map(String::as_str),
            Some("k1 k2")
        );
    }

    #[test]
    fn unique_ids_are_32_hex_and_distinct() {
        let a = new_unique_id();
        let b = new_unique_id();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
