//! The replicated state of a broker group and the commands that change it.

use std::collections::BTreeSet;

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
/// conditional on the state they are applied to (compare-and-set on the epoch),
/// so a stale or duplicated proposal is `Rejected` rather than applied twice.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Applied only if `epoch == state.epoch + 1` and `in_sync` contains
    /// `master`: sets master and in-sync set and appends
    /// `EpochStart { epoch, master, start_offset: None }` to the history.
    ElectMaster {
        epoch: u64,
        master: u64,
        in_sync: BTreeSet<u64>,
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
    /// Applied only if `epoch == state.epoch`, `state.master == Some(master)`
    /// and `in_sync` contains `master`: replaces the in-sync set.
    AlterInSync {
        epoch: u64,
        master: u64,
        in_sync: BTreeSet<u64>,
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
        match command {
            Command::ElectMaster {
                epoch,
                master,
                in_sync,
            } => {
                if Some(*epoch) != self.epoch.checked_add(1) || !in_sync.contains(master) {
                    return CommandOutcome::Rejected(self.clone());
                }
                self.epoch = *epoch;
                self.master = Some(*master);
                self.in_sync = in_sync.clone();
                self.history.push(EpochStart {
                    epoch: *epoch,
                    master: *master,
                    start_offset: None,
                });
            }
            Command::StartEpoch {
                epoch,
                master,
                start_offset,
            } => {
                let current = *epoch == self.epoch && self.master == Some(*master);
                let open = self
                    .history
                    .last_mut()
                    .filter(|last| current && last.epoch == *epoch && last.start_offset.is_none());
                let Some(last) = open else {
                    return CommandOutcome::Rejected(self.clone());
                };
                last.start_offset = Some(*start_offset);
            }
            Command::AlterInSync {
                epoch,
                master,
                in_sync,
            } => {
                if *epoch != self.epoch || self.master != Some(*master) || !in_sync.contains(master)
                {
                    return CommandOutcome::Rejected(self.clone());
                }
                self.in_sync = in_sync.clone();
            }
        }
        CommandOutcome::Applied(self.clone())
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

    /// Elects `master` and agrees its start: the two commands a failover applies.
    fn elect_and_start(
        s: &mut GroupState,
        epoch: u64,
        master: u64,
        start: u64,
        in_sync: &[u64],
    ) -> bool {
        s.apply(&elect(epoch, master, in_sync)).is_applied()
            && s.apply(&Command::StartEpoch {
                epoch,
                master,
                start_offset: start,
            })
            .is_applied()
    }

    fn elect(epoch: u64, master: u64, in_sync: &[u64]) -> Command {
        Command::ElectMaster {
            epoch,
            master,
            in_sync: set(in_sync),
        }
    }

    #[test]
    fn elect_master_needs_the_next_epoch_and_master_in_sync() {
        let mut s = GroupState::default();
        assert!(!s.apply(&elect(2, 1, &[1])).is_applied());
        assert!(!s.apply(&elect(1, 1, &[2, 3])).is_applied());
        assert_eq!(s, GroupState::default());
        let out = s.apply(&elect(1, 1, &[1, 2, 3]));
        assert!(out.is_applied());
        assert_eq!(s.epoch, 1);
        assert_eq!(s.master, Some(1));
        assert_eq!(s.in_sync, set(&[1, 2, 3]));
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
            s.apply(&elect(1, 2, &[2])),
            CommandOutcome::Rejected(before.clone())
        );
        assert_eq!(s, before);
        assert!(s.apply(&elect(2, 2, &[2, 3])).is_applied());
        assert_eq!(s.history.len(), 2);
    }

    #[test]
    fn only_the_elected_master_starts_its_epoch_and_only_once() {
        let mut s = GroupState::default();
        s.apply(&elect(1, 1, &[1, 2]));
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
    fn alter_in_sync_needs_the_current_epoch_and_master() {
        let mut s = GroupState::default();
        let alter = |epoch, master, ids: &[u64]| Command::AlterInSync {
            epoch,
            master,
            in_sync: set(ids),
        };
        assert!(!s.apply(&alter(0, 1, &[1])).is_applied());
        s.apply(&elect(1, 1, &[1, 2, 3]));
        assert!(!s.apply(&alter(0, 1, &[1])).is_applied());
        assert!(!s.apply(&alter(1, 2, &[2])).is_applied());
        assert!(!s.apply(&alter(1, 1, &[2, 3])).is_applied());
        assert!(s.apply(&alter(1, 1, &[1, 3])).is_applied());
        assert_eq!(s.in_sync, set(&[1, 3]));
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
        s.apply(&elect(4, 2, &[2]));
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
