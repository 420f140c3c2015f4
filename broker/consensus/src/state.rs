//! The replicated state of a broker group and the commands that change it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The control-plane state of one replicated broker group, as applied from the
/// committed log. Every member applies the same commands in the same order, so
/// every member converges to the same `GroupState`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupState {
    /// The current epoch; 0 means no master was ever elected.
    pub epoch: u64,
    /// The master of `epoch`.
    pub master: Option<u64>,
    /// The in-sync replica set of `epoch`, master included.
    pub in_sync: BTreeSet<u64>,
    /// Bumped by every change of `in_sync`: a change is conditioned on the version it was
    /// decided from, so one decided from a stale view is refused.
    #[serde(default)]
    pub in_sync_version: u64,
    /// The data-directory incarnation of each in-sync member as the set was agreed: a
    /// member that comes back with another one (a wiped disk) is not the member that was
    /// in sync, and is not elected.
    #[serde(default)]
    pub incarnations: BTreeMap<u64, u64>,
    /// The start of every epoch, ascending by epoch.
    pub history: Vec<EpochStart>,
}

/// Where an epoch began: its master and the CommitLog offset of its first message, once
/// the master has agreed it (`StartEpoch`); None between the election and that.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct EpochStart {
    pub epoch: u64,
    pub master: u64,
    pub start_offset: Option<u64>,
}

/// A change of the group's state, proposed through consensus. Commands are
/// conditional on the state they are applied to (compare-and-set on the epoch and the
/// in-sync version), so a stale or duplicated proposal is `Rejected` rather than applied.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Applied only if `epoch == state.epoch + 1`, `in_sync_version ==
    /// state.in_sync_version`, `in_sync` contains `master`, and (after the first epoch)
    /// `in_sync` is a subset of the current set with the same incarnations: only a member
    /// of the agreed in-sync set is ever elected. Sets master and in-sync set and appends
    /// `EpochStart { epoch, master, start_offset: None }` to the history.
    ElectMaster {
        epoch: u64,
        master: u64,
        in_sync: BTreeSet<u64>,
        #[serde(default)]
        in_sync_version: u64,
        #[serde(default)]
        incarnations: BTreeMap<u64, u64>,
    },
    /// The elected master's log end once it stopped following the old one: where its
    /// epoch starts. Applied only if `epoch == state.epoch`, `state.master == Some(master)`
    /// and the epoch's start is not yet set. Until then replicas cannot know what to
    /// truncate, and the master takes no writes.
    StartEpoch {
        epoch: u64,
        master: u64,
        start_offset: u64,
    },
    /// Applied only if `epoch == state.epoch`, `state.master == Some(master)`,
    /// `in_sync_version == state.in_sync_version` and `in_sync` contains `master`:
    /// replaces the in-sync set and its incarnations.
    AlterInSync {
        epoch: u64,
        master: u64,
        in_sync: BTreeSet<u64>,
        #[serde(default)]
        in_sync_version: u64,
        #[serde(default)]
        incarnations: BTreeMap<u64, u64>,
    },
}

/// The result of applying a [`Command`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum CommandOutcome {
    /// The command was applied; the state after it.
    Applied(GroupState),
    /// The command's condition did not hold; the (unchanged) current state.
    Rejected(GroupState),
}

impl CommandOutcome {
    /// The state carried by either outcome.
    pub fn state(&self) -> &GroupState {
        match self {
            CommandOutcome::Applied(s) | CommandOutcome::Rejected(s) => s,
        }
    }

    pub fn is_applied(&self) -> bool {
        matches!(self, CommandOutcome::Applied(_))
    }
}

impl GroupState {
    /// Applies `command` if its condition holds (see [`Command`]).
    pub fn apply(&mut self, command: &Command) -> CommandOutcome {
        let applies = match command {
            Command::ElectMaster {
                epoch,
                master,
                in_sync,
                in_sync_version,
                incarnations,
            } => {
                Some(*epoch) == self.epoch.checked_add(1)
                    && *in_sync_version == self.in_sync_version
                    && in_sync.contains(master)
                    && (self.epoch == 0 || self.keeps_agreed_members(in_sync, incarnations))
            }
            Command::StartEpoch { epoch, master, .. } => {
                *epoch == self.epoch
                    && self.master == Some(*master)
                    && self
                        .history
                        .last()
                        .is_some_and(|last| last.epoch == *epoch && last.start_offset.is_none())
            }
            Command::AlterInSync {
                epoch,
                master,
                in_sync,
                in_sync_version,
                ..
            } => {
                *epoch == self.epoch
                    && self.master == Some(*master)
                    && *in_sync_version == self.in_sync_version
                    && in_sync.contains(master)
            }
        };
        if !applies {
            return CommandOutcome::Rejected(self.clone());
        }
        match command {
            Command::ElectMaster {
                epoch,
                master,
                in_sync,
                incarnations,
                ..
            } => {
                self.epoch = *epoch;
                self.master = Some(*master);
                self.set_in_sync(in_sync, incarnations);
                self.history.push(EpochStart {
                    epoch: *epoch,
                    master: *master,
                    start_offset: None,
                });
            }
            Command::StartEpoch { start_offset, .. } => {
                if let Some(last) = self.history.last_mut() {
                    last.start_offset = Some(*start_offset);
                }
            }
            Command::AlterInSync {
                in_sync,
                incarnations,
                ..
            } => self.set_in_sync(in_sync, incarnations),
        }
        CommandOutcome::Applied(self.clone())
    }

