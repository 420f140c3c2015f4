//! A real kill -9: a child process appends with Sync flush from several threads and prints
//! each acknowledged offset; the parent kills it at a random moment, reopens the store and
//! finds every acknowledged message.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use common::{config, message};
use quiver_store::{CommitLogOffset, FlushMode, GetStatus, MessageStore, QueueOffset, StoreConfig};
use rand::Rng;

const CHILD_DIR_ENV: &str = "QUIVER_KILL9_CHILD_DIR";
const TEST_NAME: &str = "acknowledged_messages_survive_kill_9";
const TOPIC: &str = "Kill9Topic";
const WRITERS: u32 = 4;

fn sync_config(dir: &std::path::Path) -> StoreConfig {
    StoreConfig {
        flush_mode: FlushMode::Sync,
        ..config(dir)
    }
}

fn body_of(writer: u32, seq: u64) -> Vec<u8> {
    format!("writer-{writer}-seq-{seq}").into_bytes()
}

/// The child: append forever (until killed), one line per acknowledged message.
fn run_child(dir: &str) -> ! {
    let store = std::sync::Arc::new(MessageStore::open(sync_config(dir.as_ref())).unwrap());
    let threads: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                for seq in 0.. {
                    let body = body_of(writer, seq);
                    let put = store
                        .put(&message(TOPIC, writer, &body, ""), seq as i64)
                        .unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(
                        out,
                        "ACK {writer} {seq} {} {}",
                        put.queue_offset, put.physical_offset
                    )
                    .unwrap();
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

#[test]
fn acknowledged_messages_survive_kill_9() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        run_child(&dir);
    }
    let (dir, mut child) = common::spawn_writer_child(TEST_NAME, CHILD_DIR_ENV);
    let kill_after = rand::rng().random_range(50..400usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut acks = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while acks.len() < kill_after && Instant::now() < deadline {
        let Some(line) = lines.next() else { break };
        let line = line.unwrap();
        let Some(fields) = line.strip_prefix("ACK ") else {
            continue;
        };
        let parts: Vec<u64> = fields.split(' ').map(|p| p.parse().unwrap()).collect();
        acks.push((parts[0] as u32, parts[1], parts[2], parts[3]));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        acks.len() >= kill_after,
        "the child acknowledged only {} messages",
        acks.len()
    );

    let store = MessageStore::open(sync_config(dir.path())).unwrap();
    assert!(!store.recovery_report().clean_shutdown);
    for (writer, seq, queue_offset, physical_offset) in &acks {
        let expected = body_of(*writer, *seq);
        let record = store
            .read_record(CommitLogOffset(*physical_offset))
            .unwrap();
        assert_eq!(record.body.as_ref(), expected.as_slice());
        assert_eq!(record.queue_offset, QueueOffset(*queue_offset));
        let got = store
            .get(
                TOPIC,
                *writer,
                QueueOffset(*queue_offset),
                1,
                u64::MAX,
                &|_| true,
            )
            .unwrap();
        assert_eq!(got.status, GetStatus::Found);
        assert_eq!(got.messages[0].len() as u32, record_size(&got.messages[0]));
    }
    for writer in 0..WRITERS {
        let acked = acks.iter().filter(|a| a.0 == writer).count() as u64;
        assert!(store.max_offset(TOPIC, writer).0 >= acked);
    }
}

fn record_size(record: &[u8]) -> u32 {
    u32::from_be_bytes(record[..4].try_into().unwrap())
}
