//! The prefault thread runs only with a window and stops with the store. Its own test binary:
//! it counts the process's threads by name, so no other test's store may be open meanwhile.

mod common;

use quiver_store::{MessageStore, StoreConfig};

/// Threads of this process named like the prefault thread (comm keeps 15 characters).
fn prefault_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == "quiver-store-pr")
        .count()
}

fn open_and_put(dir: &std::path::Path, prefault_window_bytes: u64) -> MessageStore {
    let store = MessageStore::open(StoreConfig {
        prefault_window_bytes,
        ..common::config(dir)
    })
    .unwrap();
    for n in 0..50u64 {
        store
            .put(&common::message("T", 0, &common::body(n), ""), n as i64)
            .unwrap();
    }
    store
}

#[test]
fn the_thread_exists_only_with_a_window_and_stops_at_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_and_put(dir.path(), 0);
    assert_eq!(
        prefault_threads(),
        0,
        "a zero window started a prefault thread"
    );
    store.shutdown().unwrap();
    drop(store);

    let store = open_and_put(dir.path(), 1024 * 1024);
    assert_eq!(prefault_threads(), 1);
    store.shutdown().unwrap();
    assert_eq!(
        prefault_threads(),
        0,
        "shutdown left the prefault thread running"
    );
}