    /// Whether an election's set keeps only members of the agreed set, each as the same
    /// incarnation (a member the set never knew, or one back with a wiped disk, is not).
    fn keeps_agreed_members(
        &self,
        in_sync: &BTreeSet<u64>,
        incarnations: &BTreeMap<u64, u64>,
    ) -> bool {
        in_sync.iter().all(|id| {
            self.in_sync.contains(id)
                && match (self.incarnations.get(id), incarnations.get(id)) {
                    (Some(agreed), Some(proposed)) => agreed == proposed,
                    (Some(_), None) => false,
                    (None, _) => true,
                }
        })
    }

    fn set_in_sync(&mut self, in_sync: &BTreeSet<u64>, incarnations: &BTreeMap<u64, u64>) {
        self.in_sync = in_sync.clone();
        self.incarnations = incarnations
            .iter()
            .filter(|(id, _)| in_sync.contains(id))
            .map(|(id, incarnation)| (*id, *incarnation))
            .collect();
        self.in_sync_version += 1;
    }

    /// An election of `master` from `self`: conditioned on this state's in-sync version,
    /// keeping the agreed incarnations of `in_sync` (`reported` ones where none is agreed:
    /// the first election).
    pub fn elect(
        &self,
        master: u64,
        in_sync: BTreeSet<u64>,
        reported: &BTreeMap<u64, u64>,
    ) -> Command {
        let incarnations = in_sync
            .iter()
            .filter_map(|id| {
                let known = self.incarnations.get(id).or_else(|| reported.get(id));
                known.map(|incarnation| (*id, *incarnation))
            })
            .collect();
        Command::ElectMaster {
            epoch: self.epoch + 1,
            master,
            in_sync,
            in_sync_version: self.in_sync_version,
            incarnations,
        }
    }

    /// The master's change of the in-sync set, conditioned on this state's version.
    pub fn alter_in_sync(
        &self,
        in_sync: BTreeSet<u64>,
        incarnations: BTreeMap<u64, u64>,
    ) -> Option<Command> {
        Some(Command::AlterInSync {
            epoch: self.epoch,
            master: self.master?,
            in_sync,
            in_sync_version: self.in_sync_version,
            incarnations,
        })
    }

    /// The CommitLog offset a returning member must truncate to before it
    /// replicates from the current master: its log is valid up to where the
    /// first epoch after its own last epoch (`last_local_epoch`) began, and never
    /// beyond its own end (`local_end`). `local_end` if no later epoch exists;
    /// None while that epoch's start is not agreed yet.
    pub fn truncation_point(&self, last_local_epoch: u64, local_end: u64) -> Option<u64> {
        // An epoch superseded before it started never wrote a byte: it bounds nothing.
        let next = self.history.iter().find(|e| {
            e.epoch > last_local_epoch && (e.start_offset.is_some() || e.epoch == self.epoch)
        });
        match next {
            Some(next) => next.start_offset.map(|start| local_end.min(start)),
            None => Some(local_end),
        }
    }

