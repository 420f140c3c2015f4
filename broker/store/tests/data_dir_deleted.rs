//! The data directory deleted under a running store: writes are refused with that reason,
//! reads of what is mapped go on, and nothing re-creates the directory.

mod common;

use std::time::{Duration, Instant};

use common::{config, message};
use quiver_store::{FlushMode, GetStatus, MessageStore, QueueOffset, RefusalReason, StoreConfig};

#[test]
fn a_deleted_data_directory_refuses_writes_keeps_reads_and_stays_deleted() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("store");
    let store = MessageStore::open(StoreConfig {
        disk_check_interval_ms: 10,
        flush_interval_ms: 10,
        flush_mode: FlushMode::Async,
        ..config(&data_dir)
    })
    .unwrap();
    for n in 0..100u32 {
        store
            .put(&message("Gone", n % 2, format!("m{n}").as_bytes(), ""), 1)
            .unwrap();
    }
    std::fs::remove_dir_all(&data_dir).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let refusal = loop {
        if let Some(refusal) = store.disk_status().refusal {
            break refusal;
        }
        assert!(Instant::now() < deadline, "the deletion went unnoticed");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(refusal.reason, RefusalReason::DataDirGone);
    assert!(
        refusal.message.contains("was deleted"),
        "{}",
        refusal.message
    );
    let error = store
        .put(&message("Gone", 0, b"after", ""), 1)
        .unwrap_err()
        .to_string();
    assert!(error.contains("deleted"), "{error}");
    // What was written is still mapped and served.
    let got = store
        .get("Gone", 1, QueueOffset(0), 100, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.status, GetStatus::Found);
    assert_eq!(got.messages.len(), 50);
    // Housekeeping and shutdown write nothing that would bring the directory back.
    std::thread::sleep(Duration::from_millis(100));
    store.shutdown().unwrap();
    assert!(
        !data_dir.exists(),
        "a checkpoint re-created the data directory"
    );
}
