//! A ConsumerGroup pass decided, purely: from what [`super::observe`] found, the steps (metrics,
//! events, status, the memory of the last poll) and how the pass ends.

use super::*;

/// What one pass found.
pub(super) enum Found {
    /// The last poll was for this spec and the interval is not up: wait this long.
    NotDue(Duration),
    /// The referenced Broker does not exist.
    BrokerMissing,
    /// The poll of the Broker's brokers.
    Polled(Poll),
    /// The Broker could not be read, or the poll failed.
    Failed(Error),
}

/// One thing a pass does.
#[derive(Debug, PartialEq)]
pub(super) enum GroupStep {
    /// Set the lag series of the poll, with this judgement and these stalled queues.
    LagMetrics {
        progress: Progress,
        stalled: Option<bool>,
        stalled_queues: Option<StalledQueues>,
    },
    /// Drop the lag series: the lag is unknown.
    LagUnknown,
    /// Forget when the last poll was, so the next pass polls rather than waiting for the
    /// interval.
    ForgetPoll,
    /// Remember this poll (time and generation) and its per-queue windows.
    RememberPoll { queues: QueueWindows },
    /// A Warning event.
    Warn {
        reason: &'static str,
        action: &'static str,
        message: String,
    },
    /// Write the status unless unchanged; `best_effort`: a failed write is logged, not
    /// returned (the pass returns the poll's error).
    WriteStatus {
        status: Box<ConsumerGroupStatus>,
        best_effort: bool,
    },
}

/// How a pass ends after its steps.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Then {
    Requeue(Duration),
    /// Return the error the pass found.
    Fail,
}

/// The plan of one pass.
pub(super) fn plan(
    group: &ConsumerGroup,
    found: &Found,
    lag_interval: Duration,
    now_ms: i64,
) -> (Vec<GroupStep>, Then) {
    match found {
        Found::NotDue(wait) => (Vec::new(), Then::Requeue(*wait)),
        Found::BrokerMissing => {
            // Not an error: the user has to create the Broker; retried later.
            let message = format!("Broker {} does not exist", group.spec.broker_ref);
            let steps = lag_unknown(group, "BrokerNotFound", message, false, now_ms);
            (steps, Then::Requeue(MISSING_BROKER_REQUEUE))
        }
        Found::Failed(error) => {
            let message = format!("lag poll failed: {}", error_chain(error));
            (
                lag_unknown(group, "PollFailed", message, true, now_ms),
                Then::Fail,
            )
        }
        Found::Polled(poll) => {
            let polled = polled(group, poll, lag_interval, now_ms);
            let mut steps = vec![GroupStep::LagMetrics {
                progress: polled.judged.progress,
                stalled: polled.judged.stalled(),
                stalled_queues: polled.stalled_queues,
            }];
            for (reason, message) in polled.alarms {
                steps.push(GroupStep::Warn {
                    reason,
                    action: reason,
                    message,
                });
            }
            steps.push(GroupStep::WriteStatus {
                status: Box::new(polled.status),
                best_effort: false,
            });
            steps.push(GroupStep::RememberPoll {
                queues: polled.queue_windows,
            });
            (steps, Then::Requeue(lag_interval))
        }
    }
}

/// When the lag cannot be known: the next try polls at once, the lag series go, a Warning
/// event says why, and the status clears the figures with every condition saying why.
fn lag_unknown(
    group: &ConsumerGroup,
    reason: &'static str,
    message: String,
    best_effort: bool,
    now_ms: i64,
) -> Vec<GroupStep> {
    let status = lag_unknown_status(group, reason, &message, now_ms);
    vec![
        GroupStep::ForgetPoll,
        GroupStep::LagUnknown,
        GroupStep::Warn {
            reason,
            action: "PollingLag",
            message,
        },
        GroupStep::WriteStatus {
            status: Box::new(status),
            best_effort,
        },
    ]
}
