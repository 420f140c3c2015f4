//! Replicated broker groups, store side: a replica mirrors the master's CommitLog byte for
//! byte through `read_log` / `append_replicated` and dispatches its own queues and index;
//! a returning old master cuts its unacknowledged tail with `truncate_to`; with
//! `publish_on_confirm`, consumers see only what `confirm` covers.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::{config, message, SEGMENT_BYTES};
use quiver_store::record::{self, Placement};
use quiver_store::{
    CommitLogOffset, DispatchEvent, GetStatus, KeyMatch, MessageStore, PutResult, QueueOffset,
    StoreConfig, StoreError, MIN_SEGMENT_SIZE_BYTES,
};

const TOPICS: [&str; 3] = ["OrderTopic", "PayTopic", "%RETRY%group"];

fn small_config(dir: &Path) -> StoreConfig {
    assert_eq!(SEGMENT_BYTES, MIN_SEGMENT_SIZE_BYTES);
    config(dir)
}

fn properties(n: u64) -> String {
    format!(
        "UNIQ_KEY\u{1}U{n}\u{2}KEYS\u{1}key-{n} common-{}\u{2}TAGS\u{1}tag{}\u{2}",
        n % 5,
        n % 3
    )
}

fn body(n: u64) -> Vec<u8> {
    format!("body-{n}-{}", "p".repeat((n * 37 % 900) as usize)).into_bytes()
}

/// The `n`th message's (topic, queue id).
fn placement(n: u64) -> (&'static str, u32) {
    (TOPICS[(n % 3) as usize], ((n / 3) % 4) as u32)
}

/// Puts messages `range` (some in batches), store times 5000 + n.
fn put_range(store: &MessageStore, range: std::ops::Range<u64>) -> Vec<PutResult> {
    let mut results = Vec::new();
    let mut n = range.start;
    while n < range.end {
        let batch = if n % 7 == 0 { 3.min(range.end - n) } else { 1 };
        let bodies: Vec<_> = (n..n + batch).map(body).collect();
        let props: Vec<_> = (n..n + batch).map(properties).collect();
        let msgs: Vec<_> = (n..n + batch)
            .map(|m| {
                let (topic, queue_id) = placement(m);
                let i = (m - n) as usize;
                message(topic, queue_id, &bodies[i], &props[i])
            })
            .collect();
        results.extend(store.put_batch(&msgs, 5000 + n as i64).unwrap());
        n += batch;
    }
    results
}

/// Copies the master's log to the replica in chunks of the given sizes (cycled) until the
/// replica reaches the master's end. Returns the chunks copied.
fn replicate(master: &MessageStore, replica: &MessageStore, sizes: &[usize]) -> usize {
    let mut chunks = 0;
    loop {
        let from = replica.log_end();
        let chunk = master.read_log(from, sizes[chunks % sizes.len()]).unwrap();
        if chunk.bytes.is_empty() {
            assert_eq!(from, master.log_end());
            return chunks;
        }
        let end = replica.append_replicated(from, &chunk.bytes).unwrap();
        assert!(replica.dispatch_replicated(u64::MAX).unwrap().caught_up());
        assert_eq!(end, chunk.next, "replica end after chunk {chunks}");
        assert_eq!(replica.log_end(), chunk.next);
        chunks += 1;
    }
}

