//! The message index's unit tests.
use super::recover::{list_files, IndexRecovery};
use super::*;

const SMALL: Layout = Layout {
    slots: 4,
    capacity: 8,
};

#[test]
fn key_hash_is_pinned() {
    // On disk: a change here would orphan every index written before.
    assert_eq!(key_hash("", ""), 0xaf63_bd4c_8601_b7df);
    assert_ne!(key_hash("T", "k"), key_hash("Tk", ""));
    assert_ne!(key_hash("T", "k1"), key_hash("T", "k2"));
}

#[test]
fn entries_round_trip_and_torn_ones_fail_their_checksum() {
    let entry = Entry {
        key_hash: 0x0102_0304_0506_0708,
        physical_offset: 1 << 40,
        store_timestamp_ms: 1_700_000_000_123,
        prev: 7,
    };
    let mut bytes = entry.encode();
    assert_eq!(Entry::decode(&bytes), Some(entry));
    bytes[10] ^= 1;
    assert_eq!(Entry::decode(&bytes), None);
    assert_eq!(Entry::decode(&[0u8; 32]), None, "zeros are no entry");
}

#[test]
fn index_keys_are_the_unique_key_then_each_key() {
    let properties = "KEYS\u{1}a  b\u{2}UNIQ_KEY\u{1}U1\u{2}TAGS\u{1}t\u{2}";
    assert_eq!(index_keys(properties).collect::<Vec<_>>(), ["U1", "a", "b"]);
    assert_eq!(index_keys("TAGS\u{1}t\u{2}").count(), 0);
    assert!(KeyMatch::AnyKey.matches(properties, "b"));
    assert!(KeyMatch::AnyKey.matches(properties, "U1"));
    assert!(!KeyMatch::UniqueKey.matches(properties, "b"));
    assert!(KeyMatch::UniqueKey.matches(properties, "U1"));
    assert!(!KeyMatch::AnyKey.matches(properties, "a b"));
}

fn put(writer: &mut IndexWriter, index: &MessageIndex, key: &str, at: u64, ts: i64) {
    writer.prepare(index, at, 1).unwrap();
    writer.stage("T", key, at, ts);
    writer.publish();
}

fn found(index: &MessageIndex, key: &str, begin: i64, end: i64) -> Vec<u64> {
    let mut offsets = Vec::new();
    index.lookup(key_hash("T", key), begin, end, |at| {
        offsets.push(at);
        true
    });
    offsets
}

#[test]
fn chains_collide_roll_over_files_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    for n in 0..20u64 {
        put(
            &mut writer,
            &index,
            &format!("k{}", n % 5),
            n * 100,
            n as i64,
        );
    }
    assert_eq!(file_names(dir.path()), [0, 800, 1600], "8 entries per file");
    // Four slots for five keys: chains collide; only k2's entries come back.
    assert_eq!(found(&index, "k2", 0, 100), [1700, 1200, 700, 200]);
    assert_eq!(found(&index, "k2", 5, 12), [1200, 700]);
    index.flush().unwrap();
    drop((index, writer));
    let (index, writer, report) = recover(dir.path(), SMALL, u64::MAX).unwrap();
    assert_eq!(report, IndexRecovery::default());
    assert_eq!(writer.next_entry, 4);
    assert_eq!(found(&index, "k2", 0, 100), [1700, 1200, 700, 200]);
    assert_eq!(
        index.progress(),
        IndexProgress {
            last_timestamp_ms: 19,
            last_physical_offset: 1900
        }
    );
}

#[test]
fn recovery_drops_entries_past_the_recovery_point_and_mends_slots() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    for n in 0..12u64 {
        put(
            &mut writer,
            &index,
            &format!("k{}", n % 3),
            n * 100,
            n as i64,
        );
    }
    // A housekeeping round wrote every slot back; the crash came before its checkpoint.
    index.flush().unwrap();
    drop((index, writer));
    // Recovery keeps records below 1050: entries 0-10; the file at 800 holds 8-10.
    let (index, mut writer, report) = recover(dir.path(), SMALL, 1050).unwrap();
    assert_eq!(report.dropped_files, 0);
    assert!(report.repaired_slots > 0, "{report:?}");
    assert_eq!(writer.next_entry, 3);
    assert_eq!(found(&index, "k2", 0, 100), [800, 500, 200]);
    assert_eq!(found(&index, "k1", 0, 100), [1000, 700, 400, 100]);
    // Re-indexing goes on from the mended chains.
    put(&mut writer, &index, "k2", 1100, 11);
    assert_eq!(found(&index, "k2", 0, 100), [1100, 800, 500, 200]);
    drop((index, writer));
    // A recovery point before a file's start deletes the file.
    let (index, _, report) = recover(dir.path(), SMALL, 700).unwrap();
    assert_eq!(report.dropped_files, 1);
    assert_eq!(found(&index, "k1", 0, 100), [400, 100]);
}

/// The slot `key` lands in, as the mapping of `file` holds it (not the writer's memory).
fn slot_on_file(file: &IndexFile, key: &str) -> u32 {
    let slot = file.layout.slot_of(key_hash("T", key));
    u32::from_le(file.slot(slot).load(Ordering::Acquire))
}

