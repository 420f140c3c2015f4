//! What a poll means, pure: the wall-clock window's judgement of the group's progress and of
//! each queue's, the Ready, Lagging, Consuming, Stalled and QueuesStalled conditions, and the
//! status figures.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// What a successful poll means for the group.
pub(super) struct Polled {
    pub(super) status: ConsumerGroupStatus,
    pub(super) judged: Judged,
    /// The stalled queues; `None` when not judged.
    pub(super) stalled_queues: Option<StalledQueues>,
    /// The per-queue windows to remember for the next poll.
    pub(super) queue_windows: QueueWindows,
    /// The Warning events (reason, message) of a group that just fell behind, stalled or
    /// stopped, and of queues that just stalled while the group consumes.
    pub(super) alarms: Vec<(&'static str, String)>,
}

/// The status, judgement and alarms of a successful poll, pure.
pub(super) fn polled(
    group: &ConsumerGroup,
    poll: &Poll,
    lag_interval: Duration,
    now_ms: i64,
) -> Polled {
    let previous = group.status.clone().unwrap_or_default();
    let thresholds = group.spec.lag_thresholds.clone().unwrap_or_default();
    let window = judgement_window(&thresholds, lag_interval);
    let (lag_window, judged) = judge(&previous, poll, window, now_ms);
    let (queue_windows, stalled_queues) = judge_queues(&previous, poll, &judged, now_ms);
    let mut desired = lag_conditions(poll, &judged, &thresholds);
    let unknown_message = found_message(&desired, "Consuming");
    let queues_stalled =
        queues_stalled_condition(stalled_queues.as_ref(), &judged, unknown_message);
    desired.push(queues_stalled);
    let alarms = [
        progress_alarm(&previous.conditions, &desired),
        queues_alarm(&previous.conditions, &desired),
    ];
    let lag = &poll.lag;
    let status = ConsumerGroupStatus {
        observed_generation: group.metadata.generation,
        total_lag: lag.total_messages(),
        lag_seconds: lag.max_latency_ms().map(|ms| ms as f64 / 1000.0),
        topics: topic_statuses(lag),
        top_queues: top_queues(lag),
        stalled_queues: stalled_queues
            .as_ref()
            .map(stalled_queue_statuses)
            .unwrap_or_default(),
        stalled_queue_count: stalled_queues
            .as_ref()
            .map(|stalled| u32::try_from(stalled.count).unwrap_or(u32::MAX)),
        conditions: conditions::merge(
            &previous.conditions,
            &desired,
            group.metadata.generation,
            timestamp(now_ms),
        ),
        applied_offset_reset: poll.applied_offset_reset.clone(),
        offset_reset_in_progress: previous.offset_reset_in_progress.clone(),
        last_commit_time: lag_window
            .and_then(|window| window.last_commit_ms)
            .map(|ms| timestamp(ms).to_string())
            .or(previous.last_commit_time.clone()),
        members: Some(u32::try_from(poll.members).unwrap_or(u32::MAX)),
        lag_window: lag_window.map(|window| window_status(&window)),
    };
    Polled {
        status,
        judged,
        stalled_queues,
        queue_windows,
        alarms: alarms.into_iter().flatten().collect(),
    }
}

fn found_message<'a>(desired: &'a [Desired], type_: &str) -> &'a str {
    desired
        .iter()
        .find(|condition| condition.type_ == type_)
        .map_or("", |condition| condition.message.as_str())
}

/// The Warning event when the group enters FallingBehind, Stalled or Stopped.
fn progress_alarm(previous: &[Condition], desired: &[Desired]) -> Option<(&'static str, String)> {
    let consuming = desired.iter().find(|c| c.type_ == "Consuming")?;
    let was = previous
        .iter()
        .find(|condition| condition.type_ == "Consuming")
        .map(|condition| condition.reason.as_str());
    let alarming = matches!(consuming.reason, "FallingBehind" | "Stalled" | "Stopped");
    (alarming && was != Some(consuming.reason))
        .then(|| (consuming.reason, consuming.message.clone()))
}

/// The Warning event when queues stall while the group consumes (a group that does not consume
/// has its own event, which covers its queues).
fn queues_alarm(previous: &[Condition], desired: &[Desired]) -> Option<(&'static str, String)> {
    let queues = desired.iter().find(|c| c.type_ == QUEUES_STALLED)?;
    let was = previous
        .iter()
        .find(|condition| condition.type_ == QUEUES_STALLED)
        .map(|condition| condition.reason.as_str());
    let alarming = queues.reason == REASON_QUEUE_COMMITS_NOT_MOVING;
    (alarming && was != Some(queues.reason)).then(|| (QUEUES_STALLED, queues.message.clone()))
}

