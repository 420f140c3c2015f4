//! Test fixtures: a member of the group {0, 1, 2} acting on a given state, and a master's
//! store with some segments written.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use quiver_store::{MessageStore, NewMessage, StoreConfig};

use super::{Replication, Role};
use crate::config::BrokerConfig;

/// The topic the fixture store's messages go to (queue 0).
const TOPIC: &str = "T";

/// Member 0 of the group {0, 1, 2} configured by `config` (its members set here), whose
/// agreed state is epoch 1 with member 0 the master and `in_sync` in sync; `acts` makes it
/// act as that master.
pub(super) fn member_0(config: BrokerConfig, in_sync: &[u64], acts: bool) -> Arc<Replication> {
    let config = BrokerConfig {
        group_members: vec!["0=h:0".into(), "1=h:1".into(), "2=h:2".into()],
        ..config
    };
    let replication = Replication::new(&config).unwrap().unwrap();
    replication
        .state
        .send_replace(quiver_consensus::GroupState {
            epoch: 1,
            master: Some(0),
            in_sync: in_sync.iter().copied().collect::<BTreeSet<u64>>(),
            ..Default::default()
        });
    if acts {
        replication.role.send_replace(Role::Master { epoch: 1 });
    }
    replication
}

/// A store of the smallest segments in `dir`, with 4 KiB messages written until it holds
/// `segments` of them.
pub(super) fn store_of(dir: &Path, segments: u64) -> MessageStore {
    let store = MessageStore::open(StoreConfig {
        data_dir: dir.to_path_buf(),
        segment_size_bytes: quiver_store::MIN_SEGMENT_SIZE_BYTES,
        max_message_size_bytes: 16 * 1024,
        // The machine's own disk usage must not refuse writes here.
        disk_high_water_ratio: 1.0,
        disk_clean_ratio: 1.0,
        disk_force_clean_ratio: 1.0,
        publish_on_confirm: true,
        ..StoreConfig::default()
    })
    .unwrap();
    let body = vec![1u8; 4096];
    while store.log_end().0 < segments * store.segment_size() {
        let message = NewMessage {
            topic: TOPIC,
            queue_id: 0,
            flag: 0,
            body: &body,
            properties: "",
            sys_flag: 0,
            born_timestamp_ms: 1,
            born_host: "10.0.0.1:1".parse().unwrap(),
            store_host: "10.0.0.2:2".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        store.put(&message, 1).unwrap();
    }
    store
}
