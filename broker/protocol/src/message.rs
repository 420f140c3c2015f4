//! Client-side message forms that travel in request bodies, message ids and property names.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::MessageError;

pub const PROPERTY_KEYS: &str = "KEYS";
pub const PROPERTY_TAGS: &str = "TAGS";
/// "true" when the producer waits for the store (always true in practice).
pub const PROPERTY_WAIT_STORE_MSG_OK: &str = "WAIT";
pub const PROPERTY_WAIT: &str = PROPERTY_WAIT_STORE_MSG_OK;
/// Delay level 1..=18 of a scheduled message.
pub const PROPERTY_DELAY: &str = "DELAY";
pub const PROPERTY_DELAY_TIME_LEVEL: &str = PROPERTY_DELAY;
/// The original topic of a message moved to %RETRY%/%DLQ%.
pub const PROPERTY_RETRY_TOPIC: &str = "RETRY_TOPIC";
/// The destination topic of a message parked in SCHEDULE_TOPIC_XXXX.
pub const PROPERTY_REAL_TOPIC: &str = "REAL_TOPIC";
/// The destination queue of a message parked in SCHEDULE_TOPIC_XXXX.
pub const PROPERTY_REAL_QID: &str = "REAL_QID";
pub const PROPERTY_REAL_QUEUE_ID: &str = PROPERTY_REAL_QID;
pub const PROPERTY_TRANSACTION_PREPARED: &str = "TRAN_MSG";
pub const PROPERTY_PRODUCER_GROUP: &str = "PGROUP";
pub const PROPERTY_MIN_OFFSET: &str = "MIN_OFFSET";
pub const PROPERTY_MAX_OFFSET: &str = "MAX_OFFSET";
pub const PROPERTY_BUYER_ID: &str = "BUYER_ID";
/// The offset message id of the message a retry copy was made from.
pub const PROPERTY_ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
pub const PROPERTY_TRANSFER_FLAG: &str = "TRANSFER_FLAG";
pub const PROPERTY_CORRECTION_FLAG: &str = "CORRECTION_FLAG";
pub const PROPERTY_MQ2_FLAG: &str = "MQ2_FLAG";
pub const PROPERTY_RECONSUME_TIME: &str = "RECONSUME_TIME";
pub const PROPERTY_MSG_REGION: &str = "MSG_REGION";
pub const PROPERTY_TRACE_ON: &str = "TRACE_ON";
/// The client-generated unique id (what `SendResult.msgId` shows on Java clients).
pub const PROPERTY_UNIQ_KEY: &str = "UNIQ_KEY";
pub const PROPERTY_MAX_RECONSUME_TIMES: &str = "MAX_RECONSUME_TIMES";
pub const PROPERTY_CONSUME_START_TIME: &str = "CONSUME_START_TIME";
/// How many times the broker asked the producer for a half message's outcome.
pub const PROPERTY_TRANSACTION_CHECK_TIMES: &str = "TRANSACTION_CHECK_TIMES";
/// Seconds a half message is not checked back after it was sent (instead of the broker's
/// transaction timeout).
pub const PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS: &str = "CHECK_IMMUNITY_TIME_IN_SECONDS";
pub const PROPERTY_INSTANCE_ID: &str = "INSTANCE_ID";
pub const PROPERTY_CLUSTER: &str = "CLUSTER";
pub const PROPERTY_SHARDING_KEY: &str = "__SHARDINGKEY";
/// RocketMQ 5.x timed delivery: an absolute time, or a delay in seconds or milliseconds.
pub const PROPERTY_TIMER_DELIVER_MS: &str = "TIMER_DELIVER_MS";
pub const PROPERTY_TIMER_DELAY_SEC: &str = "TIMER_DELAY_SEC";
pub const PROPERTY_TIMER_DELAY_MS: &str = "TIMER_DELAY_MS";
/// The deliver time the broker computed, on a message waiting in the timer topic.
pub const PROPERTY_TIMER_OUT_MS: &str = "TIMER_OUT_MS";
/// Request-reply: the requester's client id, the request's correlation id, when the broker
/// pushed the reply.
pub const PROPERTY_MESSAGE_REPLY_TO_CLIENT: &str = "REPLY_TO_CLIENT";
pub const PROPERTY_CORRELATION_ID: &str = "CORRELATION_ID";
pub const PROPERTY_PUSH_REPLY_TIME: &str = "PUSH_REPLY_TIME";
/// Separates several keys inside the KEYS property.
pub const KEY_SEPARATOR: &str = " ";
/// Separates the key and value of one property in the encoded string.
pub const NAME_VALUE_SEPARATOR: char = '\u{1}';
/// Ends each property in the encoded string.
pub const PROPERTY_SEPARATOR: char = '\u{2}';

