//! Messages are found by key and by unique key, within a time range and up to a number, across
//! index files; keys that share a hash slot, or another topic's same key, never answer for
//! each other. VIEW_MESSAGE_BY_ID's read serves whole records only.

mod common;

use common::{config, message};
use quiver_store::{record, CommitLogOffset, KeyMatch, MessageStore, QueryResult, StoreConfig};

const TOPIC: &str = "KeyTopic";

fn properties(unique_key: &str, keys: &str) -> String {
    format!("UNIQ_KEY\u{1}{unique_key}\u{2}KEYS\u{1}{keys}\u{2}TAGS\u{1}T\u{2}")
}

fn bodies(found: &QueryResult) -> Vec<String> {
    found
        .messages
        .iter()
        .map(|bytes| {
            let (record, _) = record::decode(bytes).unwrap();
            String::from_utf8(record.body.to_vec()).unwrap()
        })
        .collect()
}

fn names(ns: impl IntoIterator<Item = u64>) -> Vec<String> {
    ns.into_iter().map(|n| format!("m{n}")).collect()
}

#[test]
fn keys_and_unique_keys_within_a_time_range_and_a_maximum() {
    let dir = tempfile::tempdir().unwrap();
    // One slot per file: every key of a file shares one chain; 3 entries a message, so a
    // file holds 5 messages and lookups cross files.
    let store = MessageStore::open(StoreConfig {
        index_slots_per_file: 1,
        index_entries_per_file: 16,
        ..config(dir.path())
    })
    .unwrap();
    for n in 0..40u64 {
        let props = properties(&format!("U{n}"), &format!("order-{} shared", n % 4));
        let body = format!("m{n}");
        let msg = message(TOPIC, (n % 2) as u32, body.as_bytes(), &props);
        store.put(&msg, 1000 + n as i64).unwrap();
    }
    let other = properties("U-other", "order-1 shared");
    let last = store
        .put(&message("OtherTopic", 0, b"other", &other), 2000)
        .unwrap();
    let query = |topic: &str, key: &str, key_match, max, begin, end| {
        store.query_by_key(topic, key, key_match, max, begin, end)
    };

    let all = query(TOPIC, "order-1", KeyMatch::AnyKey, 64, 0, i64::MAX);
    assert_eq!(bodies(&all), names((0..40).filter(|n| n % 4 == 1)));
    let in_range = query(TOPIC, "order-1", KeyMatch::AnyKey, 64, 1010, 1021);
    assert_eq!(bodies(&in_range), names([13, 17, 21]));
    let newest = query(TOPIC, "order-1", KeyMatch::AnyKey, 3, 0, i64::MAX);
    assert_eq!(bodies(&newest), names([29, 33, 37]), "the newest are kept");
    let shared = query(TOPIC, "shared", KeyMatch::AnyKey, 64, 0, i64::MAX);
    assert_eq!(bodies(&shared), names(0..40));
    assert!(query(TOPIC, "order-1", KeyMatch::AnyKey, 0, 0, i64::MAX)
        .messages
        .is_empty());

    let unique = query(TOPIC, "U7", KeyMatch::UniqueKey, 32, 0, i64::MAX);
    assert_eq!(bodies(&unique), names([7]));
    assert_eq!(
        bodies(&query(TOPIC, "U7", KeyMatch::AnyKey, 32, 0, i64::MAX)),
        names([7])
    );
    assert!(
        query(TOPIC, "order-1", KeyMatch::UniqueKey, 32, 0, i64::MAX)
            .messages
            .is_empty()
    );
    assert!(query(TOPIC, "order-9", KeyMatch::AnyKey, 32, 0, i64::MAX)
        .messages
        .is_empty());

    let elsewhere = query("OtherTopic", "order-1", KeyMatch::AnyKey, 64, 0, i64::MAX);
    assert_eq!(bodies(&elsewhere), ["other"]);
    assert_eq!(elsewhere.index.last_timestamp_ms, 2000);
    assert_eq!(elsewhere.index.last_physical_offset, last.physical_offset.0);
    let files = std::fs::read_dir(dir.path().join("index")).unwrap().count();
    assert!(files >= 8, "{files} index files");
}

#[test]
fn message_at_serves_whole_records_only_and_earliest_is_the_oldest_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    let first = store
        .put(&message(TOPIC, 0, b"first", &properties("U0", "k")), 5_000)
        .unwrap();
    store
        .put(&message(TOPIC, 0, b"second", &properties("U1", "k")), 6_000)
        .unwrap();
    let record = store.message_at(first.physical_offset).unwrap();
    assert_eq!(
        record,
        store.read_record_bytes(first.physical_offset).unwrap()
    );
    assert!(store
        .message_at(CommitLogOffset(first.physical_offset.0 + 4))
        .is_err());
    assert!(store.message_at(CommitLogOffset(1 << 40)).is_err());
    assert_eq!(
        store.earliest_store_timestamp(TOPIC, 0).unwrap(),
        Some(5_000)
    );
    assert_eq!(store.earliest_store_timestamp(TOPIC, 3).unwrap(), None);
}
