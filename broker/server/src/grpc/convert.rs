//! Messages between the 5.x form (`v2::Message`) and the stored record, so a consumer of
//! either protocol reads what the other sent: the message id is the `UNIQ_KEY` property,
//! the tag `TAGS`, the keys `KEYS` (space separated, as 4.x clients join them), the message
//! group `__SHARDINGKEY`, the delivery time `TIMER_DELIVER_MS`; user properties as they are.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use prost_types::Timestamp;
use quiver_grpc_proto::prost_types;
use quiver_grpc_proto::v2::{self, Code, DigestType, Encoding, MessageType};
use quiver_protocol::message as msg;
use quiver_protocol::record::{property, Record};

use super::call::name;
use super::status::status;

/// Properties the broker or the client libraries own: a user property may not set them.
const RESERVED_PROPERTIES: &[&str] = &[
    msg::PROPERTY_UNIQ_KEY,
    msg::PROPERTY_TAGS,
    msg::PROPERTY_KEYS,
    msg::PROPERTY_SHARDING_KEY,
    msg::PROPERTY_DELAY,
    msg::PROPERTY_TIMER_DELIVER_MS,
    msg::PROPERTY_TIMER_DELAY_SEC,
    msg::PROPERTY_TIMER_DELAY_MS,
    msg::PROPERTY_TIMER_OUT_MS,
    msg::PROPERTY_TRANSACTION_PREPARED,
    msg::PROPERTY_PRODUCER_GROUP,
    msg::PROPERTY_REAL_TOPIC,
    msg::PROPERTY_REAL_QID,
    msg::PROPERTY_RETRY_TOPIC,
    msg::PROPERTY_RECONSUME_TIME,
    msg::PROPERTY_MAX_RECONSUME_TIMES,
    msg::PROPERTY_TRANSACTION_CHECK_TIMES,
    msg::PROPERTY_WAIT,
    msg::PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
];

/// 4.x joins keys with a space (`MessageConst.KEY_SEPARATOR`).
const KEY_SEPARATOR: char = ' ';
/// A Timestamp's `seconds` beyond this (year 5138) is read as milliseconds: the Python
/// client 5.1.2 puts a millisecond delivery time there.
const SECONDS_THAT_ARE_MILLISECONDS: i64 = 100_000_000_000;

/// A 5.x message checked and turned into what the store keeps.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Incoming {
    pub topic: String,
    pub message_id: String,
    pub properties: BTreeMap<String, String>,
    pub kind: MessageType,
    /// The FIFO message group (`__SHARDINGKEY`).
    pub group: Option<String>,
    pub born_timestamp_ms: i64,
}

/// Checks one message of a SendMessage and builds its properties; the status says what is
/// wrong with it otherwise.
pub(crate) fn incoming(message: &v2::Message, now_ms: i64) -> Result<Incoming, v2::Status> {
    let topic = name(message.topic.as_ref());
    if topic.is_empty() {
        return Err(status(Code::IllegalTopic, "the message names no topic"));
    }
    let system = message.system_properties.clone().unwrap_or_default();
    if system.message_id.is_empty() {
        return Err(status(
            Code::IllegalMessageId,
            "the message has no message_id",
        ));
    }
    if system.body_encoding == Encoding::Gzip as i32 {
        return Err(status(
            Code::BadRequest,
            "gzip-encoded bodies are not supported; send the body as is (identity)",
        ));
    }
    let mut properties = user_properties(message)?;
    let kind = MessageType::try_from(system.message_type).unwrap_or(MessageType::Normal);
    let group = add_system_properties(&mut properties, &system, kind, now_ms);
    if kind == MessageType::Fifo && group.is_none() {
        return Err(status(
            Code::MessagePropertyConflictWithType,
            "a FIFO message needs a message group",
        ));
    }
    let born_timestamp_ms = system.born_timestamp.as_ref().map_or(now_ms, timestamp_ms);
    Ok(Incoming {
        topic: topic.to_owned(),
        message_id: system.message_id,
        properties,
        kind,
        group,
        born_timestamp_ms,
    })
}

/// The message's user properties, none of them reserved.
fn user_properties(message: &v2::Message) -> Result<BTreeMap<String, String>, v2::Status> {
    let mut properties = BTreeMap::new();
    for (key, value) in &message.user_properties {
        if RESERVED_PROPERTIES.contains(&key.as_str()) {
            return Err(status(
                Code::IllegalMessagePropertyKey,
                format!("user property {key} is reserved"),
            ));
        }
        properties.insert(key.clone(), value.clone());
    }
    Ok(properties)
}

