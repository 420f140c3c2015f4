//! Append then read: records come back byte-exact, before and after a reopen.

mod common;

use common::{config, message};
use proptest::prelude::*;
use quiver_store::record::{self, Placement};
use quiver_store::{GetStatus, MessageStore, NewMessage, QueueOffset};

#[derive(Clone, Debug)]
struct Spec {
    queue_id: u32,
    body: Vec<u8>,
    tags: Option<String>,
    ipv6: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        0u32..3,
        proptest::collection::vec(any::<u8>(), 0..600),
        proptest::option::of("[a-zA-Z0-9é]{0,8}"),
        any::<bool>(),
    )
        .prop_map(|(queue_id, body, tags, ipv6)| Spec {
            queue_id,
            body,
            tags,
            ipv6,
        })
}

fn new_message<'a>(spec: &'a Spec, properties: &'a str) -> NewMessage<'a> {
    let mut msg = message("PropTopic", spec.queue_id, &spec.body, properties);
    if spec.ipv6 {
        msg.born_host = "[2001:db8::7]:1234".parse().unwrap();
        msg.store_host = "[fe80::1]:10911".parse().unwrap();
    }
    msg
}

fn properties(spec: &Spec) -> String {
    match &spec.tags {
        Some(tags) => record::encode_properties([("TAGS", tags.as_str()), ("KEYS", "k")]),
        None => String::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn append_then_read_is_byte_exact(specs in proptest::collection::vec(spec(), 1..120)) {
        let dir = tempfile::tempdir().unwrap();
        let store = MessageStore::open(config(dir.path())).unwrap();
        let props: Vec<String> = specs.iter().map(properties).collect();
        let mut expected = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let msg = new_message(spec, &props[i]);
            let put = store.put(&msg, 5_000 + i as i64).unwrap();
            let placement = Placement { queue_offset: put.queue_offset, physical_offset: put.physical_offset, store_timestamp_ms: put.store_timestamp_ms };
            let bytes = record::encode(&msg, placement).unwrap();
            prop_assert_eq!(bytes.len() as u32, put.size);
            expected.push((spec.clone(), put, bytes));
        }
        let check = |store: &MessageStore| -> Result<(), TestCaseError> {
            for (spec, put, bytes) in &expected {
                let got = store.get("PropTopic", spec.queue_id, put.queue_offset, 1, u64::MAX, &|_| true).unwrap();
                prop_assert_eq!(got.status, GetStatus::Found);
                prop_assert_eq!(got.messages[0].as_ref(), bytes.as_slice());
                let record = store.read_record(put.physical_offset).unwrap();
                prop_assert_eq!(record.body.as_ref(), spec.body.as_slice());
                prop_assert_eq!(record.tags(), spec.tags.as_deref());
                prop_assert_eq!(record.born_host.is_ipv6(), spec.ipv6);
            }
            for queue_id in 0..3 {
                let count = expected.iter().filter(|(s, _, _)| s.queue_id == queue_id).count() as u64;
                prop_assert_eq!(store.max_offset("PropTopic", queue_id), QueueOffset(count));
            }
            Ok(())
        };
        check(&store)?;
        store.shutdown().unwrap();
        drop(store);
        let reopened = MessageStore::open(config(dir.path())).unwrap();
        prop_assert!(reopened.recovery_report().clean_shutdown);
        check(&reopened)?;
    }
}

#[test]
fn pull_body_is_the_concatenation_of_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    let v6 = {
        let mut m = message("T", 0, b"", "");
        m.born_host = "[::1]:9".parse().unwrap();
        m
    };
    let msgs = [
        message("T", 0, b"first", "TAGS\u{1}a\u{2}"),
        v6,
        message("T", 0, &[0u8; 300], ""),
    ];
    let puts = store.put_batch(&msgs, 42).unwrap();
    assert_eq!(
        puts.iter().map(|p| p.queue_offset.0).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    let got = store
        .get("T", 0, QueueOffset(0), 32, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.status, GetStatus::Found);
    assert_eq!(got.next_begin_offset, QueueOffset(3));
    let body: Vec<u8> = got
        .messages
        .iter()
        .flat_map(|m| m.iter().copied())
        .collect();
    let records = record::decode_all(&body).unwrap();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].body.as_ref(), b"first");
    assert_eq!(records[0].tags(), Some("a"));
    assert!(records[1].body.is_empty());
    assert_eq!(records[1].born_host, "[::1]:9".parse().unwrap());
    assert_eq!(records[2].body.len(), 300);
    assert_eq!(records[2].physical_offset, puts[2].physical_offset);
}