/// `MessageSysFlag` bits carried in send headers and records.
pub mod sys_flag {
    pub const COMPRESSED: i32 = 0x1;
    pub const MULTI_TAGS: i32 = 0x2;
    /// No transaction (the transaction type bits, `TRANSACTION_ROLLBACK`, all clear).
    pub const TRANSACTION_NOT_TYPE: i32 = 0;
    pub const TRANSACTION_PREPARED: i32 = 0x4;
    pub const TRANSACTION_COMMIT: i32 = 0x8;
    pub const TRANSACTION_ROLLBACK: i32 = 0xC;
    /// The born host is IPv6 (16 address bytes in the record).
    pub const BORN_HOST_V6: i32 = 0x10;
    /// The store host is IPv6.
    pub const STORE_HOST_V6: i32 = 0x20;

    /// The transaction type of `flag` (one of the four `TRANSACTION_*` values).
    pub fn transaction_type(flag: i32) -> i32 {
        flag & TRANSACTION_ROLLBACK
    }

    /// `flag` with its transaction type replaced by `kind` (Apache's `resetTransactionValue`).
    pub fn with_transaction_type(flag: i32, kind: i32) -> i32 {
        (flag & !TRANSACTION_ROLLBACK) | kind
    }
}

/// The properties field of a batched message is an i16-length string.
pub const MAX_PROPERTIES_BYTES: usize = i16::MAX as usize;

/// One message of a SEND_BATCH_MESSAGE body.
///
/// ```text
/// i32 total_size   i32 magic (0)   i32 body_crc (0)   i32 flag
/// i32 body_len     body
/// i16 props_len    properties ("k\u{1}v\u{2}..." UTF-8)
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchMessage {
    pub flag: i32,
    pub body: Bytes,
    pub properties: String,
}

/// Bytes of a batched message besides its body and properties.
const BATCH_MESSAGE_OVERHEAD: usize = 4 + 4 + 4 + 4 + 4 + 2;

/// Encodes messages as Java's `MessageDecoder.encodeMessages` does.
///
/// # Panics
/// If a message's properties exceed [`MAX_PROPERTIES_BYTES`] or its body exceeds i32; use
/// [`try_encode_batch`] for input that has not been checked.
pub fn encode_batch(msgs: &[BatchMessage]) -> Bytes {
    match try_encode_batch(msgs) {
        Ok(encoded) => encoded,
        Err(error) => panic!("encode_batch: {error}"),
    }
}

/// Encodes messages as Java's `MessageDecoder.encodeMessages` does, refusing fields that do
/// not fit their length prefixes.
pub fn try_encode_batch(msgs: &[BatchMessage]) -> Result<Bytes, MessageError> {
    let capacity = msgs
        .iter()
        .map(|msg| BATCH_MESSAGE_OVERHEAD + msg.body.len() + msg.properties.len())
        .sum();
    let mut out = BytesMut::with_capacity(capacity);
    for msg in msgs {
        let properties_len =
            i16::try_from(msg.properties.len()).map_err(|_| MessageError::FieldTooLong {
                field: "properties",
                len: msg.properties.len(),
            })?;
        let total = BATCH_MESSAGE_OVERHEAD + msg.body.len() + msg.properties.len();
        let total = i32::try_from(total).map_err(|_| MessageError::FieldTooLong {
            field: "body",
            len: msg.body.len(),
        })?;
        out.put_i32(total);
        out.put_i32(0); // magic: unused in batch bodies
        out.put_i32(0); // body crc: the broker computes it when storing
        out.put_i32(msg.flag);
        // Lossless: body.len() < total, which fits an i32.
        out.put_i32(msg.body.len() as i32);
        out.put_slice(&msg.body);
        out.put_i16(properties_len);
        out.put_slice(msg.properties.as_bytes());
    }
    Ok(out.freeze())
}

/// Decodes a SEND_BATCH_MESSAGE body; every length is checked against the bytes present.
pub fn decode_batch(body: &[u8]) -> Result<Vec<BatchMessage>, MessageError> {
    decode_batch_shared(&Bytes::copy_from_slice(body))
}

