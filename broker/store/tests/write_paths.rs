//! The CommitLog's two write paths: records of a batch (or of a page or more), and every record
//! in Sync mode, are staged and written with one pwrite per append; in Async mode a lone small
//! record goes through the mapping, into pages zero-filled ahead of it. A background thread
//! zero-fills the blocks ahead of Sync records and whole megabytes ahead of Async lone
//! records; an Async batch zero-fills whole megabytes ahead of itself. All must read back
//! byte-exact, across pages and segment rolls, and survive a crash.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{message, SEGMENT_BYTES};
use quiver_store::record;
use quiver_store::{FlushMode, GetStatus, MessageStore, NewMessage, PutResult, StoreConfig};

const TOPIC: &str = "PathsTopic";
const QUEUES: u32 = 3;

/// Bodies from 1 byte to 5 KiB: some fit in a page's rest, some cross pages, some span them.
fn body(n: u64) -> Vec<u8> {
    let len = 1 + (n * 797 % 5120) as usize;
    let mut body = format!("{n}:").into_bytes();
    body.resize(len.max(body.len()), b'a' + (n % 26) as u8);
    body
}

fn msg(body: &[u8], n: u64) -> NewMessage<'_> {
    message(
        TOPIC,
        (n % u64::from(QUEUES)) as u32,
        body,
        "TAGS\u{1}P\u{2}",
    )
}

/// Puts `count` messages from `first`: batches of 1 to 7 and lone puts, interleaved.
fn put_mixed(store: &MessageStore, first: u64, count: u64) -> Vec<(u64, PutResult)> {
    let mut puts = Vec::new();
    let mut n = first;
    while n < first + count {
        let batch = (1 + n % 7).min(first + count - n);
        let bodies: Vec<Vec<u8>> = (n..n + batch).map(body).collect();
        if batch == 1 {
            puts.push((n, store.put(&msg(&bodies[0], n), n as i64).unwrap()));
        } else {
            let msgs: Vec<NewMessage<'_>> = bodies
                .iter()
                .zip(n..)
                .map(|(body, k)| msg(body, k))
                .collect();
            let results = store.put_batch(&msgs, n as i64).unwrap();
            puts.extend((n..).zip(results));
        }
        n += batch;
    }
    puts
}

fn assert_all_readable(store: &MessageStore, puts: &[(u64, PutResult)]) {
    for (n, put) in puts {
        let queue_id = (n % u64::from(QUEUES)) as u32;
        let got = store
            .get(TOPIC, queue_id, put.queue_offset, 1, u64::MAX, &|_| true)
            .unwrap();
        assert_eq!(got.status, GetStatus::Found, "message {n}");
        let (record, _) = record::decode(&got.messages[0]).unwrap();
        assert_eq!(record.body, body(*n).as_slice(), "message {n} body");
        assert_eq!(record.queue_offset, put.queue_offset, "message {n}");
        assert_eq!(record.physical_offset, put.physical_offset, "message {n}");
    }
}

/// Queue offsets are dense per queue, in put order.
fn assert_dense_offsets(puts: &[(u64, PutResult)]) {
    let mut next = [0u64; QUEUES as usize];
    for (n, put) in puts {
        let queue = (n % u64::from(QUEUES)) as usize;
        assert_eq!(put.queue_offset.0, next[queue], "message {n}");
        next[queue] += 1;
    }
}

fn config(dir: &Path, flush_mode: FlushMode) -> StoreConfig {
    StoreConfig {
        flush_mode,
        ..common::config(dir)
    }
}

/// A store with 8 MiB segments in `dir` and the path of its first segment.
fn store_with_8_mib_segments(
    dir: &Path,
    flush_mode: FlushMode,
) -> (StoreConfig, MessageStore, PathBuf) {
    let config = StoreConfig {
        segment_size_bytes: 8 * 1024 * 1024,
        ..config(dir, flush_mode)
    };
    let store = MessageStore::open(config.clone()).unwrap();
    (config, store, common::segment_path(dir, 0))
}

/// Bytes of disk the file at `path` holds (blocks allocated or reserved).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// A crash (no shutdown): `segment` holds zeros past the log end, and recovery ends the log
/// there with every put readable.
fn crash_and_recover_at_the_zeros(
    store: MessageStore,
    config: StoreConfig,
    segment: &Path,
    puts: &[(u64, PutResult)],
) {
    let end = store.stats().max_physical_offset.0;
    drop(store);
    let bytes = std::fs::read(segment).unwrap();
    assert!(bytes[end as usize..].iter().all(|b| *b == 0));
    let store = MessageStore::open(config).unwrap();
    assert_eq!(store.stats().max_physical_offset.0, end);
    assert_all_readable(&store, puts);
    store.shutdown().unwrap();
}

