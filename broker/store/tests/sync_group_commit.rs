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
