//! A corrupt (or missing) consumerOffset.json falls back to its `.bak`.

use quiver_store::{ConsumerOffsets, QueueOffset, StoreError};

#[test]
fn corrupt_main_file_falls_back_to_backup() {
    let dir = tempfile::tempdir().unwrap();
    let offsets = ConsumerOffsets::load(dir.path()).unwrap();
    offsets.commit("g", "T", 0, QueueOffset(10));
    offsets.persist().unwrap();
    offsets.commit("g", "T", 0, QueueOffset(20));
    offsets.persist().unwrap();

    let main = dir.path().join("consumerOffset.json");
    std::fs::write(&main, b"{\"offsetTable\":{\"T@g\":{\"0\":2").unwrap(); // torn write
    let loaded = ConsumerOffsets::load(dir.path()).unwrap();
    assert_eq!(
        loaded.query("g", "T", 0),
        Some(QueueOffset(10)),
        "the previous version"
    );

    std::fs::remove_file(&main).unwrap();
    let loaded = ConsumerOffsets::load(dir.path()).unwrap();
    assert_eq!(
        loaded.query("g", "T", 0),
        Some(QueueOffset(10)),
        "missing main: the backup"
    );

    std::fs::write(&main, b"garbage").unwrap();
    std::fs::write(dir.path().join("consumerOffset.json.bak"), b"garbage").unwrap();
    assert!(matches!(
        ConsumerOffsets::load(dir.path()),
        Err(StoreError::Json { .. })
    ));
}
