//! A torn tail: the last record cut at every byte. Recovery keeps everything before it,
//! serves nothing of it, and the next append takes its place.

mod common;

use common::{assert_gone, assert_readable, config, put_many, write_log_bytes};
use quiver_store::{CommitLogOffset, MessageStore, QueueOffset};

const TOPIC: &str = "CutTopic";
const COUNT: u64 = 6;

#[test]
fn tail_cut_at_every_byte_of_the_last_record() {
    let probe_dir = tempfile::tempdir().unwrap();
    let last_size = {
        let store = MessageStore::open(config(probe_dir.path())).unwrap();
        put_many(&store, TOPIC, 2, COUNT).last().unwrap().1.size
    };
    for cut in 0..last_size {
        let dir = tempfile::tempdir().unwrap();
        let puts = {
            let store = MessageStore::open(config(dir.path())).unwrap();
            let puts = put_many(&store, TOPIC, 2, COUNT);
            store.shutdown().unwrap();
            puts
        };
        let (_, last) = puts.last().unwrap();
        assert_eq!(last.size, last_size);
        let lost = (last.size - cut) as usize;
        write_log_bytes(
            dir.path(),
            CommitLogOffset(last.physical_offset.0 + u64::from(cut)),
            &vec![0u8; lost],
        );

        let store = MessageStore::open(config(dir.path())).unwrap();
        let report = store.recovery_report();
        assert_eq!(
            report.log_end, last.physical_offset,
            "cut at {cut}: {report}"
        );
        assert_eq!(
            report.truncated_at,
            Some(last.physical_offset),
            "cut at {cut}: {report}"
        );
        for (n, put) in &puts[..puts.len() - 1] {
            assert_readable(&store, TOPIC, (*n % 2) as u32, *n, put);
        }
        let last_queue = ((COUNT - 1) % 2) as u32;
        assert_gone(&store, TOPIC, last_queue, last);
        assert_eq!(
            store.max_offset(TOPIC, last_queue),
            last.queue_offset,
            "cut at {cut}"
        );
        assert_eq!(
            store.max_offset(TOPIC, 1 - last_queue),
            QueueOffset(COUNT / 2)
        );

        let again = put_many(&store, TOPIC, 2, COUNT);
        let (_, replacement) = &again[(COUNT - 1) as usize];
        assert_eq!(
            again[0].1.physical_offset, last.physical_offset,
            "appends resume at the cut"
        );
        // The cut message's queue offset is reused by the first new message of its queue.
        assert_eq!(
            replacement.queue_offset.0,
            last.queue_offset.0 + COUNT / 2 - 1
        );
    }
}
