//! Warm segments: in Sync mode each CommitLog segment is zero-filled and fsynced before it
//! takes writes (the next one in the background, as `<name>.warm`); never in Async mode or
//! with `warm-segments = false`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{message, SEGMENT_BYTES};
use quiver_store::{FlushMode, MessageStore, PutResult, StoreConfig};

const TOPIC: &str = "WarmTopic";
const BODY_BYTES: usize = 2000;

fn store_config(dir: &Path, flush_mode: FlushMode, warm_segments: bool) -> StoreConfig {
    StoreConfig {
        flush_mode,
        warm_segments,
        ..common::config(dir)
    }
}

fn body(n: u64) -> Vec<u8> {
    let mut body = format!("warm-{n}-").into_bytes();
    body.resize(BODY_BYTES, b'a' + (n % 26) as u8);
    body
}

fn put(store: &MessageStore, n: u64) -> PutResult {
    store
        .put(&message(TOPIC, (n % 2) as u32, &body(n), ""), n as i64)
        .expect("put")
}

/// Puts messages `from..` until the log rolls into a new segment; returns the new tail's base.
fn put_until_roll(store: &MessageStore, from: u64, puts: &mut Vec<(u64, PutResult)>) -> u64 {
    let tail = |store: &MessageStore| {
        let end = store.stats().max_physical_offset.0;
        end - end % SEGMENT_BYTES
    };
    let start = tail(store);
    let mut n = from;
    while tail(store) == start {
        puts.push((n, put(store, n)));
        n += 1;
    }
    tail(store)
}

/// Puts messages `from..` until the writer is past half of the tail at `tail`, where the
/// next segment's preparation starts.
fn put_past_half(store: &MessageStore, tail: u64, from: u64, puts: &mut Vec<(u64, PutResult)>) {
    let mut n = from;
    while store.stats().max_physical_offset.0 - tail < SEGMENT_BYTES / 2 {
        puts.push((n, put(store, n)));
        n += 1;
    }
}

fn assert_all_readable(store: &MessageStore, puts: &[(u64, PutResult)]) {
    for (n, result) in puts {
        let record = store.read_record(result.physical_offset).unwrap();
        assert_eq!(record.body.as_ref(), body(*n).as_slice(), "message {n}");
        let got = store
            .get(
                TOPIC,
                (n % 2) as u32,
                result.queue_offset,
                1,
                u64::MAX,
                &|_| true,
            )
            .unwrap();
        assert_eq!(got.messages.len(), 1, "message {n} by queue");
        assert_eq!(
            got.messages[0].as_ref(),
            store
                .read_record_bytes(result.physical_offset)
                .unwrap()
                .as_ref()
        );
    }
}

fn log_dir(dir: &Path) -> PathBuf {
    dir.join("commitlog")
}

fn warm_path(dir: &Path, base: u64) -> PathBuf {
    log_dir(dir).join(format!("{base:020}.warm"))
}

/// Names in `commitlog/` ending with `suffix`.
fn files_ending(dir: &Path, suffix: &str) -> Vec<String> {
    std::fs::read_dir(log_dir(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(suffix))
        .collect()
}

/// Segment files (20-digit names) with their lengths.
fn segments(dir: &Path) -> Vec<(String, u64)> {
    let mut found: Vec<_> = std::fs::read_dir(log_dir(dir))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let name = e.file_name().into_string().unwrap();
            name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit())
        })
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    found.sort();
    found
}

