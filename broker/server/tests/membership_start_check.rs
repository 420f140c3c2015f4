//! A group member refuses to start when its `--group-members` is not the membership its
//! consensus directory stores, naming both lists; an empty directory takes its flags.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::test_config;
use quiver_broker::replication::Replication;
use quiver_consensus::{BoxFuture, Consensus, ConsensusConfig, Transport, TransportError};

/// A transport for a group of one: nobody else to reach.
struct Alone;

impl Transport for Alone {
    fn call(
        &self,
        target: u64,
        _address: &str,
        _kind: &str,
        _body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>> {
        Box::pin(async move { Err(TransportError(format!("no member {target} here"))) })
    }
}

const STORED: &str = "0=127.0.0.1:10911";
const FLAGS: &str = "0=127.0.0.1:10911,1=127.0.0.1:10921";

/// Leaves a consensus directory under `data_dir` whose membership is member 0 alone.
fn store_a_membership_of_one(data_dir: &Path) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let dir = data_dir.join("consensus");
        let members = BTreeMap::from([(0, "127.0.0.1:10911".to_owned())]);
        let consensus = Consensus::start(ConsensusConfig::new(0, members, &dir), Arc::new(Alone))
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(30), async {
            while quiver_consensus::stored_members(&dir).unwrap().is_none() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the group of one is created");
        consensus.shutdown().await;
    });
}

fn group_config(data_dir: &Path, members: &str) -> quiver_broker::BrokerConfig {
    let mut config = test_config(data_dir);
    config.broker_name = "group-a".into();
    config.group_members = members.split(',').map(str::to_owned).collect();
    config.replica_id = 0;
    config
}

#[test]
fn other_group_members_than_the_stored_membership_are_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    store_a_membership_of_one(dir.path());
    let refused = Replication::new(&group_config(dir.path(), FLAGS));
    let error = match refused {
        Err(error) => error.to_string(),
        Ok(_) => panic!("started with other members than stored"),
    };
    assert!(
        error.contains(&format!("--group-members {FLAGS} does not match")),
        "{error}"
    );
    assert!(
        error.contains(&format!("start this member with --group-members {STORED}")),
        "{error}"
    );
    assert!(error.contains("quiver replication members"), "{error}");
    let same = Replication::new(&group_config(dir.path(), STORED)).unwrap();
    assert!(same.is_some());
}

#[test]
fn an_empty_consensus_directory_takes_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Replication::new(&group_config(dir.path(), FLAGS))
        .unwrap()
        .is_some());
}

#[test]
fn the_binary_exits_non_zero_with_both_lists() {
    let dir = tempfile::tempdir().unwrap();
    store_a_membership_of_one(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .env("QUIVER_DATA_DIR", dir.path())
        .env("QUIVER_GRPC_LISTEN", "off")
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .args(["--broker-name", "group-a", "--replica-id", "0"])
        .args(["--group-members", FLAGS])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(FLAGS) && stderr.contains(&format!("--group-members {STORED}")),
        "{stderr}"
    );
}
