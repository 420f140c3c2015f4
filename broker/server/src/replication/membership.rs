//! The group's membership at run time: the member map follows the membership the group's
//! consensus agrees, QUIVER_REPLICATION_MEMBERS (30005) changes it (on the consensus
//! leader, forwarded there from any member), and a member refuses to start with other
//! `--group-members` than its consensus directory stores.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use quiver_consensus::ConsensusError;
use quiver_protocol::code::{request, response};
use quiver_protocol::header::{ReplicationMembersRequestHeader, SwitchoverRequestHeader};
use quiver_protocol::RemotingCommand;
use quiver_store::MessageStore;

use super::Replication;

/// How long a membership change may take when the request does not say (a new member's
/// catch-up as a learner included).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Marks a request one member forwarded to the consensus leader: it is not forwarded again.
const FORWARDED: &str = "quiverForwarded";

/// The group's members and their remoting addresses as this member knows them: its
/// `--group-members` until its consensus knows the agreed membership, then that.
///
/// Readers borrow the map without a guard (`&BTreeMap` for the life of `&self`), so a
/// superseded map is kept for the process's life: a change is a rare operator action and a
/// map is a few bytes per member.
pub struct Members {
    current: parking_lot::RwLock<&'static BTreeMap<u64, String>>,
}

impl Members {
    pub(super) fn new(members: BTreeMap<u64, String>) -> Members {
        Members {
            current: parking_lot::RwLock::new(Box::leak(Box::new(members))),
        }
    }

    /// Takes `members` as the membership; whether it changed.
    pub(super) fn replace(&self, members: &BTreeMap<u64, String>) -> bool {
        let mut current = self.current.write();
        if **current == *members {
            return false;
        }
        *current = Box::leak(Box::new(members.clone()));
        true
    }
}

impl std::ops::Deref for Members {
    type Target = BTreeMap<u64, String>;

    fn deref(&self) -> &BTreeMap<u64, String> {
        *self.current.read()
    }
}

/// `members` as `--group-members` takes them: `0=host:port,1=host:port`.
pub fn flag_list(members: &BTreeMap<u64, String>) -> String {
    let entries: Vec<String> = members
        .iter()
        .map(|(id, address)| format!("{id}={address}"))
        .collect();
    entries.join(",")
}

/// The start-time check: a consensus directory holding a membership must be started with
/// it as `--group-members`. An empty (new, or wiped) directory takes the flags.
pub fn check_stored_members(
    consensus_dir: &Path,
    configured: &BTreeMap<u64, String>,
) -> Result<(), String> {
    let stored = quiver_consensus::stored_members(consensus_dir)
        .map_err(|e| format!("cannot read {}: {e}", consensus_dir.display()))?;
    match stored {
        Some(stored) if stored != *configured => Err(format!(
            "--group-members {} does not match the group's membership {} stored in {}: start \
             this member with --group-members {}, or change the membership with `quiver \
             replication members add|remove|replace` (a member with an empty consensus \
             directory takes its flags)",
            flag_list(configured),
            flag_list(&stored),
            consensus_dir.display(),
            flag_list(&stored),
        )),
        _ => Ok(()),
    }
}

/// A requested membership change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Add { id: u64, address: String },
    Remove { id: u64 },
    Replace { old: u64, new: u64, address: String },
}

impl Change {
    pub(crate) fn parse(header: &ReplicationMembersRequestHeader) -> Result<Change, MembersError> {
        let address = || {
            header
                .address
                .clone()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| MembersError::Invalid(format!("{} needs an address", header.action)))
        };
        match header.action.as_str() {
            "add" => Ok(Change::Add {
                id: header.member_id,
                address: address()?,
            }),
            "remove" => Ok(Change::Remove {
                id: header.member_id,
            }),
            "replace" => Ok(Change::Replace {
                old: header.member_id,
                new: header
                    .new_member_id
                    .ok_or_else(|| MembersError::Invalid("replace needs newMemberId".into()))?,
                address: address()?,
            }),
            other => Err(MembersError::Invalid(format!(
                "unknown action {other:?}: add, remove or replace"
            ))),
        }
    }
}

