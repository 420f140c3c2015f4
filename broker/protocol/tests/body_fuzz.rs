//! Property tests for the body codecs: arbitrary input never panics, and what we write reads
//! back unchanged (fastjson maps, batches).

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;
use quiver_protocol::body::fastjson::{self, IntegerKeys};
use quiver_protocol::body::{
    ConsumeStats, HeartbeatData, MessageQueue, OffsetWrapper, ResetOffsetBody, TopicRouteData,
};
use quiver_protocol::message::{decode_batch, encode_batch, BatchMessage};

/// Text built from JSON punctuation, digits and letters, so the fastjson scanner sees keys,
/// nesting and strings in every arrangement.
fn jsonish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            ":",
            ",",
            "\"",
            "\\",
            "0",
            "12",
            "-3",
            "a",
            "é",
            " ",
            "\"k\"",
            "true",
            "null",
            "{\"topic\":\"T\"}",
        ]),
        0..64,
    )
    .prop_map(|parts| parts.concat())
}

fn message_queue() -> impl Strategy<Value = MessageQueue> {
    ("[A-Za-z%_-]{1,12}", "[a-z-]{1,8}", 0..64u32)
        .prop_map(|(topic, broker, queue_id)| MessageQueue::new(topic, broker, queue_id))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn normalize_never_panics_and_keeps_standard_json(text in jsonish()) {
        let normalized = fastjson::normalize(&text);
        if serde_json::from_str::<serde_json::Value>(&text).is_ok() {
            prop_assert_eq!(normalized.unwrap(), text);
        }
    }

    #[test]
    fn normalize_never_panics_on_any_text(text in any::<String>()) {
        if let Ok(normalized) = fastjson::normalize(&text) {
            // Only unquoted keys are rewritten: quoting and (at most two levels of) escaping.
            prop_assert!(normalized.len() <= 8 * text.len() + 16);
        }
    }

    #[test]
    fn body_decoders_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), text in jsonish()) {
        let _ = HeartbeatData::decode(&bytes);
        let _ = HeartbeatData::decode(text.as_bytes());
        let _ = TopicRouteData::decode(text.as_bytes());
        let _ = ConsumeStats::decode(text.as_bytes());
    }

    #[test]
    fn message_queue_keyed_maps_round_trip(
        entries in prop::collection::btree_map(message_queue(), (any::<i64>(), any::<i64>(), any::<i64>()), 0..8),
        resets in prop::collection::btree_map(message_queue(), any::<i64>(), 0..8),
    ) {
        let stats = ConsumeStats {
            offset_table: entries
                .into_iter()
                .map(|(queue, (broker_offset, consumer_offset, last_timestamp))| {
                    (queue, OffsetWrapper { broker_offset, consumer_offset, last_timestamp })
                })
                .collect(),
            consume_tps: 0.5,
        };
        prop_assert_eq!(ConsumeStats::decode(&stats.encode()).unwrap(), stats);
        let reset = ResetOffsetBody { offset_table: resets };
        prop_assert_eq!(ResetOffsetBody::decode(&reset.encode()).unwrap(), reset);
    }

    #[test]
    fn integer_keyed_maps_round_trip_unquoted(table in prop::collection::btree_map(any::<i32>(), any::<i64>(), 0..8)) {
        let value = serde_json::to_value(&table).unwrap();
        let written = fastjson::write(&value, IntegerKeys::Unquoted);
        let read: BTreeMap<i32, i64> = serde_json::from_str(&fastjson::normalize(&written).unwrap()).unwrap();
        prop_assert_eq!(read, table);
    }

    #[test]
    fn batches_round_trip(messages in prop::collection::vec(
        (any::<i32>(), prop::collection::vec(any::<u8>(), 0..64), "[ -~é]{0,24}"),
        0..6,
    )) {
        let batch: Vec<BatchMessage> = messages
            .into_iter()
            .map(|(flag, body, properties)| BatchMessage { flag, body: Bytes::from(body), properties })
            .collect();
        prop_assert_eq!(decode_batch(&encode_batch(&batch)).unwrap(), batch);
    }

    #[test]
    fn batch_decoder_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(messages) = decode_batch(&bytes) {
            // A successful decode accounts for every input byte.
            prop_assert_eq!(encode_batch(&messages).len(), bytes.len());
        }
    }
}
