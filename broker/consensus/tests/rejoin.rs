//! Members that lose their consensus directory, and brand-new groups: real openraft
//! members in one process over an in-memory Transport that can stop a member (calls
//! to it fail), wipe its directory and start it again.
//!
//! Every wait is bounded ([`WAIT`]); the deadlines only bound failures.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use quiver_consensus::{
    incarnation_of, member_of, node_id, BoxFuture, Command, Consensus, ConsensusConfig,
    ConsensusError, GroupState, Phase, Transport, TransportError,
};

const WAIT: Duration = Duration::from_secs(20);
const REQUEST_TIMEOUT_MS: u64 = 1500;

/// Set by the panic hook when openraft's code panics (e.g. its leader's
/// "follower log reverted" assertion, in these debug builds).
static OPENRAFT_PANICKED: AtomicBool = AtomicBool::new(false);
/// Everything logged by the tests of this binary.
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn setup() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info
                .location()
                .is_some_and(|l| l.file().contains("openraft"))
            {
                OPENRAFT_PANICKED.store(true, Ordering::SeqCst);
            }
            previous(info);
        }));
        tracing_subscriber::fmt()
            .with_env_filter("quiver_consensus=info")
            .with_ansi(false)
            .with_writer(|| LogWriter)
            .init();
    });
}

fn log_lines(containing: &[&str]) -> Vec<String> {
    let logs = LOGS.lock().unwrap();
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| containing.iter().all(|c| l.contains(c)))
        .map(str::to_string)
        .collect()
}

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
        assert_eq!(address, format!("mem-{target}"));
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

/// Snapshots after every 2 entries and keeps no log behind them: a rejoining
/// member catches up from a snapshot.
fn compacting(c: &mut ConsensusConfig) {
    fast(c);
    c.snapshot_after_logs = 2;
    c.logs_to_keep = 0;
}

impl Cluster {
    /// Members `ids`, none started.
    fn new(ids: &[u64], configure: fn(&mut ConsensusConfig)) -> Cluster {
        setup();
        Cluster {
            net: Arc::default(),
            dirs: ids
                .iter()
                .map(|id| (*id, tempfile::tempdir().unwrap()))
                .collect(),
            configure,
        }
    }