/// The wall-clock window of the judgement: `windowSeconds`, or the deprecated `stalledPolls`
/// read as that many lag intervals, or [`DEFAULT_WINDOW`].
pub fn judgement_window(thresholds: &LagThresholds, lag_interval: Duration) -> Duration {
    match (thresholds.window_seconds, thresholds.stalled_polls) {
        (Some(seconds), _) => Duration::from_secs(seconds),
        (None, Some(polls)) => lag_interval.saturating_mul(polls.max(1)),
        (None, None) => DEFAULT_WINDOW,
    }
}

/// The judgement of a successful poll, and why there is none when there is none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Judged {
    pub(super) progress: Progress,
    /// Since when lag waited with no commit, once that lasted the whole window (members or not).
    pub(super) stalled_since_ms: Option<i64>,
    pub(super) unknown_reason: &'static str,
    pub(super) window: Duration,
}

impl Judged {
    /// Whether the group is stalled; `None` when not judged.
    pub(super) fn stalled(&self) -> Option<bool> {
        (self.progress != Progress::Unknown).then_some(self.stalled_since_ms.is_some())
    }
}

/// Feeds a complete poll into the window (a poll with silent brokers or no commit would
/// distort it) and judges; the window is the one persisted in status, so a new leader goes on.
pub(super) fn judge(
    previous: &ConsumerGroupStatus,
    poll: &Poll,
    window: Duration,
    now_ms: i64,
) -> (Option<LagWindow>, Judged) {
    let remembered = window_from_status(previous);
    let sample = Sample::of(&poll.lag, now_ms);
    let unknown = |reason| Judged {
        progress: Progress::Unknown,
        stalled_since_ms: None,
        unknown_reason: reason,
        window,
    };
    match sample {
        None => (remembered, unknown("LagUnknown")),
        Some(_) if !poll.unanswered.is_empty() => (remembered, unknown("BrokersUnanswered")),
        Some(sample) => {
            let observed = LagWindow::observe(remembered.as_ref(), sample);
            let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
            let judged = Judged {
                progress: observed.judge(now_ms, window_ms, poll.members),
                stalled_since_ms: observed.stalled_since(now_ms, window_ms),
                unknown_reason: "",
                window,
            };
            (Some(observed), judged)
        }
    }
}

/// Feeds a judged poll into the per-queue windows and lists the stalled queues. The windows
/// come from the operator's memory of the last poll, else from the stalled queues in status
/// (all a new leader has: the queues not yet stalled start their window over). A poll not
/// judged leaves the windows as they were and the stalled queues unknown.
pub(super) fn judge_queues(
    previous: &ConsumerGroupStatus,
    poll: &Poll,
    judged: &Judged,
    now_ms: i64,
) -> (QueueWindows, Option<StalledQueues>) {
    let remembered = poll
        .remembered_queues
        .clone()
        .unwrap_or_else(|| queue_windows_from_status(previous));
    if judged.progress == Progress::Unknown {
        return (remembered, None);
    }
    let windows = QueueWindows::observe(&remembered, &poll.lag, now_ms);
    let window_ms = i64::try_from(judged.window.as_millis()).unwrap_or(i64::MAX);
    let stalled = windows.stalled(now_ms, window_ms, STALLED_QUEUES);
    (windows, Some(stalled))
}

/// The runs of the stalled queues a previous leader (or this one) listed in status.
pub(super) fn queue_windows_from_status(status: &ConsumerGroupStatus) -> QueueWindows {
    let runs = status.stalled_queues.iter().filter_map(|queue| {
        let since = queue.since.parse::<Timestamp>().ok()?;
        let key = QueueKey {
            topic: queue.topic.clone(),
            broker: queue.broker.clone(),
            queue_id: queue.queue_id,
        };
        let run = QueueRun {
            committed: QueueOffset(queue.committed_offset),
            lag: queue.lag,
            since_ms: since.as_millisecond(),
        };
        Some((key, run))
    });
    QueueWindows {
        runs: runs.collect(),
    }
}

pub(super) fn stalled_queue_statuses(stalled: &StalledQueues) -> Vec<StalledQueueStatus> {
    stalled
        .listed
        .iter()
        .map(|(key, run)| StalledQueueStatus {
            topic: key.topic.clone(),
            broker: key.broker.clone(),
            queue_id: key.queue_id,
            lag: run.lag,
            committed_offset: run.committed.0,
            since: timestamp(run.since_ms).to_string(),
        })
        .collect()
}

