//! The progress judgement pass by pass, over a wall-clock window: each pass plans from the
//! group's status as the previous pass wrote it (which is all a new leader has), and the poll
//! of the moment (were the scenarios group_progress and group_failover).

use super::*;
use crate::fixtures::GroupFixture;

/// The lag interval of the passes.
const INTERVAL: Duration = Duration::from_secs(15);
const START_MS: i64 = 1_700_000_000_000;

/// Queue (orders, 0) on qb-0: `stored` written, `committed` read, with `members` consumers.
fn poll_at(stored: u64, committed: u64, members: usize, now_ms: i64) -> Poll {
    let queue = QueueConsumeStats {
        topic: "orders".into(),
        broker_name: "qb-0".into(),
        queue_id: 0,
        broker_offset: QueueOffset(stored),
        consumer_offset: Some(QueueOffset(committed)),
        oldest_unconsumed_store_ms: (stored > committed).then_some(START_MS),
    };
    Poll {
        lag: group_lag(&[queue], &[], now_ms),
        members,
        brokers: 1,
        unanswered: Unanswered::default(),
        applied_offset_reset: None,
        remembered_queues: None,
    }
}

/// What one pass decided: its judgement, its Warning event, and the status it wrote (which
/// the group now has).
struct Decided {
    progress: Progress,
    stalled: Option<bool>,
    warned: Option<&'static str>,
    stalled_queues: Option<StalledQueues>,
    remembered: Option<QueueWindows>,
}

fn decide(group: &mut ConsumerGroup, poll: Poll, now_ms: i64) -> Decided {
    let (steps, then) = plan(group, &Found::Polled(poll), INTERVAL, now_ms);
    assert_eq!(then, Then::Requeue(INTERVAL));
    let mut decided = Decided {
        progress: Progress::Unknown,
        stalled: None,
        warned: None,
        stalled_queues: None,
        remembered: None,
    };
    for step in steps {
        match step {
            GroupStep::LagMetrics {
                progress,
                stalled,
                stalled_queues,
            } => {
                decided.progress = progress;
                decided.stalled = stalled;
                decided.stalled_queues = stalled_queues;
            }
            GroupStep::Warn { reason, .. } => decided.warned = Some(reason),
            GroupStep::WriteStatus { status, .. } => group.status = Some(*status),
            GroupStep::RememberPoll { queues } => decided.remembered = Some(queues),
            _ => {}
        }
    }
    decided
}

fn condition_of(group: &ConsumerGroup, type_: &str) -> (String, String) {
    let status = group.status.as_ref().expect("a status");
    let found = conditions::find(&status.conditions, type_).expect("the condition");
    (found.status.clone(), found.reason.clone())
}

fn message_of(group: &ConsumerGroup, type_: &str) -> String {
    let status = group.status.as_ref().expect("a status");
    let found = conditions::find(&status.conditions, type_).expect("the condition");
    found.message.clone()
}