    /// Members `ids`, started one after the other, all of them Raft nodes of the group.
    async fn start(ids: &[u64], configure: fn(&mut ConsensusConfig)) -> Cluster {
        let c = Cluster::new(ids, configure);
        for id in ids {
            c.start_member(*id).await;
        }
        c.joined().await;
        c
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

    /// Deletes everything in `id`'s directory (the member must be stopped).
    fn wipe(&self, id: u64) {
        assert!(!self.live().contains(&id));
        for entry in std::fs::read_dir(self.dirs[&id].path()).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
    }

    fn node(&self, id: u64) -> Arc<Consensus> {
        self.net.nodes.lock().unwrap()[&id].clone()
    }

    fn live(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.net.nodes.lock().unwrap().keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Waits until every live member is a Raft node of the group.
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

    /// Waits until every live member knows `voters` as the group's (uniform)
    /// voters, with no learner.
    async fn voters_are(&self, voters: &BTreeSet<u64>) {
        within(WAIT, async {
            while !self.live().iter().all(|id| {
                let s = self.node(*id).status();
                s.voters == *voters && s.learners.is_empty()
            }) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
    }

    /// Proposes the next election on member `from` and waits until every live
    /// member applied it.
    async fn commit_next(&self, from: u64) -> GroupState {
        let current = self.node(from).state().borrow().clone();
        let ids: Vec<u64> = self.dirs.keys().copied().collect();
        let command = next_election(&current, &ids);
        let outcome = self.node(from).propose(command).await.unwrap();
        assert!(outcome.is_applied(), "rejected: {outcome:?}");
        let state = outcome.state().clone();
        assert_eq!(state.epoch, current.epoch + 1);
        self.converge(&state).await;
        state
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

/// The election of epoch `state.epoch + 1` keeping the in-sync set (all `ids` at
/// first), its master rotating. Built from JSON so that the command carries
/// whatever conditions the state has (the fields it does not know default).
fn next_election(state: &GroupState, ids: &[u64]) -> Command {
    let in_sync: Vec<u64> = if state.in_sync.is_empty() {
        ids.to_vec()
    } else {
        state.in_sync.iter().copied().collect()
    };
    let master = in_sync[(state.epoch as usize) % in_sync.len()];
    let mut election = serde_json::json!({
        "epoch": state.epoch + 1,
        "master": master,
        "in_sync": in_sync,
    });
    let current = serde_json::to_value(state).unwrap();
    for condition in ["in_sync_version", "incarnations"] {
        if let Some(value) = current.get(condition) {
            election[condition] = value.clone();
        }
    }
    serde_json::from_value(serde_json::json!({ "ElectMaster": election })).unwrap()
}

fn has_raft_state(dir: &Path) -> bool {
    std::fs::read_dir(dir).unwrap().next().is_some()
}

/// A vote request as openraft sends it, for node `to` (None: a sender that does
/// not say).
fn vote_for(to: Option<u64>) -> Vec<u8> {
    let req = openraft::raft::VoteRequest::<u64>::new(openraft::Vote::new(1_000, 1), None);
    let mut value = serde_json::to_value(req).unwrap();
    if let Some(to) = to {
        value["to_node"] = to.into();
    }
    serde_json::to_vec(&value).unwrap()
}

#[test]
fn node_ids_keep_the_member_id_and_incarnation_zero_is_the_member_id() {
    assert_eq!(node_id(3, 0), 3);
    assert_eq!(node_id(0, 0), 0);
    let n = node_id(2, 0xdead_beef);
    assert_eq!((member_of(n), incarnation_of(n)), (2, 0xdead_beef));
    assert_eq!(member_of(node_id(0, 7)), 0);
    assert_ne!(node_id(1, 1), node_id(1, 2));
}

/// A member whose directory is wiped comes back under a new Raft node id, as a
/// learner, is promoted in place of its old node, has every committed entry, and
/// then takes part in a quorum; the leader never panics (openraft's debug
/// assertion on a reverted follower log is on in these builds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_rejoins_as_a_learner_and_is_promoted() {
    for (configure, wipe_the_leader) in [
        (fast as fn(&mut ConsensusConfig), false),
        (compacting, false),
        (fast, true),
    ] {
        let c = Cluster::start(&[1, 2, 3], configure).await;
        let first_leader = c.leader().await;
        for _ in 0..3 {
            c.commit_next(first_leader).await;
        }
        let victim = c
            .live()
            .into_iter()
            .find(|id| (*id == first_leader) == wipe_the_leader)
            .unwrap();
        let old = c.node(victim).status().node.unwrap();
        let before: BTreeSet<u64> = c.node(first_leader).status().voters;
        assert!(before.contains(&old), "{before:?} {old}");

        c.kill(victim).await;
        c.wipe(victim);
        let leader = c.leader().await;
        // Committed while it is away: it never had this one.
        let mut last = c.commit_next(leader).await;

        let back = c.start_member(victim).await;
        // Until it knows its node, it refuses Raft messages.
        if back.status().node.is_none() {
            let refused = back.handle("vote", &vote_for(Some(old))).await;
            assert!(
                matches!(
                    refused,
                    Err(ConsensusError::NotJoined | ConsensusError::WrongNode { .. })
                ),
                "{refused:?}"
            );
        }
        c.joined().await;
        let status = back.status();
        let new = status.node.unwrap();
        assert_ne!(new, old);
        assert_eq!(member_of(new), victim);
        assert_ne!(incarnation_of(new), 0);
        let after: BTreeSet<u64> = before
            .iter()
            .copied()
            .filter(|n| *n != old)
            .chain([new])
            .collect();
        c.voters_are(&after).await;
        // Messages for its old node are refused (the leader sees it unreachable).
        for to in [Some(old), None] {
            let refused = back.handle("vote", &vote_for(to)).await;
            assert!(
                matches!(refused, Err(ConsensusError::WrongNode { node, .. }) if node == new),
                "{refused:?}"
            );
        }
        // Every committed entry is there.
        c.converge(&last).await;
        assert_eq!(back.state().borrow().history.len(), 4);

        // It takes part: a proposal from it commits, and with another member
        // stopped (the leader, so it must also vote) the two left commit.
        last = c.commit_next(victim).await;
        let other = if c.leader().await == victim {
            c.live().into_iter().find(|id| *id != victim).unwrap()
        } else {
            c.leader().await
        };
        c.kill(other).await;
        let survivor = c.leader().await;
        let last_after = c.commit_next(survivor).await;
        assert_eq!(last_after.epoch, last.epoch + 1);
        assert_eq!(last_after.history.len(), 6);

        for id in c.live() {
            assert_eq!(c.node(id).status().fatal, None);
        }
        assert!(
            !OPENRAFT_PANICKED.load(Ordering::SeqCst),
            "openraft panicked"
        );
        c.shutdown().await;
    }
}

/// Two members of five wiped at once rejoin, one membership change at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_wiped_members_of_five_rejoin_one_after_the_other() {
    let c = Cluster::start(&[51, 52, 53, 54, 55], fast).await;
    let leader = c.leader().await;
    c.commit_next(leader).await;
    let victims: Vec<u64> = c
        .live()
        .into_iter()
        .filter(|id| *id != leader)
        .take(2)
        .collect();
    let before = c.node(leader).status().voters;
    for v in &victims {
        c.kill(*v).await;
        c.wipe(*v);
    }
    let committed = c.commit_next(leader).await;
    for v in &victims {
        c.start_member(*v).await;
    }
    c.joined().await;
    let new: Vec<u64> = victims
        .iter()
        .map(|v| c.node(*v).status().node.unwrap())
        .collect();
    let after: BTreeSet<u64> = before
        .iter()
        .copied()
        .filter(|n| !victims.contains(&member_of(*n)))
        .chain(new.iter().copied())
        .collect();
    assert_eq!(after.len(), 5);
    c.voters_are(&after).await;
    c.converge(&committed).await;
    c.commit_next(victims[0]).await;
    assert!(
        !OPENRAFT_PANICKED.load(Ordering::SeqCst),
        "openraft panicked"
    );
    c.shutdown().await;
}

/// A member that lost its Raft state but kept `member.json` (the identity file) is
/// not trusted to be the node it names: it rejoins under a new node id too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_kept_only_its_identity_file_rejoins_too() {
    let c = Cluster::start(&[41, 42, 43], fast).await;
    let leader = c.leader().await;
    let committed = c.commit_next(leader).await;
    let victim = c.live().into_iter().find(|id| *id != leader).unwrap();
    let old = c.node(victim).status().node.unwrap();
    c.kill(victim).await;
    for entry in std::fs::read_dir(c.dirs[&victim].path()).unwrap() {
        let path = entry.unwrap().path();
        if !path.ends_with("member.json") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let back = c.start_member(victim).await;
    c.joined().await;
    let new = back.status().node.unwrap();
    assert_ne!(new, old);
    assert_eq!(member_of(new), victim);
    c.converge(&committed).await;
    c.commit_next(victim).await;
    assert!(
        !OPENRAFT_PANICKED.load(Ordering::SeqCst),
        "openraft panicked"
    );
    c.shutdown().await;
}

/// A wiped member whose peers are all down does not create a group: it keeps
/// asking, says why, and takes no Raft message; when they come back it rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_alone_waits_and_says_why() {
    let c = Cluster::start(&[17, 18, 19], fast).await;
    let leader = c.leader().await;
    let committed = c.commit_next(leader).await;
    c.shutdown().await;
    c.wipe(18);

    let alone = c.start_member(18).await;
    // Three rounds of probes, each of which found one member of three without state.
    within(WAIT, async {
        while log_lines(&["not creating the group", "id=18"]).len() < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let line = &log_lines(&["not creating the group", "id=18"])[0];
    assert!(
        line.contains("1 of 3 members known to have no consensus state"),
        "{line}"
    );
    assert!(line.contains("member 17 is down"), "{line}");
    let status = alone.status();
    assert_eq!(status.phase, Phase::Probing);
    assert_eq!(status.node, None);
    assert!(
        status
            .waiting_for
            .as_deref()
            .is_some_and(|w| w.contains("2 needed to create the group")),
        "{status:?}"
    );
    assert!(!has_raft_state(c.dirs[&18].path()));
    assert_eq!(*alone.state().borrow(), GroupState::default());
    assert_eq!(alone.leader(), None);
    assert!(matches!(
        alone.handle("vote", &vote_for(Some(18))).await,
        Err(ConsensusError::NotJoined)
    ));
    assert!(matches!(
        alone.ensure_current().await,
        Err(ConsensusError::NotLeader { leader: None })
    ));

    // The others come back from their directories: it rejoins.
    c.start_member(17).await;
    c.start_member(19).await;
    c.joined().await;
    let node = alone.status().node.unwrap();
    assert_ne!(incarnation_of(node), 0);
    c.converge(&committed).await;
    c.leader().await;
    c.commit_next(18).await;
    assert!(
        !OPENRAFT_PANICKED.load(Ordering::SeqCst),
        "openraft panicked"
    );
    c.shutdown().await;
}

/// A brand-new group whose members start together: it initializes, elects, and
/// every member is one voter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brand_new_group_initializes_and_elects() {
    let c = Cluster::new(&[21, 22, 23], fast);
    let started = futures_join(
        [21, 22, 23]
            .into_iter()
            .map(|id| Consensus::start(c.config(id), c.net.clone())),
    )
    .await;
    for (id, node) in [21, 22, 23].into_iter().zip(started) {
        c.net
            .nodes
            .lock()
            .unwrap()
            .insert(id, Arc::new(node.unwrap()));
    }
    c.joined().await;
    let leader = c.leader().await;
    let voters = c.node(leader).status().voters;
    assert_eq!(
        voters
            .iter()
            .map(|n| member_of(*n))
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([21, 22, 23]),
        "{voters:?}"
    );
    c.voters_are(&voters).await;
    c.commit_next(leader).await;
    c.shutdown().await;
}

/// A brand-new group one of whose members is down: the two others (a majority)
/// create it and commit; the third, started later, joins it as a learner under a
/// new node id and is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_brand_new_group_forms_without_one_member_who_joins_later() {
    let c = Cluster::new(&[31, 32, 33], fast);
    c.start_member(31).await;
    c.start_member(32).await;
    c.joined().await;
    let leader = c.leader().await;
    let first = c.commit_next(leader).await;
    assert_eq!(
        c.node(leader).status().voters,
        BTreeSet::from([node_id(31, 0), node_id(32, 0), node_id(33, 0)])
    );

    let late = c.start_member(33).await;
    c.joined().await;
    let node = late.status().node.unwrap();
    assert_eq!(member_of(node), 33);
    assert_ne!(incarnation_of(node), 0);
    c.voters_are(&BTreeSet::from([node_id(31, 0), node_id(32, 0), node]))
        .await;
    c.converge(&first).await;
    c.commit_next(33).await;
    c.shutdown().await;
}

/// Awaits all of `futures` (concurrently), in order.
async fn futures_join<F: Future + Send + 'static>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
