use super::*;
use crate::admin::QueueOffset;

#[test]
fn lag_is_polled_on_every_broker_or_on_each_groups_master() {
    use crate::crd::{BrokerReplicationStatus, BrokerStatus, ReplicationGroupStatus};
    use crate::fixtures::BrokerFixture;
    let plain = Broker::test().replicas(2);
    let addresses: Vec<String> = broker_addresses(&plain).into_iter().map(|a| a.0).collect();
    assert_eq!(
        addresses,
        [
            "qb-0.qb-headless.ns.svc:10911",
            "qb-1.qb-headless.ns.svc:10911"
        ]
    );
    let mut replicated = Broker::test().replicas(2).replicated(3, 2);
    let first_members: Vec<String> = broker_addresses(&replicated)
        .into_iter()
        .map(|a| a.0)
        .collect();
    assert_eq!(
        first_members,
        [
            "qb-0.qb-headless.ns.svc:10911",
            "qb-3.qb-headless.ns.svc:10911"
        ],
        "replica 0 of each group while no master is known"
    );
    replicated.status = Some(BrokerStatus {
        current_replicas: 6,
        replication: Some(BrokerReplicationStatus {
            groups: vec![ReplicationGroupStatus {
                name: "qb-g1".into(),
                master: Some("qb-5".into()),
                ..ReplicationGroupStatus::default()
            }],
        }),
        ..BrokerStatus::default()
    });
    let masters: Vec<String> = broker_addresses(&replicated)
        .into_iter()
        .map(|a| a.0)
        .collect();
    assert_eq!(
        masters,
        [
            "qb-0.qb-headless.ns.svc:10911",
            "qb-5.qb-headless.ns.svc:10911"
        ]
    );
}

fn poll_of(messages: u64, latency_ms: i64) -> Poll {
    let queue = QueueConsumeStats {
        topic: "orders".into(),
        broker_name: "qb-0".into(),
        queue_id: 0,
        broker_offset: QueueOffset(100),
        consumer_offset: Some(QueueOffset(100 - messages)),
        oldest_unconsumed_store_ms: Some(10_000 - latency_ms),
    };
    Poll {
        lag: group_lag(&[queue], &[], 10_000),
        members: 1,
        brokers: 1,
        unanswered: Unanswered::default(),
        applied_offset_reset: None,
        remembered_queues: None,
    }
}

fn judged(progress: Progress) -> Judged {
    let stalled_since_ms = match progress {
        Progress::Stalled { since_ms } => Some(since_ms),
        _ => None,
    };
    Judged {
        progress,
        stalled_since_ms,
        unknown_reason: "LagUnknown",
        window: DEFAULT_WINDOW,
    }
}

fn found<'a>(conditions: &'a [Desired], type_: &str) -> &'a Desired {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_}"))
}

fn lagging(conditions: &[Desired]) -> (bool, &'static str) {
    let found = found(conditions, "Lagging");
    (found.status == Status::True, found.reason)
}

#[test]
fn either_threshold_sets_lagging() {
    let thresholds = LagThresholds {
        messages: Some(50),
        seconds: Some(3),
        ..LagThresholds::default()
    };
    let ok = judged(Progress::Ok);
    let calm = lag_conditions(&poll_of(10, 1_000), &ok, &thresholds);
    assert_eq!(lagging(&calm), (false, "WithinThresholds"));
    let many = lag_conditions(&poll_of(60, 1_000), &ok, &thresholds);
    assert_eq!(lagging(&many), (true, "ThresholdExceeded"));
    let old = lag_conditions(&poll_of(10, 4_000), &ok, &thresholds);
    assert_eq!(lagging(&old), (true, "ThresholdExceeded"));
}

#[test]
fn each_judgement_has_its_consuming_and_stalled_conditions() {
    let cases = [
        (
            Progress::Ok,
            0,
            ("True", "CaughtUp"),
            ("False", "Progressing"),
        ),
        (
            Progress::Ok,
            9,
            ("True", "Progressing"),
            ("False", "Progressing"),
        ),
        (
            Progress::Warning {
                since_ms: 0,
                from: 1,
            },
            9,
            ("True", "FallingBehind"),
            ("False", "Progressing"),
        ),
        (
            Progress::Stalled { since_ms: 0 },
            9,
            ("False", "Stalled"),
            ("True", "CommitsNotMoving"),
        ),
        (
            Progress::Stopped,
            9,
            ("False", "Stopped"),
            ("False", "Progressing"),
        ),
        (
            Progress::Unknown,
            9,
            ("Unknown", "LagUnknown"),
            ("Unknown", "LagUnknown"),
        ),
    ];
    for (progress, lag, consuming, stalled) in cases {
        let conditions = lag_conditions(
            &poll_of(lag, 1_000),
            &judged(progress),
            &LagThresholds::default(),
        );
        let pair = |type_| {
            let c = found(&conditions, type_);
            (c.status.as_str(), c.reason)
        };
        assert_eq!(pair("Consuming"), consuming, "{progress:?}");
        assert_eq!(pair("Stalled"), stalled, "{progress:?}");
    }
    let stalled = lag_conditions(
        &poll_of(9, 1_000),
        &judged(Progress::Stalled { since_ms: 0 }),
        &LagThresholds::default(),
    );
    assert_eq!(
        found(&stalled, "Consuming").message,
        "9 messages waiting and no commit since 1970-01-01T00:00:00Z (window 10m)"
    );
}

