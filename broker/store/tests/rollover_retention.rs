//! Segment roll-over with tiny segments, then retention deleting files while a reader
//! still holds records from them.

mod common;

use common::{assert_readable, body, config, message, put_many, SEGMENT_BYTES};
use quiver_store::{CommitLogOffset, GetStatus, MessageStore, QueueOffset, StoreConfig};

const TOPIC: &str = "RollTopic";
const QUEUES: u32 = 2;
const HOUR_MS: i64 = 3_600_000;

fn retention_config(dir: &std::path::Path) -> StoreConfig {
    // The machine's own disk usage must not decide what this test deletes.
    StoreConfig {
        disk_high_water_ratio: 1.0,
        disk_clean_ratio: 1.0,
        disk_force_clean_ratio: 1.0,
        file_reserved_hours: 72,
        ..config(dir)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn segments_roll_and_retention_deletes_old_files_under_readers() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(retention_config(dir.path())).unwrap();
    // Large bodies fill segments quickly and leave blank fillers of varying size.
    let big = vec![7u8; 9_000];
    for i in 0..30 {
        store.put(&message(TOPIC, i % QUEUES, &big, ""), 1).unwrap();
    }
    let puts = put_many(&store, TOPIC, QUEUES, 500);
    let end = store.stats().max_physical_offset.0;
    let segments = end / SEGMENT_BYTES + 1;
    assert!(
        segments >= 5,
        "expected at least 5 segments, got {segments}"
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len() as u64, segments);
    for (i, name) in names.iter().enumerate() {
        assert_eq!(name, &format!("{:020}", i as u64 * SEGMENT_BYTES));
    }
    for (n, put) in &puts {
        assert_readable(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, *n, put);
        // A record never spans files.
        let start = put.physical_offset.0;
        assert_eq!(
            start / SEGMENT_BYTES,
            (start + u64::from(put.size) - 1) / SEGMENT_BYTES
        );
    }

    // A reader holds the first messages of queue 0 (zero-copy views of the oldest file).
    let held = store
        .get(TOPIC, 0, QueueOffset(0), 4, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(held.status, GetStatus::Found);
    let held_copy: Vec<Vec<u8>> = held.messages.iter().map(|m| m.to_vec()).collect();

    let nothing = store.run_retention(now_ms(), None).unwrap();
    assert!(
        nothing.deleted_segments.is_empty(),
        "nothing is 72 hours old yet"
    );

    let report = store.run_retention(now_ms() + 73 * HOUR_MS, None).unwrap();
    assert_eq!(
        report.deleted_segments.len() as u64,
        segments - 1,
        "all but the active file"
    );
    let active_base = (segments - 1) * SEGMENT_BYTES;
    assert_eq!(report.min_physical_offset, CommitLogOffset(active_base));
    assert!(
        report.deleted_queue_files > 0,
        "consume queue files below the min go too"
    );
    assert_eq!(
        store.stats().min_physical_offset,
        CommitLogOffset(active_base)
    );

    // The reader's views still hold the deleted file's bytes.
    for (view, copy) in held.messages.iter().zip(&held_copy) {
        assert_eq!(view.as_ref(), copy.as_slice());
    }
    // Consumers behind the deleted files are told where to resume.
    for queue_id in 0..QUEUES {
        let min = store.min_offset(TOPIC, queue_id);
        assert!(min.0 > 0);
        let behind = store
            .get(TOPIC, queue_id, QueueOffset(0), 4, u64::MAX, &|_| true)
            .unwrap();
        assert_eq!(behind.status, GetStatus::OffsetTooSmall);
        assert_eq!(behind.next_begin_offset, min);
        let resumed = store
            .get(TOPIC, queue_id, min, 4, u64::MAX, &|_| true)
            .unwrap();
        assert_eq!(resumed.status, GetStatus::Found);
    }
    assert!(store.read_record(CommitLogOffset(0)).is_err());
    let surviving: Vec<_> = puts
        .iter()
        .filter(|(_, p)| p.physical_offset.0 >= active_base)
        .collect();
    assert!(!surviving.is_empty());
    for (n, put) in &surviving {
        assert_readable(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, *n, put);
    }

    // The store keeps working and the min offsets survive a reopen.
    let mins: Vec<QueueOffset> = (0..QUEUES).map(|q| store.min_offset(TOPIC, q)).collect();
    let next_body = body(10_000);
    store.put(&message(TOPIC, 0, &next_body, ""), 2).unwrap();
    store.shutdown().unwrap();
    drop(store);
    let store = MessageStore::open(retention_config(dir.path())).unwrap();
    for queue_id in 0..QUEUES {
        assert_eq!(store.min_offset(TOPIC, queue_id), mins[queue_id as usize]);
    }
    for (n, put) in &surviving {
        assert_readable(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, *n, put);
    }
}

/// A store over three or more full segments of 9 KB messages, with clean and force-clean
/// ratios any real disk is above.
fn store_under_pressure(dir: &std::path::Path, force: bool) -> (MessageStore, u64) {
    let config = StoreConfig {
        disk_clean_ratio: 1e-9,
        disk_force_clean_ratio: if force { 1e-9 } else { 1.0 },
        ..retention_config(dir)
    };
    let store = MessageStore::open(config).unwrap();
    let big = vec![1u8; 9_000];
    for i in 0..20 {
        store.put(&message(TOPIC, i % QUEUES, &big, ""), 1).unwrap();
    }
    let segments = store.stats().max_physical_offset.0 / SEGMENT_BYTES + 1;
    assert!(segments >= 3);
    (store, segments)
}

#[test]
fn disk_clean_deletes_only_files_every_group_has_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, segments) = store_under_pressure(dir.path(), false);
    // A group still has to read the second file: only the first may go.
    let needed = CommitLogOffset(SEGMENT_BYTES + 100);
    let report = store.run_retention(now_ms(), Some(needed)).unwrap();
    let reasons: Vec<_> = report.deleted_segments.iter().map(|(_, r)| *r).collect();
    assert_eq!(reasons, [quiver_store::DeleteReason::DiskClean]);
    assert_eq!(report.min_physical_offset, CommitLogOffset(SEGMENT_BYTES));
    let again = store.run_retention(now_ms(), Some(needed)).unwrap();
    assert!(again.deleted_segments.is_empty(), "the unread file stays");
    // Once every group has read everything, all but the active file go.
    let report = store.run_retention(now_ms(), None).unwrap();
    assert_eq!(report.deleted_segments.len() as u64, segments - 2);
    assert_eq!(
        report.min_physical_offset,
        CommitLogOffset((segments - 1) * SEGMENT_BYTES)
    );
}

#[test]
fn disk_force_clean_deletes_unread_files_but_never_the_active_one() {
    let dir = tempfile::tempdir().unwrap();
    let (store, segments) = store_under_pressure(dir.path(), true);
    let report = store
        .run_retention(now_ms(), Some(CommitLogOffset(0)))
        .unwrap();
    assert_eq!(report.deleted_segments.len() as u64, segments - 1);
    assert!(report
        .deleted_segments
        .iter()
        .all(|(_, reason)| *reason == quiver_store::DeleteReason::DiskForceClean));
    let forced = store
        .deleted_segments()
        .into_iter()
        .find(|(reason, _)| *reason == quiver_store::DeleteReason::DiskForceClean);
    assert_eq!(
        forced,
        Some((quiver_store::DeleteReason::DiskForceClean, segments - 1))
    );
    let report = store.run_retention(now_ms(), None).unwrap();
    assert!(report.deleted_segments.is_empty(), "the active file stays");
    let last = store
        .get(TOPIC, 1, store.min_offset(TOPIC, 1), 32, u64::MAX, &|_| {
            true
        })
        .unwrap();
    assert_eq!(last.status, GetStatus::Found);
}
