//! Durable Raft storage under the member's directory: openraft's log store and
//! state machine. The log of a broker group's control plane is tiny (a few
//! entries per failover, compacted into snapshots), so each kind of record is
//! one JSON file, rewritten atomically (temp file, fsync, rename, fsync of the
//! directory) before the call that changed it returns:
//!
//! - `vote.json`: the vote (term and voted-for / committed leader);
//! - `log.json`: the log entries not yet purged and the last purged log id;
//! - `committed.json`: the last committed log id;
//! - `sm.json`: the applied state machine (last applied id, membership, [`GroupState`]);
//! - `snapshot.json`: the current snapshot (metadata and data);
//! - `member.json`: this member's identity in the group's Raft (its incarnation, so its
//!   Raft node id, and the founders of a group it created); see [`Identity`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::{Cursor, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StoredMembership, Vote,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex};

use crate::{CommandOutcome, GroupState, TypeConfig};

type Entry = openraft::Entry<TypeConfig>;
type Membership = StoredMembership<u64, openraft::BasicNode>;
type Meta = SnapshotMeta<u64, openraft::BasicNode>;

const VOTE: &str = "vote.json";
const LOG: &str = "log.json";
const COMMITTED: &str = "committed.json";
const SM: &str = "sm.json";
const SNAPSHOT: &str = "snapshot.json";
const IDENTITY: &str = "member.json";

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

fn invalid(e: serde_json::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

/// Writes `value` as JSON to `dir/name` atomically and durably.
pub(crate) async fn write_json<T: Serialize>(
    dir: &Path,
    name: &'static str,
    value: &T,
) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(invalid)?;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || write_atomic(&dir, name, &bytes))
        .await
        .map_err(std::io::Error::other)?
}

fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let seq = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{seq}.tmp", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads `dir/name` as JSON; `None` if the file does not exist.
fn read_json<T: DeserializeOwned>(dir: &Path, name: &str) -> std::io::Result<Option<T>> {
    match std::fs::read(dir.join(name)) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(invalid),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `dir` holds any of Raft's state (vote, log, committed id, state machine,
/// snapshot): false for a directory that is new or was wiped.
pub(crate) fn has_raft_state(dir: &Path) -> bool {
    [VOTE, LOG, COMMITTED, SM, SNAPSHOT]
        .iter()
        .any(|name| dir.join(name).exists())
}

/// The group's membership (members and addresses) as the Raft state under `dir` holds
/// it: its log's last membership entry, else the applied state machine's, else the
/// snapshot's. None for a directory without one (new, wiped, or never initialized).
pub fn stored_members(dir: &Path) -> std::io::Result<Option<BTreeMap<u64, String>>> {
    let log: LogFile = read_json(dir, LOG)?.unwrap_or_default();
    let logged = log.entries.iter().rev().find_map(|e| match &e.payload {
        EntryPayload::Membership(m) => Some(m.clone()),
        _ => None,
    });
    let membership = match logged {
        Some(m) => Some(m),
        None => {
            let sm: Option<SmFile> = read_json(dir, SM)?;
            let snapshot: Option<SnapshotFile> = read_json(dir, SNAPSHOT)?;
            sm.map(|sm| sm.membership)
                .filter(|m| m.log_id().is_some())
                .or_else(|| snapshot.map(|s| s.meta.last_membership))
                .map(|m| m.membership().clone())
        }
    };
    Ok(membership
        .map(|m| crate::inner::members_of(&m))
        .filter(|members| !members.is_empty()))
}

/// Who this member is in the group's Raft, kept in `member.json` beside Raft's state
/// (written before the Raft node first runs, so a directory that has Raft state under
/// a node id also names it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The member (broker) id the directory belongs to.
    pub(crate) member: u64,
    /// 0 for a member of a brand-new group (its Raft node id is its member id); a
    /// random nonzero value for a member that rejoined after losing its directory.
    pub(crate) incarnation: u32,
    /// For a member of a brand-new group: the members known to be uninitialized when it
    /// was created, each with the nonce of the start that said so (see `lib.rs`).
    #[serde(default)]
    pub(crate) founders: BTreeMap<u64, u64>,
}

impl Identity {
    pub(crate) fn read(dir: &Path) -> std::io::Result<Option<Identity>> {
        read_json(dir, IDENTITY)
    }

    pub(crate) fn write(&self, dir: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(invalid)?;
        write_atomic(dir, IDENTITY, &bytes)
    }
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: std::io::Error) -> StorageError<u64> {
    StorageError::from_io_error(subject, verb, e)
}

// ---------------------------------------------------------------- log store

#[derive(Serialize, Deserialize, Default)]
struct LogFile {
    last_purged: Option<LogId<u64>>,
    entries: Vec<Entry>,
}

struct LogData {
    dir: PathBuf,
    vote: Option<Vote<u64>>,
    committed: Option<LogId<u64>>,
    last_purged: Option<LogId<u64>>,
    entries: BTreeMap<u64, Entry>,
}

