//! Async flush: the background flusher makes appended bytes durable on its own, by dirty
//! pages or interval, and checkpoints the queues.

mod common;

use std::time::{Duration, Instant};

use common::{config, message};
use quiver_store::{FlushMode, MessageStore, StoreConfig};

fn wait_until(deadline: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}

#[test]
fn the_flusher_flushes_dirty_pages_without_being_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(StoreConfig {
        flush_mode: FlushMode::Async,
        flush_interval_ms: 10,
        flush_least_pages: 1,
        ..config(dir.path())
    })
    .unwrap();
    let body = vec![3u8; 6_000];
    let mut end = 0;
    for n in 0..4 {
        let put = store.put(&message("AsyncTopic", 0, &body, ""), n).unwrap();
        end = put.physical_offset.0 + u64::from(put.size);
    }
    assert!(
        wait_until(Duration::from_secs(10), || store
            .stats()
            .flushed_physical_offset
            .0
            >= end),
        "flushed {} of {end}",
        store.stats().flushed_physical_offset
    );
    let checkpoint = dir.path().join("checkpoint");
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(&checkpoint).is_ok_and(|text| {
                let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                value["consumeQueueDurableOffset"]
                    .as_u64()
                    .is_some_and(|offset| offset >= end)
            })
        }),
        "the checkpoint covers the queues"
    );
}
