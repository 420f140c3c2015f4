//! Switchovers: the master stops taking sends, waits until an in-sync replica holds its whole
//! log, and hands mastership to it through consensus. Planned (QUIVER_SWITCHOVER names the
//! replica) or on shutdown (SIGTERM: the replica that has acknowledged the most). A master
//! that leads the group's consensus hands that leadership to the new master too.
//!
//! Switchovers are counted by cause on the member that had the change agreed, once the group
//! agreed it: the old master for planned and shutdown handovers, the consensus leader for a
//! failover (an election replacing a master that did not hand over). A group's total is the
//! sum over its members.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use quiver_consensus::CommandOutcome;
use quiver_store::MessageStore;

use super::{Replication, Role};

/// Why mastership moved (the `cause` label of `quiver_replication_switchovers_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwitchoverCause {
    /// QUIVER_SWITCHOVER (`quiver replication switchover`).
    Planned,
    /// The master handed over as it stopped (SIGTERM, SIGINT).
    Shutdown,
    /// The group elected a new master after the old one went silent or lost its log.
    Failover,
}

impl SwitchoverCause {
    pub const ALL: [SwitchoverCause; 3] = [
        SwitchoverCause::Planned,
        SwitchoverCause::Shutdown,
        SwitchoverCause::Failover,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SwitchoverCause::Planned => "planned",
            SwitchoverCause::Shutdown => "shutdown",
            SwitchoverCause::Failover => "failover",
        }
    }
}

/// Switchovers this member had agreed, by [`SwitchoverCause`].
#[derive(Debug, Default)]
pub(super) struct Switchovers([u64; SwitchoverCause::ALL.len()]);

impl Switchovers {
    pub(super) fn count(&mut self, cause: SwitchoverCause) {
        self.0[cause as usize] += 1;
    }
}

/// Why a switchover did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SwitchoverError {
    #[error("member {id} is not the master ({role:?}); send the switchover to the master")]
    NotMaster { id: u64, role: Role },
    #[error("member {0} is not in the in-sync set; only an in-sync replica can take over")]
    NotInSync(u64),
    #[error("member {0} is already the master")]
    AlreadyMaster(u64),
    #[error("member {target} did not catch up with the master's log end {end} within {timeout:?} (it holds {acked})")]
    CatchUp {
        target: u64,
        end: u64,
        acked: u64,
        timeout: Duration,
    },
    #[error("the group did not agree the handover: {0}")]
    Consensus(String),
    #[error("the handover to member {0} was not acted on within the timeout")]
    NotTaken(u64),
}

/// How long a switchover may pause sends by default.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The bound of handing the consensus leadership to the new master after a planned
/// switchover: a leader waits out its lease (1 s by default) after its election before
/// another can win one.
const CONSENSUS_HANDOVER_TIMEOUT: Duration = Duration::from_secs(3);

impl Replication {
    /// (cause label, switchovers this member had agreed) for every cause.
    pub fn switchovers(&self) -> Vec<(&'static str, u64)> {
        let counted = self.reports.lock().switchovers.0;
        SwitchoverCause::ALL
            .iter()
            .map(|cause| (cause.label(), counted[*cause as usize]))
            .collect()
    }

    /// Hands mastership to `target` (a planned switchover); returns how long sends were
    /// paused.
    pub(crate) async fn switchover(
        &self,
        store: &MessageStore,
        target: u64,
        timeout: Duration,
    ) -> Result<Duration, SwitchoverError> {
        let paused = self
            .switchover_for(store, target, timeout, SwitchoverCause::Planned)
            .await?;
        // The consensus leadership follows mastership, once sends flow again (so this adds
        // nothing to the pause). Left here, the new master would renew its lease through this
        // member, and stopping this member later would stall the new master's sends for an
        // election and the lease the others hold on this member (~2 s by default); with the
        // master leading the consensus, its renewals are its own and a replica stopping costs
        // nothing.
        self.hand_consensus_to(target, CONSENSUS_HANDOVER_TIMEOUT)
            .await;
        Ok(paused)
    }

    async fn switchover_for(
        &self,
        store: &MessageStore,
        target: u64,
        timeout: Duration,
        cause: SwitchoverCause,
    ) -> Result<Duration, SwitchoverError> {
        let role = self.role();
        let Role::Master { epoch } = role else {
            return Err(SwitchoverError::NotMaster { id: self.id, role });
        };
        if target == self.id {
            return Err(SwitchoverError::AlreadyMaster(target));
        }
        let state = self.state();
        if !state.in_sync.contains(&target) {
            return Err(SwitchoverError::NotInSync(target));
        }
        let paused = Instant::now();
        self.switching.store(true, Ordering::Release);
        let handed = self
            .hand_over(store, epoch, target, timeout, paused, cause)
            .await;
        // After a handover sends stay refused here: this member is no longer the master,
        // even before its role follows the new state.
        if handed.is_err() {
            self.switching.store(false, Ordering::Release);
        }
        handed.map(|()| paused.elapsed())
    }

