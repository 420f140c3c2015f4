//! Helpers for the store parts' unit tests (each part's tests sit beside it), and the
//! facade's own tests, on a store in a temporary directory.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;
use crate::config::FlushMode;

pub(super) const TOPIC: &str = "T";

pub(super) fn open_store(dir: &Path, publish_on_confirm: bool) -> MessageStore {
    MessageStore::open(StoreConfig {
        data_dir: dir.to_path_buf(),
        segment_size_bytes: crate::MIN_SEGMENT_SIZE_BYTES,
        consume_queue_units_per_file: 64,
        flush_mode: FlushMode::Async,
        max_message_size_bytes: 16 * 1024,
        index_slots_per_file: 64,
        index_entries_per_file: 512,
        // The machine's own disk usage must not refuse writes here.
        disk_high_water_ratio: 1.0,
        disk_clean_ratio: 1.0,
        disk_force_clean_ratio: 1.0,
        publish_on_confirm,
        ..StoreConfig::default()
    })
    .unwrap()
}

pub(super) fn message<'a>(queue_id: u32, body: &'a [u8], properties: &'a str) -> NewMessage<'a> {
    NewMessage {
        topic: TOPIC,
        queue_id,
        flag: 0,
        body,
        properties,
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host: "10.0.0.1:40000".parse().unwrap(),
        store_host: "10.0.0.2:10911".parse().unwrap(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// Every tags code passes.
pub(super) fn any(_: i64) -> bool {
    true
}

/// The records of `queue_id` from `offset`, as stored.
pub(super) fn read(store: &MessageStore, queue_id: u32, offset: u64) -> GetResult {
    store
        .get(TOPIC, queue_id, QueueOffset(offset), 100, u64::MAX, &any)
        .unwrap()
}

/// Remembers every dispatch event: (queue id, max offset).
pub(super) fn record_events(store: &MessageStore) -> Arc<Mutex<Vec<(u32, u64)>>> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    store.set_dispatch_hook(Arc::new(move |event: &DispatchEvent<'_>| {
        seen.lock().push((event.queue_id, event.max_offset.0));
    }));
    events
}

#[test]
fn confirm_publishes_units_in_log_order_and_tells_the_hook() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_store(dir.path(), true);
    let events = record_events(&store);
    let appended = store
        .append(&[message(0, b"a", ""), message(1, b"b", "")], 1)
        .unwrap();
    assert_eq!(store.max_offset(TOPIC, 0), QueueOffset(0));
    assert_eq!(store.written_max_offset(TOPIC, 0), QueueOffset(1));
    assert!(events.lock().is_empty());
    let first = appended.results[0];
    assert!(store.message_at(first.physical_offset).is_err());

    let first_end = first.physical_offset.0 + u64::from(first.size);
    store.confirm(CommitLogOffset(first_end));
    assert_eq!(*events.lock(), [(0, 1)]);
    assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(0));
    assert!(store.message_at(first.physical_offset).is_ok());
    store.confirm(appended.end);
    assert_eq!(*events.lock(), [(0, 1), (1, 1)]);
    assert_eq!(store.confirmed(), appended.end);
    assert_eq!(read(&store, 1, 0).status, GetStatus::Found);
    store.shutdown().unwrap();
}

#[test]
fn a_restart_hides_again_what_was_not_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let confirmed = {
        let store = open_store(dir.path(), true);
        let first = store.put(&message(0, b"a", ""), 1).unwrap();
        let confirmed = CommitLogOffset(first.physical_offset.0 + u64::from(first.size));
        store.confirm(confirmed);
        store.put(&message(0, b"b", ""), 2).unwrap();
        store.shutdown().unwrap();
        confirmed
    };
    let store = open_store(dir.path(), true);
    assert_eq!(store.confirmed(), confirmed);
    assert_eq!(store.max_offset(TOPIC, 0), QueueOffset(1));
    assert_eq!(store.written_max_offset(TOPIC, 0), QueueOffset(2));
    // A reader inside the held units keeps its position.
    let held = read(&store, 0, 2);
    assert_eq!(held.status, GetStatus::OffsetOverflowOne);
    assert_eq!(held.next_begin_offset, QueueOffset(2));
    store.confirm(store.log_end());
    assert_eq!(store.max_offset(TOPIC, 0), QueueOffset(2));
    store.shutdown().unwrap();
}
