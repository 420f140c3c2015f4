//! One broker of the group unreachable: lag comes from the brokers that answered, the
//! conditions name the silent one, and a pending offset reset waits for every broker.

use super::group_support::{poll_after, simulated_context, two_brokers};
use super::{addr, condition, stored_group, LAG_INTERVAL};
use crate::controller::group::{reconcile, FINALIZER};
use crate::crd::{ConsumerGroup, OffsetResetSpec, OffsetResetTarget};
use crate::fixtures::{paths, FakeAdmin, FakeApiServer, GroupFixture};
use std::sync::Arc;

fn message<'a>(status: &'a crate::crd::ConsumerGroupStatus, type_: &str) -> &'a str {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.message.as_str())
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

#[tokio::test]
async fn lag_from_the_brokers_that_answered_names_the_one_that_did_not() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    two_brokers(&api);
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(90), None);
    admin.set_queue(&addr(1), "billing", ("orders", 0), 50, Some(20), None);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    group.spec.offset_reset = Some(OffsetResetSpec {
        id: "replay-1".into(),
        to: OffsetResetTarget::Earliest,
        timestamp_millis: None,
    });
    api.insert(&paths::group("billing"), &group);
    admin.make_unreachable(&addr(1));

    reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("one broker answering is enough for a lag poll");
    let status = stored_group(&api).status.expect("status written");
    assert_eq!(status.total_lag, Some(10), "broker 0 only: {status:?}");
    assert_eq!(status.top_queues.len(), 1);
    assert_eq!(status.top_queues[0].broker, "qb-0");
    for type_ in ["Ready", "Lagging"] {
        let text = message(&status, type_);
        assert!(
            text.contains(&addr(1)) && text.contains("1 of 2 brokers"),
            "{type_}: {text}"
        );
        assert!(!text.contains(&addr(0)), "{type_}: {text}");
    }
    assert!(admin.resets().is_empty(), "reset not half-applied");
    assert!(status.applied_offset_reset.is_none());
    assert_eq!(
        condition(&status.conditions, "Consuming"),
        ("Unknown".into(), "BrokersUnanswered".into()),
        "progress is not judged on half the queues"
    );

    // Back again: the full lag, no note, and the reset goes to both brokers.
    admin.make_reachable(&addr(1));
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(admin.resets().len(), 2);
    assert!(status.applied_offset_reset.is_some());
    assert!(!message(&status, "Lagging").contains("did not answer"));

    // Nobody answering: nothing to report, the poll fails and is retried.
    admin.make_unreachable(&addr(0));
    admin.make_unreachable(&addr(1));
    let failed = poll_after(&api, &ctx, LAG_INTERVAL).await;
    assert!(failed.is_err(), "{failed:?}");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("False".into(), "PollFailed".into())
    );
}
