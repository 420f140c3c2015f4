//! Elections. Every member reports its log end to the consensus leader a few times a
//! second; the leader, when the master has gone quiet (or there is none), elects the
//! in-sync member with the longest log through consensus. Never an unclean election: with
//! no in-sync member alive the group waits.
//!
//! The leader judges only from agreed, current state: each round it first confirms with a
//! quorum that it still leads (a linearizable read, which also brings its applied state up
//! to date), and a leader that was not confirmed in the previous round (a stalled process,
//! a lost quorum) forgets what it heard before and gives the master a full timeout again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_consensus::{Command, GroupState};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::ConsensusRequestHeader;
use quiver_protocol::RemotingCommand;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::Member;
use super::Replication;
use crate::periodic::{periodic, Flow};
use std::ops::ControlFlow;

/// How often members report and the leader judges.
const TICK: Duration = Duration::from_millis(200);
/// A brand-new group waits this long for every member before electing among those present.
const FIRST_ELECTION_WAIT: Duration = Duration::from_secs(5);
/// A leader confirmed longer ago than this answers no report and starts its judgement
/// afresh: below openraft's minimum election timeout (500 ms), so no other leader can have
/// been elected since the confirmation.
const LEADERSHIP_FRESH: Duration = Duration::from_millis(400);

/// One member's report to the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportBody {
    pub id: u64,
    pub log_end: u64,
    /// It is the agreed master but its log lost the epoch (a new disk): it will not serve.
    #[serde(default)]
    pub declined: bool,
    /// Its data directory's incarnation.
    #[serde(default)]
    pub incarnation: u64,
    /// It recovered from an unclean stop and has not caught up with a master since.
    #[serde(default)]
    pub unclean: bool,
}

/// What the leader last heard from a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub log_end: u64,
    pub declined: bool,
    pub incarnation: u64,
    pub unclean: bool,
    pub at: Instant,
}

/// The leader's reports, and (on every member) when its own report was last taken.
#[derive(Debug, Default)]
pub(super) struct Reports {
    heard: BTreeMap<u64, Report>,
    /// Since when this member has led the consensus without a gap (reports before that are
    /// not its own).
    leading_since: Option<Instant>,
    /// When a quorum last confirmed this member leads.
    confirmed_leader_at: Option<Instant>,
    /// An election this leader proposed is not decided yet.
    electing: bool,
    /// The group as the leader last answered this member's report, and when.
    leader_view: Option<(ReportAnswer, Instant)>,
    /// Switchovers this member had agreed, by cause (kept here, beside the elections).
    pub(super) switchovers: super::switchover::Switchovers,
}

impl Reports {
    /// The members whose reports this leader heard within `timeout` of `now`.
    pub(super) fn heard_within(&self, now: Instant, timeout: Duration) -> BTreeSet<u64> {
        self.heard
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.at) < timeout)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Whether a quorum confirmed this member leads recently enough to answer reports, and
    /// no election of its is in flight.
    pub(super) fn leads_now(&self) -> bool {
        !self.electing
            && self
                .confirmed_leader_at
                .is_some_and(|at| at.elapsed() < LEADERSHIP_FRESH)
    }

    /// Leadership was confirmed at `at`: a gap since the previous confirmation (a stalled
    /// tick loop, a lost quorum) starts the grace period afresh and drops older reports.
    fn confirmed_leadership(&mut self, at: Instant) {
        let continuous = self
            .confirmed_leader_at
            .is_some_and(|last| at.saturating_duration_since(last) < LEADERSHIP_FRESH);
        if !continuous || self.leading_since.is_none() {
            self.leading_since = Some(at);
            self.heard.retain(|_, report| report.at >= at);
        }
        self.confirmed_leader_at = Some(at);
    }

    /// Not (or no longer known to be) the leader.
    fn lost_leadership(&mut self) {
        self.leading_since = None;
        self.confirmed_leader_at = None;
    }

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
/// Candidates are the live members of the agreed in-sync set still in the incarnation the
/// set agreed and still members (a removed one may linger in the set until the master
/// drops it); ones that recovered from an unclean stop only when no clean one is alive.
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
    let same_incarnation = |id: &u64| {
        state
            .incarnations
            .get(id)
            .is_none_or(|agreed| reports[id].incarnation == *agreed)
    };
    let candidates: BTreeSet<u64> = eligible
        .iter()
        .copied()
        .filter(|id| {
            Some(*id) != state.master && members.contains(id) && alive(id) && same_incarnation(id)
        })
        .collect();
    if first && candidates.len() < members.len() && leading_for < FIRST_ELECTION_WAIT {
        return None;
    }
    // A clean member first; then the longest log loses the least unconfirmed data; ties go
    // to the lowest id.
    let chosen = candidates.iter().copied().max_by_key(|id| {
        let report = &reports[id];
        (!report.unclean, report.log_end, std::cmp::Reverse(*id))
    })?;
    let reported = candidates
        .iter()
        .map(|id| (*id, reports[id].incarnation))
        .collect();
    Some(state.elect(chosen, candidates, &reported))
}