/// Waits (bounded) until `path` exists with the segment length.
fn wait_for_warm(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::fs::metadata(path).is_ok_and(|m| m.len() == SEGMENT_BYTES) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} not prepared within 10 s",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn allocated_bytes(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn sync_store_rolls_onto_prepared_segments_and_reopens_intact() {
    let dir = tempfile::tempdir().unwrap();
    let config = store_config(dir.path(), FlushMode::Sync, true);
    let store = MessageStore::open(config.clone()).unwrap();
    let mut puts = Vec::new();
    for _ in 0..4 {
        let from = puts.len() as u64;
        let tail = put_until_roll(&store, from, &mut puts);
        // Right after a roll nothing competes with the writer's fsyncs...
        assert!(!warm_path(dir.path(), tail + SEGMENT_BYTES).exists());
        // ...and half-way through, the next segment is prepared in the background.
        let from = puts.len() as u64;
        put_past_half(&store, tail, from, &mut puts);
        wait_for_warm(&warm_path(dir.path(), tail + SEGMENT_BYTES));
    }
    // The next roll adopts the prepared file: the new tail is fully allocated already.
    let from = puts.len() as u64;
    let tail = put_until_roll(&store, from, &mut puts);
    assert!(!warm_path(dir.path(), tail).exists());
    let tail_path = common::segment_path(dir.path(), tail);
    assert!(
        allocated_bytes(&tail_path) >= SEGMENT_BYTES,
        "adopted segment is sparse"
    );
    let from = puts.len() as u64;
    put_past_half(&store, tail, from, &mut puts);
    wait_for_warm(&warm_path(dir.path(), tail + SEGMENT_BYTES));
    assert_all_readable(&store, &puts);
    for (name, len) in segments(dir.path()) {
        assert_eq!(len, SEGMENT_BYTES, "{name}");
    }
    store.shutdown().unwrap();
    drop(store);

    // Leftovers of an interrupted preparation and a stale prepared file from another base.
    let tmp = log_dir(dir.path()).join(format!("{:020}.warm.tmp", tail + 2 * SEGMENT_BYTES));
    std::fs::write(&tmp, b"partial").unwrap();
    let stale = warm_path(dir.path(), tail + 5 * SEGMENT_BYTES);
    std::fs::write(&stale, vec![0u8; SEGMENT_BYTES as usize]).unwrap();

    let store = MessageStore::open(config).unwrap();
    assert!(files_ending(dir.path(), ".warm.tmp").is_empty());
    assert!(!stale.exists(), "a stale .warm survived the reopen");
    assert_all_readable(&store, &puts);
    let segments_now = segments(dir.path());
    assert_eq!(segments_now.len() as u64, tail / SEGMENT_BYTES + 1);
    for (name, len) in &segments_now {
        assert_eq!(*len, SEGMENT_BYTES, "{name}");
    }
    // Writing goes on across another roll after the reopen.
    let from = puts.len() as u64;
    put_until_roll(&store, from, &mut puts);
    assert_all_readable(&store, &puts);
    drop(store);
    let store = MessageStore::open(store_config(dir.path(), FlushMode::Sync, true)).unwrap();
    assert_all_readable(&store, &puts);
    assert!(files_ending(dir.path(), ".warm.tmp").is_empty());
}

#[test]
fn fresh_sync_store_starts_on_an_allocated_segment_and_async_on_a_sparse_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(store_config(dir.path(), FlushMode::Sync, true)).unwrap();
    let first = common::segment_path(dir.path(), 0);
    assert!(allocated_bytes(&first) >= SEGMENT_BYTES);
    store.shutdown().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(store_config(dir.path(), FlushMode::Async, true)).unwrap();
    let first = common::segment_path(dir.path(), 0);
    assert!(allocated_bytes(&first) < SEGMENT_BYTES);
    store.shutdown().unwrap();
}

/// Rolls several times and checks that no `.warm` (or `.warm.tmp`) file ever appears.
fn assert_never_warms(flush_mode: FlushMode, warm_segments: bool) {
    let dir = tempfile::tempdir().unwrap();
    let config = store_config(dir.path(), flush_mode, warm_segments);
    let store = MessageStore::open(config.clone()).unwrap();
    let first = common::segment_path(dir.path(), 0);
    assert!(
        allocated_bytes(&first) < SEGMENT_BYTES,
        "first segment warmed"
    );
    let mut puts = Vec::new();
    for _ in 0..3 {
        let from = puts.len() as u64;
        put_until_roll(&store, from, &mut puts);
        assert!(files_ending(dir.path(), ".warm").is_empty());
        assert!(files_ending(dir.path(), ".warm.tmp").is_empty());
    }
    assert_all_readable(&store, &puts);
    store.shutdown().unwrap();
    drop(store);
    let store = MessageStore::open(config).unwrap();
    assert_all_readable(&store, &puts);
    assert!(files_ending(dir.path(), ".warm").is_empty());
}

#[test]
fn sync_store_without_warm_segments_prepares_nothing() {
    assert_never_warms(FlushMode::Sync, false);
}

#[test]
fn async_store_prepares_nothing() {
    assert_never_warms(FlushMode::Async, true);
}