fn round_trip_and_crash(flush_mode: FlushMode) {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path(), flush_mode)).unwrap();
    let mut puts = put_mixed(&store, 0, 400);
    assert!(
        store.stats().max_physical_offset.0 > 3 * SEGMENT_BYTES,
        "the test should roll segments"
    );
    assert_dense_offsets(&puts);
    assert_all_readable(&store, &puts);
    let end = store.stats().max_physical_offset;
    // A crash: no shutdown, so recovery validates the tail.
    drop(store);
    let store = MessageStore::open(config(dir.path(), flush_mode)).unwrap();
    assert_eq!(store.stats().max_physical_offset, end);
    assert_all_readable(&store, &puts);
    // Appends continue where the recovered log ends, on both paths.
    puts.extend(put_mixed(&store, 400, 100));
    assert_dense_offsets(&puts);
    assert_all_readable(&store, &puts);
    store.shutdown().unwrap();
}

#[test]
fn async_mixed_batches_and_lone_puts_read_back_and_recover() {
    round_trip_and_crash(FlushMode::Async);
}

#[test]
fn sync_mixed_batches_and_lone_puts_read_back_and_recover() {
    round_trip_and_crash(FlushMode::Sync);
}

#[test]
fn a_batch_larger_than_the_staging_step_reads_back_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = StoreConfig {
        segment_size_bytes: 4 * 1024 * 1024,
        ..config(dir.path(), FlushMode::Async)
    };
    let store = MessageStore::open(config.clone()).unwrap();
    // About 1.5 MiB in one batch: written out in steps, published once.
    let bodies: Vec<Vec<u8>> = (0..400u64)
        .map(|n| {
            let mut body = body(n);
            body.resize(4000, b'b');
            body
        })
        .collect();
    let msgs: Vec<NewMessage<'_>> = bodies.iter().zip(0..).map(|(b, n)| msg(b, n)).collect();
    let results = store.put_batch(&msgs, 1).unwrap();
    let check = |store: &MessageStore| {
        for (n, put) in (0u64..).zip(&results) {
            let got = store
                .get(
                    TOPIC,
                    (n % u64::from(QUEUES)) as u32,
                    put.queue_offset,
                    1,
                    u64::MAX,
                    &|_| true,
                )
                .unwrap();
            let (record, _) = record::decode(&got.messages[0]).unwrap();
            assert_eq!(record.body, bodies[n as usize].as_slice(), "message {n}");
        }
    };
    check(&store);
    drop(store);
    let store = MessageStore::open(config).unwrap();
    check(&store);
    store.shutdown().unwrap();
}

#[test]
fn zero_extension_leaves_nothing_past_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(config(dir.path(), FlushMode::Async)).unwrap();
    let small = b"small".to_vec();
    let put = store.put(&msg(&small, 0), 1).unwrap();
    let end = store.stats().max_physical_offset.0;
    drop(store);
    let bytes = std::fs::read(common::segment_path(dir.path(), 0)).unwrap();
    assert!(bytes[end as usize..].iter().all(|b| *b == 0));
    let store = MessageStore::open(config(dir.path(), FlushMode::Async)).unwrap();
    assert_eq!(store.stats().max_physical_offset.0, end);
    let got = store
        .get(TOPIC, 0, put.queue_offset, 8, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.messages.len(), 1);
    store.shutdown().unwrap();
}