#[test]
fn the_active_files_slots_live_in_memory_until_housekeeping_writes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    put(&mut writer, &index, "k1", 0, 1);
    put(&mut writer, &index, "k1", 100, 2);
    let file = Arc::clone(&index.snapshot()[0]);
    // Found before any housekeeping, though the mapping's slot is still empty.
    assert_eq!(found(&index, "k1", 0, 100), [100, 0]);
    assert_eq!(slot_on_file(&file, "k1"), 0);
    index.flush().unwrap();
    assert_eq!(slot_on_file(&file, "k1"), 2, "1 + the newest entry");
    assert_eq!(found(&index, "k1", 0, 100), [100, 0]);
    // Rolling over retires the file's memory once written back; its keys stay found.
    for n in 2..10u64 {
        put(&mut writer, &index, "k2", n * 100, n as i64);
    }
    assert_eq!(file_names(dir.path()), [0, 800]);
    put(&mut writer, &index, "k1", 1000, 10);
    index.flush().unwrap();
    assert!(
        file.hot.read().is_none(),
        "a retired file's slots leave memory"
    );
    assert_eq!(found(&index, "k1", 0, 100), [1000, 100, 0]);
    drop((index, writer));
    let (index, _, report) = recover(dir.path(), SMALL, u64::MAX).unwrap();
    assert_eq!(report, IndexRecovery::default());
    assert_eq!(found(&index, "k1", 0, 100), [1000, 100, 0]);
}

#[test]
fn a_crash_before_housekeeping_keeps_what_the_checkpoint_covered() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    put(&mut writer, &index, "k1", 0, 1);
    index.flush().unwrap();
    // The checkpoint of that round covers records below 100; this one is only in memory.
    put(&mut writer, &index, "k1", 100, 2);
    drop((index, writer));
    let (index, mut writer, _) = recover(dir.path(), SMALL, 100).unwrap();
    assert_eq!(found(&index, "k1", 0, 100), [0]);
    // Recovery re-indexes the record from the CommitLog; the chain goes on from the file.
    put(&mut writer, &index, "k1", 100, 2);
    assert_eq!(found(&index, "k1", 0, 100), [100, 0]);
}

#[test]
fn a_damaged_file_is_dropped_and_the_others_still_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    for n in 0..12u64 {
        put(&mut writer, &index, "k", n * 100, n as i64);
    }
    index.flush().unwrap();
    drop((index, writer));
    std::fs::write(dir.path().join(format!("{:020}", 0)), b"not an index").unwrap();
    let (index, _, report) = recover(dir.path(), SMALL, u64::MAX).unwrap();
    assert_eq!(report.dropped_files, 1);
    assert_eq!(found(&index, "k", 0, 100), [1100, 1000, 900, 800]);
}

#[test]
fn retention_keeps_files_that_index_live_records_and_the_last_one() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    for n in 0..20u64 {
        put(&mut writer, &index, "k", n * 100, n as i64);
    }
    assert_eq!(
        index.delete_below(700).unwrap(),
        0,
        "entry 7 (700) still lives"
    );
    assert_eq!(index.delete_below(701).unwrap(), 1);
    assert_eq!(index.delete_below(u64::MAX).unwrap(), 1, "never the last");
    assert_eq!(file_names(dir.path()), [1600]);
    assert_eq!(found(&index, "k", 0, 100), [1900, 1800, 1700, 1600]);
}

#[test]
fn unstaged_entries_are_never_published() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    put(&mut writer, &index, "k", 0, 0);
    writer.prepare(&index, 100, 2).unwrap();
    writer.stage("T", "k", 100, 1);
    writer.stage("T", "k", 200, 2);
    writer.unstage_from(&index, 200);
    writer.publish();
    writer.prepare(&index, 200, 1).unwrap();
    writer.stage("T", "other", 200, 3);
    writer.publish();
    assert_eq!(found(&index, "k", 0, 100), [100, 0]);
    assert_eq!(found(&index, "other", 0, 100), [200]);
}

#[test]
fn a_file_started_for_records_never_written_goes_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let (index, mut writer, _) = recover(dir.path(), SMALL, 0).unwrap();
    for n in 0..6u64 {
        put(&mut writer, &index, "k", n * 100, n as i64);
    }
    // A batch: one entry fits in file 0, the next record's two start file 700.
    writer.prepare(&index, 600, 1).unwrap();
    writer.stage("T", "k", 600, 6);
    writer.prepare(&index, 700, 2).unwrap();
    writer.stage("T", "k", 700, 7);
    writer.stage("T", "j", 700, 7);
    assert_eq!(file_names(dir.path()), [0, 700]);
    // Its write failed: the log goes back to 600.
    writer.unstage_from(&index, 600);
    writer.publish();
    assert_eq!(file_names(dir.path()), [0]);
    assert!(found(&index, "k", 0, 100).starts_with(&[500]));
    // The records written there instead go to file 0 again.
    put(&mut writer, &index, "k", 600, 6);
    put(&mut writer, &index, "k", 700, 7);
    put(&mut writer, &index, "k", 800, 8);
    assert_eq!(file_names(dir.path()), [0, 800]);
    assert_eq!(
        found(&index, "k", 0, 100),
        [800, 700, 600, 500, 400, 300, 200, 100, 0]
    );
}

/// The CommitLog offsets in the names of the index files on disk (tests).
fn file_names(dir: &Path) -> Vec<u64> {
    list_files(dir)
        .unwrap()
        .into_iter()
        .map(|(base, _)| base)
        .collect()
}
