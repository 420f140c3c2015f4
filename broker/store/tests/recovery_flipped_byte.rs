//! A flipped byte in the middle of the last segment: recovery stops at the damaged record,
//! keeps everything before it and nothing after it, even records that are intact.
//! The byte is in the body of the record at the middle: RocketMQ's layout checksums the
//! body only, so a flip in other header fields is caught only when it breaks the structure.

mod common;

use common::{
    assert_gone, assert_readable, config, put_many, read_log_bytes, write_log_bytes, SEGMENT_BYTES,
};
use quiver_store::{CommitLogOffset, MessageStore, QueueOffset};

const TOPIC: &str = "FlipTopic";
const QUEUES: u32 = 3;

#[test]
fn flipped_byte_in_the_last_segment_truncates_there() {
    let dir = tempfile::tempdir().unwrap();
    let puts = {
        let store = MessageStore::open(config(dir.path())).unwrap();
        // About 2.5 segments of records.
        let puts = put_many(&store, TOPIC, QUEUES, 1_500);
        store.shutdown().unwrap();
        puts
    };
    let end = puts.last().unwrap().1.physical_offset.0;
    let last_base = end - end % SEGMENT_BYTES;
    assert!(
        last_base >= 2 * SEGMENT_BYTES,
        "the test needs three segments"
    );
    let middle = last_base + (end - last_base) / 2;
    let damaged = puts
        .iter()
        .position(|(_, p)| {
            p.physical_offset.0 <= middle && middle < p.physical_offset.0 + u64::from(p.size)
        })
        .unwrap();
    // The body starts after the 84-byte header and its 4-byte length (IPv4 hosts).
    let at = CommitLogOffset(puts[damaged].1.physical_offset.0 + 88 + 4);
    let original = read_log_bytes(dir.path(), at, 1)[0];
    write_log_bytes(dir.path(), at, &[original ^ 0x5A]);

    let store = MessageStore::open(config(dir.path())).unwrap();
    let report = store.recovery_report().clone();
    assert!(report.clean_shutdown);
    assert_eq!(report.log_end, puts[damaged].1.physical_offset, "{report}");
    assert!(report.damage.is_some(), "{report}");
    for (n, put) in &puts[..damaged] {
        assert_readable(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, *n, put);
    }
    for (n, put) in &puts[damaged..] {
        assert_gone(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, put);
    }
    for queue_id in 0..QUEUES {
        let kept = puts[..damaged]
            .iter()
            .filter(|(n, _)| (*n % u64::from(QUEUES)) as u32 == queue_id)
            .count();
        assert_eq!(store.max_offset(TOPIC, queue_id), QueueOffset(kept as u64));
    }

    // The intact records after the damage must not come back after more appends and a crash.
    let more = put_many(&store, TOPIC, QUEUES, 3);
    drop(store);
    let store = MessageStore::open(config(dir.path())).unwrap();
    assert_eq!(
        store.recovery_report().damage,
        None,
        "{}",
        store.recovery_report()
    );
    let kept_total = damaged as u64 + more.len() as u64;
    let total: u64 = (0..QUEUES).map(|q| store.max_offset(TOPIC, q).0).sum();
    assert_eq!(total, kept_total);
}