    async fn hand_over(
        &self,
        store: &MessageStore,
        epoch: u64,
        target: u64,
        timeout: Duration,
        paused: Instant,
        cause: SwitchoverCause,
    ) -> Result<(), SwitchoverError> {
        // Appends already admitted finish first; none start after.
        drop(self.appends.write());
        let end = store.log_end().0;
        self.log_grew.notify_waiters();
        self.await_caught_up(target, end, timeout, paused).await?;
        let led_consensus = cause == SwitchoverCause::Shutdown && self.leads_consensus();
        if led_consensus {
            // Before the election, so that the successor leads the consensus when it starts
            // its epoch (the election is forwarded to it).
            let left = timeout.saturating_sub(paused.elapsed());
            self.hand_consensus_to(target, left).await;
        }
        self.elect_target(epoch, target, cause).await?;
        self.reports.lock().switchovers.count(cause);
        if led_consensus {
            self.resign_consensus().await;
            return Ok(());
        }
        self.await_epoch_started(epoch, target, timeout).await
    }

    /// If this member leads the group's consensus: hands that leadership to `target` (the
    /// new master), within `timeout`. A failure is logged only: the consensus leader then
    /// stays, or the group elects one.
    async fn hand_consensus_to(&self, target: u64, timeout: Duration) {
        let Some(consensus) = self.consensus().filter(|c| c.is_leader()) else {
            return;
        };
        match consensus.transfer_leadership(target, timeout).await {
            Ok(leader) => tracing::info!(
                target,
                leader,
                "handed the group's consensus leadership to the new master"
            ),
            Err(error) => tracing::warn!(
                target,
                %error,
                "could not hand the group's consensus leadership to the new master"
            ),
        }
    }

    /// A stopping member that led the group's consensus stops its node once its successor is
    /// agreed. If it handed the leadership over, the others keep a leader, and stopping now
    /// keeps it from applying the successor's epoch start, following it and rejoining its
    /// in-sync set moments before it exits (the successor's sends would then wait for it
    /// until it is dropped, seconds). If it still leads, the others need about an election
    /// timeout to elect a new leader, and the new master's lease needs one: this way the new
    /// master starts its epoch after that, rather than starting on this member's word and
    /// losing its lease when it goes.
    async fn resign_consensus(&self) {
        if let Some(consensus) = self.consensus() {
            tracing::info!("this member led the group's consensus: stopping its node");
            consensus.shutdown().await;
        }
    }

    /// Waits until `target` has acknowledged the log up to `end`, within what is left of
    /// `timeout` since `paused`.
    async fn await_caught_up(
        &self,
        target: u64,
        end: u64,
        timeout: Duration,
        paused: Instant,
    ) -> Result<(), SwitchoverError> {
        loop {
            let recorded = self.fetch_recorded.notified();
            tokio::pin!(recorded);
            // Registered before the check, so a fetch recorded in between still wakes us.
            recorded.as_mut().enable();
            let acked = self
                .progress
                .lock()
                .followers
                .get(&target)
                .map_or(0, |f| f.acked);
            if acked >= end {
                return Ok(());
            }
            let left = timeout.saturating_sub(paused.elapsed());
            if left.is_zero() || tokio::time::timeout(left, recorded).await.is_err() {
                return Err(SwitchoverError::CatchUp {
                    target,
                    end,
                    acked,
                    timeout,
                });
            }
        }
    }

    /// Proposes `target` as the master of the epoch after `epoch`. A master that hands over
    /// as it stops leaves the new epoch's in-sync set: sends do not wait for it.
    async fn elect_target(
        &self,
        epoch: u64,
        target: u64,
        cause: SwitchoverCause,
    ) -> Result<(), SwitchoverError> {
        let consensus = self
            .consensus()
            .ok_or_else(|| SwitchoverError::Consensus("consensus not started".into()))?;
        let mut state = self.state();
        // An in-sync change agreed meanwhile (a replica joining) refuses the election: it is
        // decided again from the state that refused it, a few times at most.
        for attempt in 1.. {
            if state.epoch != epoch || !state.in_sync.contains(&target) {
                return Err(SwitchoverError::Consensus(format!(
                    "refused: the group is at epoch {} with in-sync set {:?}",
                    state.epoch, state.in_sync
                )));
            }
            let mut in_sync = state.in_sync.clone();
            if cause == SwitchoverCause::Shutdown {
                in_sync.remove(&self.id);
            }
            let election = state.elect(target, in_sync, &Default::default());
            match consensus.propose(election).await {
                Ok(CommandOutcome::Applied(_)) => break,
                Ok(CommandOutcome::Rejected(current)) if attempt < 3 => state = current,
                Ok(CommandOutcome::Rejected(current)) => {
                    return Err(SwitchoverError::Consensus(format!(
                        "refused: the group is at epoch {} (in-sync version {})",
                        current.epoch, current.in_sync_version
                    )))
                }
                Err(error) => return Err(SwitchoverError::Consensus(error.to_string())),
            }
        }
        Ok(())
    }