/// Like [`decode_batch`], with bodies as zero-copy views of `body`.
pub fn decode_batch_shared(body: &Bytes) -> Result<Vec<BatchMessage>, MessageError> {
    let mut messages = Vec::new();
    let mut offset = 0;
    while offset < body.len() {
        let start = offset;
        let remaining = body.len() - offset;
        let read_i32 = |at: usize| -> Result<i32, MessageError> {
            let bytes = body.get(at..at + 4).ok_or(MessageError::Truncated {
                offset: at,
                needed: 4,
                available: body.len().saturating_sub(at),
            })?;
            Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        };
        let total = read_i32(start)?;
        let total = usize::try_from(total)
            .ok()
            .filter(|&total| total >= BATCH_MESSAGE_OVERHEAD)
            .ok_or(MessageError::InvalidLength {
                offset: start,
                field: "total_size",
                value: i64::from(total),
            })?;
        if total > remaining {
            return Err(MessageError::Truncated {
                offset: start,
                needed: total,
                available: remaining,
            });
        }
        let end = start + total;
        let flag = read_i32(start + 12)?;
        let body_len = read_i32(start + 16)?;
        let body_start = start + 20;
        let body_len = usize::try_from(body_len)
            .ok()
            .filter(|&len| len <= end.saturating_sub(body_start + 2))
            .ok_or(MessageError::InvalidLength {
                offset: start,
                field: "body_len",
                value: i64::from(body_len),
            })?;
        let props_at = body_start + body_len;
        let props_len = i16::from_be_bytes([body[props_at], body[props_at + 1]]);
        let props_start = props_at + 2;
        let props_len = usize::try_from(props_len)
            .ok()
            .filter(|&len| props_start + len == end)
            .ok_or(MessageError::InvalidLength {
                offset: start,
                field: "properties_len",
                value: i64::from(props_len),
            })?;
        let properties = std::str::from_utf8(&body[props_start..props_start + props_len])
            .map_err(|_| MessageError::InvalidUtf8 {
                offset: start,
                field: "properties",
            })?
            .to_owned();
        messages.push(BatchMessage {
            flag,
            body: body.slice(body_start..props_at),
            properties,
        });
        offset = end;
    }
    Ok(messages)
}

/// RocketMQ's offset message id (`MessageDecoder.createMessageId`): the store host's address
/// bytes, its port as i32 and the physical offset as i64, in upper-case hex. 32 characters
/// for IPv4, 56 for IPv6.
pub fn offset_msg_id(store_host: SocketAddr, physical_offset: u64) -> String {
    let mut raw = Vec::with_capacity(28);
    match store_host.ip() {
        IpAddr::V4(ip) => raw.extend_from_slice(&ip.octets()),
        IpAddr::V6(ip) => raw.extend_from_slice(&ip.octets()),
    }
    raw.extend_from_slice(&u32::from(store_host.port()).to_be_bytes());
    raw.extend_from_slice(&physical_offset.to_be_bytes());
    let mut id = String::with_capacity(raw.len() * 2);
    for byte in raw {
        id.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
        id.push(char::from(HEX_DIGITS[usize::from(byte & 0xF)]));
    }
    id
}

const HEX_DIGITS: &[u8; 16] = b"0123456789ABCDEF";