impl LogData {
    async fn persist_log(&self) -> Result<(), StorageError<u64>> {
        let file = LogFile {
            last_purged: self.last_purged,
            entries: self.entries.values().cloned().collect(),
        };
        write_json(&self.dir, LOG, &file)
            .await
            .map_err(|e| io_err(ErrorSubject::Logs, ErrorVerb::Write, e))
    }
}

/// openraft's log storage; also its log reader (a clone shares the data).
#[derive(Clone)]
pub(crate) struct LogStore {
    inner: Arc<Mutex<LogData>>,
}

impl LogStore {
    /// Loads the log, vote and committed id persisted under `dir`.
    pub(crate) fn open(dir: &Path) -> std::io::Result<LogStore> {
        let file: LogFile = read_json(dir, LOG)?.unwrap_or_default();
        let vote: Option<Vote<u64>> = read_json(dir, VOTE)?;
        let committed: Option<Option<LogId<u64>>> = read_json(dir, COMMITTED)?;
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogData {
                dir: dir.to_path_buf(),
                vote,
                committed: committed.flatten(),
                last_purged: file.last_purged,
                entries: file
                    .entries
                    .into_iter()
                    .map(|e| (e.log_id.index, e))
                    .collect(),
            })),
        })
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        let data = self.inner.lock().await;
        Ok(data.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let data = self.inner.lock().await;
        let last = data.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: data.last_purged,
            last_log_id: last.or(data.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let mut data = self.inner.lock().await;
        write_json(&data.dir, VOTE, vote)
            .await
            .map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))?;
        data.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.inner.lock().await.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        let mut data = self.inner.lock().await;
        write_json(&data.dir, COMMITTED, &committed)
            .await
            .map_err(|e| io_err(ErrorSubject::Store, ErrorVerb::Write, e))?;
        data.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(self.inner.lock().await.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut data = self.inner.lock().await;
        for e in entries {
            data.entries.insert(e.log_id.index, e);
        }
        let result = data.persist_log().await;
        callback.log_io_completed(match &result {
            Ok(()) => Ok(()),
            Err(e) => Err(std::io::Error::other(e.to_string())),
        });
        result
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut data = self.inner.lock().await;
        data.entries.split_off(&log_id.index);
        data.persist_log().await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut data = self.inner.lock().await;
        let keep = data.entries.split_off(&(log_id.index + 1));
        data.entries = keep;
        data.last_purged = Some(log_id);
        data.persist_log().await
    }
}

// ------------------------------------------------------------ state machine

#[derive(Serialize, Deserialize, Default, Clone)]
struct SmFile {
    last_applied: Option<LogId<u64>>,
    membership: Membership,
    state: GroupState,
}

#[derive(Serialize, Deserialize, Clone)]
struct SnapshotFile {
    meta: Meta,
    /// JSON of the [`GroupState`] at `meta.last_log_id`.
    data: Vec<u8>,
}

struct SmData {
    dir: PathBuf,
    sm: SmFile,
    snapshot: Option<SnapshotFile>,
    snapshot_seq: u64,
    tx: watch::Sender<GroupState>,
}

impl SmData {
    async fn persist_sm(&self) -> Result<(), StorageError<u64>> {
        write_json(&self.dir, SM, &self.sm)
            .await
            .map_err(|e| io_err(ErrorSubject::StateMachine, ErrorVerb::Write, e))
    }

    async fn persist_snapshot(&mut self, file: SnapshotFile) -> Result<(), StorageError<u64>> {
        // A snapshot built concurrently with an install must not replace a newer one.
        if let Some(cur) = &self.snapshot {
            if cur.meta.last_log_id > file.meta.last_log_id {
                return Ok(());
            }
        }
        write_json(&self.dir, SNAPSHOT, &file).await.map_err(|e| {
            io_err(
                ErrorSubject::Snapshot(Some(file.meta.signature())),
                ErrorVerb::Write,
                e,
            )
        })?;
        self.snapshot = Some(file);
        Ok(())
    }

    fn publish(&self) {
        self.tx.send_if_modified(|s| {
            if *s == self.sm.state {
                false
            } else {
                *s = self.sm.state.clone();
                true
            }
        });
    }
}

/// openraft's state machine: applies [`crate::Command`]s to a [`GroupState`]
/// and publishes every change on a watch channel. Also its snapshot builder.
#[derive(Clone)]
pub(crate) struct StateMachine {
    inner: Arc<Mutex<SmData>>,
}

