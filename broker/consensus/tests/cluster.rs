//! Three real openraft members in one process, over an in-memory Transport
//! that can "kill" a member (calls to it fail and it is shut down and dropped)
//! and restart it from its directory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quiver_consensus::{
    BoxFuture, Command, CommandOutcome, Consensus, ConsensusConfig, ConsensusError, GroupState,
    Phase, Transport, TransportError,
};

const WAIT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT_MS: u64 = 1500;

#[derive(Default)]
struct MemNet {
    nodes: Mutex<HashMap<u64, Arc<Consensus>>>,
    /// Messages delivered, by kind.
    delivered: Mutex<HashMap<String, u64>>,
}

impl Transport for MemNet {
    fn call(
        &self,
        target: u64,
        address: &str,
        kind: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>> {
        assert_eq!(address, format!("mem-{target}"));
        let node = self.nodes.lock().unwrap().get(&target).cloned();
        let kind = kind.to_string();
        let delivered = node.is_some();
        if delivered {
            *self
                .delivered
                .lock()
                .unwrap()
                .entry(kind.clone())
                .or_default() += 1;
        }
        Box::pin(async move {
            let node = node.ok_or_else(|| TransportError(format!("member {target} is down")))?;
            node.handle(&kind, &body)
                .await
                .map_err(|e| TransportError(e.to_string()))
        })
    }
}

struct Cluster {
    net: Arc<MemNet>,
    dirs: BTreeMap<u64, tempfile::TempDir>,
    configure: fn(&mut ConsensusConfig),
}

fn fast(c: &mut ConsensusConfig) {
    c.heartbeat_ms = 50;
    c.election_timeout_min_ms = 200;
    c.election_timeout_max_ms = 400;
    c.request_timeout_ms = REQUEST_TIMEOUT_MS;
}

impl Cluster {
    async fn start(n: u64, configure: fn(&mut ConsensusConfig)) -> Cluster {
        let cluster = Cluster {
            net: Arc::default(),
            dirs: (1..=n)
                .map(|id| (id, tempfile::tempdir().unwrap()))
                .collect(),
            configure,
        };
        for id in 1..=n {
            cluster.start_member(id).await;
        }
        cluster.joined().await;
        cluster
    }

