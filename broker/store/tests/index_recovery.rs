//! The message index across restarts: a clean one re-indexes nothing; after a crash only the
//! records past the checkpoint are re-indexed (never the whole log), from the slots the last
//! housekeeping wrote back (those of later entries were in the writer's memory only; slots
//! written back past the checkpoint are mended, the index's unit tests show); a cut CommitLog
//! tail takes its index entries with it.

mod common;

use common::{config, message, write_log_bytes};
use quiver_store::{record, CommitLogOffset, KeyMatch, MessageStore, PutResult, StoreConfig};

const TOPIC: &str = "IndexedTopic";

fn put_keyed(store: &MessageStore, n: u64) -> PutResult {
    let props = format!("UNIQ_KEY\u{1}U{n}\u{2}KEYS\u{1}k{}\u{2}", n % 7);
    let body = format!("m{n}");
    store
        .put(
            &message(TOPIC, (n % 3) as u32, body.as_bytes(), &props),
            10_000 + n as i64,
        )
        .unwrap()
}

fn found(store: &MessageStore, key: &str, key_match: KeyMatch) -> Vec<String> {
    store
        .query_by_key(TOPIC, key, key_match, 64, 0, i64::MAX)
        .messages
        .iter()
        .map(|bytes| {
            let (record, _) = record::decode(bytes).unwrap();
            String::from_utf8(record.body.to_vec()).unwrap()
        })
        .collect()
}

fn expected(key: u64, upto: u64) -> Vec<String> {
    (0..upto)
        .filter(|n| n % 7 == key)
        .map(|n| format!("m{n}"))
        .collect()
}

fn no_housekeeping(dir: &std::path::Path) -> StoreConfig {
    // No checkpoint after the one written at open: what a crash leaves is known.
    StoreConfig {
        flush_interval_ms: 3_600_000,
        ..config(dir)
    }
}

#[test]
fn a_crash_reindexes_only_the_tail_past_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let clean_end = {
        let store = MessageStore::open(no_housekeeping(dir.path())).unwrap();
        for n in 0..100 {
            put_keyed(&store, n);
        }
        store.shutdown().unwrap();
        store.stats().max_physical_offset
    };
    {
        let store = MessageStore::open(no_housekeeping(dir.path())).unwrap();
        let report = store.recovery_report();
        assert_eq!(report.index_entries_rebuilt, 0, "{report}");
        assert_eq!(report.index_slots_repaired, 0, "{report}");
        for n in 100..130 {
            put_keyed(&store, n);
        }
        // Dropped without shutdown: a crash. Its entries stay in the page cache; their slots
        // were in memory only (no housekeeping since).
    }
    let store = MessageStore::open(no_housekeeping(dir.path())).unwrap();
    let report = store.recovery_report().clone();
    assert!(!report.clean_shutdown);
    assert!(clean_end.0 > 0);
    assert_eq!(report.index_rebuilt_from, clean_end, "{report}");
    assert_eq!(report.index_entries_rebuilt, 30 * 2, "{report}");
    // No slot on disk points past the checkpoint: none was written back since.
    assert_eq!(report.index_slots_repaired, 0, "{report}");
    for key in 0..7 {
        assert_eq!(
            found(&store, &format!("k{key}"), KeyMatch::AnyKey),
            expected(key, 130),
            "k{key}"
        );
    }
    for n in [0, 99, 100, 129] {
        assert_eq!(
            found(&store, &format!("U{n}"), KeyMatch::UniqueKey),
            [format!("m{n}")]
        );
    }
    // Chains go on from the re-indexed entries.
    put_keyed(&store, 130);
    assert_eq!(found(&store, "k4", KeyMatch::AnyKey), expected(4, 131));
}

#[test]
fn a_cut_log_tail_takes_its_index_entries_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let puts: Vec<PutResult> = {
        let store = MessageStore::open(config(dir.path())).unwrap();
        let puts = (0..10).map(|n| put_keyed(&store, n * 7)).collect();
        store.shutdown().unwrap();
        puts
    };
    let last = puts.last().unwrap();
    write_log_bytes(
        dir.path(),
        CommitLogOffset(last.physical_offset.0 + 20),
        &vec![0u8; last.size as usize - 20],
    );
    let store = MessageStore::open(config(dir.path())).unwrap();
    assert_eq!(store.recovery_report().log_end, last.physical_offset);
    let nine: Vec<String> = (0..9).map(|n| format!("m{}", n * 7)).collect();
    assert_eq!(found(&store, "k0", KeyMatch::AnyKey), nine);
    assert!(found(&store, "U63", KeyMatch::UniqueKey).is_empty());
    // The next record takes the cut one's place, and only it answers there.
    put_keyed(&store, 70);
    let mut ten = nine;
    ten.push("m70".into());
    assert_eq!(found(&store, "k0", KeyMatch::AnyKey), ten);
}