/// The QueuesStalled condition: queues with lag and no commit for the whole window, named.
pub(super) fn queues_stalled_condition(
    stalled: Option<&StalledQueues>,
    judged: &Judged,
    unknown_message: &str,
) -> Desired {
    let window = window_text(judged.window);
    let Some(stalled) = stalled else {
        return Desired::new(
            QUEUES_STALLED,
            Status::Unknown,
            judged.unknown_reason,
            unknown_message,
        );
    };
    if stalled.count == 0 {
        return Desired::new(
            QUEUES_STALLED,
            false,
            "NoQueueStalled",
            format!("no queue has had lag without a commit for {window}"),
        );
    }
    let reason = match judged.progress {
        Progress::Stalled { .. } | Progress::Stopped => REASON_GROUP_NOT_CONSUMING,
        _ => REASON_QUEUE_COMMITS_NOT_MOVING,
    };
    let mut named: Vec<String> = stalled
        .listed
        .iter()
        .map(|(key, run)| {
            format!(
                "{} queue {} on {} ({} messages, no commit since {})",
                key.topic,
                key.queue_id,
                key.broker,
                run.lag,
                time_text(run.since_ms)
            )
        })
        .collect();
    if stalled.count > stalled.listed.len() {
        named.push(format!("{} more", stalled.count - stalled.listed.len()));
    }
    let message = format!(
        "{} queues with lag and no commit for {window}: {}",
        stalled.count,
        named.join("; ")
    );
    Desired::new(QUEUES_STALLED, true, reason, message)
}

/// Status when the lag cannot be known: lag figures cleared (unknown, not stale), every
/// condition saying why; the window and last commit kept for the next poll.
pub(super) fn lag_unknown_status(
    group: &ConsumerGroup,
    reason: &'static str,
    message: &str,
    now_ms: i64,
) -> ConsumerGroupStatus {
    let previous = group.status.clone().unwrap_or_default();
    let unknown = |type_| Desired::new(type_, Status::Unknown, reason, message);
    let desired = [
        Desired::new("Ready", false, reason, message),
        unknown("Lagging"),
        unknown("Consuming"),
        unknown("Stalled"),
        unknown(QUEUES_STALLED),
    ];
    ConsumerGroupStatus {
        conditions: conditions::merge(
            &previous.conditions,
            &desired,
            group.metadata.generation,
            timestamp(now_ms),
        ),
        total_lag: None,
        lag_seconds: None,
        topics: Vec::new(),
        top_queues: Vec::new(),
        stalled_queues: Vec::new(),
        stalled_queue_count: None,
        members: None,
        ..previous
    }
}

pub(super) fn window_status(window: &LagWindow) -> LagWindowStatus {
    LagWindowStatus {
        committed_offsets: window.committed,
        lag: window.lag,
        stuck_since: window.stuck_since_ms.map(|ms| timestamp(ms).to_string()),
        growing_since: timestamp(window.growing_since_ms).to_string(),
        growing_from: window.growing_from,
    }
}

/// The window a previous leader (or this one) persisted; `None` when absent or unreadable.
pub(super) fn window_from_status(status: &ConsumerGroupStatus) -> Option<LagWindow> {
    let millis = |text: &str| text.parse::<Timestamp>().ok().map(|t| t.as_millisecond());
    let persisted = status.lag_window.as_ref()?;
    let stuck_since_ms = match &persisted.stuck_since {
        Some(text) => Some(millis(text)?),
        None => None,
    };
    Some(LagWindow {
        committed: persisted.committed_offsets,
        lag: persisted.lag,
        last_commit_ms: status.last_commit_time.as_deref().and_then(millis),
        stuck_since_ms,
        growing_since_ms: millis(&persisted.growing_since)?,
        growing_from: persisted.growing_from,
    })
}

pub(super) fn topic_statuses(lag: &GroupLag) -> Vec<TopicLagStatus> {
    lag.topics
        .iter()
        .map(|(topic, topic_lag)| TopicLagStatus {
            topic: topic.clone(),
            lag: topic_lag.messages,
            lag_latency_millis: topic_lag.latency_ms,
            uncommitted_queues: topic_lag.uncommitted_queues,
        })
        .collect()
}

