//! Acting on the group's state: becoming master (once this member's start offset for the
//! epoch is agreed), following a master as a replica, or waiting without a role.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_consensus::{Command, CommandOutcome, GroupState};
use tokio::sync::watch;

use super::Member;
use super::{replica, Replication, Role};

/// How often the master re-checks its in-sync set and its lease.
const MASTER_TICK: Duration = Duration::from_millis(100);

/// What this member should do for the agreed `state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Duty {
    Wait,
    /// Agree where this member's epoch starts, then take writes.
    StartEpoch {
        epoch: u64,
    },
    Master {
        epoch: u64,
    },
    Follow {
        epoch: u64,
        master: u64,
    },
}

/// The duty `state` gives member `me`.
pub(super) fn duty(state: &GroupState, me: u64) -> Duty {
    let Some(master) = state.master else {
        return Duty::Wait;
    };
    let started = state
        .history
        .iter()
        .any(|start| start.epoch == state.epoch && start.start_offset.is_some());
    match (master == me, started) {
        (true, true) => Duty::Master { epoch: state.epoch },
        (true, false) => Duty::StartEpoch { epoch: state.epoch },
        // A replica can only truncate against an agreed start.
        (false, true) => Duty::Follow {
            epoch: state.epoch,
            master,
        },
        (false, false) => Duty::Wait,
    }
}