/// Adds the properties the system properties stand for; returns the message group.
fn add_system_properties(
    properties: &mut BTreeMap<String, String>,
    system: &v2::SystemProperties,
    kind: MessageType,
    now_ms: i64,
) -> Option<String> {
    properties.insert(msg::PROPERTY_UNIQ_KEY.into(), system.message_id.clone());
    if let Some(tag) = system.tag.as_ref().filter(|tag| !tag.is_empty()) {
        properties.insert(msg::PROPERTY_TAGS.into(), tag.clone());
    }
    let keys: Vec<&str> = system
        .keys
        .iter()
        .map(String::as_str)
        .filter(|k| !k.is_empty())
        .collect();
    if !keys.is_empty() {
        properties.insert(
            msg::PROPERTY_KEYS.into(),
            keys.join(&KEY_SEPARATOR.to_string()),
        );
    }
    let group = system
        .message_group
        .clone()
        .filter(|group| !group.is_empty());
    if let Some(group) = &group {
        properties.insert(msg::PROPERTY_SHARDING_KEY.into(), group.clone());
    }
    if let Some(at) = &system.delivery_timestamp {
        let deliver_ms = timestamp_ms(at);
        if deliver_ms > now_ms {
            properties.insert(
                msg::PROPERTY_TIMER_DELIVER_MS.into(),
                deliver_ms.to_string(),
            );
        }
    }
    if let Some(trace) = system.trace_context.as_ref().filter(|t| !t.is_empty()) {
        properties.insert("TRACE_CONTEXT".into(), trace.clone());
    }
    if let Some(recovery) = system
        .orphaned_transaction_recovery_duration
        .as_ref()
        .filter(|_| kind == MessageType::Transaction)
    {
        // The check-back leaves the half message alone this long (Apache's Proxy does so).
        properties.insert(
            msg::PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS.into(),
            std_duration(recovery).as_secs().to_string(),
        );
    }
    group
}

/// Milliseconds since the epoch of a Timestamp (see [`SECONDS_THAT_ARE_MILLISECONDS`]).
pub(crate) fn timestamp_ms(at: &Timestamp) -> i64 {
    if at.seconds > SECONDS_THAT_ARE_MILLISECONDS {
        return at.seconds;
    }
    at.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(at.nanos) / 1_000_000)
}

pub(crate) fn timestamp(ms: i64) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

pub(crate) fn duration(of: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(of.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(of.subsec_nanos()).unwrap_or(0),
    }
}

/// A protobuf Duration as a std one; negative is zero.
pub(crate) fn std_duration(of: &prost_types::Duration) -> Duration {
    let seconds = u64::try_from(of.seconds).unwrap_or(0);
    let nanos = u32::try_from(of.nanos).unwrap_or(0);
    Duration::new(seconds, 0) + Duration::from_nanos(u64::from(nanos))
}

/// How a received message was handed out (POP): absent for a check-back's message.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub receipt_handle: String,
    pub delivery_attempt: u32,
    pub invisible: Duration,
}

