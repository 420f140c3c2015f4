//! A crash with ConsumeQueues behind the CommitLog: the units that never reached the disk
//! are re-dispatched from the CommitLog.

mod common;

use common::{assert_readable, config, put_many};
use quiver_store::{FlushMode, MessageStore, QueueOffset};

const TOPIC: &str = "BehindTopic";
const QUEUES: u32 = 4;
const COUNT: u64 = 200;
const LOST_UNITS_PER_QUEUE: u64 = 20;

#[test]
fn consume_queues_behind_the_commit_log_are_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.flush_mode = FlushMode::Sync;
    // The flusher never gets to checkpoint the queues before the "crash".
    cfg.flush_interval_ms = 3_600_000;
    let puts = {
        let store = MessageStore::open(cfg.clone()).unwrap();
        let puts = put_many(&store, TOPIC, QUEUES, COUNT);
        drop(store); // no shutdown: a crash
        puts
    };
    // The last units of every queue never reached the disk: zero them in the files.
    let per_queue = COUNT / u64::from(QUEUES);
    for queue_id in 0..QUEUES {
        let queue_dir = dir
            .path()
            .join("consumequeue")
            .join(TOPIC)
            .join(queue_id.to_string());
        for unit in per_queue - LOST_UNITS_PER_QUEUE..per_queue {
            let units_per_file = cfg.consume_queue_units_per_file;
            let file = queue_dir.join(format!(
                "{:020}",
                (unit / units_per_file) * units_per_file * 20
            ));
            let mut bytes = std::fs::read(&file).unwrap();
            let at = ((unit % units_per_file) * 20) as usize;
            bytes[at..at + 20].fill(0);
            std::fs::write(&file, bytes).unwrap();
        }
    }

    let store = MessageStore::open(cfg).unwrap();
    let report = store.recovery_report();
    assert!(!report.clean_shutdown);
    assert_eq!(
        report.redispatched_units,
        LOST_UNITS_PER_QUEUE * u64::from(QUEUES),
        "{report}"
    );
    assert_eq!(report.queue_holes, 0);
    for queue_id in 0..QUEUES {
        assert_eq!(store.max_offset(TOPIC, queue_id), QueueOffset(per_queue));
    }
    for (n, put) in &puts {
        assert_readable(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, *n, put);
    }
}
