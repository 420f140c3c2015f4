//! Sync flush: every put returns only once its bytes are flushed, with many writers at once.

mod common;

use common::{config, message};
use quiver_store::{FlushMode, MessageStore, QueueOffset, StoreConfig};

const WRITERS: u32 = 8;
const PUTS_PER_WRITER: u64 = 40;

#[test]
fn sync_puts_return_only_when_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(StoreConfig {
        flush_mode: FlushMode::Sync,
        ..config(dir.path())
    })
    .unwrap();
    std::thread::scope(|scope| {
        for writer in 0..WRITERS {
            let store = &store;
            scope.spawn(move || {
                for n in 0..PUTS_PER_WRITER {
                    let body = format!("w{writer}-{n}");
                    let put = store
                        .put(&message("SyncTopic", writer, body.as_bytes(), ""), n as i64)
                        .unwrap();
                    let end = put.physical_offset.0 + u64::from(put.size);
                    assert!(
                        store.stats().flushed_physical_offset.0 >= end,
                        "acknowledged before durable"
                    );
                }
            });
        }
    });
    let batch: Vec<_> = (0..5)
        .map(|_| message("SyncTopic", 0, b"batch", ""))
        .collect();
    let puts = store.put_batch(&batch, 1).unwrap();
    let last = puts.last().unwrap();
    assert!(
        store.stats().flushed_physical_offset.0 >= last.physical_offset.0 + u64::from(last.size)
    );
    for writer in 0..WRITERS {
        let expected = PUTS_PER_WRITER + if writer == 0 { 5 } else { 0 };
        assert_eq!(store.max_offset("SyncTopic", writer), QueueOffset(expected));
    }
}

/// The non-blocking path the server uses: append, join group commit, wait for the hook.
#[test]
fn append_then_flushed_hook_reports_durability() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(StoreConfig {
        flush_mode: FlushMode::Sync,
        ..config(dir.path())
    })
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let tx = std::sync::Mutex::new(tx);
    store.set_flushed_hook(std::sync::Arc::new(move || {
        let _ = tx.lock().unwrap().send(());
    }));
    for round in 0..20i64 {
        let appended = store
            .append(&[message("SyncTopic", 0, b"no-wait", "")], round)
            .unwrap();
        assert_eq!(appended.results.len(), 1);
        assert_eq!(appended.results[0].queue_offset, QueueOffset(round as u64));
        // Visible to readers before it is durable.
        assert_eq!(
            store.max_offset("SyncTopic", 0),
            QueueOffset(round as u64 + 1)
        );
        if !store.request_durable(appended.end) {
            while store.durable_status(appended.end).is_none() {
                rx.recv_timeout(std::time::Duration::from_secs(10))
                    .expect("the flusher reports within 10 s");
            }
        }
        assert!(matches!(store.durable_status(appended.end), Some(Ok(()))));
        assert!(store.stats().flushed_physical_offset >= appended.end);
    }
    // Past the end after shutdown: the answer is an error, never a hang.
    store.shutdown().unwrap();
    let beyond = quiver_store::CommitLogOffset(u64::MAX);
    assert!(matches!(store.durable_status(beyond), Some(Err(_))));
}