impl StateMachine {
    /// Loads the applied state and the snapshot persisted under `dir`; returns
    /// the store and a watch of the applied [`GroupState`].
    pub(crate) fn open(dir: &Path) -> std::io::Result<(StateMachine, watch::Receiver<GroupState>)> {
        let sm: SmFile = read_json(dir, SM)?.unwrap_or_default();
        let snapshot: Option<SnapshotFile> = read_json(dir, SNAPSHOT)?;
        let (tx, rx) = watch::channel(sm.state.clone());
        Ok((
            StateMachine {
                inner: Arc::new(Mutex::new(SmData {
                    dir: dir.to_path_buf(),
                    sm,
                    snapshot,
                    snapshot_seq: 0,
                    tx,
                })),
            },
            rx,
        ))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let mut d = self.inner.lock().await;
        let data = serde_json::to_vec(&d.sm.state)
            .map_err(|e| io_err(ErrorSubject::Snapshot(None), ErrorVerb::Write, invalid(e)))?;
        d.snapshot_seq += 1;
        let snapshot_id = match d.sm.last_applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, d.snapshot_seq),
            None => format!("none-{}", d.snapshot_seq),
        };
        let meta = Meta {
            last_log_id: d.sm.last_applied,
            last_membership: d.sm.membership.clone(),
            snapshot_id,
        };
        d.persist_snapshot(SnapshotFile {
            meta: meta.clone(),
            data: data.clone(),
        })
        .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, Membership), StorageError<u64>> {
        let d = self.inner.lock().await;
        Ok((d.sm.last_applied, d.sm.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandOutcome>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut d = self.inner.lock().await;
        let mut out = Vec::new();
        for entry in entries {
            d.sm.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => CommandOutcome::Rejected(d.sm.state.clone()),
                EntryPayload::Normal(command) => {
                    let outcome = d.sm.state.apply(&command);
                    tracing::debug!(log_id = %entry.log_id, ?command, applied = outcome.is_applied(), "consensus: applied");
                    outcome
                }
                EntryPayload::Membership(m) => {
                    d.sm.membership = StoredMembership::new(Some(entry.log_id), m);
                    CommandOutcome::Rejected(d.sm.state.clone())
                }
            };
            out.push(outcome);
        }
        d.persist_sm().await?;
        d.publish();
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let state: GroupState = serde_json::from_slice(&data).map_err(|e| {
            io_err(
                ErrorSubject::Snapshot(Some(meta.signature())),
                ErrorVerb::Read,
                invalid(e),
            )
        })?;
        let mut d = self.inner.lock().await;
        d.sm = SmFile {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state,
        };
        d.persist_sm().await?;
        d.persist_snapshot(SnapshotFile {
            meta: meta.clone(),
            data,
        })
        .await?;
        d.publish();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let d = self.inner.lock().await;
        Ok(d.snapshot.as_ref().map(|s| Snapshot {
            meta: s.meta.clone(),
            snapshot: Box::new(Cursor::new(s.data.clone())),
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, RaftLogReader};

    use super::*;
    use crate::Command;

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
            let dir = tempfile::tempdir().unwrap();
            let log = LogStore::open(dir.path()).unwrap();
            let (sm, _) = StateMachine::open(dir.path()).unwrap();
            Ok((dir, log, sm))
        }
    }

    /// openraft's conformance suite for storage implementations.
    #[test]
    fn openraft_storage_suite() {
        Suite::test_all(Builder).unwrap();
    }

    fn log_id(term: u64, index: u64) -> LogId<u64> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64, epoch: u64) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(Command::ElectMaster {
                epoch,
                master: 1,
                in_sync: [1].into(),
                // Each election bumps the version: the next one is conditioned on it.
                in_sync_version: epoch - 1,
                incarnations: Default::default(),
            }),
        }
    }

    /// What each call persisted is what a reopened store reads back.
    #[tokio::test]
    async fn a_reopened_store_reads_back_what_was_persisted() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut log = LogStore::open(dir.path()).unwrap();
            let (mut sm, _) = StateMachine::open(dir.path()).unwrap();
            let vote = Vote::new(3, 2);
            log.save_vote(&vote).await.unwrap();
            let entries: Vec<Entry> = (1..=5).map(|i| entry(3, i, i)).collect();
            {
                let mut d = log.inner.lock().await;
                for e in entries.clone() {
                    d.entries.insert(e.log_id.index, e);
                }
                d.persist_log().await.unwrap();
            }
            log.truncate(log_id(3, 5)).await.unwrap();
            log.purge(log_id(3, 2)).await.unwrap();
            log.save_committed(Some(log_id(3, 4))).await.unwrap();
            let out = sm.apply(entries[..4].to_vec()).await.unwrap();
            assert!(out.iter().all(CommandOutcome::is_applied));
            let snap = sm.build_snapshot().await.unwrap();
            assert_eq!(snap.meta.last_log_id, Some(log_id(3, 4)));
        }
        let mut log = LogStore::open(dir.path()).unwrap();
        let (mut sm, rx) = StateMachine::open(dir.path()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(Vote::new(3, 2)));
        assert_eq!(log.read_committed().await.unwrap(), Some(log_id(3, 4)));
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(3, 2)));
        assert_eq!(st.last_log_id, Some(log_id(3, 4)));
        let left = log.try_get_log_entries(0..100).await.unwrap();
        assert_eq!(
            left.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(3, 4)));
        assert_eq!(rx.borrow().epoch, 4);
        assert_eq!(rx.borrow().history.len(), 4);
        let snap = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(3, 4)));
        let state: GroupState = serde_json::from_slice(snap.snapshot.get_ref()).unwrap();
        assert_eq!(state, *rx.borrow());
        // No temp files left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
    }
}