/// FallingBehind while lag keeps rising with commits moving, Stalled once commits stop for the
/// window, Stopped as soon as no consumer is connected, CaughtUp when it consumed everything:
/// each with its judgement (the status series) and a Warning event on the way in only.
#[test]
fn falling_behind_then_stalled_then_stopped_then_caught_up() {
    let window = Duration::from_secs(120);
    let window_ms = window.as_millis() as i64;
    let interval_ms = INTERVAL.as_millis() as i64;
    let mut group = ConsumerGroup::test();
    group.spec.lag_thresholds = Some(LagThresholds {
        window_seconds: Some(window.as_secs()),
        ..LagThresholds::default()
    });
    let mut warnings = Vec::new();
    let mut now_ms = START_MS;

    // Producers outpace the consumer: every second two messages stored, one committed.
    let traffic = |elapsed_ms: i64| {
        let second = u64::try_from(elapsed_ms / 1000).expect("positive");
        (100 + 2 * second, second)
    };
    let first = decide(&mut group, poll_at(100, 0, 1, now_ms), now_ms);
    assert_eq!(first.progress, Progress::Ok);
    assert_eq!(
        condition_of(&group, "Consuming"),
        ("True".into(), "Progressing".into())
    );
    let behind_at = loop {
        now_ms += interval_ms;
        let (stored, committed) = traffic(now_ms - START_MS);
        let decided = decide(&mut group, poll_at(stored, committed, 1, now_ms), now_ms);
        warnings.extend(decided.warned);
        if condition_of(&group, "Consuming").1 == "FallingBehind" {
            assert!(matches!(decided.progress, Progress::Warning { .. }));
            assert_eq!(condition_of(&group, "Consuming").0, "True");
            break now_ms;
        }
        assert_eq!(condition_of(&group, "Consuming").1, "Progressing");
        assert!(
            now_ms - START_MS < window_ms + 3 * interval_ms,
            "never behind"
        );
    };
    assert!(
        behind_at - START_MS >= window_ms,
        "FallingBehind within the window"
    );
    assert_eq!(warnings, ["FallingBehind"]);

    // The consumer stops committing: Stalled once a whole window passed without a commit.
    let frozen = traffic(behind_at - START_MS);
    let stalled_at = loop {
        now_ms += interval_ms;
        let decided = decide(&mut group, poll_at(frozen.0, frozen.1, 1, now_ms), now_ms);
        warnings.extend(decided.warned);
        if condition_of(&group, "Consuming").1 == "Stalled" {
            assert!(matches!(decided.progress, Progress::Stalled { .. }));
            assert_eq!(decided.stalled, Some(true));
            break now_ms;
        }
        assert_eq!(decided.stalled, Some(false));
        assert!(
            now_ms - behind_at < window_ms + 4 * interval_ms,
            "never stalled"
        );
    };
    let waited = stalled_at - behind_at;
    assert!(
        waited >= window_ms - interval_ms,
        "stalled after {waited} ms"
    );
    assert_eq!(condition_of(&group, "Consuming").0, "False");
    assert_eq!(condition_of(&group, "Stalled").0, "True");

    // Its members leave: Stopped at the next poll.
    now_ms += interval_ms;
    let stopped = decide(&mut group, poll_at(frozen.0, frozen.1, 0, now_ms), now_ms);
    warnings.extend(stopped.warned);
    assert_eq!(stopped.progress, Progress::Stopped);
    assert_eq!(
        condition_of(&group, "Consuming"),
        ("False".into(), "Stopped".into())
    );
    assert_eq!(warnings, ["FallingBehind", "Stalled", "Stopped"]);

    // Back, and it consumes everything: no event for the way out.
    now_ms += interval_ms;
    let back = decide(&mut group, poll_at(frozen.0, frozen.0, 1, now_ms), now_ms);
    assert_eq!(back.progress, Progress::Ok);
    assert_eq!(back.warned, None, "no event for the way out");
    assert_eq!(
        condition_of(&group, "Consuming"),
        ("True".into(), "CaughtUp".into())
    );
}

/// Lag that never moves, a member connected: judged for half the default window, the stall's
/// start is in status.lagWindow.
fn half_a_window_stuck(now_ms: &mut i64) -> (ConsumerGroup, String) {
    let mut group = ConsumerGroup::test();
    let half = *now_ms + DEFAULT_WINDOW.as_millis() as i64 / 2;
    while *now_ms < half {
        let decided = decide(&mut group, poll_at(100, 40, 1, *now_ms), *now_ms);
        assert_eq!(decided.stalled, Some(false), "not stalled in half a window");
        *now_ms += INTERVAL.as_millis() as i64;
    }
    let status = group.status.clone().expect("a status");
    let stuck_since = status
        .lag_window
        .and_then(|window| window.stuck_since)
        .expect("the stall's start is in status");
    (group, stuck_since)
}

/// The judgement goes on from status (a new leader has nothing else): Stalled when the window
/// from the persisted stall's start ends; without the persisted window it starts over.
#[test]
fn the_judgement_continues_from_the_persisted_window_and_only_from_it() {
    let window_ms = DEFAULT_WINDOW.as_millis() as i64;
    let interval_ms = INTERVAL.as_millis() as i64;

    let mut now_ms = START_MS;
    let (mut group, stuck_since) = half_a_window_stuck(&mut now_ms);
    let since_ms = stuck_since
        .parse::<Timestamp>()
        .expect("a timestamp")
        .as_millisecond();
    let stalled_at = loop {
        let decided = decide(&mut group, poll_at(100, 40, 1, now_ms), now_ms);
        if decided.stalled == Some(true) {
            break now_ms;
        }
        now_ms += interval_ms;
        assert!(
            now_ms < since_ms + window_ms + 3 * interval_ms,
            "never stalled"
        );
    };
    let late = stalled_at - (since_ms + window_ms);
    assert!(
        (0..=3 * interval_ms).contains(&late),
        "Stalled {late} ms after the window from {stuck_since} ended"
    );
    assert_eq!(
        condition_of(&group, "Stalled"),
        ("True".into(), "CommitsNotMoving".into())
    );
    let consuming = message_of(&group, "Consuming");
    assert!(consuming.contains(&stuck_since), "{consuming}");

    let mut now_ms = START_MS;
    let (mut group, _) = half_a_window_stuck(&mut now_ms);
    if let Some(status) = group.status.as_mut() {
        status.lag_window = None;
    }
    let until = now_ms + window_ms / 2 + 2 * interval_ms;
    while now_ms < until {
        let decided = decide(&mut group, poll_at(100, 40, 1, now_ms), now_ms);
        assert_eq!(
            decided.stalled,
            Some(false),
            "the judgement restarted: the persisted window is what carried it"
        );
        now_ms += interval_ms;
    }
}