    /// Done once the new master has agreed where its epoch starts.
    async fn await_epoch_started(
        &self,
        epoch: u64,
        target: u64,
        timeout: Duration,
    ) -> Result<(), SwitchoverError> {
        let mut state = self.state.subscribe();
        let started = tokio::time::timeout(timeout.max(Duration::from_secs(1)), async {
            loop {
                let taken = state
                    .borrow_and_update()
                    .history
                    .iter()
                    .any(|start| start.epoch == epoch + 1 && start.start_offset.is_some());
                if taken || state.changed().await.is_err() {
                    return taken;
                }
            }
        })
        .await;
        match started {
            Ok(true) => Ok(()),
            _ => Err(SwitchoverError::NotTaken(target)),
        }
    }
}

impl Replication {
    /// On SIGTERM: a master hands mastership to the in-sync replica that has acknowledged the
    /// most, within `timeout`. It returns once the successor's epoch start is agreed, so the
    /// stopping member does not follow the successor (and rejoin its in-sync set) before it
    /// goes. A replica, or a master whose handover fails or runs late (logged), returns at
    /// once and stops plainly: the group then elects.
    pub async fn hand_over_for_shutdown(&self, store: &MessageStore, timeout: Duration) {
        if timeout.is_zero() || !matches!(self.role(), Role::Master { .. }) {
            return;
        }
        let Some(target) = self.most_caught_up_replica() else {
            tracing::warn!("no in-sync replica to hand mastership to; stopping without a switchover (the group elects after the master timeout)");
            return;
        };
        tracing::info!(target, ?timeout, "stopping: handing mastership over first");
        let started = Instant::now();
        let shutdown = SwitchoverCause::Shutdown;
        let handed = tokio::time::timeout(
            timeout,
            self.switchover_for(store, target, timeout, shutdown),
        )
        .await;
        match handed {
            Ok(Ok(_)) => tracing::info!(
                target,
                took = ?started.elapsed(),
                "mastership handed over; stopping"
            ),
            Ok(Err(error)) => tracing::warn!(
                %error,
                "no switchover before stopping; stopping plainly (the group elects after the master timeout)"
            ),
            Err(_) => tracing::warn!(
                target,
                ?timeout,
                "the switchover did not finish within --shutdown-switchover-timeout-ms; stopping plainly"
            ),
        }
    }

    /// The in-sync replica holding the most of this master's log.
    fn most_caught_up_replica(&self) -> Option<u64> {
        let in_sync = self.state.borrow().in_sync.clone();
        let progress = self.progress.lock();
        most_caught_up(self.id, &in_sync, |id| {
            progress.followers.get(&id).map_or(0, |f| f.acked)
        })
    }
}

/// The member of `in_sync` but `me` that acknowledged the most (ties to the lowest id).
fn most_caught_up(me: u64, in_sync: &BTreeSet<u64>, acked: impl Fn(u64) -> u64) -> Option<u64> {
    in_sync
        .iter()
        .copied()
        .filter(|id| *id != me)
        .max_by_key(|id| (acked(*id), std::cmp::Reverse(*id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shutdown_target_is_the_in_sync_replica_that_acknowledged_the_most() {
        let acked = |id: u64| [900, 300, 700, 800][id as usize];
        let in_sync = BTreeSet::from([0, 1, 2]);
        // Member 3 acknowledged more but is not in sync; the master (0) is never its own target.
        assert_eq!(most_caught_up(0, &in_sync, acked), Some(2));
        assert_eq!(most_caught_up(0, &BTreeSet::from([0]), acked), None);
        let level = |_: u64| 500;
        assert_eq!(
            most_caught_up(2, &in_sync, level),
            Some(0),
            "ties go to the lowest id"
        );
    }

    #[test]
    fn switchovers_are_counted_by_cause() {
        let mut counted = Switchovers::default();
        counted.count(SwitchoverCause::Shutdown);
        counted.count(SwitchoverCause::Shutdown);
        counted.count(SwitchoverCause::Failover);
        let labelled: Vec<_> = SwitchoverCause::ALL
            .iter()
            .map(|cause| (cause.label(), counted.0[*cause as usize]))
            .collect();
        assert_eq!(labelled, [("planned", 0), ("shutdown", 2), ("failover", 1)]);
    }
}