pub(super) fn top_queues(lag: &GroupLag) -> Vec<QueueLagStatus> {
    lag.top_queues(TOP_QUEUES)
        .into_iter()
        .map(|(key, lag)| QueueLagStatus {
            topic: key.topic.clone(),
            broker: key.broker.clone(),
            queue_id: key.queue_id,
            lag,
        })
        .collect()
}

/// "10m" or "90s": how condition messages name the window.
pub(super) fn window_text(window: Duration) -> String {
    match window.as_secs() {
        seconds if seconds % 60 == 0 => format!("{}m", seconds / 60),
        seconds => format!("{seconds}s"),
    }
}

pub(super) fn time_text(ms: i64) -> String {
    timestamp(ms).to_string()
}

pub(super) fn lag_conditions(
    poll: &Poll,
    judged: &Judged,
    thresholds: &LagThresholds,
) -> Vec<Desired> {
    let note = poll.unanswered.note(poll.brokers);
    let total = poll.lag.total_messages();
    let latency_ms = poll.lag.max_latency_ms();
    let over_messages =
        matches!((total, thresholds.messages), (Some(total), Some(limit)) if total > limit);
    let over_seconds = matches!((latency_ms, thresholds.seconds), (Some(ms), Some(limit)) if ms > limit.saturating_mul(1000));
    let lagging = over_messages || over_seconds;
    let lag_message = match total {
        Some(total) => format!(
            "{total} messages behind, {:.1}s{note}",
            latency_ms.unwrap_or(0) as f64 / 1000.0
        ),
        None => format!("nothing committed yet: lag unknown{note}"),
    };
    let consuming = consuming_condition(total.unwrap_or(0), judged, &note);
    let stalled = stalled_condition(total.unwrap_or(0), judged, &consuming);
    vec![
        Desired::new(
            "Ready",
            true,
            "GroupConfigured",
            format!(
                "group present on {} brokers; {} live members{note}",
                poll.brokers, poll.members
            ),
        ),
        Desired::new(
            "Lagging",
            lagging,
            if lagging {
                "ThresholdExceeded"
            } else {
                "WithinThresholds"
            },
            lag_message,
        ),
        consuming,
        stalled,
    ]
}

/// The Stalled condition: lag waited with no commit for the whole window, whether or not
/// consumers are connected (Consuming says Stopped first when none are).
pub(super) fn stalled_condition(lag: u64, judged: &Judged, consuming: &Desired) -> Desired {
    let window = window_text(judged.window);
    match (judged.progress, judged.stalled_since_ms) {
        (Progress::Unknown, _) => Desired::new(
            "Stalled",
            Status::Unknown,
            judged.unknown_reason,
            consuming.message.clone(),
        ),
        (_, Some(since_ms)) => Desired::new(
            "Stalled",
            true,
            "CommitsNotMoving",
            format!(
                "{lag} messages waiting and no commit since {} (window {window})",
                time_text(since_ms)
            ),
        ),
        (_, None) => Desired::new(
            "Stalled",
            false,
            "Progressing",
            format!("messages have not waited {window} without a commit"),
        ),
    }
}

/// The Consuming condition: the judged progress, its reason and what it is based on.
pub(super) fn consuming_condition(lag: u64, judged: &Judged, note: &str) -> Desired {
    let window = window_text(judged.window);
    let (status, reason, message) = match judged.progress {
        Progress::Unknown if judged.unknown_reason == "LagUnknown" => (
            Status::Unknown,
            "LagUnknown",
            format!("nothing committed yet: progress unknown{note}"),
        ),
        Progress::Unknown => (
            Status::Unknown,
            judged.unknown_reason,
            format!("progress is judged on polls every broker answers{note}"),
        ),
        Progress::Ok if lag == 0 => (
            Status::True,
            "CaughtUp",
            "no messages waiting".to_string(),
        ),
        Progress::Ok => (
            Status::True,
            "Progressing",
            format!("{lag} messages waiting; neither stalled nor falling behind over {window}"),
        ),
        Progress::Warning { since_ms, from } => (
            Status::True,
            "FallingBehind",
            format!(
                "lag has not gone down since {} and rose from {from} to {lag} messages while commits move (window {window})",
                time_text(since_ms)
            ),
        ),
        Progress::Stalled { since_ms } => (
            Status::False,
            "Stalled",
            format!(
                "{lag} messages waiting and no commit since {} (window {window})",
                time_text(since_ms)
            ),
        ),
        Progress::Stopped => (
            Status::False,
            "Stopped",
            format!("{lag} messages waiting and no consumer connected"),
        ),
    };
    Desired::new("Consuming", status, reason, message)
}
