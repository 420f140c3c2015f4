//! A group is polled once per lag interval, however often it is woken, and its status is written
//! only when something a user reads changed: a quiet group and a stalled one are not written
//! again over ten simulated minutes. (The lagging group, written once per interval, is
//! group_storm.)

use super::group_support::{GroupScenario, FIRST_POLL};
use super::{eventually, holds_for, LAG_INTERVAL};
use std::time::Duration;

const TEN_MINUTES: Duration = Duration::from_secs(600);

/// Polls expected in `period`: one per interval (each a little longer than the interval by the
/// poll's own requests), never more.
fn about_one_per_interval(polls: usize, period: Duration) -> bool {
    let intervals = (period.as_secs() / LAG_INTERVAL.as_secs()) as usize;
    (intervals * 3 / 4..=intervals + 1).contains(&polls)
}

#[tokio::test(start_paused = true)]
async fn a_quiet_group_is_polled_once_per_interval_and_never_written_again() {
    // Caught up and idle.
    let scenario = GroupScenario::with_one_queue(100, Some(100), None).await;
    scenario.create_group(|_| {});
    eventually(FIRST_POLL, || scenario.polled()).await;
    let (writes, polls, reconciles) = (
        scenario.status_writes(),
        scenario.polls(),
        scenario.reconciles(),
    );

    // Woken mid-interval by a change the controller sees (a label): no extra poll.
    scenario.edit_group(|group| group["metadata"]["labels"]["team"] = "payments".into());
    let woken = eventually(Duration::from_secs(10), || {
        scenario.reconciles() > reconciles
    })
    .await;
    assert!(woken < Duration::from_secs(10), "woken after {woken:?}");
    assert_eq!(scenario.polls(), polls, "woken early: no poll");

    holds_for(TEN_MINUTES, "nothing changed, nothing written", || {
        scenario.status_writes() == writes
    })
    .await;
    let polled = scenario.polls() - polls;
    assert!(
        about_one_per_interval(polled, TEN_MINUTES),
        "{polled} polls"
    );
    let woken = scenario.reconciles() - reconciles;
    assert!(
        woken as usize <= polled + 2,
        "{woken} reconciles for {polled} polls"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_stalled_group_of_unknown_age_stops_writing_once_judged() {
    // Lag that never moves, and no store time to age it: status settles once Stalled.
    let scenario = GroupScenario::with_one_queue(100, Some(40), None).await;
    scenario.create_group(|_| {});
    eventually(TEN_MINUTES + 2 * LAG_INTERVAL, || {
        scenario.condition("Stalled").0 == "True"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (writes, polls) = (scenario.status_writes(), scenario.polls());
    holds_for(TEN_MINUTES, "judged once, written once", || {
        scenario.status_writes() == writes
    })
    .await;
    let polled = scenario.polls() - polls;
    assert!(
        about_one_per_interval(polled, TEN_MINUTES),
        "{polled} polls"
    );
    scenario.stop().await;
}
