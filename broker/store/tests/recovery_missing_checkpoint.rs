//! A missing checkpoint (and a lost queue directory): recovery scans the whole CommitLog
//! and rebuilds every ConsumeQueue from it.

mod common;

use common::{assert_readable, config, put_many};
use quiver_store::{CommitLogOffset, MessageStore, QueueOffset};

const TOPIC: &str = "NoCheckpointTopic";
const QUEUES: u32 = 3;
const COUNT: u64 = 900;

#[test]
fn missing_checkpoint_scans_everything() {
    let dir = tempfile::tempdir().unwrap();
    let puts = {
        let store = MessageStore::open(config(dir.path())).unwrap();
        let puts = put_many(&store, TOPIC, QUEUES, COUNT);
        store.shutdown().unwrap();
        puts
    };
    std::fs::remove_file(dir.path().join("checkpoint")).unwrap();
    std::fs::remove_file(dir.path().join("checkpoint.bak")).unwrap();
    std::fs::remove_dir_all(dir.path().join("consumequeue").join(TOPIC).join("1")).unwrap();

    let store = MessageStore::open(config(dir.path())).unwrap();
    let report = store.recovery_report();
    assert!(!report.checkpoint_found);
    assert!(!report.clean_shutdown);
    assert_eq!(report.scanned_from, CommitLogOffset(0));
    assert_eq!(report.records_scanned, COUNT, "{report}");
    assert_eq!(
        report.redispatched_units,
        COUNT / u64::from(QUEUES),
        "only queue 1 was lost: {report}"
    );
    assert_eq!(report.truncated_at, None);
    for queue_id in 0..QUEUES {
        assert_eq!(
            store.max_offset(TOPIC, queue_id),
            QueueOffset(COUNT / u64::from(QUEUES))
        );
    }
    for (n, put) in &puts {
        assert_readable(&store, TOPIC, (*n % u64::from(QUEUES)) as u32, *n, put);
    }
    let next = put_many(&store, TOPIC, QUEUES, 1);
    assert_eq!(
        next[0].1.queue_offset,
        QueueOffset(COUNT / u64::from(QUEUES))
    );
}
