//! Membership changes over an in-memory transport: a fourth member added (it asks to
//! join, the leader catches it up as a learner and makes it a voter) and removed again,
//! the refusals, and a restart with other members than the directory stores.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver_consensus::{
    stored_members, BoxFuture, Command, Consensus, ConsensusConfig, ConsensusError, GroupState,
    Phase, Transport, TransportError,
};

const WAIT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct MemNet {
    nodes: Mutex<HashMap<u64, Arc<Consensus>>>,
}

impl Transport for MemNet {
    fn call(
        &self,
        target: u64,
        address: &str,
        kind: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>> {
        assert_eq!(address, address_of(target), "the agreed address");
        let node = self.nodes.lock().unwrap().get(&target).cloned();
        let kind = kind.to_string();
        Box::pin(async move {
            let node = node.ok_or_else(|| TransportError(format!("member {target} is down")))?;
            node.handle(&kind, &body)
                .await
                .map_err(|e| TransportError(e.to_string()))
        })
    }
}

fn address_of(id: u64) -> String {
    format!("mem-{id}")
}

fn members(ids: &[u64]) -> BTreeMap<u64, String> {
    ids.iter().map(|id| (*id, address_of(*id))).collect()
}

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f).await.expect("in time")
}

struct Group {
    net: Arc<MemNet>,
    dirs: BTreeMap<u64, tempfile::TempDir>,
}

impl Group {
    async fn start(ids: &[u64]) -> Group {
        let group = Group {
            net: Arc::default(),
            dirs: BTreeMap::new(),
        };
        let mut group = group;
        for id in ids {
            group.dirs.insert(*id, tempfile::tempdir().unwrap());
        }
        for id in ids {
            group.start_member(*id, ids).await.unwrap();
        }
        group
    }

    fn config(&self, id: u64, listed: &[u64]) -> ConsensusConfig {
        let mut c = ConsensusConfig::new(id, members(listed), self.dirs[&id].path());
        c.heartbeat_ms = 50;
        c.election_timeout_min_ms = 200;
        c.election_timeout_max_ms = 400;
        c.request_timeout_ms = 1500;
        c
    }

    async fn start_member(&self, id: u64, listed: &[u64]) -> Result<(), ConsensusError> {
        let node = Arc::new(Consensus::start(self.config(id, listed), self.net.clone()).await?);
        self.net.nodes.lock().unwrap().insert(id, node);
        Ok(())
    }

    fn node(&self, id: u64) -> Arc<Consensus> {
        self.net.nodes.lock().unwrap()[&id].clone()
    }

    async fn stop(&self, id: u64) {
        let node = self.net.nodes.lock().unwrap().remove(&id).unwrap();
        node.shutdown().await;
    }

    async fn leader(&self) -> u64 {
        within(async {
            loop {
                let live: Vec<u64> = self.net.nodes.lock().unwrap().keys().copied().collect();
                if let Some(l) = live.iter().find(|id| self.node(**id).is_leader()) {
                    return *l;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    /// Waits until member `id` knows `want` as the group's members.
    async fn knows(&self, id: u64, want: &BTreeMap<u64, String>) {
        let mut watch = self.node(id).members();
        within(watch.wait_for(|m| m == want)).await.unwrap();
    }

    async fn shutdown(&self) {
        let live: Vec<u64> = self.net.nodes.lock().unwrap().keys().copied().collect();
        for id in live {
            self.stop(id).await;
        }
    }
}

fn first_election(state: &GroupState, master: u64, in_sync: &[u64]) -> Command {
    state.elect(master, in_sync.iter().copied().collect(), &BTreeMap::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fourth_member_is_added_as_a_learner_made_a_voter_and_removed_again() {
    let group = Group::start(&[0, 1, 2]).await;
    let leader = group.leader().await;
    // Started with the four members and an empty directory: it asks to join and is
    // refused until the membership admits it.
    let mut group = group;
    group.dirs.insert(3, tempfile::tempdir().unwrap());
    group.start_member(3, &[0, 1, 2, 3]).await.unwrap();
    let added = within(group.node(leader).add_member(3, &address_of(3), WAIT))
        .await
        .unwrap();
    assert_eq!(added, members(&[0, 1, 2, 3]));
    for id in [0, 1, 2, 3] {
        group.knows(id, &members(&[0, 1, 2, 3])).await;
    }
    // It learns it is a voter at its next look.
    within(async {
        while group.node(3).status().phase != Phase::Member {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(group.node(3).status().voters.len(), 4);
    // It takes part: a proposal through it commits, and it applies it.
    let state = group.node(3).state().borrow().clone();
    let outcome = within(group.node(3).propose(first_election(&state, 0, &[0, 1])))
        .await
        .unwrap();
    assert!(outcome.is_applied(), "{outcome:?}");
    let mut applied = group.node(3).state();
    within(applied.wait_for(|s| s.epoch == 1)).await.unwrap();
    // Adding it again is answered with the membership.
    let again = group.node(leader).add_member(3, &address_of(3), WAIT).await;
    assert_eq!(again.unwrap(), members(&[0, 1, 2, 3]));

    let leader = group.leader().await;
    let removed = within(group.node(leader).remove_member(3, WAIT))
        .await
        .unwrap();
    assert_eq!(removed, members(&[0, 1, 2]));
    for id in [0, 1, 2] {
        group.knows(id, &members(&[0, 1, 2])).await;
    }
    group.stop(3).await;
    // The three go on without it.
    let leader = group.leader().await;
    let state = group.node(leader).state().borrow().clone();
    let next = first_election(&state, 1, &[1]);
    assert!(within(group.node(leader).propose(next))
        .await
        .unwrap()
        .is_applied());
    group.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn membership_changes_are_refused_off_the_leader_and_when_they_cannot_hold() {
    let group = Group::start(&[0, 1, 2]).await;
    let leader = group.leader().await;
    let follower = (0..3).find(|id| *id != leader).unwrap();
    within(async {
        while group.node(follower).leader() != Some(leader) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    match group.node(follower).remove_member(2, WAIT).await {
        Err(ConsensusError::NotLeader { leader: named }) => assert_eq!(named, Some(leader)),
        other => panic!("expected NotLeader, got {other:?}"),
    }
    match group.node(leader).remove_member(7, WAIT).await {
        Err(ConsensusError::Membership(why)) => assert!(why.contains("not a member"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    match group.node(leader).add_member(1, "elsewhere:1", WAIT).await {
        Err(ConsensusError::Membership(why)) => assert!(why.contains("already a member"), "{why}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // A member that never starts never joins: the add says what to do.
    match group
        .node(leader)
        .add_member(5, &address_of(5), Duration::from_millis(500))
        .await
    {
        Err(ConsensusError::Membership(why)) => {
            assert!(why.contains("did not join"), "{why}")
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(*group.node(leader).members().borrow(), members(&[0, 1, 2]));
    group.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_with_other_members_than_the_directory_stores_is_refused() {
    let group = Group::start(&[0, 1, 2]).await;
    group.leader().await;
    group.stop(2).await;
    let dir: &Path = group.dirs[&2].path();
    assert_eq!(stored_members(dir).unwrap(), Some(members(&[0, 1, 2])));
    match group.start_member(2, &[0, 1, 2, 5]).await {
        Err(ConsensusError::MembersMismatch {
            configured, stored, ..
        }) => {
            assert_eq!(configured, members(&[0, 1, 2, 5]));
            assert_eq!(stored, members(&[0, 1, 2]));
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
    group.start_member(2, &[0, 1, 2]).await.unwrap();
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(stored_members(empty.path()).unwrap(), None);
    group.shutdown().await;
}