/// Why a membership change was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MembersError {
    #[error("invalid membership change: {0}")]
    Invalid(String),
    #[error("this member's consensus has not started yet")]
    NotStarted,
    #[error("the group has no consensus leader now (it is electing one); retry in a moment")]
    NoLeader,
    #[error("member {me} does not lead the group's consensus; the leader is member {leader} at {address}: send the change there")]
    NotLeader {
        me: u64,
        leader: u64,
        address: String,
    },
    #[error("{0}")]
    Refused(String),
    #[error("member {id} is the master and mastership could not be moved first: {why}")]
    Switchover { id: u64, why: String },
    #[error(transparent)]
    Consensus(#[from] ConsensusError),
}

impl Replication {
    /// QUIVER_REPLICATION_MEMBERS: `Ok(None)` when this member leads the group's consensus
    /// (apply the change here), `Ok(Some(answer))` with the leader's answer once forwarded
    /// (signed as this member, like its other requests to members).
    pub(crate) async fn forward_members_change(
        &self,
        header: &ReplicationMembersRequestHeader,
        request: &RemotingCommand,
    ) -> Result<Option<RemotingCommand>, MembersError> {
        let consensus = self.consensus().ok_or(MembersError::NotStarted)?;
        if consensus.is_leader() {
            return Ok(None);
        }
        let leader = consensus.leader().ok_or(MembersError::NoLeader)?;
        let address = self.address_of(leader);
        if request.ext_fields.contains_key(FORWARDED) {
            return Err(MembersError::NotLeader {
                me: self.id,
                leader,
                address,
            });
        }
        let mut forwarded =
            RemotingCommand::request(request::QUIVER_REPLICATION_MEMBERS, header.to_ext());
        forwarded.ext_fields.insert(FORWARDED, self.id.to_string());
        let wait = header
            .timeout_ms
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis)
            + Duration::from_secs(5);
        let answer = self
            .links
            .request(&address, forwarded, wait)
            .await
            .map_err(|error| {
                MembersError::Refused(format!(
                    "forwarding to the consensus leader, member {leader} at {address}: {}",
                    crate::error::chain(&error)
                ))
            })?;
        Ok(Some(answer))
    }

    /// On the consensus leader: makes `change` and returns the membership after it.
    pub(crate) async fn change_members(
        &self,
        store: &MessageStore,
        change: Change,
        timeout: Option<u64>,
    ) -> Result<BTreeMap<u64, String>, MembersError> {
        let consensus = self.consensus().ok_or(MembersError::NotStarted)?;
        let timeout = timeout.map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        tracing::info!(?change, ?timeout, "changing the group's membership");
        let members = match change {
            Change::Add { id, address } => consensus.add_member(id, &address, timeout).await?,
            Change::Remove { id } => self.remove_member(store, id, timeout).await?,
            Change::Replace { old, new, address } => {
                if self.members.contains_key(&new) {
                    return Err(MembersError::Refused(format!(
                        "member {new} is already a member of the group (members: {})",
                        flag_list(&self.members)
                    )));
                }
                self.check_removal(old, Some(new))?;
                consensus.add_member(new, &address, timeout).await?;
                self.remove_member(store, old, timeout).await?
            }
        };
        self.members.replace(&members);
        tracing::info!(members = %flag_list(&members), "the group's membership changed");
        Ok(members)
    }

    async fn remove_member(
        &self,
        store: &MessageStore,
        id: u64,
        timeout: Duration,
    ) -> Result<BTreeMap<u64, String>, MembersError> {
        let consensus = self.consensus().ok_or(MembersError::NotStarted)?;
        self.check_removal(id, None)?;
        if self.state().master == Some(id) {
            self.move_mastership_from(store, id, timeout).await?;
        }
        Ok(consensus.remove_member(id, timeout).await?)
    }

    /// Refuses removing `id` (with `joining` about to be added) when the group could not go
    /// on without it: a member it does not have, fewer members or in-sync members than
    /// min-in-sync-replicas, or too few of the remaining members answering to agree.
    fn check_removal(&self, id: u64, joining: Option<u64>) -> Result<(), MembersError> {
        let refused = |why: String| Err(MembersError::Refused(why));
        if !self.members.contains_key(&id) {
            return refused(format!(
                "member {id} is not a member of the group (members: {})",
                flag_list(&self.members)
            ));
        }
        let min = self.min_in_sync as usize;
        let remaining: BTreeSet<u64> = self
            .member_ids()
            .into_iter()
            .chain(joining)
            .filter(|m| *m != id)
            .collect();
        if remaining.len() < min.max(1) {
            return refused(format!(
                "removing member {id} would leave {} member(s), fewer than min-in-sync-replicas {min}",
                remaining.len()
            ));
        }
        // Only an in-sync member's removal shrinks the set (a dead member already left it).
        let mut in_sync = self.state().in_sync;
        if in_sync.remove(&id) && in_sync.len() < min {
            return refused(format!(
                "without member {id} the in-sync set would be {in_sync:?}, fewer than \
                 min-in-sync-replicas {min}: sends would be refused; wait until other members \
                 are in sync"
            ));
        }
        let answering = self.answering_members(&remaining);
        let needed = remaining.len() / 2 + 1;
        if answering.len() + usize::from(joining.is_some()) < needed {
            return refused(format!(
                "removing member {id} would leave {} members of which only {answering:?} \
                 answer; {needed} must answer for the group to agree anything",
                remaining.len()
            ));
        }
        Ok(())
    }

    /// The members of `among` heard from within the master timeout (the consensus leader
    /// hears every member's reports).
    fn answering_members(&self, among: &BTreeSet<u64>) -> BTreeSet<u64> {
        let heard = self
            .reports
            .lock()
            .heard_within(Instant::now(), self.master_timeout);
        among.intersection(&heard).copied().collect()
    }

    /// Hands mastership from `id` to another in-sync member (a planned switchover, run on
    /// the master) and waits until the group agreed it.
    async fn move_mastership_from(
        &self,
        store: &MessageStore,
        id: u64,
        timeout: Duration,
    ) -> Result<(), MembersError> {
        let failed = |why: String| MembersError::Switchover { id, why };
        let state = self.state();
        let target = state
            .in_sync
            .iter()
            .copied()
            .find(|m| *m != id && self.members.contains_key(m))
            .ok_or_else(|| failed("no other in-sync member to take over".into()))?;
        tracing::info!(
            id,
            target,
            "removing the master: switching mastership over first"
        );
        if id == self.id {
            self.switchover(store, target, super::DEFAULT_SWITCHOVER_TIMEOUT)
                .await
                .map_err(|e| failed(e.to_string()))?;
        } else {
            let header = SwitchoverRequestHeader {
                target_replica_id: target,
                timeout_ms: None,
            };
            let request = RemotingCommand::request(request::QUIVER_SWITCHOVER, header.to_ext());
            let answer = self
                .links
                .request(&self.address_of(id), request, timeout)
                .await
                .map_err(|e| failed(crate::error::chain(&e)))?;
            if answer.code != response::SUCCESS {
                return Err(failed(answer.remark.unwrap_or_default()));
            }
        }
        let mut watched = self.state.subscribe();
        let moved = tokio::time::timeout(timeout, watched.wait_for(|s| s.master != Some(id))).await;
        match moved {
            Ok(Ok(_)) => Ok(()),
            _ => Err(failed(format!(
                "the group did not agree the handover to member {target} within {timeout:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(ids: &[u64]) -> BTreeMap<u64, String> {
        ids.iter().map(|id| (*id, format!("h:{id}"))).collect()
    }

    #[test]
    fn the_map_follows_replacements_and_old_borrows_stay_valid() {
        let map = Members::new(members(&[0, 1, 2]));
        let before: &BTreeMap<u64, String> = &map;
        assert!(!map.replace(&members(&[0, 1, 2])));
        assert!(map.replace(&members(&[0, 1, 2, 3])));
        assert_eq!(before.len(), 3);
        assert_eq!(map.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn changes_parse_from_the_header() {
        let header = |action: &str, address: Option<&str>, new: Option<u64>| {
            ReplicationMembersRequestHeader {
                action: action.into(),
                member_id: 3,
                address: address.map(str::to_owned),
                new_member_id: new,
                timeout_ms: None,
            }
        };
        assert_eq!(
            Change::parse(&header("add", Some("h:3"), None)).unwrap(),
            Change::Add {
                id: 3,
                address: "h:3".into()
            }
        );
        assert_eq!(
            Change::parse(&header("remove", None, None)).unwrap(),
            Change::Remove { id: 3 }
        );
        assert_eq!(
            Change::parse(&header("replace", Some("h:4"), Some(4))).unwrap(),
            Change::Replace {
                old: 3,
                new: 4,
                address: "h:4".into()
            }
        );
        assert!(Change::parse(&header("add", None, None)).is_err());
        assert!(Change::parse(&header("replace", Some("h:4"), None)).is_err());
        assert!(Change::parse(&header("grow", None, None)).is_err());
    }

    #[test]
    fn an_empty_directory_takes_the_flags() {
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            check_stored_members(empty.path(), &members(&[0, 1])),
            Ok(())
        );
        assert_eq!(flag_list(&members(&[0, 1])), "0=h:0,1=h:1");
    }

    /// Member 0 of a group {0, 1, 2} (min in sync `min`) whose agreed in-sync set is
    /// `in_sync`, having heard reports from `heard`.
    fn group(dir: &Path, min: u32, in_sync: &[u64], heard: &[u64]) -> std::sync::Arc<Replication> {
        let config = crate::config::BrokerConfig {
            data_dir: dir.to_path_buf(),
            min_in_sync_replicas: min,
            ..Default::default()
        };
        let replication = super::super::fixture::member_0(config, in_sync, false);
        for id in heard {
            replication.record_report(super::super::controller::ReportBody {
                id: *id,
                log_end: 0,
                declined: false,
                incarnation: 1,
                unclean: false,
            });
        }
        replication
    }

    fn refusal(result: Result<(), MembersError>) -> String {
        match result {
            Err(MembersError::Refused(why)) => why,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn removals_the_group_cannot_take_are_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let healthy = group(dir.path(), 2, &[0, 1, 2], &[0, 1, 2]);
        assert!(healthy.check_removal(2, None).is_ok());
        let why = refusal(healthy.check_removal(7, None));
        assert!(why.contains("member 7 is not a member"), "{why}");

        let dir = tempfile::tempdir().unwrap();
        let strict = group(dir.path(), 3, &[0, 1, 2], &[0, 1, 2]);
        let why = refusal(strict.check_removal(2, None));
        assert!(
            why.contains("would leave 2 member(s), fewer than min-in-sync-replicas 3"),
            "{why}"
        );
        let why = refusal(strict.check_removal(2, Some(3)));
        assert!(why.contains("in-sync set would be {0, 1}"), "{why}");

        let dir = tempfile::tempdir().unwrap();
        let one_down = group(dir.path(), 2, &[0, 1], &[0, 1]);
        assert!(
            one_down.check_removal(2, Some(3)).is_ok(),
            "replacing a member out of the set shrinks nothing"
        );

        let dir = tempfile::tempdir().unwrap();
        let lagging = group(dir.path(), 2, &[0, 1], &[0, 1, 2]);
        let why = refusal(lagging.check_removal(1, None));
        assert!(why.contains("in-sync set would be {0}"), "{why}");
        assert!(lagging.check_removal(2, None).is_ok());

        let dir = tempfile::tempdir().unwrap();
        let silent = group(dir.path(), 1, &[0, 1, 2], &[0]);
        let why = refusal(silent.check_removal(2, None));
        assert!(why.contains("only {0} answer; 2 must answer"), "{why}");
    }
}
