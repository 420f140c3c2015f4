//! One broker of the group unreachable: lag comes from the brokers that answered, the
//! conditions name the silent one, progress is not judged and a pending offset reset waits for
//! every broker; back, the full lag and the reset; nobody answering, the poll fails.

use super::group_support::{GroupScenario, FIRST_POLL, NEXT_POLL};
use super::{addr, eventually};
use crate::crd::{OffsetResetSpec, OffsetResetTarget};

#[tokio::test(start_paused = true)]
async fn lag_from_the_brokers_that_answered_names_the_one_that_did_not() {
    let scenario = GroupScenario::start().await;
    let admin = &scenario.admin;
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(90), None);
    admin.set_queue(&addr(1), "billing", ("orders", 0), 50, Some(20), None);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    admin.make_unreachable(&addr(1));
    scenario.create_group(|group| {
        group.spec.offset_reset = Some(OffsetResetSpec {
            id: "replay-1".into(),
            to: OffsetResetTarget::Earliest,
            timestamp_millis: None,
        });
    });

    eventually(FIRST_POLL, || scenario.polled()).await;
    let status = scenario.status();
    assert_eq!(status.total_lag, Some(10), "broker 0 only: {status:?}");
    assert_eq!(status.top_queues.len(), 1);
    assert_eq!(status.top_queues[0].broker, "qb-0");
    for type_ in ["Ready", "Lagging"] {
        let text = scenario.message(type_);
        assert!(
            text.contains(&addr(1)) && text.contains("1 of 2 brokers"),
            "{type_}: {text}"
        );
        assert!(!text.contains(&addr(0)), "{type_}: {text}");
    }
    assert!(admin.resets().is_empty(), "reset not half-applied");
    assert!(status.applied_offset_reset.is_none());
    assert_eq!(
        scenario.condition("Consuming"),
        ("Unknown".into(), "BrokersUnanswered".into()),
        "progress is not judged on half the queues"
    );

    // Back again: at the next poll the full lag, no note, and the reset on both brokers.
    admin.make_reachable(&addr(1));
    eventually(NEXT_POLL, || {
        scenario.status().applied_offset_reset.is_some()
    })
    .await;
    assert_eq!(admin.resets().len(), 2);
    assert!(!scenario.message("Lagging").contains("did not answer"));
    assert_eq!(scenario.status().total_lag, Some(150), "both rewound to 0");
    assert_eq!(scenario.condition("Consuming").0, "True");

    // Nobody answering: nothing to report, the poll fails.
    admin.make_unreachable(&addr(0));
    admin.make_unreachable(&addr(1));
    eventually(NEXT_POLL, || {
        scenario.condition("Ready") == ("False".into(), "PollFailed".into())
    })
    .await;
    scenario.stop().await;
}
