//! Retention deletes an index file once every record it indexes is gone, never the one being
//! written; keys of deleted records are no longer found, the others still are.

mod common;

use common::{config, message, SEGMENT_BYTES};
use quiver_store::{KeyMatch, MessageStore, StoreConfig};

const TOPIC: &str = "RetainedTopic";
const HOUR_MS: i64 = 3_600_000;

fn index_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("index")).unwrap().count()
}

#[test]
fn index_files_go_with_the_records_they_index() {
    let dir = tempfile::tempdir().unwrap();
    // Two entries a message, eight a file: four messages per index file.
    let store = MessageStore::open(StoreConfig {
        file_reserved_hours: 1,
        index_entries_per_file: 8,
        ..config(dir.path())
    })
    .unwrap();
    let big = vec![b'x'; 9_000];
    let puts: Vec<_> = (0..40u64)
        .map(|n| {
            let props = format!("UNIQ_KEY\u{1}U{n}\u{2}KEYS\u{1}key-{n}\u{2}");
            store.put(&message(TOPIC, 0, &big, &props), 1_000).unwrap()
        })
        .collect();
    let segments = store.stats().max_physical_offset.0 / SEGMENT_BYTES + 1;
    assert!(segments >= 5, "{segments} segments");
    let before = index_files(dir.path());
    assert_eq!(before, 10);

    // Every CommitLog file but the active one has expired.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let report = store.run_retention(now + 2 * HOUR_MS, None).unwrap();
    let log_min = report.min_physical_offset.0;
    assert!(log_min > 0, "{report:?}");
    assert!(report.deleted_index_files > 0, "{report:?}");
    assert_eq!(index_files(dir.path()), before - report.deleted_index_files);
    for (n, put) in puts.iter().enumerate() {
        let key = format!("key-{n}");
        let hits = store
            .query_by_key(TOPIC, &key, KeyMatch::AnyKey, 8, 0, i64::MAX)
            .messages
            .len();
        let kept = put.physical_offset.0 >= log_min;
        assert_eq!(hits, usize::from(kept), "{key} at {}", put.physical_offset);
    }
    // An index file whose newest record is gone is gone too; the one after it stays.
    let first_kept = puts
        .iter()
        .position(|put| put.physical_offset.0 >= log_min)
        .unwrap();
    assert_eq!(report.deleted_index_files, first_kept / 4);
}