/// Every [`TICK`]: reports to the leader and, on the leader, elects when needed.
pub(super) async fn run(
    broker: Arc<dyn Member>,
    replication: Arc<Replication>,
    stop: watch::Receiver<bool>,
) {
    let round = move || report_round(broker.clone(), replication.clone());
    // A task of its own: there the compiler proves the loop's future Send.
    let reporting = periodic("reporting to the group's leader", TICK, None, stop, round);
    let _ = tokio::spawn(reporting).await;
}

async fn report_round(broker: Arc<dyn Member>, replication: Arc<Replication>) -> Flow {
    let Some(consensus) = replication.consensus() else {
        return ControlFlow::Continue(None);
    };
    let report = replication.own_report(broker.store().log_end().0);
    match consensus.leader() {
        Some(leader) if leader == replication.id => {
            replication.record_report(report);
            elect_if_needed(&replication).await;
        }
        Some(leader) => {
            replication.reports.lock().lost_leadership();
            send_report(&replication, leader, report).await;
        }
        None => replication.reports.lock().lost_leadership(),
    }
    ControlFlow::Continue(None)
}

/// On the leader: confirms it still leads (and brings its state up to date), then elects
/// if the agreed state and the reports heard since call for it.
async fn elect_if_needed(replication: &Replication) {
    let Some(consensus) = replication.consensus() else {
        return;
    };
    let asked = Instant::now();
    let state = match consensus.ensure_current().await {
        Ok(state) => state,
        Err(error) => {
            tracing::debug!(%error, "not confirmed as the consensus leader; not judging");
            replication.reports.lock().lost_leadership();
            return;
        }
    };
    let now = Instant::now();
    let (reports, leading_for) = {
        let mut reports = replication.reports.lock();
        reports.confirmed_leadership(asked);
        let since = reports.leading_since.unwrap_or(asked);
        (reports.heard.clone(), now.saturating_duration_since(since))
    };
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
    // Until it is decided, no report renews the lease of the master being replaced (it may
    // come back meanwhile and would take writes the next epoch drops).
    replication.reports.lock().electing = true;
    let proposed = consensus.propose(election).await;
    let mut reports = replication.reports.lock();
    reports.electing = false;
    match proposed {
        // Replacing a master that did not hand over (not the group's first election).
        Ok(quiver_consensus::CommandOutcome::Applied(_)) if state.master.is_some() => reports
            .switchovers
            .count(super::switchover::SwitchoverCause::Failover),
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %error, "election not agreed yet"),
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
    /// This member's report: its log end, incarnation and whether it may be short.
    fn own_report(&self, log_end: u64) -> ReportBody {
        use std::sync::atomic::Ordering;
        ReportBody {
            id: self.id,
            log_end,
            declined: self.declined.load(Ordering::Acquire),
            incarnation: self.epoch_file.incarnation(),
            unclean: self.unclean.load(Ordering::Acquire),
        }
    }

    /// Takes a member's report (on the leader).
    pub(crate) fn record_report(&self, report: ReportBody) {
        self.reports.lock().heard.insert(
            report.id,
            Report {
                log_end: report.log_end,
                declined: report.declined,
                incarnation: report.incarnation,
                unclean: report.unclean,
                at: Instant::now(),
            },
        );
    }

    /// The leader's answer to a member's report: the group as agreed, or None while this
    /// member's leadership is not freshly confirmed (a stale leader must not extend an old
    /// master's lease).
    pub(super) fn report_answer(&self) -> Option<ReportAnswer> {
        if !self.reports.lock().leads_now() {
            return None;
        }
        let state = self.state();
        Some(ReportAnswer {
            epoch: state.epoch,
            master: state.master,
        })
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
            in_sync_version: 9,
            ..GroupState::default()
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
                        incarnation: 100 + *id,
                        unclean: false,
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
                in_sync_version: 9,
                // None agreed yet (a group from before incarnations): the reported ones.
                incarnations: BTreeMap::from([(1, 101), (2, 102)]),
            })
        );
    }

    #[test]
    fn a_removed_member_still_in_the_in_sync_set_is_not_elected() {
        let now = Instant::now();
        // Member 2 has the longest log but was removed from the membership before the
        // master dropped it from the set.
        let reports = heard(now, &[(0, 30, 5000), (1, 20, 100), (2, 25, 100)]);
        let decided = decide(
            &state(0, &[0, 1, 2]),
            &BTreeSet::from([0, 1]),
            &reports,
            now,
            TIMEOUT * 2,
            TIMEOUT,
        );
        assert!(
            matches!(decided, Some(Command::ElectMaster { master: 1, ref in_sync, .. }) if *in_sync == BTreeSet::from([1])),
            "{decided:?}"
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
                in_sync_version: 9,
                // None agreed yet (a group from before incarnations): the reported ones.
                incarnations: BTreeMap::from([(1, 101), (2, 102)]),
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
                in_sync_version: 0,
                incarnations: BTreeMap::from([(0, 100), (1, 101), (2, 102)]),
            })
        );
    }

    #[test]
    fn a_member_back_with_a_wiped_disk_is_not_elected() {
        let now = Instant::now();
        let mut agreed = state(0, &[0, 1, 2]);
        agreed.incarnations = BTreeMap::from([(0, 100), (1, 101), (2, 102)]);
        // Member 2 has the longest log but a new incarnation: its disk was replaced.
        let mut reports = heard(now, &[(0, 30, 5000), (1, 20, 100), (2, 25, 100)]);
        reports.get_mut(&2).unwrap().incarnation = 777;
        let decided = decide(&agreed, &members(), &reports, now, TIMEOUT * 2, TIMEOUT);
        assert_eq!(
            decided,
            Some(Command::ElectMaster {
                epoch: 5,
                master: 1,
                in_sync: BTreeSet::from([1]),
                in_sync_version: 9,
                incarnations: BTreeMap::from([(1, 101)]),
            })
        );
        // With only the wiped member left, the group waits.
        reports.remove(&1);
        assert_eq!(
            decide(&agreed, &members(), &reports, now, TIMEOUT * 2, TIMEOUT),
            None
        );
    }

    #[test]
    fn a_clean_member_is_preferred_to_a_longer_one_that_stopped_uncleanly() {
        let now = Instant::now();
        let mut reports = heard(now, &[(0, 30, 5000), (1, 20, 100), (2, 25, 100)]);
        reports.get_mut(&2).unwrap().unclean = true;
        let decided = decide(
            &state(0, &[0, 1, 2]),
            &members(),
            &reports,
            now,
            TIMEOUT * 2,
            TIMEOUT,
        );
        assert!(
            matches!(decided, Some(Command::ElectMaster { master: 1, .. })),
            "{decided:?}"
        );
    }

    /// Issue 36's loss: the paused consensus leader resumes, its reports from before the
    /// pause make the master look silent; a gap in its leadership drops them and restarts
    /// the grace period, so it judges nothing until it has heard the group again.
    #[test]
    fn a_leader_that_stalled_forgets_old_reports_and_waits_again() {
        let start = Instant::now();
        let mut reports = Reports::default();
        reports.confirmed_leadership(start);
        for id in [0, 1, 2] {
            reports.heard.insert(
                id,
                Report {
                    log_end: 10,
                    declined: false,
                    incarnation: 1,
                    unclean: false,
                    at: start,
                },
            );
        }
        let steady = start + Duration::from_millis(200);
        reports.confirmed_leadership(steady);
        assert_eq!(reports.leading_since, Some(start));
        assert_eq!(reports.heard.len(), 3);
        // Paused for 4.5 s, then confirmed again.
        let resumed = steady + Duration::from_millis(4500);
        reports.confirmed_leadership(resumed);
        assert_eq!(reports.leading_since, Some(resumed));
        assert!(reports.heard.is_empty());
        let decided = decide(
            &state(0, &[0, 2]),
            &members(),
            &reports.heard,
            resumed,
            Duration::ZERO,
            TIMEOUT,
        );
        assert_eq!(decided, None);
    }

    /// A master that comes back while the leader is replacing it must not have its lease
    /// renewed by the leader's answer (async mode would acknowledge what the next epoch
    /// drops).
    #[test]
    fn no_report_is_answered_while_an_election_is_in_flight() {
        let mut reports = Reports::default();
        reports.confirmed_leadership(Instant::now());
        assert!(reports.leads_now());
        reports.electing = true;
        assert!(!reports.leads_now());
        reports.electing = false;
        assert!(reports.leads_now());
        reports.lost_leadership();
        assert!(!reports.leads_now());
    }
}
