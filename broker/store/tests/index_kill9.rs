//! A real kill -9 while writers append keyed messages (Sync flush): after the restart every
//! acknowledged message is found by its key and its unique key, and the index was rebuilt
//! from the checkpoint on, not from the start of the log.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use common::{config, message};
use quiver_store::{FlushMode, KeyMatch, MessageStore, StoreConfig};

const CHILD_DIR_ENV: &str = "QUIVER_INDEX_KILL9_CHILD_DIR";
const TEST_NAME: &str = "acknowledged_messages_are_found_by_key_after_kill_9";
const TOPIC: &str = "Kill9Keys";
const WRITERS: u32 = 3;
/// Acknowledged messages the parent waits for before it kills the child.
const ACKS_BEFORE_KILL: usize = 300;

fn sync_config(dir: &std::path::Path) -> StoreConfig {
    StoreConfig {
        flush_mode: FlushMode::Sync,
        ..config(dir)
    }
}

fn key_of(writer: u32, seq: u64) -> String {
    format!("key-{writer}-{seq}")
}

fn unique_key_of(writer: u32, seq: u64) -> String {
    format!("U{writer:04}{seq:012}")
}

/// The child: append forever (until killed), one line per acknowledged message.
fn run_child(dir: &str) -> ! {
    let store = std::sync::Arc::new(MessageStore::open(sync_config(dir.as_ref())).unwrap());
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                for seq in 0.. {
                    let props = format!(
                        "UNIQ_KEY\u{1}{}\u{2}KEYS\u{1}{} writer-{writer}\u{2}",
                        unique_key_of(writer, seq),
                        key_of(writer, seq)
                    );
                    let body = format!("{writer}-{seq}");
                    let msg = message(TOPIC, writer, body.as_bytes(), &props);
                    store.put(&msg, 1_000 + seq as i64).unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ACK {writer} {seq}").unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    unreachable!("writers never stop");
}

/// The index offset of the checkpoint on disk, once it has one.
fn checkpointed_index_offset(dir: &std::path::Path) -> u64 {
    std::fs::read(dir.join("checkpoint"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .and_then(|checkpoint| checkpoint["indexDurableOffset"].as_u64())
        .unwrap_or(0)
}

fn parse_ack(line: &str) -> Option<(u32, u64)> {
    let mut fields = line.strip_prefix("ACK ")?.split(' ');
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

#[test]
fn acknowledged_messages_are_found_by_key_after_kill_9() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        run_child(&dir);
    }
    let (dir, mut child) = common::spawn_writer_child(TEST_NAME, CHILD_DIR_ENV);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acks = Vec::new();
    while acks.len() < ACKS_BEFORE_KILL && Instant::now() < deadline {
        let Some(line) = lines.next() else { break };
        acks.extend(parse_ack(&line.unwrap()));
    }
    // Past a checkpoint that covers index entries, so the restart has a tail to rebuild.
    while checkpointed_index_offset(dir.path()) == 0 && Instant::now() < deadline {
        let Some(line) = lines.next() else { break };
        acks.extend(parse_ack(&line.unwrap()));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    acks.extend(lines.map_while(Result::ok).filter_map(|l| parse_ack(&l)));
    assert!(acks.len() >= ACKS_BEFORE_KILL, "only {} acks", acks.len());
    let checkpointed = checkpointed_index_offset(dir.path());
    assert!(checkpointed > 0, "no checkpoint covered the index in 60 s");

    let store = MessageStore::open(sync_config(dir.path())).unwrap();
    let report = store.recovery_report();
    assert!(!report.clean_shutdown);
    assert!(
        report.index_rebuilt_from.0 >= checkpointed.min(report.log_end.0),
        "{report}"
    );
    assert!(report.index_rebuilt_from.0 > 0, "a full rebuild: {report}");
    for (writer, seq) in &acks {
        let body = format!("{writer}-{seq}");
        for (key, key_match) in [
            (key_of(*writer, *seq), KeyMatch::AnyKey),
            (unique_key_of(*writer, *seq), KeyMatch::UniqueKey),
        ] {
            let found = store.query_by_key(TOPIC, &key, key_match, 4, 0, i64::MAX);
            assert_eq!(found.messages.len(), 1, "{key}: {report}");
            let (record, _) = quiver_store::record::decode(&found.messages[0]).unwrap();
            assert_eq!(record.body.as_ref(), body.as_bytes(), "{key}");
        }
    }
}