pub(super) async fn run(
    broker: Arc<dyn Member>,
    replication: Arc<Replication>,
    mut stop: watch::Receiver<bool>,
) {
    let mut state = replication.state.subscribe();
    loop {
        let current = state.borrow_and_update().clone();
        let duty = duty(&current, replication.id);
        if !matches!(duty, Duty::Master { .. }) {
            replication
                .declined
                .store(false, std::sync::atomic::Ordering::Release);
        }
        match duty {
            Duty::Wait => {
                replication.role.send_replace(Role::Unknown);
            }
            Duty::StartEpoch { epoch } => {
                replication.role.send_replace(Role::Unknown);
                start_epoch(&*broker, &replication, epoch).await;
            }
            Duty::Master { epoch } if !holds_epoch(&replication, epoch) => {
                // The agreed master, but its log no longer reaches where its epoch started
                // (the data directory was lost): it must not serve. Its reports show it, so
                // the group elects another.
                replication.role.send_replace(Role::Unknown);
                tracing::error!(epoch, end = broker.store().log_end().0, "this member is the group's master but its log lost the epoch; waiting for the group to elect another");
            }
            Duty::Master { epoch } | Duty::Follow { epoch, .. } => {
                // Acts until the state gives another duty or the broker stops.
                let mut watching = replication.state.subscribe();
                let mut acting_stop = stop.clone();
                let acting = async {
                    match duty {
                        Duty::Follow { master, .. } => {
                            follow(&broker, &replication, epoch, master, &mut acting_stop).await
                        }
                        _ => serve_as_master(&*broker, &replication, epoch, &mut acting_stop).await,
                    }
                };
                tokio::select! {
                    _ = acting => {}
                    _ = wait_for_other_duty(&mut watching, replication.id, duty) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        if *stop.borrow() {
            replication.role.send_replace(Role::Unknown);
            return;
        }
        if !matches!(duty, Duty::Master { .. } | Duty::Follow { .. })
            || replication.role() == Role::Unknown
        {
            tokio::select! {
                _ = stop.changed() => return,
                _ = state.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }
}

/// Whether this member's log holds the epoch it is master of (its epoch file, written
/// before the epoch's start was proposed, says so; a new disk has none).
fn holds_epoch(replication: &Replication, epoch: u64) -> bool {
    let holds = replication.epoch_file.epoch() >= epoch;
    replication
        .declined
        .store(!holds, std::sync::atomic::Ordering::Release);
    holds
}

async fn wait_for_other_duty(state: &mut watch::Receiver<GroupState>, me: u64, current: Duty) {
    loop {
        if duty(&state.borrow_and_update(), me) != current {
            return;
        }
        if state.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Records this member's log end as where `epoch` starts: nothing of an older epoch can
/// arrive any more (the fetcher stopped), so every member can truncate against it.
async fn start_epoch(broker: &dyn Member, replication: &Replication, epoch: u64) {
    let Some(consensus) = replication.consensus() else {
        return;
    };
    let start_offset = broker.store().log_end().0;
    if let Err(error) = replication.epoch_file.advance(epoch) {
        tracing::error!(error = %crate::error::chain(&error), "cannot record the epoch this member starts; not taking mastership");
        return;
    }
    let command = Command::StartEpoch {
        epoch,
        master: replication.id,
        start_offset,
    };
    match consensus.propose(command).await {
        Ok(CommandOutcome::Applied(_)) => {
            tracing::info!(epoch, start_offset, "this member is the group's master")
        }
        Ok(CommandOutcome::Rejected(state)) => {
            tracing::info!(
                epoch,
                current = state.epoch,
                "epoch start refused: the group moved on"
            )
        }
        Err(error) => tracing::warn!(error = %error, epoch, "cannot agree the epoch's start yet"),
    }
}

/// Serves as master of `epoch` until the state says otherwise: fences the store at the
/// confirmed offset, keeps the in-sync set and the lease.
async fn serve_as_master(
    broker: &dyn Member,
    replication: &Replication,
    epoch: u64,
    stop: &mut watch::Receiver<bool>,
) {
    replication.progress.lock().reset();
    replication.streams.clear();
    replication.expanding.lock().clear();
    replication
        .switching
        .store(false, std::sync::atomic::Ordering::Release);
    // A restarted member acts on its saved state: it takes writes only once the group
    // confirms it is the master of this epoch now.
    *replication.lease.lock() = None;
    replication.role.send_replace(Role::Unknown);
    while !renew_lease(replication, epoch).await {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(MASTER_TICK) => {}
        }
    }
    if let Err(error) = broker
        .transactions()
        .reload(broker.store(), broker.offsets())
    {
        tracing::error!(error = %crate::error::chain(&error), "cannot reload the transaction state; half messages are checked from what this member knew");
    }
    let clamped = super::metadata::clamp_offsets_to_log(broker);
    if clamped > 0 {
        tracing::warn!(
            clamped,
            "committed offsets past this member's queues moved back to their ends"
        );
    }
    replication.role.send_replace(Role::Master { epoch });
    replication.advance_confirmed(broker.store());
    tracing::info!(epoch, "taking writes as the group's master");
    let mut tick = tokio::time::interval(MASTER_TICK);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        renew_lease(replication, epoch).await;
        replication.advance_confirmed(broker.store());
        let Some(change) = replication.in_sync_change(broker.store()) else {
            continue;
        };
        let Some(consensus) = replication.consensus() else {
            continue;
        };
        tracing::info!(?change, "proposing a new in-sync set");
        replication.count_joining(&change, broker.store());
        match consensus.propose(change).await {
            Ok(CommandOutcome::Applied(_)) => {}
            Ok(CommandOutcome::Rejected(state)) => {
                tracing::info!(
                    current = state.epoch,
                    "in-sync change refused: the group moved on"
                )
            }
            Err(error) => tracing::warn!(error = %error, "cannot change the in-sync set now"),
        }
        // Agreed members count through the state from here; refused ones no longer count.
        replication.expanding.lock().clear();
        replication.advance_confirmed(broker.store());
    }
}

/// The master keeps taking writes only while a quorum of the group confirms it is the
/// master of `epoch`: a linearizable read on the consensus leader, the leader's answer to
/// its report otherwise. Whether the lease was renewed.
async fn renew_lease(replication: &Replication, epoch: u64) -> bool {
    let Some(consensus) = replication.consensus() else {
        return false;
    };
    let asked = Instant::now();
    let heard = if consensus.is_leader() {
        let state = consensus.ensure_current().await.ok();
        state
            .filter(|state| state.master == Some(replication.id) && state.epoch == epoch)
            .map(|_| asked)
    } else {
        replication
            .reports
            .lock()
            .confirmed_master(replication.id, epoch)
    };
    let Some(heard) = heard else {
        return false;
    };
    let mut lease = replication.lease.lock();
    *lease = Some(lease.map_or(heard, |at| at.max(heard)));
    heard.elapsed() < replication.master_timeout * 2 / 3
}

async fn follow(
    broker: &Arc<dyn Member>,
    replication: &Replication,
    epoch: u64,
    master: u64,
    stop: &mut watch::Receiver<bool>,
) {
    replication
        .role
        .send_replace(Role::Replica { epoch, master });
    replica::follow(broker, replication, epoch, master, stop).await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use quiver_consensus::EpochStart;

    use super::*;

    fn state(master: Option<u64>, started: bool) -> GroupState {
        GroupState {
            epoch: 3,
            master,
            in_sync: BTreeSet::from([0, 1]),
            history: vec![EpochStart {
                epoch: 3,
                master: master.unwrap_or(0),
                start_offset: started.then_some(42),
            }],
            ..GroupState::default()
        }
    }

    #[test]
    fn a_new_master_agrees_its_start_before_taking_writes() {
        assert_eq!(
            duty(&state(Some(1), false), 1),
            Duty::StartEpoch { epoch: 3 }
        );
        assert_eq!(duty(&state(Some(1), true), 1), Duty::Master { epoch: 3 });
    }

    #[test]
    fn replicas_follow_only_an_agreed_start() {
        assert_eq!(duty(&state(Some(1), false), 0), Duty::Wait);
        assert_eq!(
            duty(&state(Some(1), true), 0),
            Duty::Follow {
                epoch: 3,
                master: 1
            }
        );
        assert_eq!(duty(&state(None, false), 0), Duty::Wait);
    }
}
