//! Pull semantics: statuses and next offsets, tag and record filters, byte budgets, timestamp search,
//! the dispatch hook, batches and topic deletion.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{config, message};
use quiver_store::record::tags_code;
use quiver_store::{GetFilter, GetStatus, MessageStore, QueueOffset, StoreError};

#[test]
fn statuses_and_next_begin_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    let all = |_| true;
    let missing = store
        .get("Nope", 0, QueueOffset(5), 32, u64::MAX, &all)
        .unwrap();
    assert_eq!(missing.status, GetStatus::NoMessageInQueue);
    assert_eq!(store.max_offset("Nope", 0), QueueOffset(0));

    for i in 0..10 {
        let tags = if i % 2 == 0 {
            "TAGS\u{1}even\u{2}"
        } else {
            "TAGS\u{1}odd\u{2}"
        };
        store
            .put(
                &message("T", 1, format!("m{i}").as_bytes(), tags),
                1_000 + i * 10,
            )
            .unwrap();
    }
    let got = store
        .get("T", 1, QueueOffset(0), 3, u64::MAX, &all)
        .unwrap();
    assert_eq!(
        (got.status, got.messages.len(), got.next_begin_offset),
        (GetStatus::Found, 3, QueueOffset(3))
    );
    assert_eq!(
        (got.min_offset, got.max_offset),
        (QueueOffset(0), QueueOffset(10))
    );

    let even = tags_code("even");
    let filtered = store
        .get("T", 1, QueueOffset(0), 32, u64::MAX, &|code| code == even)
        .unwrap();
    assert_eq!(filtered.messages.len(), 5);
    assert_eq!(
        filtered.next_begin_offset,
        QueueOffset(10),
        "filtered units still count as scanned"
    );
    let none = store
        .get("T", 1, QueueOffset(0), 32, u64::MAX, &|_| false)
        .unwrap();
    assert_eq!(
        (none.status, none.next_begin_offset),
        (GetStatus::NoMatchedMessage, QueueOffset(10))
    );

    let one_size = got.messages[0].len() as u64;
    let budget = store
        .get("T", 1, QueueOffset(0), 32, one_size * 2 + 1, &all)
        .unwrap();
    assert_eq!(budget.messages.len(), 2, "the byte budget stops the pull");
    let tiny = store.get("T", 1, QueueOffset(0), 32, 1, &all).unwrap();
    assert_eq!(
        tiny.messages.len(),
        1,
        "at least one message fits any budget"
    );

    let at_end = store
        .get("T", 1, QueueOffset(10), 32, u64::MAX, &all)
        .unwrap();
    assert_eq!(
        (at_end.status, at_end.next_begin_offset),
        (GetStatus::OffsetOverflowOne, QueueOffset(10))
    );
    let beyond = store
        .get("T", 1, QueueOffset(99), 32, u64::MAX, &all)
        .unwrap();
    assert_eq!(
        (beyond.status, beyond.next_begin_offset),
        (GetStatus::OffsetOverflowBadly, QueueOffset(0))
    );

    assert_eq!(
        store.search_offset_by_timestamp("T", 1, 0).unwrap(),
        QueueOffset(0)
    );
    assert_eq!(
        store.search_offset_by_timestamp("T", 1, 1_035).unwrap(),
        QueueOffset(4)
    );
    assert_eq!(
        store.search_offset_by_timestamp("T", 1, 1_040).unwrap(),
        QueueOffset(4)
    );
    assert_eq!(
        store.search_offset_by_timestamp("T", 1, 9_999).unwrap(),
        QueueOffset(10)
    );
    assert_eq!(
        store.store_timestamp("T", 1, QueueOffset(3)).unwrap(),
        Some(1_030)
    );
    assert_eq!(
        store.store_timestamp("T", 1, QueueOffset(10)).unwrap(),
        None
    );
}

