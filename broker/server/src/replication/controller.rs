//! Elections. Every member reports its log end to the consensus leader a few times a
//! second; the leader, when the master has gone quiet (or there is none), elects the
//! in-sync member with the longest log through consensus. Never an unclean election: with
//! no in-sync member alive the group waits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_consensus::{Command, GroupState};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::ConsensusRequestHeader;
use quiver_protocol::RemotingCommand;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::Replication;
use crate::broker::Broker;

/// How often members report and the leader judges.
const TICK: Duration = Duration::from_millis(200);
/// A brand-new group waits this long for every member before electing among those present.
const FIRST_ELECTION_WAIT: Duration = Duration::from_secs(5);

/// One member's report to the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportBody {
    pub id: u64,
    pub log_end: u64,
    /// It is the agreed master but its log lost the epoch (a new disk): it will not serve.
    #[serde(default)]
    pub declined: bool,
}

/// What the leader last heard from a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub log_end: u64,
    pub declined: bool,
    pub at: Instant,
}

/// The leader's reports, and (on every member) when its own report was last taken.
#[derive(Debug, Default)]
pub(super) struct Reports {
    heard: BTreeMap<u64, Report>,
    /// Since when this member has led the consensus (reports before that are not its own).
    leading_since: Option<Instant>,
    /// The group as the leader last answered this member's report, and when.
    leader_view: Option<(ReportAnswer, Instant)>,
}

impl Reports {
    /// When the consensus leader last confirmed that `me` is the master of `epoch`.
    pub(super) fn confirmed_master(&self, me: u64, epoch: u64) -> Option<Instant> {
        self.leader_view
            .filter(|(view, _)| view.master == Some(me) && view.epoch == epoch)
            .map(|(_, at)| at)
    }
}

/// The leader's answer to a report: the group as it has agreed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportAnswer {
    pub epoch: u64,
    pub master: Option<u64>,
}

/// The election the leader should propose now, if any (a pure function of what it knows).
/// `leading_for`: how long this member has led; reports older than `timeout` count as gone.
pub fn decide(
    state: &GroupState,
    members: &BTreeSet<u64>,
    reports: &BTreeMap<u64, Report>,
    now: Instant,
    leading_for: Duration,
    timeout: Duration,
) -> Option<Command> {
    let alive = |id: &u64| {
        reports
            .get(id)
            .is_some_and(|r| now.saturating_duration_since(r.at) < timeout)
    };
    if let Some(master) = state.master {
        // A master whose log lost its epoch (a new disk) says it will not serve.
        let lost_log = reports.get(&master).is_some_and(|r| r.declined);
        // A new leader first gives the master a full timeout to be heard.
        if alive(&master) && !lost_log || leading_for < timeout {
            return None;
        }
    }
    let first = state.epoch == 0;
    let eligible: BTreeSet<u64> = if first {
        members.clone()
    } else {
        state.in_sync.clone()
    };
    let candidates: BTreeSet<u64> = eligible
        .iter()
        .copied()
        .filter(|id| Some(*id) != state.master && alive(id))
        .collect();
    if first && candidates.len() < members.len() && leading_for < FIRST_ELECTION_WAIT {
        return None;
    }
    // The longest log loses the least unconfirmed data; ties go to the lowest id.
    let chosen = candidates
        .iter()
        .copied()
        .max_by_key(|id| (reports[id].log_end, std::cmp::Reverse(*id)))?;
    Some(Command::ElectMaster {
        epoch: state.epoch + 1,
        master: chosen,
        in_sync: candidates,
    })
}

/// Reports to the leader and, on the leader, elects when needed.
pub(super) async fn run(
    broker: Arc<Broker>,
    replication: Arc<Replication>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let Some(consensus) = replication.consensus() else {
            continue;
        };
        let report = ReportBody {
            id: replication.id,
            log_end: broker.store.log_end().0,
            declined: replication
                .declined
                .load(std::sync::atomic::Ordering::Acquire),
        };
        match consensus.leader() {
            Some(leader) if leader == replication.id => {
                replication.record_report(report);
                elect_if_needed(&replication).await;
            }
            Some(leader) => {
                replication.reports.lock().leading_since = None;
                send_report(&replication, leader, report).await;
            }
            None => replication.reports.lock().leading_since = None,
        }
    }
}

async fn elect_if_needed(replication: &Replication) {
    let Some(consensus) = replication.consensus() else {
        return;
    };
    let now = Instant::now();
    let (reports, leading_for) = {
        let mut reports = replication.reports.lock();
        let since = *reports.leading_since.get_or_insert(now);
        (reports.heard.clone(), now - since)
    };
    let state = replication.state();
    let Some(election) = decide(
        &state,
        &replication.member_ids(),
        &reports,
        now,
        leading_for,
        replication.master_timeout,
    ) else {
        return;
    };
    tracing::warn!(?election, previous = ?state.master, epoch = state.epoch, "electing a master");
    if let Err(error) = consensus.propose(election).await {
        tracing::warn!(error = %error, "election not agreed yet");
    }
}

