//! Random damage anywhere in the CommitLog or ConsumeQueue files: opening never panics, and
//! whatever is served afterwards is whole records whose body CRC matches.

mod common;

use common::{config, put_many};
use proptest::prelude::*;
use quiver_store::record;
use quiver_store::{MessageStore, QueueOffset};

const TOPIC: &str = "DamageTopic";
const QUEUES: u32 = 3;

fn data_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.join("commitlog"), dir.join("consumequeue")];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn random_damage_never_panics_or_serves_garbage(
        damage in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>()), 1..6),
        clean in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = MessageStore::open(config(dir.path())).unwrap();
            put_many(&store, TOPIC, QUEUES, 300);
            if clean {
                store.shutdown().unwrap();
            }
        }
        let files = data_files(dir.path());
        for (file, at, byte) in &damage {
            let path = file.get(&files);
            let mut bytes = std::fs::read(path).unwrap();
            // Damage the written part of a file (its first 64 KiB) where there is data.
            let written = bytes.len().min(64 * 1024);
            let at = at.index(written);
            bytes[at] ^= byte | 1;
            std::fs::write(path, bytes).unwrap();
        }
        let store = match MessageStore::open(config(dir.path())) {
            Ok(store) => store,
            // A typed error (e.g. a malformed file) is acceptable; a panic is not.
            Err(_) => return Ok(()),
        };
        for queue_id in 0..QUEUES {
            let mut offset = store.min_offset(TOPIC, queue_id);
            let max = store.max_offset(TOPIC, queue_id);
            let mut pulls = 0;
            while offset < max && pulls < 1_000 {
                let got = store.get(TOPIC, queue_id, offset, 32, u64::MAX, &|_| true).unwrap();
                for message in &got.messages {
                    // Flips in unchecksummed header fields (e.g. a topic byte) can survive;
                    // what is guaranteed is a whole record with a matching body CRC.
                    let (_, used) = record::decode(message).unwrap();
                    prop_assert_eq!(used, message.len());
                }
                prop_assert!(got.next_begin_offset > offset || got.messages.is_empty());
                if got.next_begin_offset <= offset {
                    break;
                }
                offset = got.next_begin_offset;
                pulls += 1;
            }
            let _ = store.search_offset_by_timestamp(TOPIC, queue_id, 1_100).unwrap();
            let _ = store.store_timestamp(TOPIC, queue_id, QueueOffset(0)).unwrap();
        }
    }
}
