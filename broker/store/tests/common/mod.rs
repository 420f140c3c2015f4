//! Helpers shared by the store's scenario tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;

use quiver_store::record::{self, Placement};
use quiver_store::{
    CommitLogOffset, FlushMode, GetStatus, MessageStore, NewMessage, PutResult, QueueOffset,
    StoreConfig,
};

pub const SEGMENT_BYTES: u64 = 64 * 1024;

pub fn config(dir: &Path) -> StoreConfig {
    StoreConfig {
        data_dir: dir.to_path_buf(),
        segment_size_bytes: SEGMENT_BYTES,
        consume_queue_units_per_file: 64,
        flush_mode: FlushMode::Async,
        flush_interval_ms: 50,
        max_message_size_bytes: 16 * 1024,
        // Small index files: tests roll over them and meet slot collisions.
        index_slots_per_file: 64,
        index_entries_per_file: 512,
        // The machine's own disk usage must not refuse writes or delete files here.
        disk_high_water_ratio: 1.0,
        disk_clean_ratio: 1.0,
        disk_force_clean_ratio: 1.0,
        ..StoreConfig::default()
    }
}

pub fn born_host() -> SocketAddr {
    "10.0.0.1:40000".parse().unwrap()
}

pub fn store_host() -> SocketAddr {
    "10.0.0.2:10911".parse().unwrap()
}

/// A message to `topic`/`queue_id` with the given body and a TAGS property.
pub fn message<'a>(
    topic: &'a str,
    queue_id: u32,
    body: &'a [u8],
    properties: &'a str,
) -> NewMessage<'a> {
    NewMessage {
        topic,
        queue_id,
        flag: 0,
        body,
        properties,
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host: born_host(),
        store_host: store_host(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// The body of the `n`th test message: recognisable and of varying length.
pub fn body(n: u64) -> Vec<u8> {
    format!("message-{n}-{}", "x".repeat((n % 17) as usize)).into_bytes()
}

/// Appends `count` messages round-robin over `queues` queues of `topic`, timestamps 1000+n.
pub fn put_many(
    store: &MessageStore,
    topic: &str,
    queues: u32,
    count: u64,
) -> Vec<(u64, PutResult)> {
    (0..count)
        .map(|n| {
            let body = body(n);
            let result = store
                .put(
                    &message(
                        topic,
                        (n % u64::from(queues)) as u32,
                        &body,
                        "TAGS\u{1}T\u{2}",
                    ),
                    1000 + n as i64,
                )
                .expect("put");
            (n, result)
        })
        .collect()
}

/// Checks that the message `n` put with `result` reads back byte-exact by queue and by offset.
pub fn assert_readable(
    store: &MessageStore,
    topic: &str,
    queue_id: u32,
    n: u64,
    result: &PutResult,
) {
    let body = body(n);
    let msg = message(topic, queue_id, &body, "TAGS\u{1}T\u{2}");
    let expected = record::encode(
        &msg,
        Placement {
            queue_offset: result.queue_offset,
            physical_offset: result.physical_offset,
            store_timestamp_ms: result.store_timestamp_ms,
        },
    )
    .unwrap();
    let got = store
        .get(topic, queue_id, result.queue_offset, 1, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(
        got.status,
        GetStatus::Found,
        "message {n} at {:?}",
        result.queue_offset
    );
    assert_eq!(
        got.messages[0].as_ref(),
        expected.as_slice(),
        "message {n} bytes"
    );
    let record = store.read_record(result.physical_offset).unwrap();
    assert_eq!(record.body.as_ref(), body.as_slice());
}

/// True when nothing is readable at `result`'s queue offset or physical offset.
pub fn assert_gone(store: &MessageStore, topic: &str, queue_id: u32, result: &PutResult) {
    let got = store
        .get(topic, queue_id, result.queue_offset, 1, u64::MAX, &|_| true)
        .unwrap();
    assert_ne!(
        got.status,
        GetStatus::Found,
        "{:?} should be gone",
        result.queue_offset
    );
    assert!(store.read_record(result.physical_offset).is_err());
}

pub fn segment_path(dir: &Path, base: u64) -> std::path::PathBuf {
    dir.join("commitlog").join(format!("{base:020}"))
}

/// Overwrites `bytes` at a CommitLog offset in the segment files (store closed).
pub fn write_log_bytes(dir: &Path, offset: CommitLogOffset, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let base = offset.0 - offset.0 % SEGMENT_BYTES;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(segment_path(dir, base))
        .unwrap();
    file.seek(SeekFrom::Start(offset.0 - base)).unwrap();
    file.write_all(bytes).unwrap();
}

pub fn read_log_bytes(dir: &Path, offset: CommitLogOffset, len: usize) -> Vec<u8> {
    let base = offset.0 - offset.0 % SEGMENT_BYTES;
    let data = std::fs::read(segment_path(dir, base)).unwrap();
    let at = (offset.0 - base) as usize;
    data[at..at + len].to_vec()
}

pub fn queue_offset(n: u64) -> QueueOffset {
    QueueOffset(n)
}

/// Runs the calling test binary's `test_name` again as a child writer on a fresh directory
/// (handed over in `dir_env`), its stdout piped for the acknowledgements it prints, so that
/// the parent can SIGKILL it mid-write. Returns the directory and the child.
pub fn spawn_writer_child(
    test_name: &str,
    dir_env: &str,
) -> (tempfile::TempDir, std::process::Child) {
    let dir = tempfile::tempdir().unwrap();
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(dir_env, dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (dir, child)
}