#[test]
fn record_filters_skip_records_without_spending_the_limits() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    for i in 0..10 {
        let properties = format!("a\u{1}{i}\u{2}");
        store
            .put(
                &message("P", 0, format!("m{i}").as_bytes(), &properties),
                1_000,
            )
            .unwrap();
    }
    let above_five = |record: &[u8]| {
        let properties = quiver_store::record::properties_of(record).unwrap();
        quiver_store::record::property(properties, "a")
            .unwrap()
            .parse::<u32>()
            .unwrap()
            > 5
    };
    let filter = GetFilter {
        tags_code: &|_| true,
        record: Some(&above_five),
    };
    let got = store
        .get_filtered("P", 0, QueueOffset(0), 2, u64::MAX, &filter)
        .unwrap();
    let bodies: Vec<_> = quiver_store::record::decode_all(&got.messages.concat())
        .unwrap()
        .into_iter()
        .map(|r| r.body)
        .collect();
    assert_eq!(
        bodies,
        vec![&b"m6"[..], &b"m7"[..]],
        "skipped records do not count towards max"
    );
    assert_eq!(got.next_begin_offset, QueueOffset(8));
    let rest = store
        .get_filtered("P", 0, QueueOffset(8), 32, 1, &filter)
        .unwrap();
    assert_eq!(
        (rest.messages.len(), rest.next_begin_offset),
        (1, QueueOffset(9))
    );
    let none = store
        .get_filtered(
            "P",
            0,
            QueueOffset(0),
            5,
            u64::MAX,
            &GetFilter {
                tags_code: &|_| true,
                record: Some(&|_| false),
            },
        )
        .unwrap();
    assert_eq!(
        (none.status, none.next_begin_offset),
        (GetStatus::NoMatchedMessage, QueueOffset(10)),
        "a get scans past what it skips, up to its scan bound, not its message count"
    );
}

#[test]
fn hook_batches_topics_and_limits() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    let events = Arc::new(AtomicU64::new(0));
    let last_max = Arc::new(AtomicU64::new(0));
    let (e, m) = (Arc::clone(&events), Arc::clone(&last_max));
    store.set_dispatch_hook(Arc::new(move |event| {
        e.fetch_add(1, Ordering::SeqCst);
        if event.topic == "A" && event.queue_id == 0 {
            m.store(event.max_offset.0, Ordering::SeqCst);
        }
    }));
    let batch = [
        message("A", 0, b"1", ""),
        message("A", 0, b"2", ""),
        message("B", 3, b"3", ""),
    ];
    let puts = store.put_batch(&batch, 5).unwrap();
    assert_eq!(puts[1].queue_offset, QueueOffset(1));
    assert_eq!(puts[2].queue_offset, QueueOffset(0));
    assert_eq!(
        events.load(Ordering::SeqCst),
        2,
        "one event per queue of the batch"
    );
    assert_eq!(last_max.load(Ordering::SeqCst), 2);
    assert_eq!(
        store.queues(),
        vec![("A".to_string(), 0), ("B".to_string(), 3)]
    );

    let huge = vec![0u8; 20_000];
    assert!(matches!(
        store.put(&message("A", 0, &huge, ""), 5),
        Err(StoreError::MessageTooLarge { .. })
    ));
    assert!(matches!(
        store.put(&message("", 0, b"x", ""), 5),
        Err(StoreError::InvalidMessage(_))
    ));

    store.delete_topic("A").unwrap();
    assert_eq!(store.queues(), vec![("B".to_string(), 3)]);
    assert_eq!(store.max_offset("A", 0), QueueOffset(0));
    assert!(!dir.path().join("consumequeue").join("A").exists());
    let again = store.put(&message("A", 0, b"new", ""), 6).unwrap();
    assert_eq!(
        again.queue_offset,
        QueueOffset(0),
        "a re-created topic starts over"
    );

    store.shutdown().unwrap();
    store.shutdown().unwrap();
    assert!(matches!(
        store.put(&message("A", 0, b"late", ""), 7),
        Err(StoreError::ShutDown)
    ));
    drop(store);
    let store = MessageStore::open(config(dir.path())).unwrap();
    assert_eq!(
        store.max_offset("A", 0),
        QueueOffset(1),
        "deleted queues stay deleted"
    );
    assert_eq!(store.max_offset("B", 3), QueueOffset(1));
}

#[test]
fn a_data_dir_opens_once_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    assert!(matches!(
        MessageStore::open(config(dir.path())),
        Err(StoreError::Locked { .. })
    ));
    drop(store);
    MessageStore::open(config(dir.path())).unwrap();
}

#[test]
fn delete_topic_refuses_paths_outside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path())).unwrap();
    for topic in ["..", "../consumequeue", "a/b"] {
        assert!(matches!(
            store.delete_topic(topic),
            Err(StoreError::InvalidTopic { .. })
        ));
    }
    assert!(dir.path().join("commitlog").exists());
}
