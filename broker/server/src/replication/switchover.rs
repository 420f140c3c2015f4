//! Planned switchover: the master stops taking sends, waits until the named in-sync replica
//! holds its whole log, and hands mastership to it through consensus.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use quiver_consensus::CommandOutcome;
use quiver_store::MessageStore;

use super::{Replication, Role};

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

impl Replication {
    /// Hands mastership to `target`; returns how long sends were paused.
    pub(crate) async fn switchover(
        &self,
        store: &MessageStore,
        target: u64,
        timeout: Duration,
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
        let handed = self.hand_over(store, epoch, target, timeout, paused).await;
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
    ) -> Result<(), SwitchoverError> {
        // Appends already admitted finish first; none start after.
        drop(self.appends.write());
        let end = store.log_end().0;
        self.log_grew.notify_waiters();
        self.await_caught_up(target, end, timeout, paused).await?;
        self.elect_target(epoch, target).await?;
        self.await_epoch_started(epoch, target, timeout).await
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

    /// Proposes `target` as the master of the epoch after `epoch`.
    async fn elect_target(&self, epoch: u64, target: u64) -> Result<(), SwitchoverError> {
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
            let election = state.elect(target, state.in_sync.clone(), &Default::default());
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