#[test]
fn consume_queue_zero_extension_leaves_no_units_past_the_max() {
    let dir = tempfile::tempdir().unwrap();
    // Queue files of 20,000 bytes: several 4 KiB pages, zero-extended ahead of the units.
    let config = StoreConfig {
        consume_queue_units_per_file: 1000,
        ..config(dir.path(), FlushMode::Async)
    };
    let store = MessageStore::open(config.clone()).unwrap();
    // Three queues of about 233 units: each crosses a page of its file (204 units).
    let puts = put_mixed(&store, 0, 700);
    let max: Vec<u64> = (0..QUEUES)
        .map(|q| {
            store
                .get(TOPIC, q, quiver_store::QueueOffset(0), 1, u64::MAX, &|_| {
                    true
                })
                .unwrap()
                .max_offset
                .0
        })
        .collect();
    drop(store);
    for (queue_id, max) in max.iter().enumerate() {
        let queue_dir = dir
            .path()
            .join("consumequeue")
            .join(TOPIC)
            .join(queue_id.to_string());
        let mut files: Vec<_> = std::fs::read_dir(&queue_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let last = files.last().unwrap();
        let base: u64 = last.file_name().unwrap().to_str().unwrap().parse().unwrap();
        let bytes = std::fs::read(last).unwrap();
        let end = (max * 20 - base) as usize;
        assert!(end <= bytes.len());
        assert!(bytes[end..].iter().all(|b| *b == 0), "queue {queue_id}");
    }
    let store = MessageStore::open(config).unwrap();
    assert_all_readable(&store, &puts);
    store.shutdown().unwrap();
}

#[test]
fn async_batches_land_in_steps_zero_filled_ahead() {
    // commit_log.rs's STAGED_FILL_STEP_BYTES.
    const STEP: u64 = 256 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let (config, store, segment) = store_with_8_mib_segments(dir.path(), FlushMode::Async);
    let mut puts = Vec::new();
    let mut n = 0;
    // Batches of 7 (about 18 KiB) past two and a half megabytes: every pwrite lands in zeros
    // written up to a step boundary, at least a step ahead, never further.
    while store.stats().max_physical_offset.0 < 2560 * 1024 {
        let bodies: Vec<Vec<u8>> = (n..n + 7).map(body).collect();
        let msgs: Vec<NewMessage<'_>> = bodies.iter().zip(n..).map(|(b, k)| msg(b, k)).collect();
        let results = store.put_batch(&msgs, n as i64).unwrap();
        puts.extend((n..).zip(results));
        n += 7;
        let end = store.stats().max_physical_offset.0;
        let filled = allocated(&segment);
        assert!(
            filled >= end.next_multiple_of(STEP) && filled % STEP == 0,
            "{filled} bytes allocated with the log ending at {end}"
        );
        assert!(
            filled <= end.next_multiple_of(STEP) + STEP,
            "{filled} past {end}"
        );
    }
    assert_all_readable(&store, &puts);
    crash_and_recover_at_the_zeros(store, config, &segment, &puts);
}

/// Waits (10 s at most) until the bytes of blocks `segment` holds satisfy `settled` (a thread
/// fills them, and its write in progress is seen part-way); how many it holds.
fn wait_allocated(segment: &Path, settled: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !settled(allocated(segment)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    allocated(segment)
}

/// Lone puts until the log passes `past`; every `every` puts, once the fill thread has caught
/// up (bounded wait: it is a thread, and a chunk it is writing shows part-way), at least
/// `ahead` bytes are allocated past the log end. Then every put reads back and a crash
/// recovers at the zeros.
fn lone_puts_find_blocks_filled_ahead(flush_mode: FlushMode, past: u64, every: u64, ahead: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (config, store, segment) = store_with_8_mib_segments(dir.path(), flush_mode);
    let mut puts = Vec::new();
    let mut n = 0;
    while store.stats().max_physical_offset.0 < past {
        let body = body(n);
        puts.push((n, store.put(&msg(&body, n), n as i64).unwrap()));
        if n % every == 0 {
            let end = store.stats().max_physical_offset.0;
            let settled = |filled: u64| filled >= end + ahead;
            let filled = wait_allocated(&segment, settled);
            assert!(
                settled(filled),
                "{filled} bytes allocated with the log ending at {end}"
            );
        }
        n += 1;
    }
    assert_all_readable(&store, &puts);
    crash_and_recover_at_the_zeros(store, config, &segment, &puts);
}

#[test]
fn async_lone_puts_find_megabytes_filled_ahead_by_the_thread() {
    const MIB: u64 = 1024 * 1024;
    // Past three megabytes, most copied through the mapping (those under a page): at least a
    // megabyte filled past the log end. Not necessarily in whole megabytes: on a busy machine
    // the writer can outrun the thread and fill what it needs itself, to the page (commit_log's
    // unit tests cover that path).
    lone_puts_find_blocks_filled_ahead(FlushMode::Async, 3 * MIB, 100, MIB);
}

#[test]
fn sync_mode_keeps_zero_filled_blocks_ahead_of_its_records() {
    // Past the first filled megabyte and a half: at least half a megabyte filled ahead.
    lone_puts_find_blocks_filled_ahead(FlushMode::Sync, 1536 * 1024, 50, 512 * 1024);
}