fn commitlog_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir.join("commitlog"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().len() == 20)
        .map(|p| {
            (
                p.file_name().unwrap().to_str().unwrap().to_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

fn all_messages(store: &MessageStore, topic: &str, queue_id: u32) -> Vec<bytes::Bytes> {
    let max = store.max_offset(topic, queue_id).0;
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < max {
        let got = store
            .get(topic, queue_id, QueueOffset(offset), 32, u64::MAX, &|_| {
                true
            })
            .unwrap();
        assert_eq!(got.status, GetStatus::Found);
        offset = got.next_begin_offset.0;
        out.extend(got.messages);
    }
    out
}

fn assert_same_queues(master: &MessageStore, replica: &MessageStore) {
    assert_eq!(master.queues(), replica.queues());
    for (topic, queue_id) in master.queues() {
        assert_eq!(
            master.max_offset(&topic, queue_id),
            replica.max_offset(&topic, queue_id),
            "{topic}/{queue_id}"
        );
        assert_eq!(
            all_messages(master, &topic, queue_id),
            all_messages(replica, &topic, queue_id),
            "{topic}/{queue_id}"
        );
    }
}

fn bodies_by_key(store: &MessageStore, topic: &str, key: &str) -> Vec<Vec<u8>> {
    store
        .query_by_key(topic, key, KeyMatch::AnyKey, 100, 0, i64::MAX)
        .messages
        .iter()
        .map(|bytes| record::decode(bytes).unwrap().0.body.to_vec())
        .collect()
}

#[test]
fn replica_mirrors_the_master_byte_for_byte() {
    let (master_dir, replica_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let master = MessageStore::open(small_config(master_dir.path())).unwrap();
    let replica = MessageStore::open(small_config(replica_dir.path())).unwrap();
    assert_eq!(master.segment_size(), replica.segment_size());
    assert_eq!(master.log_min(), CommitLogOffset(0));
    let grown: Arc<Mutex<std::collections::HashMap<(String, u32), u64>>> = Arc::default();
    let seen = Arc::clone(&grown);
    replica.set_dispatch_hook(Arc::new(move |event: &DispatchEvent<'_>| {
        let mut seen = seen.lock().unwrap();
        let max = seen
            .entry((event.topic.to_owned(), event.queue_id))
            .or_default();
        assert!(event.max_offset.0 > *max, "queues only grow");
        *max = event.max_offset.0;
    }));

    put_range(&master, 0..400);
    assert!(
        master.log_end().0 > 3 * SEGMENT_BYTES,
        "several rolls, end {}",
        master.log_end()
    );
    // One byte (always one whole record), odd sizes, about a segment.
    let chunks = replicate(&master, &replica, &[1, 777, 5000, 40_000, 70_000]);
    assert!(chunks > 10, "{chunks} chunks");
    // More on the master, copied on the fly.
    put_range(&master, 400..450);
    replicate(&master, &replica, &[3000]);

    assert_eq!(replica.log_end(), master.log_end());
    assert_eq!(
        commitlog_files(master_dir.path()),
        commitlog_files(replica_dir.path())
    );
    assert_same_queues(&master, &replica);
    // The replica's hook heard of every queue's growth, up to its max.
    for (topic, queue_id) in master.queues() {
        assert_eq!(
            grown
                .lock()
                .unwrap()
                .get(&(topic.clone(), queue_id))
                .copied(),
            Some(master.max_offset(&topic, queue_id).0),
            "{topic}/{queue_id}"
        );
    }
    for key in ["key-7", "common-3", "U401"] {
        for topic in TOPICS {
            let expected = bodies_by_key(&master, topic, key);
            assert_eq!(
                bodies_by_key(&replica, topic, key),
                expected,
                "{topic} {key}"
            );
        }
    }
    assert_eq!(
        bodies_by_key(&replica, TOPICS[1], "key-7"),
        vec![body(7)],
        "found on the replica by key"
    );
    // The replica's own store times are the master's.
    let probe = master
        .physical_offset_at(TOPICS[0], 1, QueueOffset(2))
        .unwrap();
    assert_eq!(
        master.read_record(probe).unwrap(),
        replica.read_record(probe).unwrap()
    );
    replica.shutdown().unwrap();
    master.shutdown().unwrap();
}

#[test]
fn read_log_chunks_are_whole_records_within_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(small_config(dir.path())).unwrap();
    let empty = store.read_log(CommitLogOffset(0), 1000).unwrap();
    assert!(empty.bytes.is_empty());
    assert_eq!(empty.next, CommitLogOffset(0));
    let results = put_range(&store, 0..300);
    let first = store.read_log(CommitLogOffset(0), 1).unwrap();
    assert_eq!(
        first.bytes.len() as u32,
        results[0].size,
        "at least one record"
    );
    assert_eq!(first.next, results[1].physical_offset);
    // A chunk ends on a record boundary, never past a segment end.
    let mut from = CommitLogOffset(0);
    let mut fillers = 0;
    while from < store.log_end() {
        let chunk = store.read_log(from, 10_000).unwrap();
        assert!(!chunk.bytes.is_empty());
        assert_eq!(from.0 / SEGMENT_BYTES, (chunk.next.0 - 1) / SEGMENT_BYTES);
        if chunk.next.0 % SEGMENT_BYTES == 0
            && chunk.bytes[4..8] == record::BLANK_MAGIC.to_be_bytes()
        {
            fillers += 1;
            assert_eq!(chunk.bytes.len() as u64, chunk.next.0 - from.0);
        }
        from = chunk.next;
    }
    assert!(fillers >= 2, "{fillers} fillers");
    assert_eq!(from, store.log_end());
    // Not a boundary, or out of range.
    assert!(store.read_log(CommitLogOffset(3), 100).is_err());
    assert!(matches!(
        store.read_log(CommitLogOffset(store.log_end().0 + 1), 100),
        Err(StoreError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn mismatches_are_refused() {
    let (master_dir, replica_dir, big_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let master = MessageStore::open(small_config(master_dir.path())).unwrap();
    let replica = MessageStore::open(small_config(replica_dir.path())).unwrap();
    put_range(&master, 0..10);
    let chunk = master.read_log(CommitLogOffset(0), 1_000_000).unwrap();

    // Not at the replica's end.
    let wrong_at = replica.append_replicated(CommitLogOffset(5), &chunk.bytes);
    assert!(
        matches!(
            wrong_at,
            Err(StoreError::ReplicaOffsetMismatch { expected, found })
                if expected == CommitLogOffset(0) && found == CommitLogOffset(5)
        ),
        "{wrong_at:?}"
    );

    // A record claiming a queue offset its queue has not reached: the logs diverged.
    let props = properties(0);
    let msg = message("T", 0, b"diverged", &props);
    let encoded = |queue_offset: u64, physical_offset: u64| {
        record::encode(
            &msg,
            Placement {
                queue_offset: QueueOffset(queue_offset),
                physical_offset: CommitLogOffset(physical_offset),
                store_timestamp_ms: 1,
            },
        )
        .unwrap()
    };
    // Framing holds: appended, then refused by dispatch and cut back.
    let appended = replica.append_replicated(CommitLogOffset(0), &encoded(5, 0));
    assert!(appended.is_ok(), "{appended:?}");
    let wrong_queue = replica.dispatch_replicated(u64::MAX);
    replica.truncate_to(CommitLogOffset(0)).unwrap();
    assert!(
        matches!(
            wrong_queue,
            Err(StoreError::ReplicaQueueOffsetMismatch {
                expected: 0,
                found: 5,
                ..
            })
        ),
        "{wrong_queue:?}"
    );
    // A record stamped with another position.
    let wrong_position = replica.append_replicated(CommitLogOffset(0), &encoded(0, 64));
    assert!(
        matches!(
            wrong_position,
            Err(StoreError::ReplicaOffsetMismatch { .. })
        ),
        "{wrong_position:?}"
    );
    // A damaged record.
    let mut damaged = encoded(0, 0);
    let last = damaged.len() - 30;
    damaged[last] ^= 0xff;
    replica
        .append_replicated(CommitLogOffset(0), &damaged)
        .unwrap();
    let bad_crc = replica.dispatch_replicated(u64::MAX);
    assert!(
        matches!(bad_crc, Err(StoreError::BadRecord { offset, .. }) if offset.0 == 0),
        "{bad_crc:?}"
    );
    replica.truncate_to(CommitLogOffset(0)).unwrap();
    assert_eq!(replica.log_end(), CommitLogOffset(0), "cut back");
    assert_eq!(replica.max_offset("T", 0), QueueOffset(0));
    // The right chunk still goes in.
    assert_eq!(
        replica
            .append_replicated(CommitLogOffset(0), &chunk.bytes)
            .unwrap(),
        chunk.next
    );

    // A replica with larger segments cannot mirror the master's filler.
    let big = MessageStore::open(StoreConfig {
        segment_size_bytes: 2 * SEGMENT_BYTES,
        ..small_config(big_dir.path())
    })
    .unwrap();
    assert_ne!(big.segment_size(), master.segment_size());
    put_range(&master, 10..200);
    let mut refused = None;
    while refused.is_none() {
        let from = big.log_end();
        let chunk = master.read_log(from, 50_000).unwrap();
        assert!(!chunk.bytes.is_empty(), "the filler never came");
        if let Err(error) = big.append_replicated(from, &chunk.bytes) {
            refused = Some(error);
        }
    }
    assert!(
        matches!(refused, Some(StoreError::ReplicaSegmentMismatch { .. })),
        "{refused:?}"
    );
    // Refused at the master's first filler, before anything of it was written.
    assert!(big.log_end().0 < SEGMENT_BYTES);
}

#[test]
fn truncate_removes_the_tail_for_readers_and_for_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(small_config(dir.path())).unwrap();
    let results = put_range(&store, 0..300);
    let old_end = store.log_end();
    assert!(old_end.0 > 2 * SEGMENT_BYTES);
    let k = 60usize;
    let cut = results[k].physical_offset;
    assert!(cut.0 < SEGMENT_BYTES, "later segments are deleted");

    assert!(matches!(
        store.truncate_to(CommitLogOffset(cut.0 + 1)),
        Err(StoreError::NotARecordBoundary { .. })
    ));
    let report = store.truncate_to(cut).unwrap();
    assert_eq!(report.old_end, old_end);
    assert_eq!(report.new_end, cut);
    assert_eq!(report.bytes, old_end.0 - cut.0);
    assert!(report.deleted_segments >= 2, "{report:?}");
    assert_eq!(
        report.messages.iter().map(|m| m.2).sum::<u64>(),
        (results.len() - k) as u64
    );
    assert!(report.index_entries > 0);

    let check = |store: &MessageStore, extra: u64| {
        assert_eq!(store.log_end().0, cut.0 + extra);
        for (n, result) in results.iter().enumerate() {
            let (topic, queue_id) = placement(n as u64);
            let expected = (0..k as u64)
                .filter(|m| placement(*m) == (topic, queue_id))
                .count() as u64;
            let max = store.max_offset(topic, queue_id).0;
            if n < k {
                assert!(result.queue_offset.0 < max);
                let got = store
                    .get(topic, queue_id, result.queue_offset, 1, u64::MAX, &|_| true)
                    .unwrap();
                assert_eq!(got.status, GetStatus::Found);
            } else {
                assert!(max <= expected + 1, "{topic}/{queue_id}: {max}");
                let key = format!("key-{n}");
                assert!(
                    bodies_by_key(store, topic, &key).is_empty(),
                    "{key} still found"
                );
            }
        }
        let mut from = CommitLogOffset(0);
        while from < store.log_end() {
            from = store.read_log(from, 100_000).unwrap().next;
        }
        assert_eq!(from, store.log_end());
    };
    check(&store, 0);
    assert!(store.read_record(results[k].physical_offset).is_err());
    assert!(store.read_log(results[k + 5].physical_offset, 10).is_err());

    // New messages go on at the cut with the removed ones' queue offsets.
    let (topic, queue_id) = placement(k as u64);
    let new_props = "KEYS\u{1}after-cut\u{2}";
    let again = store
        .put(&message(topic, queue_id, b"after the cut", new_props), 9999)
        .unwrap();
    assert_eq!(again.physical_offset, cut);
    assert_eq!(again.queue_offset, results[k].queue_offset);
    assert_eq!(
        bodies_by_key(&store, topic, "after-cut"),
        vec![b"after the cut".to_vec()]
    );
    check(&store, u64::from(again.size));

    // A crash: the truncated state comes back, not the old tail.
    drop(store);
    let store = MessageStore::open(small_config(dir.path())).unwrap();
    check(&store, u64::from(again.size));
    assert_eq!(
        store.max_offset(topic, queue_id).0,
        again.queue_offset.0 + 1
    );
    let got = store
        .get(topic, queue_id, again.queue_offset, 1, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(
        record::decode(&got.messages[0]).unwrap().0.body.as_ref(),
        b"after the cut"
    );
    let next = store
        .put(&message(topic, queue_id, b"later", new_props), 10_000)
        .unwrap();
    assert_eq!(next.queue_offset.0, again.queue_offset.0 + 1);
    store.shutdown().unwrap();
}

#[test]
fn confirm_fences_what_consumers_see() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(StoreConfig {
        publish_on_confirm: true,
        ..small_config(dir.path())
    })
    .unwrap();
    let events: Arc<Mutex<Vec<(String, u32, u64)>>> = Arc::default();
    let seen = Arc::clone(&events);
    store.set_dispatch_hook(Arc::new(move |event: &DispatchEvent<'_>| {
        seen.lock()
            .unwrap()
            .push((event.topic.to_owned(), event.queue_id, event.max_offset.0));
    }));
    let props = "TAGS\u{1}a\u{2}";
    let put = |body: &[u8]| store.put(&message("T", 0, body, props), 1).unwrap();
    let results: Vec<_> = [b"m0", b"m1", b"m2"].iter().map(|b| put(*b)).collect();
    let end_of = |r: &PutResult| CommitLogOffset(r.physical_offset.0 + u64::from(r.size));

    assert_eq!(store.max_offset("T", 0), QueueOffset(0));
    let got = store
        .get("T", 0, QueueOffset(0), 10, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.status, GetStatus::NoMessageInQueue);
    assert!(events.lock().unwrap().is_empty(), "no hook before confirm");
    // Replicas still read the records.
    assert_eq!(
        store.read_log(CommitLogOffset(0), 1 << 20).unwrap().next,
        store.log_end()
    );

    // Covering m0 and m1 only (m2's end is past the offset).
    store.confirm(CommitLogOffset(end_of(&results[1]).0 + 1));
    assert_eq!(store.max_offset("T", 0), QueueOffset(2));
    assert_eq!(*events.lock().unwrap(), vec![("T".to_owned(), 0, 2)]);
    let got = store
        .get("T", 0, QueueOffset(0), 10, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.messages.len(), 2);
    // Monotonic: a lower offset changes nothing.
    store.confirm(CommitLogOffset(0));
    assert_eq!(
        store.confirmed(),
        CommitLogOffset(end_of(&results[1]).0 + 1)
    );
    assert_eq!(store.max_offset("T", 0), QueueOffset(2));
    store.confirm(end_of(&results[2]));
    assert_eq!(store.max_offset("T", 0), QueueOffset(3));
    assert_eq!(events.lock().unwrap().len(), 2);

    // Truncation drops pending units; confirming later does not bring them back.
    let m3 = put(b"m3");
    let m4 = put(b"m4");
    store.truncate_to(m4.physical_offset).unwrap();
    assert!(store.confirmed() <= m4.physical_offset);
    store.confirm(store.log_end());
    assert_eq!(store.max_offset("T", 0), QueueOffset(4));
    assert_eq!(store.confirmed(), end_of(&m3));
    let m4_again = put(b"m4-again");
    assert_eq!(m4_again.queue_offset, QueueOffset(4));
    assert_eq!(
        store.max_offset("T", 0),
        QueueOffset(4),
        "not confirmed yet"
    );

    // A restart shows only what was confirmed before it (the checkpoint keeps the fence):
    // m4-again waits for the group to confirm it, and is not read by id either.
    store.shutdown().unwrap();
    drop(store);
    let store = MessageStore::open(StoreConfig {
        publish_on_confirm: true,
        ..small_config(dir.path())
    })
    .unwrap();
    assert_eq!(store.confirmed(), end_of(&m3));
    assert_eq!(store.max_offset("T", 0), QueueOffset(4));
    assert!(store.message_at(m4_again.physical_offset).is_err());
    assert!(store.message_at(m3.physical_offset).is_ok());
    store.confirm(store.log_end());
    assert_eq!(store.max_offset("T", 0), QueueOffset(5));
    assert!(store.message_at(m4_again.physical_offset).is_ok());
}

/// Issue 36: a member that crashes and restarts must not serve records its group never
/// confirmed (a new epoch may truncate them and hand their queue offsets to others).
#[test]
fn a_crashed_member_serves_nothing_past_its_checkpointed_fence() {
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        MessageStore::open(StoreConfig {
            publish_on_confirm: true,
            ..small_config(dir.path())
        })
        .unwrap()
    };
    let store = open();
    let results = put_range(&store, 0..30);
    let end_of = |r: &PutResult| CommitLogOffset(r.physical_offset.0 + u64::from(r.size));
    let fence = end_of(&results[9]);
    store.confirm(fence);
    // A truncation writes a checkpoint at once (the housekeeper's may come later).
    store.truncate_to(results[29].physical_offset).unwrap();
    let visible_before: Vec<(String, u32, u64)> = store
        .queues()
        .into_iter()
        .map(|(t, q)| {
            let max = store.max_offset(&t, q).0;
            (t, q, max)
        })
        .collect();
    drop(store); // a crash: no shutdown
    let store = open();
    assert!(store.confirmed() <= fence);
    assert!(
        store.confirmed().0 > 0,
        "the truncation's checkpoint kept the fence"
    );
    for (topic, queue, max) in &visible_before {
        assert!(store.max_offset(topic, *queue).0 <= *max, "{topic}/{queue}");
    }
    for result in &results[10..29] {
        assert!(store.message_at(result.physical_offset).is_err());
    }
    // A reader positioned inside the hidden units waits there; one past everything written
    // (a tail a failover cut) starts the queue again rather than skip.
    let (topic, queue) = placement(20);
    let hidden = results[20].queue_offset;
    let got = store
        .get(topic, queue, hidden, 10, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.status, GetStatus::OffsetOverflowOne);
    assert_eq!(got.next_begin_offset, hidden);
    assert!(store.max_offset(topic, queue) <= hidden);
    assert!(
        store.written_max_offset(topic, queue) > hidden,
        "what was written counts for a new master's offsets"
    );
    let got = store
        .get(topic, queue, QueueOffset(1000), 10, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(got.status, GetStatus::OffsetOverflowBadly);
    assert_eq!(got.next_begin_offset, QueueOffset(0));
    let unconfirmed_key = bodies_by_key(&store, placement(20).0, "key-20");
    assert!(
        unconfirmed_key.is_empty(),
        "queried by key before confirmed"
    );
    store.confirm(store.log_end());
    assert_eq!(
        bodies_by_key(&store, placement(20).0, "key-20"),
        vec![body(20)]
    );
    let total: u64 = store
        .queues()
        .into_iter()
        .map(|(t, q)| store.max_offset(&t, q).0)
        .sum();
    assert_eq!(total, 29);
}

#[test]
fn default_mode_publishes_at_append() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(small_config(dir.path())).unwrap();
    store.put(&message("T", 0, b"m0", ""), 1).unwrap();
    assert_eq!(store.max_offset("T", 0), QueueOffset(1));
}

#[test]
fn replica_survives_a_crash_and_continues() {
    let (master_dir, replica_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let master = MessageStore::open(small_config(master_dir.path())).unwrap();
    put_range(&master, 0..150);
    {
        let replica = MessageStore::open(small_config(replica_dir.path())).unwrap();
        replicate(&master, &replica, &[2500, 9000]);
        // Dropped without shutdown: recovers as after a crash.
    }
    put_range(&master, 150..300);
    let replica = MessageStore::open(small_config(replica_dir.path())).unwrap();
    assert!(!replica.recovery_report().clean_shutdown);
    replicate(&master, &replica, &[6000]);
    assert_eq!(replica.log_end(), master.log_end());
    assert_eq!(
        commitlog_files(master_dir.path()),
        commitlog_files(replica_dir.path())
    );
    assert_same_queues(&master, &replica);
    assert_eq!(
        bodies_by_key(&replica, TOPICS[2], "key-200"),
        vec![body(200)]
    );
}

#[test]
fn truncate_at_a_filler_and_in_sync_mode() {
    truncate_at_a_filler_in_sync_mode(false);
}

#[test]
fn truncate_at_a_filler_in_sync_mode_with_warm_segments() {
    truncate_at_a_filler_in_sync_mode(true);
}

fn truncate_at_a_filler_in_sync_mode(warm_segments: bool) {
    let dir = tempfile::tempdir().unwrap();
    let sync = |dir: &Path| StoreConfig {
        flush_mode: quiver_store::FlushMode::Sync,
        warm_segments,
        ..small_config(dir)
    };
    let store = MessageStore::open(sync(dir.path())).unwrap();
    let results = put_range(&store, 0..200);
    // The first filler: where the first record of the second segment would have gone.
    let mut filler = None;
    let mut from = CommitLogOffset(0);
    while filler.is_none() {
        let chunk = store.read_log(from, 1 << 20).unwrap();
        if chunk.bytes[4..8] == record::BLANK_MAGIC.to_be_bytes() {
            filler = Some(from);
        }
        from = chunk.next;
    }
    let filler = filler.unwrap();
    let k = results
        .iter()
        .position(|r| r.physical_offset.0 >= SEGMENT_BYTES)
        .unwrap();
    let report = store.truncate_to(filler).unwrap();
    assert_eq!(report.new_end, filler);
    assert!(store.stats().flushed_physical_offset <= filler);
    assert_eq!(store.log_end(), filler);
    // The cut segment's rest is free again: a small record goes there, and Sync puts are
    // acknowledged once durable, flushed from the cut on.
    let (topic, queue_id) = placement(k as u64);
    let small = store
        .put(&message(topic, queue_id, b"small", ""), 1)
        .unwrap();
    assert_eq!(small.physical_offset, filler);
    assert_eq!(small.queue_offset, results[k].queue_offset);
    assert!(store.stats().flushed_physical_offset.0 >= filler.0 + u64::from(small.size));
    let more = put_range(&store, 1000..1300);
    assert!(more.last().unwrap().physical_offset.0 > 2 * SEGMENT_BYTES);
    for (n, result) in (1000..1300).zip(&more) {
        let (topic, queue_id) = placement(n);
        let got = store
            .get(topic, queue_id, result.queue_offset, 1, u64::MAX, &|_| true)
            .unwrap();
        assert_eq!(record::decode(&got.messages[0]).unwrap().0.body, body(n));
    }
    store.shutdown().unwrap();
    assert!(matches!(
        store.append_replicated(store.log_end(), b""),
        Err(StoreError::ShutDown)
    ));
    assert!(matches!(
        store.truncate_to(CommitLogOffset(0)),
        Err(StoreError::ShutDown)
    ));
    drop(store);
    let store = MessageStore::open(sync(dir.path())).unwrap();
    assert!(store.recovery_report().clean_shutdown);
    let got = store
        .get(topic, queue_id, small.queue_offset, 1, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(
        record::decode(&got.messages[0]).unwrap().0.body.as_ref(),
        b"small"
    );
}

#[test]
fn replication_keeps_up_with_concurrent_writes() {
    let (master_dir, replica_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let master = Arc::new(MessageStore::open(small_config(master_dir.path())).unwrap());
    let replica = MessageStore::open(StoreConfig {
        publish_on_confirm: true,
        ..small_config(replica_dir.path())
    })
    .unwrap();
    let writer = {
        let master = Arc::clone(&master);
        std::thread::spawn(move || put_range(&master, 0..600))
    };
    let mut sizes = [1usize, 900, 4000, 20_000].iter().cycle();
    loop {
        let done = writer.is_finished();
        let from = replica.log_end();
        let chunk = master.read_log(from, *sizes.next().unwrap()).unwrap();
        if chunk.bytes.is_empty() {
            if done {
                break;
            }
            std::thread::yield_now();
            continue;
        }
        let end = replica.append_replicated(from, &chunk.bytes).unwrap();
        replica.dispatch_replicated(u64::MAX).unwrap();
        // The replica's consumers see what the group confirmed.
        replica.confirm(end);
    }
    writer.join().unwrap();
    assert_eq!(replica.log_end(), master.log_end());
    assert_eq!(replica.confirmed(), master.log_end());
    assert_eq!(
        commitlog_files(master_dir.path()),
        commitlog_files(replica_dir.path())
    );
    assert_same_queues(&master, &replica);
}