async fn send_report(replication: &Replication, leader: u64, report: ReportBody) {
    let header = ConsensusRequestHeader {
        broker_name: replication.broker_name.clone(),
        kind: "report".into(),
        from: replication.id,
    };
    let body = serde_json::to_vec(&report).unwrap_or_default();
    let request =
        RemotingCommand::request(request::QUIVER_CONSENSUS, header.to_ext()).with_body(body.into());
    let address = replication.address_of(leader);
    let sent = Instant::now();
    match replication.links.request(&address, request, TICK * 5).await {
        Ok(answer) if answer.code == response::SUCCESS => {
            match serde_json::from_slice::<ReportAnswer>(&answer.body) {
                Ok(view) => replication.reports.lock().leader_view = Some((view, sent)),
                Err(error) => tracing::debug!(%error, "unreadable answer to a report"),
            }
        }
        Ok(answer) => {
            tracing::debug!(code = answer.code, remark = ?answer.remark, "report refused")
        }
        Err(error) => tracing::debug!(error = %crate::error::chain(&error), "report not delivered"),
    }
}

impl Replication {
    /// Takes a member's report (on the leader).
    pub(crate) fn record_report(&self, report: ReportBody) {
        self.reports.lock().heard.insert(
            report.id,
            Report {
                log_end: report.log_end,
                declined: report.declined,
                at: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(1500);

    fn members() -> BTreeSet<u64> {
        BTreeSet::from([0, 1, 2])
    }

    fn state(master: u64, in_sync: &[u64]) -> GroupState {
        GroupState {
            epoch: 4,
            master: Some(master),
            in_sync: in_sync.iter().copied().collect(),
            history: Vec::new(),
        }
    }

    fn heard(now: Instant, ends: &[(u64, u64, u64)]) -> BTreeMap<u64, Report> {
        ends.iter()
            .map(|(id, log_end, ago_ms)| {
                let at = now - Duration::from_millis(*ago_ms);
                (
                    *id,
                    Report {
                        log_end: *log_end,
                        declined: false,
                        at,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn a_live_master_is_kept() {
        let now = Instant::now();
        let reports = heard(now, &[(0, 10, 100), (1, 10, 100), (2, 10, 100)]);
        let decided = decide(
            &state(0, &[0, 1, 2]),
            &members(),
            &reports,
            now,
            TIMEOUT * 2,
            TIMEOUT,
        );
        assert_eq!(decided, None);
    }

    #[test]
    fn a_silent_master_is_replaced_by_the_in_sync_member_with_the_longest_log() {
        let now = Instant::now();
        let reports = heard(now, &[(0, 30, 5000), (1, 20, 100), (2, 25, 100)]);
        let decided = decide(
            &state(0, &[0, 1, 2]),
            &members(),
            &reports,
            now,
            TIMEOUT * 2,
            TIMEOUT,
        );
        assert_eq!(
            decided,
            Some(Command::ElectMaster {
                epoch: 5,
                master: 2,
                in_sync: BTreeSet::from([1, 2]),
            })
        );
    }

    #[test]
    fn a_master_whose_log_lost_its_epoch_is_replaced() {
        let now = Instant::now();
        let mut reports = heard(now, &[(0, 0, 100), (1, 20, 100), (2, 25, 100)]);
        reports.get_mut(&0).unwrap().declined = true;
        let decided = decide(
            &state(0, &[0, 1, 2]),
            &members(),
            &reports,
            now,
            TIMEOUT * 2,
            TIMEOUT,
        );
        assert_eq!(
            decided,
            Some(Command::ElectMaster {
                epoch: 5,
                master: 2,
                in_sync: BTreeSet::from([1, 2]),
            })
        );
    }

    #[test]
    fn an_out_of_sync_member_is_never_elected() {
        let now = Instant::now();
        let reports = heard(now, &[(1, 99, 100)]);
        let decided = decide(
            &state(0, &[0, 2]),
            &members(),
            &reports,
            now,
            TIMEOUT * 2,
            TIMEOUT,
        );
        assert_eq!(
            decided, None,
            "member 2 is gone and member 1 is not in sync"
        );
    }

    #[test]
    fn a_new_leader_waits_a_timeout_before_judging_the_master() {
        let now = Instant::now();
        let reports = heard(now, &[(1, 10, 10)]);
        let decided = decide(
            &state(0, &[0, 1]),
            &members(),
            &reports,
            now,
            TIMEOUT / 2,
            TIMEOUT,
        );
        assert_eq!(decided, None);
    }

    #[test]
    fn a_new_group_elects_once_everyone_reported() {
        let now = Instant::now();
        let fresh = GroupState::default();
        let some = heard(now, &[(0, 0, 10), (1, 0, 10)]);
        assert_eq!(
            decide(&fresh, &members(), &some, now, Duration::ZERO, TIMEOUT),
            None
        );
        let all = heard(now, &[(0, 0, 10), (1, 0, 10), (2, 0, 10)]);
        assert_eq!(
            decide(&fresh, &members(), &all, now, Duration::ZERO, TIMEOUT),
            Some(Command::ElectMaster {
                epoch: 1,
                master: 0,
                in_sync: members(),
            })
        );
    }
}