/// Reads an offset message id back into the store host and the physical offset.
pub fn decode_offset_msg_id(id: &str) -> Result<(SocketAddr, u64), MessageError> {
    let invalid = |reason| MessageError::InvalidMessageId {
        id: id.chars().take(64).collect(),
        reason,
    };
    let address_len = match id.len() {
        32 => 4,
        56 => 16,
        _ => {
            return Err(invalid(
                "length must be 32 (IPv4) or 56 (IPv6) hex characters",
            ))
        }
    };
    let raw = id
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            let high = hex_value(pair[0])?;
            let low = hex_value(pair[1])?;
            Some(high << 4 | low)
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| invalid("not hexadecimal"))?;
    let (address, rest) = raw.split_at(address_len);
    let port = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let port = u16::try_from(port).map_err(|_| invalid("port out of range"))?;
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&rest[4..12]);
    let ip = match address_len {
        4 => IpAddr::V4(Ipv4Addr::new(
            address[0], address[1], address[2], address[3],
        )),
        _ => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(address);
            IpAddr::V6(Ipv6Addr::from(octets))
        }
    };
    Ok((SocketAddr::new(ip, port), u64::from_be_bytes(offset)))
}

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<BatchMessage> {
        vec![
            BatchMessage {
                flag: 0,
                body: Bytes::from_static(b"first"),
                properties: "TAGS\u{1}A\u{2}KEYS\u{1}k1\u{2}".into(),
            },
            BatchMessage {
                flag: 7,
                body: Bytes::new(),
                properties: String::new(),
            },
            BatchMessage {
                flag: -1,
                body: Bytes::from(vec![0u8; 300]),
                properties: "UNIQ_KEY\u{1}é\u{2}".into(),
            },
        ]
    }

    #[test]
    fn batch_round_trips() {
        let encoded = encode_batch(&sample());
        assert_eq!(decode_batch(&encoded).unwrap(), sample());
        assert_eq!(decode_batch_shared(&encoded).unwrap(), sample());
        assert!(decode_batch(&[]).unwrap().is_empty());
    }

    #[test]
    fn batch_layout_matches_java_encode_message() {
        let encoded = encode_batch(&[BatchMessage {
            flag: 3,
            body: Bytes::from_static(b"ab"),
            properties: "k\u{1}v\u{2}".into(),
        }]);
        let expected: Vec<u8> = [
            &28i32.to_be_bytes()[..],
            &[0, 0, 0, 0],
            &[0, 0, 0, 0],
            &3i32.to_be_bytes(),
            &2i32.to_be_bytes(),
            b"ab",
            &4i16.to_be_bytes(),
            b"k\x01v\x02",
        ]
        .concat();
        assert_eq!(&encoded[..], &expected[..]);
    }

    #[test]
    fn truncated_or_inconsistent_batches_are_errors() {
        let encoded = encode_batch(&sample());
        let boundaries: Vec<usize> = sample()
            .iter()
            .scan(0, |end, msg| {
                *end += encode_batch(std::slice::from_ref(msg)).len();
                Some(*end)
            })
            .collect();
        for cut in (1..encoded.len()).filter(|cut| !boundaries.contains(cut)) {
            assert!(decode_batch(&encoded[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_body_len = encoded.to_vec();
        bad_body_len[16..20].copy_from_slice(&(-1i32).to_be_bytes());
        assert!(matches!(
            decode_batch(&bad_body_len),
            Err(MessageError::InvalidLength {
                field: "body_len",
                ..
            })
        ));
        let mut bad_total = encoded.to_vec();
        bad_total[0..4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(matches!(
            decode_batch(&bad_total),
            Err(MessageError::Truncated { .. })
        ));
    }

    #[test]
    fn oversized_properties_are_refused() {
        let too_long = BatchMessage {
            properties: "x".repeat(MAX_PROPERTIES_BYTES + 1),
            ..Default::default()
        };
        assert!(matches!(
            try_encode_batch(&[too_long]),
            Err(MessageError::FieldTooLong {
                field: "properties",
                ..
            })
        ));
    }

    #[test]
    fn offset_msg_id_round_trips_ipv4() {
        let host: SocketAddr = "127.0.0.1:10911".parse().unwrap();
        let id = offset_msg_id(host, 0x1234_5678_9ABC);
        assert_eq!(id, "7F00000100002A9F0000123456789ABC");
        assert_eq!(decode_offset_msg_id(&id).unwrap(), (host, 0x1234_5678_9ABC));
        assert_eq!(
            decode_offset_msg_id(&id.to_lowercase()).unwrap(),
            (host, 0x1234_5678_9ABC)
        );
    }

    #[test]
    fn offset_msg_id_round_trips_ipv6() {
        let host: SocketAddr = "[2001:db8::1]:10911".parse().unwrap();
        let id = offset_msg_id(host, u64::MAX);
        assert_eq!(id.len(), 56);
        assert!(id.starts_with("20010DB8"));
        assert_eq!(decode_offset_msg_id(&id).unwrap(), (host, u64::MAX));
    }

    #[test]
    fn malformed_msg_ids_are_errors() {
        assert!(decode_offset_msg_id("").is_err());
        assert!(decode_offset_msg_id("7F00000100002A9F000012345678").is_err());
        assert!(decode_offset_msg_id("ZZ00000100002A9F0000123456789ABC").is_err());
        assert!(decode_offset_msg_id("7F000001FFFFFFFF0000123456789ABC").is_err());
        assert!(decode_offset_msg_id("7F000001000é2A9F0000123456789AB").is_err());
    }
}