#[test]
fn the_window_comes_from_window_seconds_or_the_deprecated_polls() {
    let interval = Duration::from_secs(30);
    let window = |window_seconds, stalled_polls| {
        judgement_window(
            &LagThresholds {
                window_seconds,
                stalled_polls,
                ..LagThresholds::default()
            },
            interval,
        )
    };
    assert_eq!(window(None, None), DEFAULT_WINDOW);
    assert_eq!(window(Some(120), None), Duration::from_secs(120));
    assert_eq!(window(None, Some(5)), Duration::from_secs(150));
    assert_eq!(window_text(DEFAULT_WINDOW), "10m");
    assert_eq!(window_text(Duration::from_secs(90)), "90s");
}

#[test]
fn window_seconds_and_stalled_polls_are_validated() {
    use kube::core::cel::validate_cel;
    let group = |thresholds: serde_json::Value| -> ConsumerGroup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "quiver.io/v1alpha1",
            "kind": "ConsumerGroup",
            "metadata": {"name": "billing", "namespace": "ns"},
            "spec": {"brokerRef": "qb", "lagThresholds": thresholds},
        }))
        .expect("valid group")
    };
    validate_cel(&group(serde_json::json!({"windowSeconds": 600}))).expect("window alone");
    validate_cel(&group(serde_json::json!({"stalledPolls": 5}))).expect("deprecated alone");
    let both = validate_cel(&group(
        serde_json::json!({"windowSeconds": 600, "stalledPolls": 5}),
    ))
    .unwrap_err();
    assert!(
        format!("{both:?}").contains("stalledPolls is deprecated"),
        "{both:?}"
    );
    let zero = validate_cel(&group(serde_json::json!({"windowSeconds": 0}))).unwrap_err();
    assert!(
        format!("{zero:?}").contains("windowSeconds must be between"),
        "{zero:?}"
    );
}

#[test]
fn the_window_round_trips_through_status() {
    let window = LagWindow {
        committed: 40,
        lag: 7,
        last_commit_ms: Some(1_700_000_000_123),
        stuck_since_ms: Some(1_700_000_030_456),
        growing_since_ms: 1_700_000_000_000,
        growing_from: 3,
    };
    let status = ConsumerGroupStatus {
        last_commit_time: Some(time_text(1_700_000_000_123)),
        lag_window: Some(window_status(&window)),
        ..ConsumerGroupStatus::default()
    };
    assert_eq!(window_from_status(&status), Some(window));
    let unreadable = ConsumerGroupStatus {
        lag_window: Some(LagWindowStatus {
            growing_since: "yesterday".into(),
            ..window_status(&window)
        }),
        ..ConsumerGroupStatus::default()
    };
    assert_eq!(window_from_status(&unreadable), None);
}

/// The steps of a plan, one word each.
fn step_names(steps: &[GroupStep]) -> Vec<String> {
    steps
        .iter()
        .map(|step| match step {
            GroupStep::LagMetrics { .. } => "metrics".to_string(),
            GroupStep::LagUnknown => "metrics unknown".to_string(),
            GroupStep::ForgetPoll => "forget".to_string(),
            GroupStep::RememberPoll { .. } => "remember".to_string(),
            GroupStep::Warn { reason, .. } => format!("warn {reason}"),
            GroupStep::WriteStatus { best_effort, .. } => {
                format!("write{}", if *best_effort { " (best effort)" } else { "" })
            }
        })
        .collect()
}

fn written_ready(steps: &[GroupStep]) -> (String, String) {
    let status = steps.iter().find_map(|step| match step {
        GroupStep::WriteStatus { status, .. } => Some(status),
        _ => None,
    });
    let ready = conditions::find(&status.expect("a status").conditions, "Ready").expect("Ready");
    (ready.status.clone(), ready.reason.clone())
}

/// Each outcome of a pass's reads: the steps, how the pass ends, and Ready.
#[test]
fn the_plan_of_each_pass() {
    use crate::fixtures::GroupFixture;
    let group = ConsumerGroup::test();
    let interval = Duration::from_secs(30);
    let failed = Error::MissingField {
        kind: "Broker",
        name: "qb".into(),
        field: "uid",
    };
    let cases = [
        (
            Found::NotDue(Duration::from_secs(7)),
            vec![],
            Then::Requeue(Duration::from_secs(7)),
            None,
        ),
        (
            Found::BrokerMissing,
            vec!["forget", "metrics unknown", "warn BrokerNotFound", "write"],
            Then::Requeue(MISSING_BROKER_REQUEUE),
            Some(("False", "BrokerNotFound")),
        ),
        (
            Found::Failed(failed),
            vec![
                "forget",
                "metrics unknown",
                "warn PollFailed",
                "write (best effort)",
            ],
            Then::Fail,
            Some(("False", "PollFailed")),
        ),
        (
            Found::Polled(poll_of(5, 1_000)),
            vec!["metrics", "write", "remember"],
            Then::Requeue(interval),
            Some(("True", "GroupConfigured")),
        ),
    ];
    for (found, steps, then, ready) in cases {
        let (planned, ends) = plan(&group, &found, interval, 10_000);
        assert_eq!(step_names(&planned), steps);
        assert_eq!(ends, then);
        if let Some((status, reason)) = ready {
            assert_eq!(written_ready(&planned), (status.into(), reason.into()));
        }
    }
}

// Pass-by-pass rows: were the scenarios group_progress and group_failover.
mod passes;