/// Queues (orders, 0..) on qb-0 at `(stored, committed)` each, one member, what this operator
/// remembered of its last poll.
fn poll_of_queues(queues: &[(u64, u64)], remembered: Option<QueueWindows>, now_ms: i64) -> Poll {
    let stats: Vec<QueueConsumeStats> = (0..)
        .zip(queues)
        .map(|(queue_id, &(stored, committed))| QueueConsumeStats {
            topic: "orders".into(),
            broker_name: "qb-0".into(),
            queue_id,
            broker_offset: QueueOffset(stored),
            consumer_offset: Some(QueueOffset(committed)),
            oldest_unconsumed_store_ms: (stored > committed).then_some(START_MS),
        })
        .collect();
    let mut poll = poll_at(0, 0, 1, now_ms);
    poll.lag = group_lag(&stats, &[], now_ms);
    poll.remembered_queues = remembered;
    poll
}

/// One queue keeps its lag with no commit while two others commit at every poll: the group's
/// sums move, so it is Progressing, yet QueuesStalled names the queue once a whole window
/// passed (a Warning event on the way in), and the status and the metric step list it. A new
/// leader, with nothing in memory, goes on from the status's list; a commit ends it.
#[test]
fn one_stuck_queue_is_named_while_the_group_progresses() {
    let window = Duration::from_secs(120);
    let window_ms = window.as_millis() as i64;
    let interval_ms = INTERVAL.as_millis() as i64;
    let mut group = ConsumerGroup::test();
    group.spec.lag_thresholds = Some(LagThresholds {
        window_seconds: Some(window.as_secs()),
        ..LagThresholds::default()
    });
    let mut now_ms = START_MS;
    let mut memory = None;
    let mut warnings = Vec::new();
    let queues_at = |now_ms: i64| {
        let moving = 100 + u64::try_from((now_ms - START_MS) / 1000).expect("positive");
        [
            (45, 40),
            (moving + 3, moving),
            (moving + 2 + moving % 2, moving),
        ]
    };
    let stalled_at = loop {
        let poll = poll_of_queues(&queues_at(now_ms), memory.take(), now_ms);
        let decided = decide(&mut group, poll, now_ms);
        memory = decided.remembered;
        warnings.extend(decided.warned);
        assert_eq!(
            condition_of(&group, "Consuming"),
            ("True".into(), "Progressing".into()),
            "the group's sums move"
        );
        if condition_of(&group, QUEUES_STALLED).0 == "True" {
            let stalled = decided.stalled_queues.expect("judged");
            assert_eq!((stalled.count, stalled.listed[0].0.queue_id), (1, 0));
            break now_ms;
        }
        assert_eq!(
            condition_of(&group, QUEUES_STALLED),
            ("False".into(), "NoQueueStalled".into())
        );
        now_ms += interval_ms;
        assert!(
            now_ms - START_MS < window_ms + 3 * interval_ms,
            "never stalled"
        );
    };
    assert_eq!(stalled_at - START_MS, window_ms, "after exactly the window");
    assert_eq!(warnings, [QUEUES_STALLED]);
    assert_eq!(
        condition_of(&group, QUEUES_STALLED).1,
        REASON_QUEUE_COMMITS_NOT_MOVING
    );
    let message = message_of(&group, QUEUES_STALLED);
    assert!(
        message.starts_with("1 queues with lag and no commit for 2m: orders queue 0 on qb-0 (5 messages, no commit since 2023-11-14T22:13:20Z)"),
        "{message}"
    );
    let status = group.status.clone().expect("a status");
    assert_eq!(status.stalled_queue_count, Some(1));
    assert_eq!(
        status.stalled_queues,
        [StalledQueueStatus {
            topic: "orders".into(),
            broker: "qb-0".into(),
            queue_id: 0,
            lag: 5,
            committed_offset: 40,
            since: "2023-11-14T22:13:20Z".into(),
        }]
    );

    // A new leader: nothing in memory, the status's list carries the stalled queue on.
    now_ms += interval_ms;
    let poll = poll_of_queues(&queues_at(now_ms), None, now_ms);
    let decided = decide(&mut group, poll, now_ms);
    assert_eq!(decided.stalled_queues.map(|stalled| stalled.count), Some(1));
    assert_eq!(decided.warned, None, "no second event");

    // The queue commits: no longer stalled.
    now_ms += interval_ms;
    let mut queues = queues_at(now_ms);
    queues[0] = (45, 41);
    let decided = decide(
        &mut group,
        poll_of_queues(&queues, decided.remembered, now_ms),
        now_ms,
    );
    assert_eq!(decided.stalled_queues.map(|stalled| stalled.count), Some(0));
    assert_eq!(condition_of(&group, QUEUES_STALLED).0, "False");
    assert_eq!(group.status.expect("a status").stalled_queues, Vec::new());
}