    /// The history entry of `epoch`, if it was ever elected.
    pub fn epoch_start(&self, epoch: u64) -> Option<&EpochStart> {
        self.history.iter().find(|e| e.epoch == epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    /// An election conditioned on `s`'s in-sync version, keeping its incarnations.
    fn elect(s: &GroupState, epoch: u64, master: u64, in_sync: &[u64]) -> Command {
        let mut command = s.elect(master, set(in_sync), &BTreeMap::new());
        if let Command::ElectMaster { epoch: e, .. } = &mut command {
            *e = epoch;
        }
        command
    }

    /// Widens the set to hold `in_sync` (as the current master would once they caught
    /// up), then elects `master` and agrees its start: the commands a failover applies.
    fn elect_and_start(
        s: &mut GroupState,
        epoch: u64,
        master: u64,
        start: u64,
        in_sync: &[u64],
    ) -> bool {
        let wider: BTreeSet<u64> = s.in_sync.union(&set(in_sync)).copied().collect();
        if let Some(widen) = s.alter_in_sync(wider, BTreeMap::new()) {
            assert!(s.apply(&widen).is_applied());
        }
        let election = elect(s, epoch, master, in_sync);
        s.apply(&election).is_applied()
            && s.apply(&Command::StartEpoch {
                epoch,
                master,
                start_offset: start,
            })
            .is_applied()
    }

    fn alter(s: &GroupState, master: u64, ids: &[u64]) -> Command {
        Command::AlterInSync {
            epoch: s.epoch,
            master,
            in_sync: set(ids),
            in_sync_version: s.in_sync_version,
            incarnations: BTreeMap::new(),
        }
    }

    #[test]
    fn elect_master_needs_the_next_epoch_the_version_and_master_in_sync() {
        let mut s = GroupState::default();
        assert!(!s.apply(&elect(&s, 2, 1, &[1])).is_applied());
        assert!(!s.apply(&elect(&s, 1, 1, &[2, 3])).is_applied());
        let mut stale_version = elect(&s, 1, 1, &[1, 2, 3]);
        if let Command::ElectMaster {
            in_sync_version, ..
        } = &mut stale_version
        {
            *in_sync_version = 7;
        }
        assert!(!s.apply(&stale_version).is_applied());
        assert_eq!(s, GroupState::default());
        let out = s.apply(&elect(&s, 1, 1, &[1, 2, 3]));
        assert!(out.is_applied());
        assert_eq!(s.epoch, 1);
        assert_eq!(s.master, Some(1));
        assert_eq!(s.in_sync, set(&[1, 2, 3]));
        assert_eq!(s.in_sync_version, 1);
        assert_eq!(
            s.history,
            vec![EpochStart {
                epoch: 1,
                master: 1,
                start_offset: None
            }]
        );
        assert_eq!(out.state(), &s);
        // Stale: the same epoch again.
        let before = s.clone();
        assert_eq!(
            s.apply(&elect(&before, 1, 2, &[2])),
            CommandOutcome::Rejected(before.clone())
        );
        assert_eq!(s, before);
        assert!(s.apply(&elect(&before, 2, 2, &[2, 3])).is_applied());
        assert_eq!(s.history.len(), 2);
    }

    /// Issue 36's loss: a paused replica that led consensus resumes with the set it knew
    /// before the master shrank it, and proposes itself with a set of its own.
    #[test]
    fn a_stale_leaders_self_election_is_refused() {
        let mut s = GroupState::default();
        assert!(s.apply(&elect(&s, 1, 0, &[0, 1, 2])).is_applied());
        let stale_view = s.clone();
        // While member 2 is paused, the master drops it and goes on with member 1.
        assert!(s.apply(&alter(&s, 0, &[0, 1])).is_applied());
        // Member 2 resumes believing it leads, the master silent in its old reports.
        let self_election = elect(&stale_view, 2, 2, &[2]);
        let before = s.clone();
        assert_eq!(
            s.apply(&self_election),
            CommandOutcome::Rejected(before.clone())
        );
        // Even with the current version, a member outside the agreed set is not elected.
        assert!(!s.apply(&elect(&s, 2, 2, &[2])).is_applied());
        assert!(
            !s.apply(&elect(&s, 2, 1, &[1, 2])).is_applied(),
            "the set only shrinks"
        );
        assert_eq!(s, before);
        assert!(s.apply(&elect(&s, 2, 1, &[1])).is_applied());
    }

    #[test]
    fn a_member_back_with_another_incarnation_is_not_elected() {
        let mut s = GroupState::default();
        let first = s.elect(
            0,
            set(&[0, 1, 2]),
            &BTreeMap::from([(0, 10), (1, 11), (2, 12)]),
        );
        assert!(s.apply(&first).is_applied());
        assert_eq!(s.incarnations, BTreeMap::from([(0, 10), (1, 11), (2, 12)]));
        let mut wiped = s.elect(1, set(&[1, 2]), &BTreeMap::new());
        if let Command::ElectMaster { incarnations, .. } = &mut wiped {
            incarnations.insert(1, 99);
        }
        assert!(!s.apply(&wiped).is_applied());
        let mut forgotten = s.elect(1, set(&[1, 2]), &BTreeMap::new());
        if let Command::ElectMaster { incarnations, .. } = &mut forgotten {
            incarnations.remove(&1);
        }
        assert!(!s.apply(&forgotten).is_applied());
        assert!(s
            .apply(&s.elect(1, set(&[1, 2]), &BTreeMap::new()))
            .is_applied());
        assert_eq!(s.incarnations, BTreeMap::from([(1, 11), (2, 12)]));
    }

    #[test]
    fn only_the_elected_master_starts_its_epoch_and_only_once() {
        let mut s = GroupState::default();
        s.apply(&elect(&s, 1, 1, &[1, 2]));
        let start = |epoch, master, start_offset| Command::StartEpoch {
            epoch,
            master,
            start_offset,
        };
        assert!(!s.apply(&start(1, 2, 10)).is_applied(), "not the master");
        assert!(!s.apply(&start(2, 1, 10)).is_applied(), "not the epoch");
        assert!(s.apply(&start(1, 1, 10)).is_applied());
        assert!(!s.apply(&start(1, 1, 20)).is_applied(), "already started");
        assert_eq!(s.epoch_start(1).and_then(|e| e.start_offset), Some(10));
    }

    #[test]
    fn alter_in_sync_needs_the_current_epoch_master_and_version() {
        let mut s = GroupState::default();
        assert!(!s.apply(&alter(&s, 1, &[1])).is_applied());
        s.apply(&elect(&s, 1, 1, &[1, 2, 3]));
        let mut old_epoch = alter(&s, 1, &[1]);
        if let Command::AlterInSync { epoch, .. } = &mut old_epoch {
            *epoch = 0;
        }
        assert!(!s.apply(&old_epoch).is_applied());
        assert!(!s.apply(&alter(&s, 2, &[2])).is_applied());
        assert!(!s.apply(&alter(&s, 1, &[2, 3])).is_applied());
        let decided = s.clone();
        assert!(s.apply(&alter(&decided, 1, &[1, 3])).is_applied());
        assert_eq!(s.in_sync, set(&[1, 3]));
        assert!(
            !s.apply(&alter(&decided, 1, &[1, 2])).is_applied(),
            "decided from the set before the last change"
        );
        assert_eq!(s.history.len(), 1);
    }

    #[test]
    fn truncation_point_examples() {
        let mut s = GroupState::default();
        assert_eq!(s.truncation_point(0, 50), Some(50));
        assert!(elect_and_start(&mut s, 1, 1, 0, &[1, 2]));
        assert!(elect_and_start(&mut s, 2, 2, 100, &[2]));
        assert!(elect_and_start(&mut s, 3, 1, 250, &[1]));
        // A member last in epoch 1 with 120 bytes: epoch 2 began at 100.
        assert_eq!(s.truncation_point(1, 120), Some(100));
        // ... with only 80 bytes: keeps all (never past its own end).
        assert_eq!(s.truncation_point(1, 80), Some(80));
        assert_eq!(s.truncation_point(2, 300), Some(250));
        // Last in the current epoch: nothing to cut.
        assert_eq!(s.truncation_point(3, 300), Some(300));
        // Never had an epoch: up to epoch 1's start.
        assert_eq!(s.truncation_point(0, 300), Some(0));
        // A new epoch whose start is not agreed yet: nobody can know.
        let widen = s.alter_in_sync(set(&[1, 2]), BTreeMap::new()).unwrap();
        assert!(s.apply(&widen).is_applied());
        assert!(s.apply(&elect(&s, 4, 2, &[2])).is_applied());
        assert_eq!(s.truncation_point(3, 300), None);
        // Superseded before it started (a reversed handover): it wrote nothing and bounds
        // nothing; the next started epoch does.
        assert!(elect_and_start(&mut s, 5, 1, 280, &[1]));
        assert_eq!(s.truncation_point(3, 300), Some(280));
    }

    proptest! {
        #[test]
        fn truncation_point_is_bounded_and_matches_the_next_epoch(
            starts in proptest::collection::vec(0u64..1000, 0..8),
            last_local_epoch in 0u64..10,
            local_end in 0u64..2000,
        ) {
            let mut offsets = starts.clone();
            offsets.sort_unstable();
            let mut s = GroupState::default();
            for (i, off) in offsets.iter().enumerate() {
                let epoch = i as u64 + 1;
                let master = epoch % 3 + 1;
                prop_assert!(elect_and_start(&mut s, epoch, master, *off, &[master]));
            }
            let point = s.truncation_point(last_local_epoch, local_end).expect("every start agreed");
            prop_assert!(point <= local_end);
            match s.history.iter().find(|e| e.epoch > last_local_epoch) {
                Some(next) => prop_assert_eq!(point, local_end.min(next.start_offset.unwrap())),
                None => prop_assert_eq!(point, local_end),
            }
            // Every epoch the member knew (<= last_local_epoch) began at or
            // before the point, as long as its own log reached there.
            for e in s.history.iter().filter(|e| e.epoch <= last_local_epoch) {
                prop_assert!(point >= e.start_offset.unwrap().min(local_end));
            }
        }
    }
}