    /// Waits until every live member is a Raft node of the group (a member that
    /// started after the group was created rejoins it as a learner first).
    async fn joined(&self) {
        within(WAIT, async {
            while !self
                .live()
                .iter()
                .all(|id| self.node(*id).status().phase == Phase::Member)
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    fn config(&self, id: u64) -> ConsensusConfig {
        let members = self
            .dirs
            .keys()
            .map(|id| (*id, format!("mem-{id}")))
            .collect();
        let mut c = ConsensusConfig::new(id, members, self.dirs[&id].path());
        (self.configure)(&mut c);
        c
    }

    async fn start_member(&self, id: u64) -> Arc<Consensus> {
        let node = Arc::new(
            Consensus::start(self.config(id), self.net.clone())
                .await
                .unwrap(),
        );
        self.net.nodes.lock().unwrap().insert(id, node.clone());
        node
    }

    async fn kill(&self, id: u64) {
        let node = self.net.nodes.lock().unwrap().remove(&id).unwrap();
        node.shutdown().await;
    }

    fn node(&self, id: u64) -> Arc<Consensus> {
        self.net.nodes.lock().unwrap()[&id].clone()
    }

    fn live(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.net.nodes.lock().unwrap().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Waits until every live member knows the same leader, which is live and
    /// knows it leads.
    async fn leader(&self) -> u64 {
        within(WAIT, async {
            loop {
                let live = self.live();
                let leaders: BTreeSet<Option<u64>> =
                    live.iter().map(|id| self.node(*id).leader()).collect();
                if let [Some(l)] = leaders.iter().copied().collect::<Vec<_>>()[..] {
                    if live.contains(&l) && self.node(l).is_leader() {
                        return l;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    /// Waits until every live member has applied `want`.
    async fn converge(&self, want: &GroupState) {
        for id in self.live() {
            let mut rx = self.node(id).state();
            within(WAIT, rx.wait_for(|s| s == want)).await.unwrap();
        }
    }

    fn delivered(&self, kind: &str) -> u64 {
        self.net
            .delivered
            .lock()
            .unwrap()
            .get(kind)
            .copied()
            .unwrap_or(0)
    }

    async fn shutdown(&self) {
        for id in self.live() {
            self.kill(id).await;
        }
    }
}

async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .expect("timed out waiting")
}

fn set(ids: &[u64]) -> BTreeSet<u64> {
    ids.iter().copied().collect()
}

/// An election; the tests' third argument (an offset) only tells proposals apart in logs.
/// Conditioned on the in-sync version of a group whose every change so far was an
/// election (each bumps it).
fn elect(epoch: u64, master: u64, _label: u64, in_sync: &[u64]) -> Command {
    Command::ElectMaster {
        epoch,
        master,
        in_sync: set(in_sync),
        in_sync_version: epoch - 1,
        incarnations: Default::default(),
    }
}

/// An in-sync change conditioned on `in_sync_version`.
fn alter(epoch: u64, master: u64, in_sync: &[u64], in_sync_version: u64) -> Command {
    Command::AlterInSync {
        epoch,
        master,
        in_sync: set(in_sync),
        in_sync_version,
        incarnations: Default::default(),
    }
}

fn applied(outcome: CommandOutcome) -> GroupState {
    match outcome {
        CommandOutcome::Applied(s) => s,
        CommandOutcome::Rejected(s) => panic!("rejected; current state {s:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follower_proposal_applies_everywhere_and_stale_epochs_are_rejected() {
    let c = Cluster::start(3, fast).await;
    let leader = c.leader().await;
    let follower = c.live().into_iter().find(|id| *id != leader).unwrap();
    assert!(!c.node(follower).is_leader());

    let state = applied(
        c.node(follower)
            .propose(elect(1, follower, 0, &[1, 2, 3]))
            .await
            .unwrap(),
    );
    assert_eq!(state.epoch, 1);
    assert_eq!(state.master, Some(follower));
    assert_eq!(state.in_sync, set(&[1, 2, 3]));
    assert_eq!(state.history.len(), 1);
    c.converge(&state).await;

    // Stale: epoch 1 again, from the leader and from a follower.
    for from in [leader, follower] {
        let out = c
            .node(from)
            .propose(elect(1, leader, 99, &[leader]))
            .await
            .unwrap();
        assert_eq!(out, CommandOutcome::Rejected(state.clone()));
    }
    // An in-sync change of the wrong master is rejected; of the right one, applied.
    let wrong = alter(1, leader, &[leader], 1);
    if leader != follower {
        assert!(!c.node(leader).propose(wrong).await.unwrap().is_applied());
    }
    let shrunk = applied(
        c.node(leader)
            .propose(alter(1, follower, &[follower, leader], 1))
            .await
            .unwrap(),
    );
    c.converge(&shrunk).await;

    // Linearizable reads: the leader's, not a follower's.
    assert_eq!(c.node(leader).ensure_current().await.unwrap(), shrunk);
    match c.node(follower).ensure_current().await {
        Err(ConsensusError::NotLeader { leader: l }) => assert_eq!(l, Some(leader)),
        other => panic!("a follower's read: {other:?}"),
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_and_two_of_three_make_progress() {
    let c = Cluster::start(3, fast).await;
    let old = c.leader().await;
    let s1 = applied(
        c.node(old)
            .propose(elect(1, old, 0, &[1, 2, 3]))
            .await
            .unwrap(),
    );
    c.converge(&s1).await;

    c.kill(old).await;
    let new = c.leader().await;
    assert_ne!(new, old);
    let other = c.live().into_iter().find(|id| *id != new).unwrap();
    // From the follower (forwarded) and from the leader.
    let s2 = applied(
        c.node(other)
            .propose(elect(2, new, 1000, &[new, other]))
            .await
            .unwrap(),
    );
    c.converge(&s2).await;
    let s3 = applied(c.node(new).propose(alter(2, new, &[new], 2)).await.unwrap());
    c.converge(&s3).await;
    assert_eq!(s3.history.len(), 2);
    // Nobody can truncate against epoch 2 until its master agrees where it starts.
    assert_eq!(s3.truncation_point(1, 5000), None);
    let s4 = applied(
        c.node(other)
            .propose(Command::StartEpoch {
                epoch: 2,
                master: new,
                start_offset: 1000,
            })
            .await
            .unwrap(),
    );
    c.converge(&s4).await;
    assert_eq!(s4.truncation_point(1, 5000), Some(1000));
    c.shutdown().await;
}

/// Elections only after a second of silence, so none starts by itself while a test
/// counts vote requests (the leader lease, `election_timeout_max_ms`, is 1.5 s).
fn steady(c: &mut ConsensusConfig) {
    fast(c);
    c.election_timeout_min_ms = 1000;
    c.election_timeout_max_ms = 1500;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_a_caught_up_voter_that_the_leader_asks_to_campaign() {
    let c = Cluster::start(3, steady).await;
    let old = c.leader().await;
    let s1 = applied(
        c.node(old)
            .propose(elect(1, old, 0, &[1, 2, 3]))
            .await
            .unwrap(),
    );
    c.converge(&s1).await;
    let target = c.live().into_iter().find(|id| *id != old).unwrap();
    let third = c
        .live()
        .into_iter()
        .find(|id| ![old, target].contains(id))
        .unwrap();

    // Refused off the leader (naming it) and for a member the group does not have.
    match c.node(target).transfer_leadership(third, WAIT).await {
        Err(ConsensusError::NotLeader { leader }) => assert_eq!(leader, Some(old)),
        other => panic!("a transfer asked of a follower: {other:?}"),
    }
    match c.node(old).transfer_leadership(9, WAIT).await {
        Err(ConsensusError::Transfer(why)) => assert!(why.contains("not a voter"), "{why}"),
        other => panic!("a transfer to a non-member: {other:?}"),
    }
    assert_eq!(
        c.node(old).transfer_leadership(old, WAIT).await.unwrap(),
        old
    );

    let votes = c.delivered("vote");
    let leader = c.node(old).transfer_leadership(target, WAIT).await.unwrap();
    assert_eq!(leader, target);
    assert_eq!(c.leader().await, target);
    // The target won its first campaign: two vote requests, the old leader's vote granted
    // (its own lease on its vote had passed) while the third member still held its lease.
    assert_eq!(c.delivered("vote") - votes, 2);

    // The group goes on committing: from the old leader (forwarded) and from the new one.
    let s2 = applied(
        c.node(old)
            .propose(elect(2, target, 0, &[1, 2, 3]))
            .await
            .unwrap(),
    );
    c.converge(&s2).await;
    let s3 = applied(
        c.node(target)
            .propose(alter(2, target, &[target, third], 2))
            .await
            .unwrap(),
    );
    c.converge(&s3).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_transfer_is_refused_in_a_group_of_more_than_three_voters() {
    let c = Cluster::start(4, steady).await;
    let leader = c.leader().await;
    let target = c.live().into_iter().find(|id| *id != leader).unwrap();
    match c.node(leader).transfer_leadership(target, WAIT).await {
        Err(ConsensusError::Transfer(why)) => assert!(why.contains("at most 3"), "{why}"),
        other => panic!("a transfer in a group of four: {other:?}"),
    }
    assert_eq!(c.leader().await, leader);
    c.shutdown().await;
}

/// Snapshots after every 2 entries and keeps no log behind them, so the
/// returning member must catch up from a snapshot, not the log.
fn compacting(c: &mut ConsensusConfig) {
    fast(c);
    c.snapshot_after_logs = 2;
    c.logs_to_keep = 0;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_recovers_its_state_and_catches_up() {
    for (configure, compacted) in [
        (fast as fn(&mut ConsensusConfig), false),
        (compacting, true),
    ] {
        let c = Cluster::start(3, configure).await;
        let leader = c.leader().await;
        let s1 = applied(
            c.node(leader)
                .propose(elect(1, leader, 0, &[1, 2, 3]))
                .await
                .unwrap(),
        );
        c.converge(&s1).await;

        let gone = c.live().into_iter().find(|id| *id != leader).unwrap();
        c.kill(gone).await;
        let mut last = s1.clone();
        for epoch in 2..=5 {
            let master = c.live()[(epoch as usize) % 2];
            last = applied(
                c.node(leader)
                    .propose(elect(epoch, master, epoch * 100, &c.live()))
                    .await
                    .unwrap(),
            );
        }
        c.converge(&last).await;

        let snapshots_before = c.delivered("snapshot");
        let back = c.start_member(gone).await;
        // Its applied state came back from its directory (or it has already caught up).
        let recovered = back.state().borrow().clone();
        assert!(recovered.epoch >= 1, "{recovered:?}");
        assert_eq!(recovered.history[0], s1.history[0]);
        c.converge(&last).await;

        // And it takes part: a proposal from it is applied everywhere.
        let next = applied(
            back.propose(alter(5, last.master.unwrap(), &[1, 2, 3], 5))
                .await
                .unwrap(),
        );
        c.converge(&next).await;
        // Epoch 2's start was never agreed here (no StartEpoch): nothing to truncate against.
        assert_eq!(next.truncation_point(1, 10_000), None);
        // With compaction it caught up from a snapshot (the log was purged);
        // without, from the log.
        assert_eq!(c.delivered("snapshot") > snapshots_before, compacted);
        assert!(c.dirs[&gone].path().join("sm.json").exists());
        assert_eq!(
            c.dirs[&gone].path().join("snapshot.json").exists(),
            compacted
        );
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_group_restarts_from_its_directories() {
    let c = Cluster::start(3, fast).await;
    let leader = c.leader().await;
    let s1 = applied(
        c.node(leader)
            .propose(elect(1, leader, 7, &[1, 2, 3]))
            .await
            .unwrap(),
    );
    c.converge(&s1).await;
    c.shutdown().await;

    for id in 1..=3 {
        let node = c.start_member(id).await;
        assert_eq!(*node.state().borrow(), s1);
    }
    let leader = c.leader().await;
    let s2 = applied(
        c.node(leader)
            .propose(elect(2, leader, 70, &[leader]))
            .await
            .unwrap(),
    );
    c.converge(&s2).await;
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_proposals_time_out_and_nothing_changes() {
    let c = Cluster::start(3, fast).await;
    let leader = c.leader().await;
    let s1 = applied(
        c.node(leader)
            .propose(elect(1, leader, 0, &[1, 2, 3]))
            .await
            .unwrap(),
    );
    c.converge(&s1).await;

    // Leave one member: first a follower alone (no leader at all), then the old
    // leader alone (it may still believe it leads, but cannot commit).
    for survivor in [
        c.live().into_iter().find(|id| *id != leader).unwrap(),
        leader,
    ] {
        for id in c.live() {
            if id != survivor {
                c.kill(id).await;
            }
        }
        let node = c.node(survivor);
        let started = tokio::time::Instant::now();
        let result = within(
            Duration::from_millis(REQUEST_TIMEOUT_MS) * 3,
            node.propose(elect(2, survivor, 50, &[survivor])),
        )
        .await;
        assert!(
            matches!(result, Err(ConsensusError::Timeout(_))),
            "{result:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(REQUEST_TIMEOUT_MS) / 2);
        assert!(node.ensure_current().await.is_err());
        assert_eq!(*node.state().borrow(), s1);
        c.kill(survivor).await;
        if survivor == leader {
            break;
        }
        // Back to three from the directories for the next round.
        for id in 1..=3 {
            c.start_member(id).await;
        }
        let l = c.leader().await;
        assert_eq!(c.node(l).ensure_current().await.unwrap(), s1);
    }
    c.shutdown().await;
}

#[tokio::test]
async fn a_member_must_be_in_its_own_membership() {
    let dir = tempfile::tempdir().unwrap();
    let config = ConsensusConfig::new(4, BTreeMap::from([(1, "mem-1".to_string())]), dir.path());
    let net: Arc<MemNet> = Arc::default();
    assert!(matches!(
        Consensus::start(config, net).await,
        Err(ConsensusError::Config(_))
    ));
}