/// A stored record as a 5.x client reads it, named by `topic` (the subscribed one, not a
/// retry topic).
pub(crate) fn outgoing(
    record: &Record,
    topic: &str,
    delivery: Option<Delivery>,
    store_host: &str,
) -> v2::Message {
    let properties = record.properties_map();
    let get = |key: &str| property(&record.properties, key).map(str::to_owned);
    let message_id = get(msg::PROPERTY_UNIQ_KEY)
        .unwrap_or_else(|| msg::offset_msg_id(record.store_host, record.physical_offset.0));
    let message_group = get(msg::PROPERTY_SHARDING_KEY).filter(|g| !g.is_empty());
    // A released timed message keeps its deliver time in TIMER_OUT_MS (Apache's proxy reads it first).
    let deliver_ms = get(msg::PROPERTY_TIMER_OUT_MS)
        .or_else(|| get(msg::PROPERTY_TIMER_DELIVER_MS))
        .and_then(|ms| ms.parse::<i64>().ok());
    let is_transactional = msg::sys_flag::transaction_type(record.sys_flag)
        != msg::sys_flag::TRANSACTION_NOT_TYPE
        || get(msg::PROPERTY_TRANSACTION_PREPARED).as_deref() == Some("true");
    let message_type = if is_transactional {
        MessageType::Transaction
    } else if message_group.is_some() {
        MessageType::Fifo
    } else if deliver_ms.is_some() {
        MessageType::Delay
    } else {
        MessageType::Normal
    };
    let user_properties = properties
        .into_iter()
        .filter(|(key, _)| !RESERVED_PROPERTIES.contains(&key.as_str()))
        .collect();
    let keys = get(msg::PROPERTY_KEYS)
        .map(|keys| {
            keys.split(KEY_SEPARATOR)
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let system_properties = v2::SystemProperties {
        tag: get(msg::PROPERTY_TAGS),
        keys,
        message_id,
        body_digest: Some(v2::Digest {
            r#type: DigestType::Sha1 as i32,
            checksum: sha1_hex(&record.body),
        }),
        body_encoding: Encoding::Identity as i32,
        message_type: message_type as i32,
        born_timestamp: Some(timestamp(record.born_timestamp_ms)),
        born_host: host_of(record.born_host),
        store_timestamp: Some(timestamp(record.store_timestamp_ms)),
        store_host: store_host.to_owned(),
        delivery_timestamp: deliver_ms.map(timestamp),
        receipt_handle: delivery.as_ref().map(|d| d.receipt_handle.clone()),
        queue_id: i32::try_from(record.queue_id).unwrap_or(i32::MAX),
        queue_offset: i64::try_from(record.queue_offset.0).ok(),
        invisible_duration: delivery.as_ref().map(|d| duration(d.invisible)),
        delivery_attempt: delivery
            .as_ref()
            .map(|d| i32::try_from(d.delivery_attempt).unwrap_or(i32::MAX)),
        message_group,
        trace_context: get("TRACE_CONTEXT"),
        orphaned_transaction_recovery_duration: None,
    };
    v2::Message {
        topic: Some(v2::Resource {
            resource_namespace: String::new(),
            name: topic.to_owned(),
        }),
        user_properties,
        system_properties: Some(system_properties),
        body: record.body.clone(),
    }
}

fn host_of(address: SocketAddr) -> String {
    address.ip().to_string()
}

/// Upper-case hex SHA-1: the body digest every 5.x client checks alike (their CRC32 texts
/// differ in zero padding between languages).
fn sha1_hex(body: &[u8]) -> String {
    use sha1::Digest as _;
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let digest = sha1::Sha1::digest(body);
    // One allocation, not one `format!` per byte (6% of a receive's broker CPU).
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0F)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn body_digest_is_upper_case_hex_sha1() {
        // FIPS 180's "abc" example.
        assert_eq!(sha1_hex(b"abc"), "A9993E364706816ABA3E25717850C26C9CD0D89D");
        assert_eq!(sha1_hex(b"").len(), 40);
    }

    fn message(id: &str) -> v2::Message {
        v2::Message {
            topic: Some(v2::Resource {
                resource_namespace: String::new(),
                name: "T".into(),
            }),
            user_properties: [("color".to_owned(), "red".to_owned())].into(),
            system_properties: Some(v2::SystemProperties {
                message_id: id.into(),
                tag: Some("TagA".into()),
                keys: vec!["k1".into(), "k2".into()],
                message_group: Some("g".into()),
                message_type: MessageType::Fifo as i32,
                ..Default::default()
            }),
            body: Bytes::from_static(b"hello"),
        }
    }

    #[test]
    fn properties_carry_id_tag_keys_group_and_user_properties() {
        let checked = incoming(&message("ID1"), 1_000).expect("valid");
        let expected: BTreeMap<String, String> = [
            ("UNIQ_KEY", "ID1"),
            ("TAGS", "TagA"),
            ("KEYS", "k1 k2"),
            ("__SHARDINGKEY", "g"),
            ("color", "red"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(checked.properties, expected);
        assert_eq!(checked.group.as_deref(), Some("g"));
    }

    #[test]
    fn bad_messages_are_refused_with_their_code() {
        let no_id = incoming(&message(""), 0).unwrap_err();
        assert_eq!(no_id.code, Code::IllegalMessageId as i32);
        let mut reserved = message("ID");
        reserved
            .user_properties
            .insert("UNIQ_KEY".into(), "x".into());
        assert_eq!(
            incoming(&reserved, 0).unwrap_err().code,
            Code::IllegalMessagePropertyKey as i32
        );
        let mut fifo_without_group = message("ID");
        fifo_without_group
            .system_properties
            .as_mut()
            .unwrap()
            .message_group = None;
        assert_eq!(
            incoming(&fifo_without_group, 0).unwrap_err().code,
            Code::MessagePropertyConflictWithType as i32
        );
    }

    #[test]
    fn millisecond_seconds_are_read_as_milliseconds() {
        let proper = Timestamp {
            seconds: 1_800_000_000,
            nanos: 250_000_000,
        };
        assert_eq!(timestamp_ms(&proper), 1_800_000_000_250);
        let python = Timestamp {
            seconds: 1_800_000_000_250,
            nanos: 0,
        };
        assert_eq!(timestamp_ms(&python), 1_800_000_000_250);
        assert_eq!(
            timestamp_ms(&timestamp(1_800_000_000_250)),
            1_800_000_000_250
        );
    }

    #[test]
    fn a_delivery_time_ahead_becomes_the_timer_property() {
        let mut delayed = message("ID");
        delayed
            .system_properties
            .as_mut()
            .unwrap()
            .delivery_timestamp = Some(timestamp(5_000));
        let checked = incoming(&delayed, 1_000).expect("valid");
        assert_eq!(
            checked
                .properties
                .get("TIMER_DELIVER_MS")
                .map(String::as_str),
            Some("5000")
        );
        let due = incoming(&delayed, 9_000).expect("valid");
        assert!(
            !due.properties.contains_key("TIMER_DELIVER_MS"),
            "already due"
        );
    }
}
